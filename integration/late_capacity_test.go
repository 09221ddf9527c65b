package integration

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
)

// TestLateKeepsPlaceCapacity runs the built binary with one tenant under a
// capacity of 8 events a second (CAPACITY=8/1s, its own rule of 1000/1m far
// from full): of 200 events, the capacity defers most over about 48 seconds
// ahead (a future capacity window holds half the tenant's share), and the
// retry tier moves them into idle capacity as it goes (CAPACITY_ADVANCE,
// the default). The process is paused (SIGSTOP, 10s) while deferred events
// are due. Back, the events that missed their slot take the slots of the
// tenant's later reservations in the capacity's windows (LATE_TAKES_SLOTS=on,
// the default), ahead of what it deferred after them. Every event arrives
// once, none before its gk-due, no capacity window books more than the
// capacity, and the tenant's own windows count each event once.
func TestLateKeepsPlaceCapacity(t *testing.T) {
	t.Parallel()
	const (
		n        = 200
		capacity = 8 // events a second
		pause    = 10 * time.Second
	)
	f := newFlow(t, 1)
	prefix := keyPrefix(t)
	env := f.env(t, "GATEKEEPER_LIMITS", "acme=1000/1m", "GATEKEEPER_CAPACITY", fmt.Sprintf("%d/1s", capacity),
		"GATEKEEPER_REDIS_KEY_PREFIX", prefix)
	gk := startGatekeeper(t, "gk", env)
	gk.waitReady(90 * time.Second)
	rtWaitAssigned(t, rtGroups(f, 1), gk)

	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Partition: 0, Key: []byte("acme"), Value: ev{ID: i, Part: 0, Seq: i}.value()}
	}
	start := time.Now()
	produce(t, f.Source, msgs)
	waitFor(t, 30*time.Second, "the backlog deferred", func() (bool, string) {
		d := gk.metric(t, "gatekeeper_decisions_total", `decision="defer"`)
		a := gk.metric(t, "gatekeeper_decisions_total", `decision="admit"`)
		return a+d >= n, fmt.Sprintf("%v admitted, %v deferred", a, d)
	})
	var lastDue time.Time
	for _, m := range readTopic(t, f.Retry) {
		if due, ok := rtMillis(t, m, "gk-due"); ok && due.After(lastDue) {
			lastDue = due
		}
	}

	// Pause it while the backlog's head is due.
	time.Sleep(time.Until(start.Add(3 * time.Second)))
	if err := gk.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(pause)
	if err := gk.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()

	var o outputs
	waitFor(t, 90*time.Second, "every event downstream", func() (bool, string) {
		o = readOutputs(t, f)
		missing, _ := missingIDs(idCounts(o.down), n)
		return len(missing) == 0 || len(o.dlq) > 0, fmt.Sprintf("%s; %d of %d ids not downstream", o, len(missing), n)
	})
	missing, dups := missingIDs(idCounts(o.down), n)
	if len(missing) > 0 || dups > 0 || len(o.dlq) > 0 {
		t.Fatalf("downstream: %d missing, %d duplicated, %d dead-lettered, want none", len(missing), dups, len(o.dlq))
	}
	var took, early []string
	var tookLast time.Time
	for _, m := range o.down {
		due, ok := rtMillis(t, m, "gk-due")
		if !ok {
			continue
		}
		if m.Time.Before(due) {
			early = append(early, fmt.Sprintf("%s appended %s, due %s", evName(m), m.Time.Format(time.StampMilli), due.Format(time.StampMilli)))
		}
		if header(m, "gk-took") != "" {
			took = append(took, evName(m))
			if m.Time.After(tookLast) {
				tookLast = m.Time
			}
		}
	}
	if len(early) > 0 {
		t.Errorf("%d events forwarded before their gk-due, want none (G3): %s", len(early), strings.Join(rtHead(early), "; "))
	}
	tookSlot := gk.metric(t, "gatekeeper_decisions_total", `decision="took_slot"`)
	slotTaken := gk.metric(t, "gatekeeper_decisions_total", `decision="slot_taken"`)
	advanced := gk.metric(t, "gatekeeper_decisions_total", `decision="advanced"`)
	if tookSlot == 0 || len(took) == 0 {
		_, body, _ := gk.Get("/metrics")
		for l := range strings.Lines(body) {
			if strings.HasPrefix(l, "gatekeeper_decisions_total") || strings.HasPrefix(l, "gatekeeper_late_reservations_total") ||
				strings.HasPrefix(l, "gatekeeper_released_slots_total") {
				t.Log(strings.TrimSpace(l))
			}
		}
		t.Fatalf("took_slot %v, %d events downstream with gk-took: want some (the pause made events miss their slot "+
			"while later capacity windows held the tenant's reservations)", tookSlot, len(took))
	}
	if !tookLast.Before(lastDue) {
		t.Errorf("last event that took a slot appended %s, want before the backlog's last due time %s",
			tookLast.Format(time.StampMilli), lastDue.Format(time.StampMilli))
	}

	// Redis, once the retry tier has nothing left: no capacity window over
	// the capacity, and the tenant's own windows count each event once
	// (missed slots are given back there; a capacity keeps them booked).
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer rdb.Close()
	var booked, fullest int64
	var over []string
	for _, w := range readCapWindows(t, rdb, prefix, "1s") {
		booked += w.count
		fullest = max(fullest, w.count)
		if w.count > capacity {
			over = append(over, fmt.Sprintf("%d: %d", w.start, w.count))
		}
	}
	if len(over) > 0 {
		t.Errorf("capacity windows over %d: %v (G12)", capacity, over)
	}
	if booked < n {
		t.Errorf("the capacity's windows booked %d, want at least the %d events", booked, n)
	}
	var counted int64
	for _, w := range readWindows(t, redisAddr(), prefix) {
		if w.Tenant == "acme" && w.Window == "1m" {
			counted += w.Count
		}
	}
	if counted != n {
		t.Errorf("acme's own windows counted %d, want the %d events once", counted, n)
	}
	t.Logf("%d events, capacity %d/1s; paused %v, resumed %v after the load; %v took a slot, %v found theirs taken, "+
		"%v advanced; the capacity booked %d (+%d: missed slots stay booked there), the fullest window %d; acme's "+
		"windows counted %d; the last took-slot event appended %v before the backlog's last due time",
		n, capacity, pause, resumed.Sub(start).Round(100*time.Millisecond), tookSlot, slotTaken, advanced, booked, booked-n,
		fullest, counted, lastDue.Sub(tookLast).Round(100*time.Millisecond))
}
