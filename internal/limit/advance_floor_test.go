package limit

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCapacityBacklogFloors: a backlog's moves under a capacity of
// bytes or units (or events) keep the capacity's own bookkeeping as admission keeps
// it, for tenants with floors and weights. For three seconds b (weight 2,
// a floor) floods 15 events a call and c (no floor, no rule of its own) 5,
// while a (a floor, no rule of its own) sends 2, each event of 500, 1000 or
// 1500 bytes and as many units in turn: with Advance, moves take b's and
// c's bookings out of their slots' windows by each event's cost (unbook,
// under a floor and not) while they still reserve and a still books. After
// the run, in every second's capacity window, the window's demand
// histogram holds the tenants' predicted demands (q:) there: its demands and fm sum to theirs, fm to their parts under their
// floors, and its weights to the weights of the tenants that ask there
// without a floor (a floor's entry takes its tenant's weight back). The
// same holds without Advance (the check is admission's bookkeeping), and
// under a capacity of events (whose histogram packs weight and demand), and
// backlogOf's checks hold: every window counts exactly what was forwarded
// in it, within its limits, its fb is what the tenants booked under their
// floors, and replays count nothing.
func TestCapacityBacklogFloors(t *testing.T) {
	sizes := []int64{500, 1000, 1500}
	cost := func(i int) Cost { return Cost{Bytes: sizes[i%len(sizes)], Units: sizes[i%len(sizes)]} }
	plan := func(sec, k int) []string {
		return append(append(repeat("b", 15), repeat("c", 5)...), repeat("a", 2)...)
	}
	for _, tc := range []struct{ capacity, limits string }{
		{"100KiB/1s", "b=150KiB/1s,weight:2,floor:20KiB/1s;a=floor:10KiB/1s"},
		{"100000u/1s", "b=150/1s,weight:2,floor:20000u/1s;a=floor:10000u/1s"},
		{"100/1s", "b=150/1s,weight:2,floor:20/1s;a=floor:10/1s"}, // events, as before
	} {
		t.Run(tc.capacity, func(t *testing.T) {
			var checked int
			check := func(t *testing.T, l *Limiter, start time.Time) {
				checked += checkCapacityBooks(t, l, start, 60)
			}
			p := drainPlan{capacity: tc.capacity, limits: tc.limits, until: 3, plan: plan, cost: cost, check: check}
			before := backlogOf(t, false, p)
			after := backlogOf(t, true, p)
			if after.moves == 0 || after.last >= before.last {
				t.Errorf("with Advance %d events moved and the backlog drained in second %d, reserved slots alone in second %d: want moves, and sooner",
					after.moves, after.last, before.last)
			}
			t.Logf("%s: %d events moved; the backlog gone in second %d, %d without Advance; %d capacity windows checked in the two runs",
				tc.capacity, after.moves, after.last, before.last, checked)
			if checked == 0 {
				t.Error("no capacity window checked")
			}
		})
	}
}

// checkCapacityBooks checks the bookkeeping of l's first capacity rule in
// the windows of the secs seconds from start that hold a booking (see
// TestCapacityBacklogFloors), and returns how many it checked.
func checkCapacityBooks(t *testing.T, l *Limiter, start time.Time, secs int) int {
	t.Helper()
	ctx := context.Background()
	c := l.opts.Capacity[0]
	rules := l.Rules()
	checked := 0
	for sec := 0; sec < secs; sec++ {
		ms := strconv.FormatInt(start.Add(time.Duration(sec)*time.Second).UnixMilli(), 10)
		w, err := l.rdb.HGetAll(ctx, l.keys.capacity(c)+WindowSep+ms).Result()
		if err != nil {
			t.Fatal(err)
		}
		h, err := l.rdb.HGetAll(ctx, l.keys.capacity(c)+CapacityDemandSuffix+WindowSep+ms).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(w) == 0 {
			continue
		}
		checked++
		num := func(m map[string]string, f string) int64 {
			n, _ := strconv.ParseInt(m[f], 10, 64)
			return n
		}
		var q, qf, wq int64
		for f := range w {
			tenant, ok := strings.CutPrefix(f, "t:")
			if !ok {
				continue
			}
			share := rules.Share(tenant)
			floor := share.FloorIn(c)
			d := num(w, "q:"+tenant)
			q += d
			qf += min(d, floor)
			if d > 0 && floor == 0 {
				wq += share.Weight
			}
		}
		var hd, hw int64
		for f := range h {
			switch {
			case f == "fm":
			case strings.HasPrefix(f, "w"):
				hw += num(h, f)
			case c.Measure == Events:
				// Packed: W * 2^32 + D, |D| < 2^31.
				v := num(h, f)
				w := (v + 1<<31) >> 32
				hw, hd = hw+w, hd+v-w<<32
			default:
				hd += num(h, f)
			}
		}
		if hd+num(h, "fm") != q || num(h, "fm") != qf || hw != wq {
			t.Errorf("second %d: the demand histogram holds demands %d, fm %d, weights %d; the tenants ask %d (%d under their floors), weights %d without a floor",
				sec, hd, num(h, "fm"), hw, q, qf, wq)
		}
	}
	return checked
}
