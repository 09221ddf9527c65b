package limit

import (
	"context"
	"testing"
	"time"
)

// A tenant with several rules (events and bytes, minute and day) whose
// events fit is decided by one HINCRBY per rule, without reading a window
// or an anchor, like a tenant of one rule: aligned windows, and ttl
// windows whose chains the Limiter remembers from the last reply.
func TestSeveralRulesFastPath(t *testing.T) {
	for _, tc := range []struct {
		name  string
		kind  WindowKind
		rules string
	}{
		{"aligned minute and day", Aligned, "acme=100/1m,1000/1d"},
		{"aligned events and bytes", Aligned, "acme=100/1m,1MiB/1m"},
		{"ttl events and bytes", TTL, "acme=100/1m,1MiB/1m"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := privateRedis(t)
			m := newWorkMeter(t, rdb)
			clk := newFakeClock(t0)
			l := newTestLimiter(t, rdb, tc.rules, Options{Clock: clk.Now, WindowKind: tc.kind})
			costs := []Cost{{Bytes: 300}, {Bytes: 300}, {Bytes: 300}}
			batch := []string{"acme", "acme", "acme"}
			// The first batch opens the windows (and the ttl chains).
			if ds, err := l.AdmitCosts(context.Background(), batch, costs); err != nil || kinds(ds) != "aaa" {
				t.Fatalf("first batch: %v %v", kinds(ds), err)
			}
			clk.Add(time.Second)
			m.reset()
			if ds, err := l.AdmitCosts(context.Background(), batch, costs); err != nil || kinds(ds) != "aaa" {
				t.Fatalf("second batch: %v %v", kinds(ds), err)
			}
			if got := m.calls("hincrby"); got != 2 {
				t.Errorf("HINCRBY: got %d, want 2 (one per rule)", got)
			}
			if got := m.calls("hmget"); got != 0 {
				t.Errorf("HMGET (windows and anchors read): got %d, want 0", got)
			}
		})
	}
}
