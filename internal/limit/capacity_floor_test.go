package limit

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCapacityFloorAsked: a floor is kept apart for what its tenant asks
// of a window, and a tenant that asks gets it against floods. Under
// CAPACITY=100/1s, c, d and e flood 300 events a second each from second
// 0, and g (floor 30/1s) sends 40 a second, spread over each second, from
// second 3. Before it, g asks nothing, and the floods take the whole
// capacity (a floor kept apart whatever the demand left 30 a second idle).
// In second 3, with nothing predicted for g, its floor is not kept apart
// (the floods' shares may take the window first); from second 4 on it is
// predicted to ask (what it sent in second 3, and what it reserved), and
// it books at least its floor, 30, in every second. Every window is within
// the capacity, and full (at least 98: the ramp keeps a satisfied
// tenant's expected rest) except in second 3. The water-filling answer
// from second 4: g 30 (its floor over the level), the floods about 23
// each.
func TestCapacityFloorAsked(t *testing.T) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, err := ParseCapacity("100/1s")
	if err != nil {
		t.Fatal(err)
	}
	l := newTestLimiter(t, testRedis(t), "*=100000/1m;g=floor:30/1s", Options{Clock: clk.Now, Capacity: c})
	ctx := context.Background()
	start := clk.Now()
	const steps, secs, from = 20, 10, 3
	for sec := 0; sec < secs; sec++ {
		for k := 0; k < steps; k++ {
			clk.Set(start.Add(time.Duration(sec)*time.Second + time.Duration(k)*time.Second/steps))
			var batch []string
			for _, f := range []string{"c", "d", "e"} {
				batch = append(batch, repeat(f, 300/steps)...)
			}
			if sec >= from {
				batch = append(batch, repeat("g", 2)...)
			}
			if _, err := l.Admit(ctx, batch); err != nil {
				t.Fatal(err)
			}
		}
	}
	for sec := 0; sec < secs; sec++ {
		count, _, got := capWindow(t, l, c[0], start.Add(time.Duration(sec)*time.Second))
		t.Logf("second %d: count %d, booked %v", sec, count, got)
		checkFloorUse(t, l, c[0], start.Add(time.Duration(sec)*time.Second))
		if count > c[0].Limit {
			t.Errorf("second %d: count %d, over the capacity %d", sec, count, c[0].Limit)
		}
		if sec != from && count < c[0].Limit-2 {
			t.Errorf("second %d: count %d, want the capacity %d (at least %d: work-conserving)", sec, count, c[0].Limit, c[0].Limit-2)
		}
		if sec > from && got["g"] < 30 {
			t.Errorf("second %d: g booked %d, want at least its floor 30 (it asks 40)", sec, got["g"])
		}
	}
}

// checkFloorUse checks field fu of l's window of capacity rule r starting
// at start: the sum, over the tenants with a floor there, of what each uses
// of its floor, min(floor, max(booked, asked)) (its t: and q: fields; see
// 35_capacity.lua's Floors).
func checkFloorUse(t testing.TB, l *Limiter, r Rule, start time.Time) {
	t.Helper()
	h, err := l.rdb.HGetAll(context.Background(), l.keys.capacity(r)+WindowSep+strconv.FormatInt(start.UnixMilli(), 10)).Result()
	if err != nil {
		t.Fatal(err)
	}
	num := func(f string) int64 {
		n, _ := strconv.ParseInt(h[f], 10, 64)
		return n
	}
	var want int64
	seen := map[string]bool{}
	for f := range h {
		tenant, ok := strings.CutPrefix(f, "t:")
		if !ok {
			tenant, ok = strings.CutPrefix(f, "q:")
		}
		if !ok || seen[tenant] {
			continue
		}
		seen[tenant] = true
		if floor := l.Rules().Share(tenant).FloorIn(r); floor > 0 {
			want += min(floor, max(num("t:"+tenant), num("q:"+tenant)))
		}
	}
	if got := num("fu"); got != want {
		t.Errorf("window %v: fu %d, want %d, what the tenants with a floor use of it (booked or asked)", start, got, want)
	}
}
