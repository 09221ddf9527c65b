package limit

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// segRecorded returns what acme's home window (of its one rule) records as reserved at each due time t0+at (85_late.lua,
// Segments): events (s0), then bytes (s1).
func segRecorded(t *testing.T, l *Limiter, rdb redis.UniversalClient, ats ...time.Duration) (evs, bytes []int64) {
	t.Helper()
	ctx := context.Background()
	home := l.Rules().For("acme")[0] // (one rule: its home)
	for _, at := range ats {
		due := t0.Add(at)
		key := l.keys.window("acme", home, alignedStart(home, due, l.opts.Location))
		f := strconv.FormatInt(due.UnixMilli(), 10)
		v, err := rdb.HMGet(ctx, key, "s0:"+f, "s1:"+f).Result()
		if err != nil {
			t.Fatalf("HMGET %s: %v", key, err)
		}
		n := make([]int64, 2)
		for i, x := range v {
			if x != nil {
				n[i], _ = strconv.ParseInt(x.(string), 10, 64)
			}
		}
		evs, bytes = append(evs, n[0]), append(bytes, n[1])
	}
	return evs, bytes
}

// Under rules that do not nest with the capacity's (4s beside 6s), or an
// events capacity of shorter windows than acme's rule of bytes (10s beside
// 1m), each reservation records what it holds at its due time in acme's
// home window, in each measure that a rule counts (the events, and the
// bytes where a rule counts them). A reservation that leaves its slot
// before it starts takes its cost off: given back (Release) or moved into
// idle capacity (Advance).
func TestSegmentRecordFollowsReservations(t *testing.T) {
	for _, tc := range []struct {
		capacity, limits string
		w                time.Duration
	}{
		{"4/4s", "acme=100/6s", 4 * time.Second},
		{"4/10s", "acme=10000B/1m", 10 * time.Second},
	} {
		t.Run(tc.capacity+" "+tc.limits, func(t *testing.T) {
			ctx := context.Background()
			rdb := privateRedis(t)
			w := tc.w
			l, clk, _, _, ds := capBacklog(t, rdb, false, tc.capacity, tc.limits, w)
			byBytes := int64(0)
			if strings.Contains(tc.limits, "B/") {
				byBytes = 100
			}
			ats := []time.Duration{w, 2 * w, 3 * w, 4 * w, 5 * w, 6 * w}
			want := []int64{2, 2, 2, 2, 2, 1}
			check := func(what string) {
				t.Helper()
				evs, bytes := segRecorded(t, l, rdb, ats...)
				wantBytes := make([]int64, len(want))
				for i, n := range want {
					wantBytes[i] = n * byBytes
				}
				if !slices.Equal(evs, want) || !slices.Equal(bytes, wantBytes) {
					t.Errorf("%s: recorded at t0+w..6w: events %v, bytes %v; want %v and %v", what, evs, bytes, want, wantBytes)
				}
			}
			check("reserved")
			// At t0+3.5w the slots of t0+3w are given back.
			clk.Set(t0.Add(3*w + w/2))
			var slots []MissedSlot
			for i, d := range ds {
				if d.Kind == Defer && d.Due.Equal(t0.Add(3*w)) {
					slots = append(slots, MissedSlot{Tenant: "acme", Due: d.Due, Trip: strconv.Itoa(i), Cost: Cost{Bytes: 100}})
				}
			}
			if n, err := l.Release(ctx, slots); err != nil || n != 2 {
				t.Fatalf("release: %d, %v; want 2", n, err)
			}
			want[2] = 0
			check("after the release of t0+3w")
			// At t0+4w+7w/8 the events due at t0+5w on move into the idle
			// capacity of the current window.
			clk.Set(t0.Add(4*w + 7*w/8))
			waiting, moved := advanceBacklog(t, l, ds, t0.Add(4*w))
			n := 0
			for i, m := range moved {
				if m {
					want[waiting[i].Due.Sub(t0)/w-1]--
					n++
				}
			}
			if n == 0 {
				t.Fatalf("advance moved none of %d, want some", len(waiting))
			}
			check(fmt.Sprintf("after %d moves", n))
		})
	}
}

