package limit

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestOverlayShare: an override's share replaces the tenant's weight and
// floors (the rules of LIMITS stay with KeepRules), counts in the floors'
// sum in place of the tenant's own, and is refused when the sum would pass
// the capacity.
func TestOverlayShare(t *testing.T) {
	c, _ := ParseCapacity("100/1s")
	base := mustRules(t, "*=100/1m;a=50/1m,weight:2,floor:40/1s;b=floor:30/1s")
	sec := Rule{Limit: 1, Count: 1, Unit: Second}
	share := func(items ...string) *Share {
		s, err := ParseShare(items)
		if err != nil {
			t.Fatal(err)
		}
		return &s
	}
	over := base.WithOverlays(map[string]Overlay{
		"a": {KeepRules: true, Share: share("weight:5", "floor:10/1s"), Version: 7},
		"x": {Rules: mustRules(t, "x=9/1m").For("x"), Share: share("floor:20/1s"), Version: 8},
	}, 8)
	if got := over.For("a"); len(got) != 1 || got[0].String() != "50/1m" {
		t.Errorf("a keeps its rules: got %v, want [50/1m]", got)
	}
	if r, v := over.lookup("a"); len(r) != 1 || v != 7 {
		t.Errorf("a: rules %v version %d, want its own rules under version 7", r, v)
	}
	if s := over.Share("a"); s.Weight != 5 || s.floor(sec) != 10 {
		t.Errorf("a: share %+v, want weight 5 floor 10", s)
	}
	if s := over.Share("x"); s.Weight != 1 || s.floor(sec) != 20 {
		t.Errorf("x: share %+v, want weight 1 (not given) floor 20", s)
	}
	if got := floorSums(over, c)[0]; got != 10+30+20 {
		t.Errorf("floor sum %d, want 60 (a's override 10 in place of its 40, b 30, x 20)", got)
	}
	if got := floorSums(base, c)[0]; got != 70 {
		t.Errorf("base floor sum %d, want 70", got)
	}
	if err := CheckCapacity(over, c); err != nil {
		t.Errorf("CheckCapacity: %v", err)
	}
	if err := CheckShareChange(over, c, "b", *share("floor:70/1s")); err != nil {
		// 70 + 10 + 20: b's 30 replaced, exactly the capacity.
		t.Errorf("b to 70/1s: got %v, want it fits", err)
	}
	if err := CheckShareChange(over, c, "b", *share("floor:71/1s")); err == nil || !strings.Contains(err.Error(), "over the capacity") {
		t.Errorf("b to 71/1s: got %v, want refused (71+10+20 > 100)", err)
	}
	if err := CheckShareChange(over, c, "b", *share("floor:5/1m")); err == nil || !strings.Contains(err.Error(), "no capacity rule of window 1m") {
		t.Errorf("a floor of 1m: got %v, want refused", err)
	}
	if err := CheckShareChange(over, c, "b", *share("floor:5KiB/1s")); err == nil || !strings.Contains(err.Error(), "counts bytes, the capacity 100/1s counts events") {
		t.Errorf("a floor of bytes under a capacity of events: got %v, want refused", err)
	}
	bad := base.WithOverlays(map[string]Overlay{"y": {KeepRules: true, Share: share("floor:31/1s")}}, 9)
	if err := CheckCapacity(bad, c); err == nil || !strings.Contains(err.Error(), "sum to 101") {
		t.Errorf("floors over the capacity through an override: got %v", err)
	}
	if !ShareRaised(Share{Weight: 1}, *share("weight:2")) || !ShareRaised(Share{Weight: 3}, *share("weight:1", "floor:5/1s")) ||
		ShareRaised(*share("weight:2", "floor:5/1s"), *share("weight:2", "floor:5/1s")) {
		t.Error("ShareRaised")
	}
	for _, items := range [][]string{{"weight:0"}, {"weight:1001"}, {"floor:5MiB/1s", "floor:5/1s"}, {"floor:1/1s", "floor:2/1s"}, {"5/1m"}} {
		if _, err := ParseShare(items); err == nil {
			t.Errorf("ParseShare(%q): no error", items)
		}
	}
}

// TestCapacityOverlayWorkedExample is the README's worked example with
// c's weight and floor set by a live override instead of LIMITS: the same
// water-filling answer (a 10, b 30, c 60) once the level settles; then the
// override is dropped (c back to weight 1, no floor) and the answer becomes
// a 10, b 45, c 45.
func TestCapacityOverlayWorkedExample(t *testing.T) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, _ := ParseCapacity("100/1s")
	l := newTestLimiter(t, testRedis(t), "*=100000/1m", Options{Clock: clk.Now, Capacity: c})
	s, err := ParseShare([]string{"weight:2", "floor:30/1s"})
	if err != nil {
		t.Fatal(err)
	}
	base := l.Rules()
	if err := l.SetRules(base.WithOverlays(map[string]Overlay{"c": {KeepRules: true, Share: &s, Version: 3}}, 3)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := clk.Now()
	const steps = 20
	run := func(from, to int) {
		for sec := from; sec < to; sec++ {
			for k := 0; k < steps; k++ {
				clk.Set(start.Add(time.Duration(sec)*time.Second + time.Duration(k)*time.Second/steps))
				var batch []string
				batch = append(batch, repeat("a", 10/steps+btoi(k%2 == 0))...)
				batch = append(batch, repeat("b", 200/steps)...)
				batch = append(batch, repeat("c", 100/steps)...)
				ds, err := l.Admit(ctx, batch)
				if err != nil {
					t.Fatal(err)
				}
				for i, d := range ds {
					if want := int64(3 * btoi(batch[i] == "c" && sec < 14)); d.Override != want {
						t.Fatalf("second %d: %s decided under override %d, want %d", sec, batch[i], d.Override, want)
					}
				}
			}
		}
	}
	run(0, 14)
	checkBooked(t, l, c[0], start, 10, 14, map[string]int64{"a": 10, "b": 30, "c": 60})
	if err := l.SetRules(base); err != nil {
		t.Fatal(err)
	}
	run(14, 28)
	// Reserved slots booked under the override stay booked: check the
	// seconds after the old reservations, where only the new shares count.
	checkBooked(t, l, c[0], start, 26, 28, map[string]int64{"a": 10, "b": 45, "c": 45})
}
