package limit

import (
	"context"
	"testing"
	"time"
)

// TestCapacityPacedFixedPerWindow: two replicas with different views of a
// paced capacity (one set to 20/s, one still at the configured 100/s) share
// a window. The capacity in force there is the one of the window's first
// call, for both; the next window, first called by the other, has the other's.
func TestCapacityPacedFixedPerWindow(t *testing.T) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rdb := testRedis(t)
	c, _ := ParseCapacity("100/1s")
	prefix := testPrefix(t)
	opts := Options{Prefix: prefix, Clock: clk.Now, Capacity: c, Horizon: time.Second}
	slow := newTestLimiter(t, rdb, "*=100000/1m", opts)
	fast := newTestLimiter(t, rdb, "*=100000/1m", opts)
	slow.SetCapacityRate(20)
	if got := slow.CapacityInForce()[0].Limit; got != 20 {
		t.Fatalf("capacity in force %d, want 20", got)
	}
	ctx := context.Background()
	start := clk.Now()
	admitted := func(l *Limiter, tenant string, n int) int {
		t.Helper()
		ds, err := l.Admit(ctx, repeat(tenant, n))
		if err != nil {
			t.Fatal(err)
		}
		k := 0
		for _, d := range ds {
			if d.Kind == Admit {
				k++
			}
		}
		return k
	}
	// Second 0: the slow view calls first, late in the window (past the
	// ramp, so one tenant may take all that is left).
	clk.Set(start.Add(980 * time.Millisecond))
	a := admitted(slow, "a", 5)
	b := admitted(fast, "b", 200)
	if count, _, _ := capWindow(t, slow, c[0], start); count != 20 || a+b != 20 {
		t.Errorf("second 0 (first call paced at 20): count %d, admitted %d+%d, want 20", count, a, b)
	}
	// Second 1: the fast view calls first; the slow one books within 100.
	clk.Set(start.Add(1980 * time.Millisecond))
	b = admitted(fast, "b", 50)
	a = admitted(slow, "a", 200)
	// (second 0 reserved some of b's refused events here)
	if count, _, _ := capWindow(t, slow, c[0], start.Add(time.Second)); count != 100 || a <= 20 {
		t.Errorf("second 1 (first call at 100): count %d, admitted %d+%d, want count 100 and a over the slow view's 20", count, a, b)
	}
	if us, err := slow.CapacityUsage(ctx, "a"); err != nil || len(us) != 1 || us[0].InForce != 100 || us[0].Capacity != "100/1s" {
		t.Errorf("usage in second 1: %+v, %v; want the capacity in force 100", us, err)
	}
	clk.Set(start.Add(5 * time.Second)) // a window with no call yet: what calls pass now
	if us, err := slow.CapacityUsage(ctx, "a"); err != nil || len(us) != 1 || us[0].InForce != 20 {
		t.Errorf("usage before the window's first call: %+v, %v; want 20", us, err)
	}
	slow.SetCapacityRate(0)
	if got := slow.CapacityInForce()[0].Limit; got != 100 {
		t.Errorf("after reset: capacity in force %d, want the configured 100", got)
	}
	slow.SetCapacityRate(1e9)
	if got := slow.CapacityInForce()[0].Limit; got != 100 {
		t.Errorf("rate above the configured: capacity in force %d, want the configured 100", got)
	}
}

// TestCapacityRatePacesShortestRule: a paced rate sets the capacity's rule
// of the shortest window; the longer ones keep their configured limits (a
// minute paced at the rate of its first second would hold it all minute).
func TestCapacityRatePacesShortestRule(t *testing.T) {
	c, err := ParseCapacity("200000/1m,5000/1s")
	if err != nil {
		t.Fatal(err)
	}
	l := newTestLimiter(t, testRedis(t), "*=100000/1m", Options{Capacity: c})
	l.SetCapacityRate(500)
	got := l.CapacityInForce()
	if got[0].Limit != 200000 || got[1].Limit != 500 {
		t.Errorf("capacity in force at 500/s: %v, want 200000/1m,500/1s", got)
	}
	if r := got.Rate(); r != 500 {
		t.Errorf("rate in force %v, want 500", r)
	}
}
