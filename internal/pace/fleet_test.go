package pace

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// TestFleetLeaseAndCap: one replica at a time holds the lease and only it
// stores the rate; a cap is recorded with who and why, applied by every
// replica's Runner, and ends at its time.
func TestFleetLeaseAndCap(t *testing.T) {
	rdb, _ := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	ctx := context.Background()
	f := NewFleet(rdb, prefix, time.Second)
	for _, tc := range []struct {
		id   string
		want bool
	}{{"a", true}, {"b", false}, {"a", true}} {
		if got, err := f.Lease(ctx, tc.id, time.Second); err != nil || got != tc.want {
			t.Fatalf("lease %s: got %v, %v, want %v", tc.id, got, err, tc.want)
		}
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	if ok, _ := f.Publish(ctx, Paced{Estimate: Estimate{Rate: 999, State: StateOK}, At: now, By: "b"}); ok {
		t.Fatal("b published without the lease")
	}
	if ok, err := f.Publish(ctx, Paced{Estimate: Estimate{Rate: 750, Drain: 700, Lag: 1400, Wait: 2 * time.Second, Skew: 1.5, State: StateOK}, At: now, By: "a"}); !ok || err != nil {
		t.Fatalf("a publish: %v, %v", ok, err)
	}
	// Two replicas' runners (no downstream of their own) apply the fleet's
	// rate as paced, with a cap under it.
	if err := f.SetCap(ctx, Cap{Rate: 500, Until: now.Add(time.Hour), By: "ops", Why: "db slow", At: now}); err != nil {
		t.Fatal(err)
	}
	var applied float64
	r := &Runner{Fleet: f, Downstream: &Downstream{}, Params: Params{Floor: 10, Interval: time.Second}, Ceiling: 1000, Apply: func(x float64) { applied = x }}
	r.m = newMetrics()
	r.apply(ctx)
	if s := r.Status(); applied != 500 || s.Cap == nil || s.Cap.By != "ops" || s.Fleet == nil || s.Fleet.Rate != 750 || s.Fleet.Skew != 1.5 {
		t.Fatalf("with a cap: applied %v, status %+v; want 500 and the fleet's 750", applied, s)
	}
	r.Shadow = true
	r.apply(ctx)
	if applied != 500 {
		t.Errorf("shadow with a cap: applied %v, want the cap 500", applied)
	}
	if err := f.LiftCap(ctx, "ops", "db fine", now); err != nil {
		t.Fatal(err)
	}
	r.apply(ctx)
	if applied != 1000 {
		t.Errorf("shadow, no cap: applied %v, want the ceiling 1000 (the paced 750 not enforced)", applied)
	}
	r.Shadow = false
	r.apply(ctx)
	if applied != 750 {
		t.Errorf("paced, no cap: applied %v, want 750", applied)
	}
	if n := r.Note(); n == "" {
		t.Error("no readiness note while paced")
	}
	log, err := f.Audit(ctx, 10)
	if err != nil || len(log) != 2 || log[0].Op != "lift" || log[1].Op != "set" || log[1].By != "ops" || log[1].Why != "db slow" || math.Abs(log[1].Rate-500) > 0 {
		t.Fatalf("audit: %+v, %v", log, err)
	}
	if err := f.SetCap(ctx, Cap{Rate: 500, Until: now.Add(-time.Second), At: now}); err == nil {
		t.Error("a cap that ended before it began was accepted")
	}
	// A cap ends at its time, by itself.
	if err := f.SetCap(ctx, Cap{Rate: 100, Until: time.Now().Add(300 * time.Millisecond), By: "ops", At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	r.apply(ctx)
	if applied != 100 {
		t.Errorf("short cap: applied %v, want 100", applied)
	}
	time.Sleep(400 * time.Millisecond)
	r.apply(ctx)
	if applied != 750 {
		t.Errorf("after the cap's end: applied %v, want 750", applied)
	}
}
