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

// windowState returns the count of tenant's window of rule (e.g. "2/1m")
// that starts at start, and the takes there: the tenant's record of takes
// at that due time (keys.taken) and the window's own field taken (where
// an earlier version recorded them).
func windowState(t *testing.T, rdb redis.UniversalClient, l *Limiter, tenant, rule string, start time.Time) (count, taken int64) {
	t.Helper()
	ctx := context.Background()
	r, err := parseRule(rule)
	if err != nil {
		t.Fatal(err)
	}
	v, err := rdb.HMGet(ctx, l.keys.window(tenant, r, start), "count", "taken").Result()
	if err != nil {
		t.Fatal(err)
	}
	rec, err := rdb.HMGet(ctx, l.keys.taken(tenant), strconv.FormatInt(start.UnixMilli(), 10)).Result()
	if err != nil {
		t.Fatal(err)
	}
	var legacy, recorded int64
	for i, p := range []*int64{&count, &legacy, &recorded} {
		x := append(v, rec...)[i]
		if s, ok := x.(string); ok {
			if *p, err = strconv.ParseInt(s, 10, 64); err != nil {
				t.Fatal(err)
			}
		}
	}
	return count, legacy + recorded
}

// dues writes the decisions as "kind@offset from t0" (a took slot marked
// "!"), e.g. "a d@1m0s d@1h0m0s!".
func dues(ds []Decision) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.Kind.String()[:1]
		if d.Kind == Defer {
			parts[i] += "@" + d.Due.Sub(t0).String()
			if d.Took {
				parts[i] += "!"
			}
		}
	}
	return strings.Join(parts, " ")
}

// A late event keeps its place when the coarser rule is the one that is
// full: its current hour is full, so the take scan walks the minutes left
// of it (empty) to the next hour, takes the slots there, skips the rest of
// that hour once its minutes read hold all it counts, and goes on in the
// hour after. The displaced events go to the first free slot.
func TestLateTakesPastFullHour(t *testing.T) {
	ctx := context.Background()
	rdb := privateRedis(t)
	m := newWorkMeter(t, rdb)
	clk := newFakeClock(t0)
	l := newTestLimiter(t, rdb, "acme=3/1m,6/1h", Options{Clock: clk.Now})
	evs := make([]Event, 20)
	for i := range evs {
		evs[i] = Event{Tenant: "acme", Offset: int64(i)}
	}
	ds, err := l.AdmitFrom(ctx, Source{Topic: "events"}, evs)
	if err != nil {
		t.Fatal(err)
	}
	want := "a a a d@1m0s d@1m0s d@1m0s d@1h0m0s d@1h0m0s d@1h0m0s d@1h1m0s d@1h1m0s d@1h1m0s " +
		"d@2h0m0s d@2h0m0s d@2h0m0s d@2h1m0s d@2h1m0s d@2h1m0s d@3h0m0s d@3h0m0s"
	if got := dues(ds); got != want {
		t.Fatalf("source batch:\n got %s\nwant %s", got, want)
	}

	clk.Set(t0.Add(time.Minute + 10*time.Second))
	late := make([]Event, 7)
	for i := range late {
		late[i] = Event{Tenant: "acme", Offset: int64(100 + i)}
	}
	m.reset()
	ds, err = l.AdmitLate(ctx, Source{Topic: "events.retry"}, late, true)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(ds), "d@1h0m0s! d@1h0m0s! d@1h0m0s! d@1h1m0s! d@1h1m0s! d@1h1m0s! d@2h0m0s!"; got != want {
		t.Fatalf("late events:\n got %s\nwant %s", got, want)
	}
	// The current minute and hour (admission), 58 minutes left of the
	// current hour, 2 windows at t0+1h, 1 at t0+1h1m, 2 at t0+2h: 65 (123
	// without the skip of the rest of the hour t0+1h).
	m.check("7 late events past a full hour", 1, 65)

	// At t0+1h the three events reserved there come back: all three slots
	// were taken. They go to the first free slot: t0+3h (1 left there),
	// then t0+3h1m.
	clk.Set(t0.Add(time.Hour + 2*time.Second))
	claims := []Event{{Tenant: "acme", Offset: 200, InSlot: true}, {Tenant: "acme", Offset: 201, InSlot: true},
		{Tenant: "acme", Offset: 202, InSlot: true}}
	ds, err = l.AdmitLate(ctx, Source{Topic: "events.retry"}, claims, true)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(ds), "d@3h0m0s d@3h1m0s d@3h1m0s"; got != want {
		t.Fatalf("claims of t0+1h: got %s, want %s", got, want)
	}
	for _, w := range []struct {
		rule         string
		at           time.Duration
		count, taken int64
	}{
		{"3/1m", time.Hour, 3, 0}, {"3/1m", time.Hour + time.Minute, 3, 3}, {"3/1m", 2 * time.Hour, 3, 1},
		{"3/1m", 3 * time.Hour, 3, 0}, {"3/1m", 3*time.Hour + time.Minute, 2, 0},
		// (Takes are recorded by due time: the hour's start is the minute's.)
		{"6/1h", time.Hour, 6, 0}, {"6/1h", 2 * time.Hour, 6, 1}, {"6/1h", 3 * time.Hour, 5, 0},
	} {
		if c, tk := windowState(t, rdb, l, "acme", w.rule, t0.Add(w.at)); c != w.count || tk != w.taken {
			t.Errorf("%s window t0+%s: count %d taken %d, want %d and %d", w.rule, w.at, c, tk, w.count, w.taken)
		}
	}
}

