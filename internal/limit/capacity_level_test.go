package limit

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// floodWindows has tenants flood under l: every second from 0 to secs-1,
// each sends perStep events at each of the steps from 0 to last of the
// second's 20 (last 19: over the whole second; less: none in its end).
// before(sec) runs at the start of each second.
func floodWindows(t *testing.T, l *Limiter, clk *fakeClock, tenants []string, secs, last, perStep int, before func(sec int)) time.Time {
	t.Helper()
	ctx := context.Background()
	start := clk.Now()
	for sec := 0; sec < secs; sec++ {
		if before != nil {
			before(sec)
		}
		for k := 0; k <= last; k++ {
			clk.Set(start.Add(time.Duration(sec)*time.Second + time.Duration(k)*time.Second/20))
			var batch []string
			for _, ten := range tenants {
				batch = append(batch, repeat(ten, perStep)...)
			}
			if _, err := l.Admit(ctx, batch); err != nil {
				t.Fatal(err)
			}
		}
	}
	return start
}

func tenantNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("f%02d", i)
	}
	return out
}

// TestCapacityLevelFollowsCapacity: ten tenants flood under a paced
// capacity of 100 a second, then 300 from the fifth second on (SetCapacityRate,
// as the pacing does), sending in the first 80% of each second only (no
// events in the ramp to take what a low level leaves). The level of a
// window is solved for the capacity in force there, so the first window at
// 300 books 300, 30 each. (The level before was the mean of the solved one
// and the window before's, 10: it booked 200, then 250, 270, 280 under the
// capacity while the level caught up.)
func TestCapacityLevelFollowsCapacity(t *testing.T) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, _ := ParseCapacity("1000/1s")
	l := newTestLimiter(t, testRedis(t), "*=1000000/1m", Options{Clock: clk.Now, Capacity: c, Horizon: time.Minute})
	l.SetCapacityRate(100)
	start := floodWindows(t, l, clk, tenantNames(10), 8, 15, 4, func(sec int) {
		if sec == 4 {
			l.SetCapacityRate(300)
		}
	})
	want := map[string]int64{}
	for _, ten := range tenantNames(10) {
		want[ten] = 10
	}
	checkBookedUpTo(t, l, c[0], start, 2, 4, 100, want)
	for _, ten := range tenantNames(10) {
		want[ten] = 30
	}
	checkBookedUpTo(t, l, c[0], start, 4, 8, 300, want)
}

// TestCapacityRampFractions: seven tenants flood a capacity of 100 a
// second: the level is 14.29 a tenant, 14 events each, 98 in all. In the
// ramp the capped tenants' parts of what is spare are rounded up, so that
// the two events left are booked (two tenants book 15): every second is
// full, every tenant within one event of the others. (Rounded down, as
// before, the ramp's part was 14.57, 14: 98 every second.)
func TestCapacityRampFractions(t *testing.T) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, _ := ParseCapacity("100/1s")
	l := newTestLimiter(t, testRedis(t), "*=1000000/1m", Options{Clock: clk.Now, Capacity: c, Horizon: time.Minute})
	start := floodWindows(t, l, clk, tenantNames(7), 6, 19, 2, nil)
	want := map[string]int64{}
	for _, ten := range tenantNames(7) {
		want[ten] = 14
	}
	checkBookedUpTo(t, l, c[0], start, 2, 6, 100, want)
}

// checkBookedUpTo is checkBooked with a capacity in force of limit.
func checkBookedUpTo(t *testing.T, l *Limiter, r Rule, start time.Time, from, to int, limit int64, want map[string]int64) {
	t.Helper()
	r.Limit = limit
	checkBooked(t, l, r, start, from, to, want)
}

// TestCapacityReserveUnpredicted: five light tenants send two events a
// second; in the second second ten tenants start flooding (100 a second
// each), which the level of that second did not predict (nobody capped:
// the largest demand and the spare, 21). What a flooder reserves in later
// seconds is then at most half the equal share of the tenants active in
// the second, the call's tenants counted (100 / 15), not half the level:
// from the next second on every tenant books its water-filling allocation
// of what it asked there (booked and refused) and every second is full.
// The level of the flooders' second second is not damped with the one
// before, where nobody was capped. (Before, the flooders reserved half the
// level, 10 each, in every later second: they booked 10 each there, and
// the light tenants' events found no room in seconds 2, 4 and 5. With the
// active weight of the tenants marked so far, not the call's, the first
// eight flooders of the call reserved 10 and the last two 5.)
func TestCapacityReserveUnpredicted(t *testing.T) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, _ := ParseCapacity("100/1s")
	l := newTestLimiter(t, testRedis(t), "*=1000000/1m", Options{Clock: clk.Now, Capacity: c, Horizon: time.Hour})
	ctx := context.Background()
	start := clk.Now()
	light, floods := []string{"l1", "l2", "l3", "l4", "l5"}, tenantNames(10)
	for sec := 0; sec < 6; sec++ {
		for k := 0; k < 20; k++ {
			clk.Set(start.Add(time.Duration(sec)*time.Second + time.Duration(k)*time.Second/20))
			var batch []string
			if k == 5 || k == 15 {
				batch = append(batch, light...)
			}
			if sec >= 1 {
				for _, f := range floods {
					batch = append(batch, repeat(f, 5)...)
				}
			}
			if len(batch) == 0 {
				continue
			}
			if _, err := l.Admit(ctx, batch); err != nil {
				t.Fatal(err)
			}
		}
	}
	for sec := 2; sec < 6; sec++ {
		s := start.Add(time.Duration(sec) * time.Second)
		count, _, booked := capWindow(t, l, c[0], s)
		refused := capRefused(t, l, c[0], s)
		asked := map[string]int64{}
		for _, ten := range append(slices.Clone(light), floods...) {
			asked[ten] = booked[ten] + refused[ten]
		}
		want, level := testenv.WaterFill(asked, 100)
		t.Logf("second %d: count %d, level %.1f, booked %v", sec, count, level, booked)
		if count != 100 {
			t.Errorf("second %d: count %d, want 100", sec, count)
		}
		for ten, w := range want {
			if got := float64(booked[ten]); math.Abs(got-w) > math.Max(1, 0.05*w) {
				t.Errorf("second %d: %s booked %v, want %.1f (asked %d)", sec, ten, got, w, asked[ten])
			}
		}
	}
}