// The worst case of a take by segments (85_late.lua, Segments): rules whose
// windows do not nest (1/2s beside 1/3s), every window ahead full, each
// segment (the time between two bounds of either rule) holding one
// reservation that a late event took already. The take scan reads the home
// window's record of each segment and the record of takes, and stops at
// its bound of windows; the call's work stays bounded and nothing is
// counted or taken.
func TestBoundedLateTakeBySegments(t *testing.T) {
	ctx := context.Background()
	rdb := privateRedis(t)
	m := newWorkMeter(t, rdb)
	l := newTestLimiter(t, rdb, "*=1/2s,1/3s", Options{Clock: func() time.Time { return t0 }})
	rs := l.Rules().For("hot")
	const ahead = 4000 // seconds
	p := rdb.Pipeline()
	taken := l.keys.taken("hot")
	for sec := 0; sec <= ahead; sec++ {
		s := t0.Add(time.Duration(sec) * time.Second)
		f := strconv.FormatInt(s.UnixMilli(), 10)
		for i, r := range rs {
			w := time.Duration(2+i) * time.Second
			if sec%(2+i) != 0 {
				continue
			}
			key := l.keys.window("hot", r, s)
			p.HSet(ctx, key, "count", 1, "expire", s.Add(w).UnixMilli())
			p.PExpire(ctx, key, time.Hour)
		}
		if sec%2 == 0 || sec%3 == 0 { // a segment's start: recorded in the 2s window
			home := l.keys.window("hot", rs[0], t0.Add(time.Duration(sec-sec%2)*time.Second))
			p.HSet(ctx, home, "s0:"+f, 1)
			p.HSet(ctx, taken, f, 1, f+"/m", 3, f+"/0", 1)
		}
	}
	p.PExpire(ctx, taken, time.Hour)
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	before, err := rdb.HGetAll(ctx, taken).Result()
	if err != nil {
		t.Fatal(err)
	}
	m.reset()
	hmget0 := m.calls("hmget")
	ds, err := l.AdmitLate(ctx, Source{Topic: "events.retry"}, hotEvents(0), true)
	if err != nil {
		t.Fatal(err)
	}
	// Window reads (its bound and the current windows), and two HMGETs a
	// segment at most, each segment starting a window of one rule.
	m.check("500 late events, every segment ahead taken", 1, 3*int64(DefaultMaxScan)+4)
	t.Logf("HMGETs: %d", m.calls("hmget")-hmget0)
	for i, d := range ds {
		if d.Kind != Defer || d.Took || !d.Due.After(t0) {
			t.Fatalf("event %d: got %+v, want deferred, no slot taken", i, d)
		}
	}
	after, err := rdb.HGetAll(ctx, taken).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("record of takes: %d fields, want %d (unchanged)", len(after), len(before))
	}
	for f, v := range before {
		if after[f] != v {
			t.Fatalf("record of takes, field %s: %q, want %q (unchanged)", f, after[f], v)
		}
	}
}

// Many tenants of one call taking by segments under a capacity whose windows
// do not nest with theirs (10/2s beside 100/15s), every capacity window of
// the next 236 seconds full: the capacity windows one tenant read cost the
// tenants after it nothing (the call has their shared fields; a full one
// needs no tenant's fields), so each home window's read at a segment costs
// the budget one, and the call's work stays bounded, with or without a
// record in every segment (one reservation of each tenant, taken already).
// Found by a review of 86fdb26: uncharged, 500 tenants made 6,130 reads
// (75 ms of Redis CPU) with records, 3,658 without.
func TestBoundedLateTakeBySegmentsManyTenants(t *testing.T) {
	for _, records := range []bool{false, true} {
		t.Run(fmt.Sprintf("records=%v", records), func(t *testing.T) {
			ctx := context.Background()
			rdb := privateRedis(t)
			m := newWorkMeter(t, rdb)
			c, err := ParseCapacity("10/2s")
			if err != nil {
				t.Fatal(err)
			}
			l := newTestLimiter(t, rdb, "*=100/15s", Options{Clock: func() time.Time { return t0 }, Capacity: c})
			const tenants, ahead = 500, 236 // seconds of full capacity windows
			p := rdb.Pipeline()
			for i := 0; i < ahead; i += 2 {
				s := t0.Add(time.Duration(i) * time.Second)
				key := l.keys.capacity(c[0]) + WindowSep + strconv.FormatInt(s.UnixMilli(), 10)
				p.HSet(ctx, key, "count", c[0].Limit, "expire", s.Add(2*time.Second).UnixMilli())
				p.PExpire(ctx, key, 2*time.Hour)
			}
			for ti := 0; records && ti < tenants; ti++ {
				tn := fmt.Sprintf("t%03d", ti)
				home := l.Rules().For(tn)[0]
				for i := 0; i < ahead; i++ {
					if i%2 != 0 && i%15 != 0 {
						continue // not a segment's start
					}
					s := t0.Add(time.Duration(i) * time.Second)
					f := strconv.FormatInt(s.UnixMilli(), 10)
					key := l.keys.window(tn, home, alignedStart(home, s, l.opts.Location))
					p.HSet(ctx, key, "s0:"+f, 1)
					p.PExpire(ctx, key, 2*time.Hour)
					p.HSet(ctx, l.keys.taken(tn), f, 1, f+"/m", 3, f+"/0", 1)
				}
				p.PExpire(ctx, l.keys.taken(tn), 2*time.Hour)
			}
			if _, err := p.Exec(ctx); err != nil {
				t.Fatal(err)
			}
			var evs []Event
			for ti := range tenants {
				evs = append(evs, Event{Tenant: fmt.Sprintf("t%03d", ti), Offset: int64(ti)})
			}
			m.reset()
			ds, err := l.AdmitLate(ctx, Source{Topic: "events.retry"}, evs, true)
			if err != nil {
				t.Fatal(err)
			}
			m.check(fmt.Sprintf("%d tenants' late events, every capacity window ahead full (records %v)", tenants, records), 1, 3*int64(DefaultMaxScan)+4)
			for i, d := range ds {
				if d.Took || d.Kind == Admit {
					t.Fatalf("event %d: got %+v, want no slot taken (all taken already) nor admitted", i, d)
				}
			}
		})
	}
}