// Hours inside days (windows of explicit boundaries, "e") nest: a late
// event takes the next hour's slot although the day is full.
func TestLateTakesHourInDay(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis(t)
	clk := newFakeClock(t0) // 10:00 on a Monday
	l := newTestLimiter(t, rdb, "acme=1/1h,3/1d", Options{Clock: clk.Now})
	evs := make([]Event, 5)
	for i := range evs {
		evs[i] = Event{Tenant: "acme", Offset: int64(i)}
	}
	ds, err := l.AdmitFrom(ctx, Source{Topic: "events"}, evs)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(ds), "a d@1h0m0s d@2h0m0s d@14h0m0s d@15h0m0s"; got != want {
		t.Fatalf("source batch: got %s, want %s", got, want)
	}
	clk.Set(t0.Add(time.Hour + 30*time.Minute))
	ds, err = l.AdmitLate(ctx, Source{Topic: "events.retry"}, []Event{{Tenant: "acme", Offset: 100}}, true)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(ds), "d@2h0m0s!"; got != want {
		t.Fatalf("late event: got %s, want %s", got, want)
	}
}

// Rules whose windows do not nest (10s and 15s: a 10s window may hold slots
// of two 15s windows) take the slot of a reservation at its due time, the
// time between two bounds of either rule (85_late.lua, Segments; before,
// they took none). acme's ten events at t0: two admitted, then reserved at
// t0+10s, 15s, 20s (two), 30s (two), 40s and 45s. At t0+12s neither window
// has room: the late event takes the slot of t0+15s (until t0+20s, the end
// of the 10s window), and the reservation's event, back in its slot, finds
// it taken and is placed again; no window counts more than its limit or
// other than what was reserved in it.
func TestLateRulesNotNested(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis(t)
	clk := newFakeClock(t0)
	l := newTestLimiter(t, rdb, "acme=2/10s,3/15s", Options{Clock: clk.Now})
	evs := make([]Event, 10)
	for i := range evs {
		evs[i] = Event{Tenant: "acme", Offset: int64(i)}
	}
	ds, err := l.AdmitFrom(ctx, Source{Topic: "events"}, evs)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(ds), "a a d@10s d@15s d@20s d@20s d@30s d@30s d@40s d@45s"; got != want {
		t.Fatalf("source batch: got %s, want %s", got, want)
	}
	counts := func() []int64 {
		t.Helper()
		var out []int64
		for _, w := range []struct {
			r  int
			at time.Duration
		}{{0, 10 * time.Second}, {0, 20 * time.Second}, {1, 15 * time.Second}} {
			r := l.Rules().For("acme")[w.r]
			n, err := rdb.HGet(ctx, l.keys.window("acme", r, t0.Add(w.at)), "count").Int64()
			if err != nil && err != redis.Nil {
				t.Fatal(err)
			}
			out = append(out, n)
		}
		return out
	}
	before := counts() // 10s windows at t0+10s and 20s, 15s window at t0+15s
	if want := []int64{2, 2, 3}; !slices.Equal(before, want) {
		t.Fatalf("window counts: %v, want %v", before, want)
	}
	clk.Set(t0.Add(12 * time.Second))
	retry := Source{Topic: "events.retry"}
	late := []Event{{Tenant: "acme", Offset: 100}}
	ds, err = l.AdmitLate(ctx, retry, late, true)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(ds), "d@15s!"; got != want {
		t.Fatalf("late event: got %s, want %s", got, want)
	}
	if got, want := ds[0].Until, t0.Add(20*time.Second); !got.Equal(want) {
		t.Errorf("late event's slot ends at t0+%s, want t0+20s", got.Sub(t0))
	}
	if tk := takenOf(t, rdb, l, "acme", 15*time.Second); tk != 1 {
		t.Errorf("record of takes at t0+15s: %d, want 1", tk)
	}
	replaysSame(t, l, retry, late, ds, "replayed late event")
	if got := counts(); !slices.Equal(got, before) {
		t.Errorf("window counts after the take: %v, want %v (unmoved)", got, before)
	}
	// Back in its slot at t0+15.5s, event 3 finds it taken: placed again,
	// after what acme reserved (t0+45s is the last), and the take is used up.
	clk.Set(t0.Add(15500 * time.Millisecond))
	claims := inSlot(t0.Add(15*time.Second), Event{Tenant: "acme", Offset: 3})
	ds, err = l.AdmitLate(ctx, retry, claims, true)
	if err != nil {
		t.Fatal(err)
	}
	if ds[0].Kind != Defer || ds[0].Took || ds[0].Due.Before(t0.Add(45*time.Second)) {
		t.Errorf("claim of t0+15s: got %s, want deferred after t0+45s", dues(ds))
	}
	if tk := takenOf(t, rdb, l, "acme", 15*time.Second); tk != 0 {
		t.Errorf("record of takes at t0+15s after the claim: %d, want 0", tk)
	}
	if got := counts(); !slices.Equal(got, before) {
		t.Errorf("window counts after the claim: %v, want %v (the late event forwarded in the claim's slot)", got, before)
	}
}