// TestCapacityRampActive: ten tenants flood (50 a second each) for three
// seconds, then only a sends (30 events every twentieth of a second).
// The fourth second's level is predicted for the ten (10 each, 45 of it
// already reserved by the nine that stopped); in its ramp what is spare is
// split by the capped weight, at most the window's active weight (a alone),
// so that a, the only tenant with events, takes it: the second books 85
// or more. (Split by the capped weight predicted, 10, a took a tenth of
// it: 60.)
func TestCapacityRampActive(t *testing.T) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, _ := ParseCapacity("100/1s")
	l := newTestLimiter(t, testRedis(t), "*=1000000/1m", Options{Clock: clk.Now, Capacity: c, Horizon: time.Hour})
	ctx := context.Background()
	start := clk.Now()
	floods := append([]string{"a"}, tenantNames(9)...)
	for sec := 0; sec < 4; sec++ {
		for k := 0; k < 20; k++ {
			clk.Set(start.Add(time.Duration(sec)*time.Second + time.Duration(k)*time.Second/20))
			var batch []string
			if sec < 3 {
				for _, f := range floods {
					batch = append(batch, repeat(f, 2+btoi(k%2 == 0))...)
				}
			} else {
				batch = repeat("a", 30)
			}
			if _, err := l.Admit(ctx, batch); err != nil {
				t.Fatal(err)
			}
		}
	}
	count, _, booked := capWindow(t, l, c[0], start.Add(3*time.Second))
	t.Logf("fourth second: count %d, booked %v", count, booked)
	if count < 85 || count > 100 {
		t.Errorf("fourth second: count %d, want 85 to 100 (a takes what is spare)", count)
	}
}

// TestCapacityRampShortfall: four tenants send 50 events a second each
// (one every fiftieth of a second) under a capacity of 100 a second,
// beside ten light tenants that send three a second (at 10%, 44% and 78%
// of it) for three seconds, then one. The fourth second's level is solved
// on the demand predicted from the third (the lights' 30): 17.5, so the
// four book 17 each and the lights 10, 78; the lights' 20 missing are
// spare, and the four have events waiting all along. The ramp (the capped
// tenants share what is spare, the satisfied tenants' expected rest kept
// for them) starts at half the window: the four take the spare as it
// shows, and the second is full (98 at least: the capacity used whenever
// demand exceeds it); in the seconds before, the lights' third events
// still find their room (the rest is kept with a margin). (With the ramp
// from 90% of the window, the four took it only from the events they sent
// in its last tenth: 94 booked, 21 each. TestGateCapacityFair's under-used
// windows without a stall are these: a window asked 5-10% less than
// predicted, its level 16 and 19 where water-filling of what it asked
// gives 26 and 30, no gap over 45 ms in its decisions, 95-96% used.)
func TestCapacityRampShortfall(t *testing.T) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, _ := ParseCapacity("100/1s")
	l := newTestLimiter(t, testRedis(t), "*=1000000/1m", Options{Clock: clk.Now, Capacity: c, Horizon: time.Hour})
	ctx := context.Background()
	start := clk.Now()
	floods, lights := tenantNames(4), []string{}
	for i := range 10 {
		lights = append(lights, fmt.Sprintf("l%02d", i))
	}
	for sec := 0; sec < 5; sec++ {
		for k := 0; k < 50; k++ {
			clk.Set(start.Add(time.Duration(sec)*time.Second + time.Duration(k)*time.Second/50))
			batch := slices.Clone(floods)
			if k == 5 || (sec < 3 && (k == 22 || k == 39)) {
				batch = append(batch, lights...)
			}
			if _, err := l.Admit(ctx, batch); err != nil {
				t.Fatal(err)
			}
		}
	}
	for sec := 0; sec < 5; sec++ {
		count, _, booked := capWindow(t, l, c[0], start.Add(time.Duration(sec)*time.Second))
		t.Logf("second %d: count %d, booked %v, refused %v", sec, count, booked, capRefused(t, l, c[0], start.Add(time.Duration(sec)*time.Second)))
	}
	// The ramp from half the window leaves the lights their late events'
	// room (their third event comes at 78% of the second).
	for sec := 1; sec < 3; sec++ {
		_, _, booked := capWindow(t, l, c[0], start.Add(time.Duration(sec)*time.Second))
		for _, ten := range lights {
			if booked[ten] != 3 {
				t.Errorf("second %d: light %s booked %d, want its 3", sec, ten, booked[ten])
			}
		}
	}
	count, _, booked := capWindow(t, l, c[0], start.Add(3*time.Second))
	if count < 98 {
		t.Errorf("fourth second: count %d, want at least 98 (the lights' missing events are spare, the four have events waiting)", count)
	}
	for _, ten := range lights {
		if booked[ten] != 1 {
			t.Errorf("fourth second: light %s booked %d, want its 1", ten, booked[ten])
		}
	}
	for _, f := range floods {
		if booked[f] < 17 {
			t.Errorf("fourth second: %s booked %d, want at least its entitlement 17", f, booked[f])
		}
	}
}
