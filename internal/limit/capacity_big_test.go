package limit

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"
)

// bigReads bounds the window reads (HMGET) of a call that holds big's
// event: its search reads at most the 121 capacity windows of the horizon,
// with the spacing's 15 before (BIGK, 35_capacity.lua), its own rule's
// three, and the current window's shared reads; measured at most 63 (47
// before the spacing and the room left for big events), far under the
// call's budget (DefaultMaxScan).
const bigReads = 200

// bigBeside runs, under CAPACITY=1000B/1s and a horizon of 2 minutes,
// floods tenants that send 10-byte events at twice the capacity between
// them (ten calls a second), and a tenant "big" that sends one event of
// size bytes a second, in the middle of it, for secs seconds. It returns
// how many of big's events were placed (admitted or deferred with a slot)
// and rejected, and the bytes a second big booked in those seconds; it
// checks on the way that no slot is early, that no window passes the
// capacity, that big's placed events are all booked, and, on a private
// Redis, the window reads of the calls with big's event and the slowest
// call (SLOWLOG).
func bigBeside(t *testing.T, floods, size, secs int) (placed, rejected int, perSec int64) {
	t.Helper()
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, _ := ParseCapacity("1000B/1s")
	rdb := privateRedis(t)
	m := newWorkMeter(t, rdb)
	l := newTestLimiter(t, rdb, "*=10000000/1m", Options{Clock: clk.Now, Capacity: c, Horizon: 2 * time.Minute})
	var slow time.Duration
	var reads int64 // the most window reads of a call with big's event
	ctx := context.Background()
	start := clk.Now()
	per := 200 / floods / 20 // each flood's events a call
	if per < 1 {
		per = 1
	}
	for sec := 0; sec < secs; sec++ {
		for k := 0; k < 20; k++ {
			clk.Set(start.Add(time.Duration(sec)*time.Second + time.Duration(k)*50*time.Millisecond))
			var tenants []string
			var costs []Cost
			for f := 0; f < floods; f++ {
				tenants, costs = sized(fmt.Sprintf("f%02d", f), per, 10, tenants, costs)
			}
			if k == 10 {
				tenants, costs = sized("big", 1, int64(size), tenants, costs)
			}
			if k == 10 {
				slow = max(slow, m.slowest()) // the calls since the last reset
				m.reset()
			}
			ds, err := l.AdmitCosts(ctx, tenants, costs)
			if err != nil {
				t.Fatal(err)
			}
			if k == 10 {
				reads = max(reads, m.calls("hmget"))
			}
			for i, d := range ds {
				if d.Kind == Defer && d.Due.Before(clk.Now().Truncate(time.Second)) {
					t.Fatalf("second %d: event %d of %s deferred to %v, before its window", sec, i, tenants[i], d.Due)
				}
				if tenants[i] != "big" {
					continue
				}
				switch d.Kind {
				case Admit, Defer:
					placed++
				case Reject:
					rejected++
				default:
					t.Fatalf("second %d: big's event: %+v", sec, d)
				}
			}
		}
	}
	slow = max(slow, m.slowest())
	t.Logf("a call with big's event: at most %d window reads; the slowest call %v", reads, slow)
	if slow > slowCeiling {
		t.Errorf("slowest script call %v, want at most %v", slow, slowCeiling)
	}
	if reads > bigReads {
		t.Errorf("a call with big's event read %d windows, want at most %d", reads, bigReads)
	}
	var booked, inRun, floodRun int64
	for sec := 0; sec < secs+125; sec++ {
		count, _, got := capWindow(t, l, c[0], start.Add(time.Duration(sec)*time.Second))
		if count > c[0].Limit {
			t.Errorf("second %d: %d bytes booked, over the capacity %d", sec, count, c[0].Limit)
		}
		booked += got["big"]
		if sec < secs {
			inRun += got["big"]
			floodRun += count - got["big"]
		}
	}
	t.Logf("in the %d seconds: big booked %d bytes a second, the floods %d", secs, inRun/int64(secs), floodRun/int64(secs))
	if booked != int64(placed*size) {
		t.Errorf("big booked %d bytes in the windows, placed %d events of %d", booked, placed, size)
	}
	return placed, rejected, inRun / int64(secs)
}

// TestCapacityBigEventsPlaced: an event larger than half a tenant's share
// (the most a flooding tenant may reserve in a future window) is placed
// beside tenants that flood the capacity with small events, one every k
// windows, k = ceil(its cost / its share): the big tenant books its share
// at the grain of its events, size / k bytes a second (80% to 110% of
// it, the first windows being the floods' reservations), beside one flood
// or ten. (Before, the floods' reservations left 1000 - 250 bytes in
// every window up to the horizon, and the current window's room went to
// the floods first: beside one flood, events of 800 or 900 bytes were
// placed 20 and 19 times of 90, 115 and 120 bytes a second for a share of
// 500; beside ten floods, where the share is 91, big events took one a
// window wherever there was room, 171 to 200 bytes a second.)
func TestCapacityBigEventsPlaced(t *testing.T) {
	const secs = 90
	for _, tc := range []struct{ floods, size int }{{1, 700}, {1, 800}, {1, 900}, {10, 700}, {10, 900}} {
		placed, rejected, got := bigBeside(t, tc.floods, tc.size, secs)
		share := 1000 / float64(tc.floods+1)
		k := math.Ceil(float64(tc.size) / share)
		want := float64(tc.size) / k
		t.Logf("%d flood(s), big events of %d bytes: placed %d, rejected %d of %d; %d bytes a second, its share at the grain %.0f",
			tc.floods, tc.size, placed, rejected, secs, got, want)
		if float64(got) < 0.8*want || float64(got) > 1.1*want {
			t.Errorf("%d flood(s), events of %d bytes: big booked %d bytes a second, want %.0f (one event every %.0f windows) within -20%%/+10%%",
				tc.floods, tc.size, got, want, k)
		}
	}
}
