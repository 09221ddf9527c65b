package integration

import (
	"fmt"
	"testing"
	"time"
)

// shutdownGrace is GATEKEEPER_SHUTDOWN_GRACE of the shutdown tests (flow.env).
const shutdownGrace = 15 * time.Second

// TestGateShutdown checks G7 on the built binary: after it has processed a
// stream (with deferred events waiting in the retry tier, both roles
// running), SIGTERM makes it exit 0 within SHUTDOWN_GRACE, having left both
// groups, and the source group's committed offsets are the end offsets of
// the source partitions.
func TestGateShutdown(t *testing.T) {
	t.Parallel()
	const parts, n = 6, 1200
	f := newFlow(t, parts)
	env := f.env(t,
		"GATEKEEPER_LIMITS", "*=50/1m",
		"GATEKEEPER_SHUTDOWN_GRACE", shutdownGrace.String(),
		"GATEKEEPER_ROLES", "gate,retry")
	gk := startGatekeeper(t, "gk", env)
	gk.waitReady(90 * time.Second)
	gen := newEventGen(parts, []string{"a", "b", "c"}, []int{1, 1, 1})
	produce(t, f.Source, gen.next(n))
	o := waitAllRouted(t, f, n, 90*time.Second)
	t.Logf("before SIGTERM: %s", o)

	code, took := gk.terminate(shutdownGrace + 15*time.Second)
	if code != 0 {
		t.Errorf("exit code after SIGTERM: got %d, want 0 (took %v)", code, took)
	}
	t.Logf("exited %d after %v", code, took)
	if got, want := gk.CountLines("left consumer group"), 2; got != want {
		t.Errorf("\"left consumer group\" log lines: got %d, want %d (source and retry groups)", got, want)
	}
	end := endOffsets(t, f.Source, parts)
	got := committed(t, env["GATEKEEPER_GROUP_ID"], f.Source, parts)
	for p := range parts {
		if got[p] != end[p] {
			t.Errorf("partition %d: committed offset got %d, want the end offset %d", p, got[p], end[p])
		}
	}
}

// TestGateShutdownMidStream checks G7 and G5 when SIGTERM comes while
// batches are in flight: the process exits 0, and what it committed is
// exactly what it wrote: every source event below the committed offset of its
// partition is in the outputs, none at or above it is (in-flight writes were
// finished and committed, not left for redelivery). A successor in the same
// group then finishes the stream with no event lost or duplicated.
func TestGateShutdownMidStream(t *testing.T) {
	t.Parallel()
	const parts, n = 6, 6000
	f := newFlow(t, parts)
	env := f.env(t,
		"GATEKEEPER_LIMITS", "*=1000000/1m",
		"GATEKEEPER_BATCH_SIZE", "5",
		"GATEKEEPER_SHUTDOWN_GRACE", shutdownGrace.String(),
		"GATEKEEPER_ROLES", "gate")
	group := env["GATEKEEPER_GROUP_ID"]
	gk := startGatekeeper(t, "gk1", env)
	gk.waitReady(90 * time.Second)
	gen := newEventGen(parts, []string{"a", "b", "c", "d"}, []int{1, 1, 1, 1})
	produce(t, f.Source, gen.next(n))

	// SIGTERM as soon as it is under way.
	deadline := time.Now().Add(90 * time.Second)
	for gk.metric(t, "gatekeeper_events_in_total", `topic="`+f.Source+`"`) < 200 {
		if time.Now().After(deadline) {
			t.Fatalf("gk1 took in fewer than 200 events in 90s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	code, took := gk.terminate(shutdownGrace + 15*time.Second)
	if code != 0 {
		t.Errorf("exit code after SIGTERM: got %d, want 0 (took %v)", code, took)
	}

	// Where each event sits in the source.
	type pos struct {
		part   int
		offset int64
	}
	where := map[int]pos{}
	for _, m := range readTopic(t, f.Source) {
		e, ok := parseEv(m)
		if !ok {
			t.Fatalf("source %d@%d: foreign value %q", m.Partition, m.Offset, m.Value)
		}
		where[e.ID] = pos{m.Partition, m.Offset}
	}
	if len(where) != n {
		t.Fatalf("source holds %d events, want %d", len(where), n)
	}
	c := committed(t, group, f.Source, parts)
	end := endOffsets(t, f.Source, parts)
	var done int64
	for p := range parts {
		done += max(c[p], 0)
	}
	t.Logf("exited %d after %v; committed %v of %v (%d of %d events)", code, took, c, end, done, n)
	counts := idCounts(readOutputs(t, f).all())
	var lost, uncommitted []int
	for id, at := range where {
		switch {
		case at.offset < c[at.part] && counts[id] == 0:
			lost = append(lost, id)
		case at.offset >= c[at.part] && counts[id] > 0:
			uncommitted = append(uncommitted, id)
		}
	}
	if len(lost) > 0 {
		t.Errorf("committed but not in the outputs: %d events (%v)", len(lost), first10(lost))
	}
	if len(uncommitted) > 0 {
		t.Errorf("written but not committed at shutdown: %d events (%v), want 0", len(uncommitted), first10(uncommitted))
	}

	// A successor takes over from the committed offsets.
	gk2 := startGatekeeper(t, "gk2", env)
	gk2.waitReady(90 * time.Second)
	o := waitAllRouted(t, f, n, 90*time.Second)
	missing, dups := missingIDs(idCounts(o.all()), n)
	if len(missing) > 0 || dups > 0 {
		t.Errorf("after the successor: got %d missing (%v) and %d duplicates, want 0 and 0", len(missing), first10(missing), dups)
	}
	waitFor(t, 30*time.Second, "successor committed every source offset", func() (bool, string) {
		c := committed(t, group, f.Source, parts)
		for p := range parts {
			if c[p] != end[p] {
				return false, fmt.Sprintf("committed %v, end %v", c, end)
			}
		}
		return true, ""
	})
	if code, took := gk2.terminate(shutdownGrace + 15*time.Second); code != 0 {
		t.Errorf("gk2 exit code after SIGTERM: got %d, want 0 (took %v)", code, took)
	}
}
