package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestGateRedisOutage checks G6 with ON_REDIS_ERROR=pause (the default): when
// Redis stops, consumption pauses and readiness goes false, nothing is
// forwarded unchecked while Redis is down, the process does not exit, and
// once Redis is back on the same address everything resumes by itself with
// no event lost. The test runs a Redis of its own; its counters are lost with
// the restart, as expected.
func TestGateRedisOutage(t *testing.T) {
	t.Parallel()
	const parts, phase = 3, 300
	rs := startRedisServer(t, "")
	f := newFlow(t, parts)
	gk := startGatekeeper(t, "gk", f.env(t,
		"GATEKEEPER_REDIS_ADDRS", rs.Addr,
		"GATEKEEPER_REDIS_TIMEOUT", "1s",
		"GATEKEEPER_LIMITS", "*=100000/1m",
		"GATEKEEPER_ROLES", "gate"))
	gk.waitReady(90 * time.Second)
	gen := newEventGen(parts, []string{"a", "b", "c"}, []int{1, 1, 1})

	// Phase 1, Redis up: everything admitted.
	produce(t, f.Source, gen.next(phase))
	o := waitAllRouted(t, f, phase, 60*time.Second)
	if len(o.down) != phase {
		t.Fatalf("before the outage: got %s, want %d downstream", o, phase)
	}

	// Phase 2, Redis down.
	rs.Stop()
	t.Logf("redis stopped")
	produce(t, f.Source, gen.next(phase))
	waitFor(t, 60*time.Second, "readiness reports consumption paused", func() (bool, string) {
		code, body, err := gk.Get("/readyz")
		return code != 200 && strings.Contains(body, "[-]consumption failed: paused"), fmt.Sprintf("%d %q %v", code, body, err)
	})
	// Events produced during the outage must not be forwarded unchecked:
	// downstream stays put for a while.
	for range 6 {
		down := readTopic(t, f.Downstream)
		for _, m := range down {
			if e, ok := parseEv(m); ok && e.ID >= phase {
				t.Fatalf("event %d produced while Redis was down reached downstream", e.ID)
			}
		}
		if len(down) != phase {
			t.Fatalf("downstream during the outage: got %d events, want %d", len(down), phase)
		}
		select {
		case <-gk.Done():
			t.Fatalf("gatekeeper exited during the Redis outage: %v", gk.Err())
		default:
		}
		time.Sleep(500 * time.Millisecond)
	}
	if code, body, _ := gk.Get("/readyz"); code == 200 {
		t.Errorf("/readyz during the outage: got 200, want 503\n%s", body)
	}

	// Redis back on the same address, empty: the gatekeeper resumes by itself.
	startRedisServer(t, rs.Addr)
	t.Logf("redis restarted")
	waitFor(t, 60*time.Second, "ready again after Redis is back", func() (bool, string) {
		code, body, err := gk.Get("/readyz")
		return code == 200, fmt.Sprintf("%d %q %v", code, body, err)
	})
	produce(t, f.Source, gen.next(phase)) // phase 3
	const n = 3 * phase
	o = waitAllRouted(t, f, n, 60*time.Second)
	downIDs := idCounts(o.down)
	missing, dups := missingIDs(downIDs, n)
	if len(missing) > 0 || len(o.retry) > 0 || len(o.dlq) > 0 {
		t.Errorf("after the outage: %s, %d ids missing downstream (%v); want all %d downstream", o, len(missing), first10(missing), n)
	}
	if u := gk.metric(t, "gatekeeper_redis_unchecked_total"); u != 0 {
		t.Errorf("gatekeeper_redis_unchecked_total: got %v, want 0", u)
	}
	if !gk.LogContains("admit works again, resuming") {
		t.Errorf("log: no \"admit works again, resuming\" line")
	}
	t.Logf("%s; %d duplicates", o, dups)
}
