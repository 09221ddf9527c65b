package limit

import (
	"context"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"slices"
	"strconv"
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

// paceMix sends, from start, the paced harness's mix (integration's
// TestGatePacedByDownstream) under l: 450 events a second, the heavy
// tenant (weight 3) 40%, gold (floor 20/s) 5%, 18 others the rest evenly,
// in one batch per partition of four every 50ms, for the seconds from
// from to to-1; before(sec) runs at each second's start.
func paceMix(t *testing.T, l *Limiter, clk *fakeClock, start time.Time, from, to int, before func(sec int)) {
	t.Helper()
	rates := map[string]float64{"heavy": 180, "gold": 22.5}
	for i := range 18 {
		rates[fmt.Sprintf("t%02d", i)] = 450 * 0.55 / 18
	}
	names := slices.Sorted(maps.Keys(rates))
	part := func(s string) int {
		h := fnv.New32a()
		h.Write([]byte(s))
		return int(h.Sum32() % 4)
	}
	credit := map[string]float64{}
	for step := from * 20; step < to*20; step++ {
		if step%20 == 0 && before != nil {
			before(step / 20)
		}
		clk.Set(start.Add(time.Duration(step) * 50 * time.Millisecond))
		batches := make([][]string, 4)
		for _, n := range names {
			credit[n] += rates[n] / 20
			k := int(credit[n])
			credit[n] -= float64(k)
			batches[part(n)] = append(batches[part(n)], repeat(n, k)...)
		}
		for _, b := range batches {
			if len(b) == 0 {
				continue
			}
			if _, err := l.Admit(context.Background(), b); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// capInForce returns the count and the capacity in force (field cl, -1
// before the window's first call while current) of r's window at start.
func capInForce(t *testing.T, l *Limiter, r Rule, start time.Time) (count, cl int64) {
	t.Helper()
	v, err := l.rdb.HMGet(context.Background(), l.keys.capacity(r)+WindowSep+strconv.FormatInt(start.UnixMilli(), 10), "count", "cl").Result()
	if err != nil {
		t.Fatal(err)
	}
	count, cl = -1, -1
	if s, ok := v[0].(string); ok {
		count, _ = strconv.ParseInt(s, 10, 64)
	}
	if s, ok := v[1].(string); ok {
		cl, _ = strconv.ParseInt(s, 10, 64)
	}
	return count, cl
}

// TestCapacityPacedCut: the paced harness's mix floods a capacity paced at
// 300 a second, with the pacing's floor at 50 (PaceReservations), and the
// rate is cut to the floor at second 15, as the pacing does after the
// downstream's drain halves. The windows ahead hold at the cut at most the
// floor, each tenant at most about its weighted part of it, and every
// window from the cut on has the capacity in force that was set, 50:
// nothing reserved before the cut keeps it higher. Before the cut every
// window is full and within its capacity. (Without the bound, a tenant
// reserved up to half its share in each window ahead: at the cut the next
// two held 131 and 111, in force there while the rate set was 50.)
func TestCapacityPacedCut(t *testing.T) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, _ := ParseCapacity("3000/1s")
	l := newTestLimiter(t, testRedis(t), "*=1000000/1m;heavy=weight:3;gold=floor:20/1s", Options{Clock: clk.Now, Capacity: c, Horizon: time.Hour})
	l.SetCapacityRate(300)
	l.PaceReservations(50)
	start := clk.Now()
	const cut = 15
	paceMix(t, l, clk, start, 0, cut, nil)
	weights := map[string]float64{"heavy": 3}
	for sec := cut; sec < cut+12; sec++ {
		count, _, booked := capWindow(t, l, c[0], start.Add(time.Duration(sec)*time.Second))
		t.Logf("at the cut, window %d holds %d: %v", sec, count, booked)
		if count > 50 {
			t.Errorf("at the cut, window %d holds %d, over the floor 50", sec, count)
		}
		for ten, n := range booked {
			w := max(1, weights[ten])
			if part := 50 * w / 22; float64(n) > math.Ceil(1.25*part)+1 {
				t.Errorf("at the cut, %s holds %d in window %d, over its part of the floor (%.1f)", ten, n, sec, part)
			}
		}
	}
	l.SetCapacityRate(50)
	paceMix(t, l, clk, start, cut, cut+8, nil)
	clk.Set(start.Add((cut + 8) * time.Second))
	for sec := 2; sec < cut+8; sec++ {
		count, cl := capInForce(t, l, c[0], start.Add(time.Duration(sec)*time.Second))
		want := int64(300)
		if sec >= cut {
			want = 50
		}
		t.Logf("window %d: count %d, in force %d", sec, count, cl)
		if cl != want || count > cl || count < cl*98/100 {
			t.Errorf("window %d: count %d, in force %d; want in force %d (the rate set), full and within it", sec, count, cl, want)
		}
	}
}

// TestCapacityPacedLateTenant is TestCapacityLateTenant under a paced
// capacity with the pacing's floor at 10 a second (PaceReservations): b
// reserves ahead at most an eighth of the capacity (more than the floor),
// 12, and d still gets its share from the second after it came.
func TestCapacityPacedLateTenant(t *testing.T) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, _ := ParseCapacity("1000/1s")
	l := newTestLimiter(t, testRedis(t), "*=100000/1m", Options{Clock: clk.Now, Capacity: c, Horizon: time.Minute})
	l.SetCapacityRate(100)
	l.PaceReservations(10)
	r := c[0]
	r.Limit = 100
	start := lateTenant(t, l, clk, r)
	if count, _, got := capWindow(t, l, r, start.Add(10*time.Second)); count > 12 || got["b"] < 5 {
		t.Errorf("second 10: %d reserved, b %d; want at most an eighth of the capacity (12), b's part of it", count, got["b"])
	}
}

// TestCapacityPaceReservationsBound: the bound passed for a paced window
// not yet current is the pacing's floor times the window, at least an
// eighth of the capacity in force, on the paced (shortest) rule alone, and
// none when it is no less than the capacity in force or unset.
func TestCapacityPaceReservationsBound(t *testing.T) {
	c, err := ParseCapacity("3000/1s,100000/1m")
	if err != nil {
		t.Fatal(err)
	}
	l := newTestLimiter(t, testRedis(t), "*=100000/1m", Options{Capacity: c})
	bound := func() [2]int64 {
		in := l.CapacityInForce()
		return [2]int64{l.reserveBound(in[0], in[0].Limit), l.reserveBound(in[1], in[1].Limit)}
	}
	l.SetCapacityRate(300)
	if got := bound(); got != [2]int64{0, 0} {
		t.Errorf("not paced: bounds %v, want none", got)
	}
	for _, tc := range []struct {
		floor, rate float64
		want        int64
	}{
		{50, 300, 50},   // the floor
		{50, 1500, 187}, // an eighth of the capacity
		{50, 50, 0},     // at the floor: the capacity bounds it
		{0.5, 4, 1},     // at least one event
		{0, 300, 0},     // unset
		{-1, 300, 0},    // not a floor
		{50, 3000, 375}, // the ceiling
	} {
		l.PaceReservations(tc.floor)
		l.SetCapacityRate(tc.rate)
		if got := bound(); got != [2]int64{tc.want, 0} {
			t.Errorf("floor %v, rate %v: bounds %v, want [%d 0] (the minute's rule is not paced)", tc.floor, tc.rate, got, tc.want)
		}
	}
}

// TestCapacityPacedFair: ten tenants flood a capacity paced at 300 a
// second with the pacing's floor at 30 (PaceReservations: 37 may be
// reserved in a window ahead, an eighth): every window is full and each
// tenant books its share, 30, as without the bound
// (TestCapacityLevelFollowsCapacity).
func TestCapacityPacedFair(t *testing.T) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, _ := ParseCapacity("1000/1s")
	l := newTestLimiter(t, testRedis(t), "*=1000000/1m", Options{Clock: clk.Now, Capacity: c, Horizon: time.Minute})
	l.SetCapacityRate(300)
	l.PaceReservations(30)
	start := floodWindows(t, l, clk, tenantNames(10), 8, 15, 4, nil)
	want := map[string]int64{}
	for _, ten := range tenantNames(10) {
		want[ten] = 30
	}
	checkBookedUpTo(t, l, c[0], start, 2, 8, 300, want)
	if count, _, _ := capWindow(t, l, c[0], start.Add(9*time.Second)); count > 37 {
		t.Errorf("second 9: %d reserved, over the bound 37", count)
	}
}