// countTaken counts the windows under the tenant key prefix that hold a
// field taken (single Redis: SCAN).
func countTaken(ctx context.Context, rdb redis.UniversalClient, prefix string) (int, error) {
	keys, err := rdb.Keys(ctx, prefix+"*").Result()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, k := range keys {
		if typ, _ := rdb.Type(ctx, k).Result(); typ != "hash" {
			continue
		}
		if ok, err := rdb.HExists(ctx, k, "taken").Result(); err != nil {
			return 0, fmt.Errorf("%s: %w", k, err)
		} else if ok {
			n++
		}
	}
	return n, nil
}

// The worst case of a take with several rules (G11): late events of a
// tenant of 1/1s and 60/1m whose windows are full far ahead, every slot in
// them taken already, its current minute full too. The take scan walks
// second windows (a full minute ahead is skipped only once its seconds
// read hold all it counts): it reads at most take_reads windows, then the
// search goes on within the budget. The call's work stays bounded by the
// budget, nothing is counted or taken, and no call is slow.
func TestBoundedLateTakeRules(t *testing.T) {
	ctx := context.Background()
	rdb := privateRedis(t)
	m := newWorkMeter(t, rdb)
	l := newTestLimiter(t, rdb, "*=1/1s,60/1m", Options{Clock: func() time.Time { return t0.Add(30 * time.Second) }})
	sec, err := parseRule("1/1s")
	if err != nil {
		t.Fatal(err)
	}
	minute, err := parseRule("60/1m")
	if err != nil {
		t.Fatal(err)
	}
	const ahead = 3000 // seconds, every slot taken: past the take scan's reach
	p := rdb.Pipeline()
	for i := range ahead + 1 {
		s := t0.Add(time.Duration(i) * time.Second)
		key := l.keys.window("hot", sec, s)
		p.HSet(ctx, key, "count", 1, "taken", 1, "expire", s.Add(time.Second).UnixMilli())
		p.PExpire(ctx, key, 2*time.Hour)
	}
	for i := range 25 * 60 { // minutes, full: past the budget's reach
		s := t0.Add(time.Duration(i) * time.Minute)
		key := l.keys.window("hot", minute, s)
		p.HSet(ctx, key, "count", 60, "expire", s.Add(time.Minute).UnixMilli())
		p.PExpire(ctx, key, 26*time.Hour)
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	ds := lateHotBatch(t, l, m, "500 late events, 1/1s and 60/1m, every slot ahead taken", int64(DefaultMaxScan)+2)
	for i, d := range ds {
		if d.Kind != Defer || d.Took || !d.Due.Equal(d.Until) {
			t.Fatalf("event %d: got %+v, want deferred unreserved to where the search stopped", i, d)
		}
	}
	for i := range ahead + 1 {
		s := t0.Add(time.Duration(i) * time.Second)
		v, err := rdb.HMGet(ctx, l.keys.window("hot", sec, s), "count", "taken").Result()
		if err != nil {
			t.Fatal(err)
		}
		if v[0] != "1" || v[1] != "1" {
			t.Fatalf("second t0+%ds: count %v taken %v, want 1 and 1", i, v[0], v[1])
		}
	}
}

func TestLateRuleChangeRedis(t *testing.T)        { testLateRuleChange(t, testRedis(t)) }
func TestLateRuleChangeRedisCluster(t *testing.T) { testLateRuleChange(t, testCluster(t)) }

// A change of the tenant's rules between a take and its claims: the take
// is recorded by the slot's due time in a record of the tenant's own, not
// in a window of its rules, so the claims find it under any rules (here a
// finer rule was added, so the window that holds now is a second's; or the
// rules no longer qualify: a byte rule). One claim is placed again, the
// other keeps its slot: the minute window forwards no more than it counted.
func testLateRuleChange(t *testing.T, rdb redis.UniversalClient) {
	for _, after := range []string{"acme=2/1m,1/1s", "acme=2/1m,1KiB/1m"} {
		t.Run(after, func(t *testing.T) {
			ctx := context.Background()
			clk := newFakeClock(t0)
			l := newTestLimiter(t, rdb, "acme=2/1m", Options{Clock: clk.Now})
			evs := make([]Event, 8)
			for i := range evs {
				evs[i] = Event{Tenant: "acme", Offset: int64(i)}
			}
			if _, err := l.AdmitFrom(ctx, Source{Topic: "events"}, evs); err != nil {
				t.Fatal(err)
			}
			clk.Set(t0.Add(time.Minute + 30*time.Second))
			retry := Source{Topic: "events.retry"}
			ds, err := l.AdmitLate(ctx, retry, []Event{{Tenant: "acme", Offset: 100}}, true)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := dues(ds), "d@2m0s!"; got != want {
				t.Fatalf("late event: got %s, want %s", got, want)
			}
			if err := l.SetRules(mustRules(t, after)); err != nil {
				t.Fatal(err)
			}
			clk.Set(t0.Add(2*time.Minute + 5*time.Second))
			slot := t0.Add(2 * time.Minute)
			claims := []Event{{Tenant: "acme", Offset: 101, InSlot: true, Due: slot, Cost: Cost{Bytes: 10}},
				{Tenant: "acme", Offset: 102, InSlot: true, Due: slot, Cost: Cost{Bytes: 10}}}
			ds, err = l.AdmitLate(ctx, retry, claims, true)
			if err != nil {
				t.Fatal(err)
			}
			if ds[0].Kind != Keep || ds[1].Kind != Defer || ds[1].Took {
				t.Fatalf("claims of t0+2m: got %s, want keep, then a deferral (its slot was taken)", dues(ds))
			}
			again, err := l.AdmitLate(ctx, retry, claims, true)
			if err != nil {
				t.Fatal(err)
			}
			if dues(again) != dues(ds) {
				t.Errorf("replayed claims: got %s, want %s", dues(again), dues(ds))
			}
			if _, tk := windowState(t, rdb, l, "acme", "2/1m", slot); tk != 0 {
				t.Errorf("takes at t0+2m after the claims: %d, want 0", tk)
			}
		})
	}
}

// A tenant with one rule of ttl windows keeps its place too: a slot is a
// window of its chain (anchored at its first event), and a claim reads the
// takes of its own due time, the start of its chain's window.
func TestLateKeepsPlaceTTL(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis(t)
	start := t0.Add(7 * time.Second) // the chain starts here, off every minute
	clk := newFakeClock(start)
	l := newTestLimiter(t, rdb, "acme=2/1m", Options{Clock: clk.Now, WindowKind: TTL})
	evs := make([]Event, 8)
	for i := range evs {
		evs[i] = Event{Tenant: "acme", Offset: int64(i)}
	}
	ds, err := l.AdmitFrom(ctx, Source{Topic: "events"}, evs)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(ds), "a a d@1m7s d@1m7s d@2m7s d@2m7s d@3m7s d@3m7s"; got != want {
		t.Fatalf("source batch: got %s, want %s", got, want)
	}
	clk.Set(start.Add(time.Minute + 30*time.Second))
	retry := Source{Topic: "events.retry"}
	late := []Event{{Tenant: "acme", Offset: 100}}
	ds, err = l.AdmitLate(ctx, retry, late, true)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(ds), "d@2m7s!"; got != want || !ds[0].Until.Equal(start.Add(3*time.Minute)) {
		t.Fatalf("late event: got %s until %s, want %s until t0+3m7s", got, ds[0].Until.Sub(t0), want)
	}
	again, err := l.AdmitLate(ctx, retry, late, true)
	if err != nil {
		t.Fatal(err)
	}
	if again[0] != ds[0] {
		t.Errorf("replayed late event: got %+v, want %+v", again[0], ds[0])
	}
	clk.Set(start.Add(2*time.Minute + 5*time.Second))
	slot := start.Add(2 * time.Minute)
	claims := []Event{{Tenant: "acme", Offset: 101, InSlot: true, Due: slot}, {Tenant: "acme", Offset: 102, InSlot: true, Due: slot}}
	ds, err = l.AdmitLate(ctx, retry, claims, true)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(ds), "k d@4m7s"; got != want {
		t.Fatalf("claims of t0+2m7s: got %s, want %s (keep, then the first free slot)", got, want)
	}
	for i, want := range []int64{2, 2, 2, 2, 1} {
		at := start.Add(time.Duration(i) * time.Minute)
		if c, tk := windowState(t, rdb, l, "acme", "2/1m", at); c != want || tk != 0 {
			t.Errorf("chain window %s: count %d taken %d, want %d and 0", at.Sub(t0), c, tk, want)
		}
	}
}

// The worst case of claims (G11): a batch of claims of one tenant, each
// with a due time of its own (gk-due is written by whoever writes the retry
// tier, unless RETRY_SECRET is set), every one of them recorded as taken.
// The claims read the record once (one HMGET of the batch's due times),
// all are placed again within the budget, and no call is slow.
func TestBoundedLateClaims(t *testing.T) {
	ctx := context.Background()
	rdb := privateRedis(t)
	m := newWorkMeter(t, rdb)
	l := newTestLimiter(t, rdb, "*=1/1s", Options{Clock: func() time.Time { return t0 }})
	evs := make([]Event, boundedBatch)
	fields := make([]any, 0, 2*boundedBatch)
	for i := range evs {
		due := t0.Add(-time.Duration(i) * time.Millisecond)
		evs[i] = Event{Tenant: "hot", Offset: int64(i), InSlot: true, Due: due}
		fields = append(fields, strconv.FormatInt(due.UnixMilli(), 10), 1)
	}
	if err := rdb.HSet(ctx, l.keys.taken("hot"), fields...).Err(); err != nil {
		t.Fatal(err)
	}
	m.reset()
	ds, err := l.AdmitLate(ctx, Source{Topic: "events.retry"}, evs, true)
	if err != nil {
		t.Fatal(err)
	}
	// The record, the current window, and the search's budget. Each claim
	// is placed in a window of its own, which the call reads, opens and
	// gives its end: 40 to 52 ms of Redis CPU measured on an idle machine,
	// at cpuCeiling's edge, so it has a ceiling of its own.
	m.checkCPU("500 claims of 500 due times, every one taken", 1, int64(DefaultMaxScan)+2, 2*cpuCeiling)
	for i, d := range ds {
		if d.Kind == Keep {
			t.Fatalf("claim %d: kept, want placed again (its slot was taken)", i)
		}
	}
	left, err := rdb.HVals(ctx, l.keys.taken("hot")).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range left {
		if v != "0" {
			t.Fatalf("record of takes after the claims: a field holds %s, want every one used up (0)", v)
		}
	}
}
