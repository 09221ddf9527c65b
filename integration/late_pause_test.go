package integration

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// lateRun is what pausedLate saw: the outputs, when the load started and
// the process resumed, the backlog's last due time, and the events
// downstream that took a slot (gk-took) with the last one's append time.
type lateRun struct {
	o                               outputs
	start, resumed, lastDue, tookAt time.Time
	took                            []string
}

// pausedLate runs what the late-event tests share: it produces msgs (n
// events with ids 0..n-1) to f's source, waits until gk decided them all,
// pauses gk (SIGSTOP) from at after the load for pause, as a long GC pause
// or a starved CPU would, and waits until every event is downstream. It
// fails the test when an event is missing, duplicated or dead-lettered,
// and reports those forwarded before their gk-due (G3).
func pausedLate(t *testing.T, gk *gkProc, f flow, msgs []kafka.Message, at, pause time.Duration) lateRun {
	t.Helper()
	n := len(msgs)
	var r lateRun
	r.start = time.Now()
	produce(t, f.Source, msgs)
	waitFor(t, 30*time.Second, "the backlog deferred", func() (bool, string) {
		d := gk.metric(t, "gatekeeper_decisions_total", `decision="defer"`)
		a := gk.metric(t, "gatekeeper_decisions_total", `decision="admit"`)
		return a+d >= float64(n), fmt.Sprintf("%v admitted, %v deferred", a, d)
	})
	for _, m := range readTopic(t, f.Retry) {
		if due, ok := rtMillis(t, m, "gk-due"); ok && due.After(r.lastDue) {
			r.lastDue = due
		}
	}

	time.Sleep(time.Until(r.start.Add(at)))
	if err := gk.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(pause)
	if err := gk.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	r.resumed = time.Now()

	waitFor(t, 90*time.Second, "every event downstream", func() (bool, string) {
		r.o = readOutputs(t, f)
		missing, _ := missingIDs(idCounts(r.o.down), n)
		return len(missing) == 0 || len(r.o.dlq) > 0, fmt.Sprintf("%s; %d of %d ids not downstream", r.o, len(missing), n)
	})
	missing, dups := missingIDs(idCounts(r.o.down), n)
	if len(missing) > 0 || dups > 0 || len(r.o.dlq) > 0 {
		t.Fatalf("downstream: %d missing, %d duplicated, %d dead-lettered, want none", len(missing), dups, len(r.o.dlq))
	}
	var early []string
	for _, m := range r.o.down {
		due, ok := rtMillis(t, m, "gk-due")
		if !ok {
			continue
		}
		if m.Time.Before(due) {
			early = append(early, fmt.Sprintf("%s appended %s, due %s", evName(m), m.Time.Format(time.StampMilli), due.Format(time.StampMilli)))
		}
		if header(m, "gk-took") != "" {
			r.took = append(r.took, evName(m))
			if m.Time.After(r.tookAt) {
				r.tookAt = m.Time
			}
		}
	}
	if len(early) > 0 {
		t.Errorf("%d events forwarded before their gk-due, want none (G3): %s", len(early), strings.Join(rtHead(early), "; "))
	}
	return r
}

// checkTook fails the test unless late events took slots (took_slot above
// zero, with claims slot_taken too, and events downstream with gk-took;
// else it logs the decision metrics and says why some were wanted), and
// reports the last that took one appended at or after the backlog's last
// due time: they went ahead of what the tenant deferred after them. It
// returns took_slot and slot_taken.
func (r lateRun) checkTook(t *testing.T, gk *gkProc, wantTaken bool, why string) (tookSlot, slotTaken float64) {
	t.Helper()
	tookSlot = gk.metric(t, "gatekeeper_decisions_total", `decision="took_slot"`)
	slotTaken = gk.metric(t, "gatekeeper_decisions_total", `decision="slot_taken"`)
	if tookSlot == 0 || (wantTaken && slotTaken == 0) || len(r.took) == 0 {
		_, body, _ := gk.Get("/metrics")
		for l := range strings.Lines(body) {
			if strings.HasPrefix(l, "gatekeeper_decisions_total") || strings.HasPrefix(l, "gatekeeper_late_reservations_total") ||
				strings.HasPrefix(l, "gatekeeper_released_slots_total") {
				t.Log(strings.TrimSpace(l))
			}
		}
		t.Fatalf("took_slot %v, slot_taken %v, %d events downstream with gk-took: want some (%s)", tookSlot, slotTaken, len(r.took), why)
	}
	if !r.tookAt.Before(r.lastDue) {
		t.Errorf("last event that took a slot appended %s, want before the backlog's last due time %s",
			r.tookAt.Format(time.StampMilli), r.lastDue.Format(time.StampMilli))
	}
	return tookSlot, slotTaken
}
