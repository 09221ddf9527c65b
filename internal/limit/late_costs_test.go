package limit

import (
	"context"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// costEvents returns events of tenant, one per cost in bytes (and as
// many units), at offsets from off on.
func costEvents(tenant string, off int64, costs ...int64) []Event {
	evs := make([]Event, len(costs))
	for i, c := range costs {
		evs[i] = Event{Tenant: tenant, Offset: off + int64(i), Cost: Cost{Bytes: c, Units: c}}
	}
	return evs
}

// replaysSame checks that AdmitLate of evs again (a replay of the call
// that decided ds) decides the same.
func replaysSame(t *testing.T, l *Limiter, src Source, evs []Event, ds []Decision, what string) {
	t.Helper()
	again, err := l.AdmitLate(context.Background(), src, evs, true)
	if err != nil {
		t.Fatal(err)
	}
	if dues(again) != dues(ds) {
		t.Errorf("%s: got %s, want %s", what, dues(again), dues(ds))
	}
}

// bytesState returns the count of tenant's window of the byte rule at
// start, and the bytes late events took there (its record of takes).
func bytesState(t *testing.T, rdb redis.UniversalClient, l *Limiter, tenant, rule string, start time.Time) (count, taken int64) {
	t.Helper()
	return costState(t, rdb, l, tenant, rule, "1", start)
}

// costState returns the count of tenant's window of the rule at start,
// and what late events took there, in the measure mark ("1" bytes, "2"
// units) of its record of takes.
func costState(t *testing.T, rdb redis.UniversalClient, l *Limiter, tenant, rule, mark string, start time.Time) (count, taken int64) {
	t.Helper()
	ctx := context.Background()
	r, err := parseRule(rule)
	if err != nil {
		t.Fatal(err)
	}
	c, err := rdb.HGet(ctx, l.keys.window(tenant, r, start), "count").Int64()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	f := strconv.FormatInt(start.UnixMilli(), 10)
	v, err := rdb.HMGet(ctx, l.keys.taken(tenant), f, f+"/m").Result()
	if err != nil {
		t.Fatal(err)
	}
	if v[0] == nil {
		return c, 0
	}
	// A take of bytes is marked 1 (events: 0 or no mark), so that a
	// replica that reads every take as one of events gives up a claim for
	// each byte: more than needed, never too few.
	if m, _ := v[1].(string); m != mark {
		t.Errorf("record of takes, %s/m: %v, want %s", f, v[1], mark)
	}
	tk, err := strconv.ParseInt(v[0].(string), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return c, tk
}

func TestLateKeepsPlaceBytesRedis(t *testing.T)        { testLateKeepsPlaceBytes(t, testRedis(t)) }
func TestLateKeepsPlaceBytesRedisCluster(t *testing.T) { testLateKeepsPlaceBytes(t, testCluster(t)) }

// A tenant whose rules count bytes keeps its place too: a late event takes
// as many bytes of the reservations of the earliest full window ahead as
// it costs, and the claims of that window give up their slots, the last
// first, until they have given up at least as many bytes: the window never
// forwards more bytes than it counted. With two byte rules that nest, a
// slot is a window of the finer one. The same with a rule of units.
func testLateKeepsPlaceBytes(t *testing.T, rdb redis.UniversalClient) {
	for _, spec := range []string{"acme=100B/1m", "acme=100B/1m,1000B/1h", "acme=100u/1m"} {
		t.Run(spec, func(t *testing.T) {
			rule, mark := "100B/1m", "1"
			if spec == "acme=100u/1m" {
				rule, mark = "100u/1m", "2"
			}
			ctx := context.Background()
			clk := newFakeClock(t0)
			l := newTestLimiter(t, rdb, spec, Options{Clock: clk.Now})
			// t0: 50 50; t0+1m: 60 40; t0+2m: 30 30 40; t0+3m: 50 50; t0+4m: 70.
			ds, err := l.AdmitFrom(ctx, Source{Topic: "events"}, costEvents("acme", 0, 50, 50, 60, 40, 30, 30, 40, 50, 50, 70))
			if err != nil {
				t.Fatal(err)
			}
			if got, want := dues(ds), "a a d@1m0s d@1m0s d@2m0s d@2m0s d@2m0s d@3m0s d@3m0s d@4m0s"; got != want {
				t.Fatalf("source batch: got %s, want %s", got, want)
			}
			window := func(at time.Duration) (int64, int64) {
				t.Helper()
				return costState(t, rdb, l, "acme", rule, mark, t0.Add(at))
			}

			// The event of 60 bytes due at t0+1m missed its slot: at
			// t0+2m30s the current window is full, and it takes 60 bytes of
			// the reservations of t0+3m, ahead of the 70 bytes due at t0+4m.
			clk.Set(t0.Add(2*time.Minute + 30*time.Second))
			retry := Source{Topic: "events.retry"}
			late := costEvents("acme", 100, 60)
			ds, err = l.AdmitLate(ctx, retry, late, true)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := dues(ds), "d@3m0s!"; got != want || !ds[0].Until.Equal(t0.Add(4*time.Minute)) {
				t.Fatalf("late event: got %s until %s, want %s until t0+4m", got, ds[0].Until.Sub(t0), want)
			}
			if c, tk := window(3 * time.Minute); c != 100 || tk != 60 {
				t.Errorf("window t0+3m: count %d, taken %d bytes, want 100 and 60", c, tk)
			}
			replaysSame(t, l, retry, late, ds, "replayed late event")
			if c, tk := window(3 * time.Minute); c != 100 || tk != 60 {
				t.Errorf("window t0+3m after the replay: count %d, taken %d bytes, want 100 and 60", c, tk)
			}
			// A second late event of 50 bytes finds 40 left at t0+3m, too
			// few, and goes on to t0+4m (70 of 100 counted there: no room
			// for it, 70 bytes to take).
			more := costEvents("acme", 110, 50)
			ds, err = l.AdmitLate(ctx, retry, more, true)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := dues(ds), "d@4m0s!"; got != want {
				t.Fatalf("second late event: got %s, want %s", got, want)
			}

			// At t0+3m the two claims of 50 bytes come back: the last gives
			// up 50 of the 60 taken, the first the other 10 (its slot cannot
			// hold it beside the 60): both are placed again, after t0+4m,
			// whose 70 bytes hold the second late event's 50 and so only 20
			// of the reservations'. Nothing forwarded at t0+3m but the late
			// event's 60 bytes.
			clk.Set(t0.Add(3*time.Minute + 5*time.Second))
			slot := t0.Add(3 * time.Minute)
			claims := []Event{{Tenant: "acme", Offset: 107, InSlot: true, Due: slot, Cost: Cost{Bytes: 50, Units: 50}},
				{Tenant: "acme", Offset: 108, InSlot: true, Due: slot, Cost: Cost{Bytes: 50, Units: 50}}}
			ds, err = l.AdmitLate(ctx, retry, claims, true)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := dues(ds), "d@5m0s d@5m0s"; got != want {
				t.Fatalf("claims of t0+3m: got %s, want %s", got, want)
			}
			if c, tk := window(3 * time.Minute); c != 100 || tk != 0 {
				t.Errorf("window t0+3m after the claims: count %d, taken %d bytes, want 100 and 0", c, tk)
			}
			if c, _ := window(5 * time.Minute); c != 100 {
				t.Errorf("window t0+5m: count %d, want 100 (the two placed again)", c)
			}
			replaysSame(t, l, retry, claims, ds, "replayed claims")

			// At t0+4m the claim of 70 bytes gives up its slot to the late
			// event of 50 (20 bytes of it stay unused: the window forwards
			// the 50 alone).
			clk.Set(t0.Add(4*time.Minute + 5*time.Second))
			claims = []Event{{Tenant: "acme", Offset: 109, InSlot: true, Due: t0.Add(4 * time.Minute), Cost: Cost{Bytes: 70, Units: 70}}}
			ds, err = l.AdmitLate(ctx, retry, claims, true)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := dues(ds), "d@6m0s"; got != want {
				t.Fatalf("claim of t0+4m: got %s, want %s", got, want)
			}
			if spec == "acme=100B/1m,1000B/1h" {
				// The hour counts every source event once (470 bytes) and each
				// claim placed again once more (170); the late events took
				// counted slots (their missed slots are given back by Release).
				if c, _ := bytesState(t, rdb, l, "acme", "1000B/1h", t0); c != 640 {
					t.Errorf("hour t0: count %d, want 640", c)
				}
			}
		})
	}
}

// A claim that keeps its slot and one after it that gives its slot up:
// the kept claim leaves the call, and the one placed again is placed at
// its own cost (the costs of the call's events follow them).
func TestLateBytesKeptClaimBeforeDisplaced(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis(t)
	clk := newFakeClock(t0)
	l := newTestLimiter(t, rdb, "acme=100B/1m", Options{Clock: clk.Now})
	// t0: 100; t0+1m: 100; t0+2m: 30 70; t0+3m: 100; t0+4m: 100.
	ds, err := l.AdmitFrom(ctx, Source{Topic: "events"}, costEvents("acme", 0, 100, 100, 30, 70, 100, 100))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(ds), "a d@1m0s d@2m0s d@2m0s d@3m0s d@4m0s"; got != want {
		t.Fatalf("source batch: got %s, want %s", got, want)
	}
	retry := Source{Topic: "events.retry"}
	clk.Set(t0.Add(time.Minute + 30*time.Second))
	ds, err = l.AdmitLate(ctx, retry, costEvents("acme", 100, 50), true)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(ds), "d@2m0s!"; got != want {
		t.Fatalf("late event: got %s, want %s", got, want)
	}
	// At t0+2m: a late event of 10 bytes, and the claims of 30 and 70
	// bytes. The 70 gives up its slot (50 taken), the 30 keeps its own; the
	// late event takes 10 bytes of t0+3m, and the 70 goes to t0+5m.
	clk.Set(t0.Add(2*time.Minute + 5*time.Second))
	slot := t0.Add(2 * time.Minute)
	evs := []Event{
		{Tenant: "acme", Offset: 110, Cost: Cost{Bytes: 10}},
		{Tenant: "acme", Offset: 102, InSlot: true, Due: slot, Cost: Cost{Bytes: 30}},
		{Tenant: "acme", Offset: 103, InSlot: true, Due: slot, Cost: Cost{Bytes: 70}},
	}
	ds, err = l.AdmitLate(ctx, retry, evs, true)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(ds), "d@3m0s! k d@5m0s"; got != want {
		t.Fatalf("batch at t0+2m: got %s, want %s", got, want)
	}
	if c, _ := bytesState(t, rdb, l, "acme", "100B/1m", t0.Add(5*time.Minute)); c != 70 {
		t.Errorf("window t0+5m: count %d, want 70 (the claim placed again, at its own cost)", c)
	}
}

// recordFields returns the fields of tenant's record of takes for the due
// time at, by suffix ("" for the pool, "/m" its mark, "/0" to "/2" the
// pools of each measure), 0 when absent.
func recordFields(t *testing.T, rdb redis.UniversalClient, l *Limiter, tenant string, at time.Time) map[string]int64 {
	t.Helper()
	f := strconv.FormatInt(at.UnixMilli(), 10)
	sfx := []string{"", "/m", "/0", "/1", "/2"}
	fields := make([]string, len(sfx))
	for i, x := range sfx {
		fields[i] = f + x
	}
	v, err := rdb.HMGet(context.Background(), l.keys.taken(tenant), fields...).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for i, x := range sfx {
		if s, ok := v[i].(string); ok {
			if out[x], err = strconv.ParseInt(s, 10, 64); err != nil {
				t.Fatal(err)
			}
		}
	}
	return out
}

func TestLateKeepsPlaceMixedRedis(t *testing.T)        { testLateKeepsPlaceMixed(t, testRedis(t)) }
func TestLateKeepsPlaceMixedRedisCluster(t *testing.T) { testLateKeepsPlaceMixed(t, testCluster(t)) }

// Rules of two measures whose windows are the same (2/1m and 100B/1m) keep
// a late event's place too: it takes a slot where both have room for it
// among the reservations, one event and its bytes, each recorded in a pool
// of its measure (marked 3, the pool the sum), and the claims give up
// slots, the last first, until both pools are spent: never more forwarded
// than counted, in events or bytes.
func testLateKeepsPlaceMixed(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	clk := newFakeClock(t0)
	l := newTestLimiter(t, rdb, "acme=2/1m,100B/1m", Options{Clock: clk.Now})
	// t0: 50 50; t0+1m: 30 30; t0+2m: 60 40; t0+3m: 10.
	ds, err := l.AdmitFrom(ctx, Source{Topic: "events"}, costEvents("acme", 0, 50, 50, 30, 30, 60, 40, 10))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(ds), "a a d@1m0s d@1m0s d@2m0s d@2m0s d@3m0s"; got != want {
		t.Fatalf("source batch: got %s, want %s", got, want)
	}
	retry := Source{Topic: "events.retry"}
	clk.Set(t0.Add(time.Minute + 30*time.Second))
	late := costEvents("acme", 100, 70)
	ds, err = l.AdmitLate(ctx, retry, late, true)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(ds), "d@2m0s!"; got != want {
		t.Fatalf("late event: got %s, want %s", got, want)
	}
	slot := t0.Add(2 * time.Minute)
	want := map[string]int64{"": 71, "/m": 3, "/0": 1, "/1": 70}
	if got := recordFields(t, rdb, l, "acme", slot); !maps.Equal(got, want) {
		t.Errorf("record of takes at t0+2m: got %v, want %v", got, want)
	}
	replaysSame(t, l, retry, late, ds, "replayed late event")
	// At t0+2m the claims of 60 and 40 bytes come back: the 40 gives up
	// the event and 40 of the 70 bytes, the 60 the other 30 bytes. Both are
	// placed again: the 60 beside the 10 of t0+3m, the 40 at t0+4m.
	clk.Set(t0.Add(2*time.Minute + 5*time.Second))
	claims := []Event{{Tenant: "acme", Offset: 104, InSlot: true, Due: slot, Cost: Cost{Bytes: 60}},
		{Tenant: "acme", Offset: 105, InSlot: true, Due: slot, Cost: Cost{Bytes: 40}}}
	ds, err = l.AdmitLate(ctx, retry, claims, true)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(ds), "d@3m0s d@4m0s"; got != want {
		t.Fatalf("claims of t0+2m: got %s, want %s", got, want)
	}
	want = map[string]int64{"": 0, "/m": 3, "/0": 0, "/1": 0}
	if got := recordFields(t, rdb, l, "acme", slot); !maps.Equal(got, want) {
		t.Errorf("record of takes at t0+2m after the claims: got %v, want %v", got, want)
	}
	replaysSame(t, l, retry, claims, ds, "replayed claims")
	if c, _ := bytesState(t, rdb, l, "acme", "100B/1m", t0.Add(3*time.Minute)); c != 70 {
		t.Errorf("bytes at t0+3m: %d, want 70", c)
	}
}

// Rules of two measures take slots when one measure has no rule of the
// finest windows too (2/10s with 100B/1m): each reservation adds what it
// costs in bytes to its 10s window's field r1 (the bytes reserved there,
// which no rule counts), and a late event takes a slot where its bytes fit
// what is reserved there, less what was taken. A missed slot given back
// takes its bytes off r1 too. (Before, such a tenant took no slot: a late
// event went behind everything the tenant had deferred.)
func TestLateMixedMeasuresTakeByReserved(t *testing.T) {
	for _, c := range []struct {
		name string
		rdb  func(*testing.T) redis.UniversalClient
	}{{"Redis", func(t *testing.T) redis.UniversalClient { return testRedis(t) }}, {"Cluster", func(t *testing.T) redis.UniversalClient { return testCluster(t) }}} {
		t.Run(c.name, func(t *testing.T) { testLateMixedMeasuresTakeByReserved(t, c.rdb(t)) })
	}
}

func testLateMixedMeasuresTakeByReserved(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	clk := newFakeClock(t0)
	l := newTestLimiter(t, rdb, "acme=2/10s,100B/1m", Options{Clock: clk.Now})
	ds, err := l.AdmitFrom(ctx, Source{Topic: "events"}, costEvents("acme", 0, 10, 10, 10, 10, 15, 5))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(ds), "a a d@10s d@10s d@20s d@20s"; got != want {
		t.Fatalf("source batch: got %s, want %s", got, want)
	}
	r := l.Rules().For("acme")[0]
	reserved := func(at time.Duration) int64 {
		t.Helper()
		key := l.keys.window("acme", r, t0.Add(at))
		v, err := rdb.HGet(ctx, key, "r1").Int64()
		if err != nil && err != redis.Nil {
			t.Fatalf("HGET %s r1: %v", key, err)
		}
		return v
	}
	if a, b := reserved(10*time.Second), reserved(20*time.Second); a != 20 || b != 20 {
		t.Fatalf("bytes reserved at t0+10s, t0+20s: %d, %d; want 20, 20", a, b)
	}
	retry := Source{Topic: "events.retry"}
	clk.Set(t0.Add(5 * time.Second))
	// 25 bytes fit no window's 20 reserved: reserved as usual; 10 take a
	// slot at t0+10s; the next 15 fit what is left there by bytes (10) no
	// more, and take the slot of t0+20s.
	late := costEvents("acme", 100, 10, 15)
	ds, err = l.AdmitLate(ctx, retry, late, true)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(ds), "d@10s! d@20s!"; got != want {
		t.Fatalf("late events: got %s, want %s", got, want)
	}
	replaysSame(t, l, retry, late, ds, "replayed late events")
	big, err := l.AdmitLate(ctx, retry, costEvents("acme", 102, 25), true)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(big), "d@30s"; got != want {
		t.Fatalf("late event of 25 bytes: got %s, want %s (no window holds 25 reserved)", got, want)
	}
	// The claims of t0+10s: the last gives up its slot (one event and its
	// 10 bytes taken) and is placed again; the first keeps its slot.
	clk.Set(t0.Add(10*time.Second + 500*time.Millisecond))
	slot := t0.Add(10 * time.Second)
	claims := []Event{{Tenant: "acme", Offset: 2, InSlot: true, Due: slot, Cost: Cost{Bytes: 10, Units: 10}},
		{Tenant: "acme", Offset: 3, InSlot: true, Due: slot, Cost: Cost{Bytes: 10, Units: 10}}}
	ds, err = l.AdmitLate(ctx, retry, claims, true)
	if err != nil {
		t.Fatal(err)
	}
	if ds[0].Kind != Keep || ds[1].Kind != Defer || ds[1].Took || !ds[1].Due.After(slot) {
		t.Fatalf("claims of t0+10s: got %s, want the first kept, the second placed again later", dues(ds))
	}
	// A reservation of t0+30s missed (its slot given back): its bytes leave
	// r1 with its count.
	clk.Set(t0.Add(45 * time.Second))
	before := reserved(30 * time.Second)
	if n, err := l.Release(ctx, []MissedSlot{{Tenant: "acme", Due: t0.Add(30 * time.Second), Trip: "x", Cost: Cost{Bytes: 25, Units: 25}}}); err != nil || n != 1 {
		t.Fatalf("release: %d, %v; want 1", n, err)
	}
	if after := reserved(30 * time.Second); after != max(before-25, 0) {
		t.Errorf("bytes reserved at t0+30s after the release: %d, want %d", after, max(before-25, 0))
	}
	// Every window within its limits: events per 10s, bytes per minute.
	for at := time.Duration(0); at < time.Minute; at += 10 * time.Second {
		if c, _ := windowState(t, rdb, l, "acme", "2/10s", t0.Add(at)); c > 2 {
			t.Errorf("events counted at t0+%s: %d, over 2", at, c)
		}
	}
	if c, _ := bytesState(t, rdb, l, "acme", "100B/1m", t0); c > 100 {
		t.Errorf("bytes counted in the first minute: %d, over 100", c)
	}
}

// Rules changed from bytes to events between a take and its claims: the
// take's pool is marked bytes. A late event takes no slot beside takes of
// another measure, and a tenant that counts no bytes any more gives up one
// claim for each byte taken (more than needed, never too few).
func TestLateBytesTakeThenEventRules(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis(t)
	clk := newFakeClock(t0)
	l := newTestLimiter(t, rdb, "acme=100B/1m", Options{Clock: clk.Now})
	if _, err := l.AdmitFrom(ctx, Source{Topic: "events"}, costEvents("acme", 0, 100, 100, 50, 50)); err != nil {
		t.Fatal(err)
	}
	retry := Source{Topic: "events.retry"}
	clk.Set(t0.Add(time.Minute + 30*time.Second))
	ds, err := l.AdmitLate(ctx, retry, costEvents("acme", 100, 1), true)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(ds), "d@2m0s!"; got != want {
		t.Fatalf("late event: got %s, want %s", got, want)
	}
	if err := l.SetRules(mustRules(t, "acme=5/1m")); err != nil {
		t.Fatal(err)
	}
	// Under the event rule: t0+1m full, 5 events reserved at t0+2m.
	if _, err := l.AdmitFrom(ctx, Source{Topic: "events"}, costEvents("acme", 10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	// t0+2m holds 5 reserved events and 1 byte taken: a late event does
	// not take a slot there (it would read the byte as an event), and is
	// placed at t0+3m.
	ds, err = l.AdmitLate(ctx, retry, costEvents("acme", 101, 1), true)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dues(ds), "d@3m0s"; got != want {
		t.Fatalf("late event under event rules: got %s, want %s", got, want)
	}
	clk.Set(t0.Add(2*time.Minute + 5*time.Second))
	slot := t0.Add(2 * time.Minute)
	claims := []Event{{Tenant: "acme", Offset: 102, InSlot: true, Due: slot, Cost: Cost{Bytes: 50}},
		{Tenant: "acme", Offset: 103, InSlot: true, Due: slot, Cost: Cost{Bytes: 50}}}
	ds, err = l.AdmitLate(ctx, retry, claims, true)
	if err != nil {
		t.Fatal(err)
	}
	if ds[0].Kind != Keep || ds[1].Kind == Keep {
		t.Errorf("claims: got %s, want keep, then placed again (1 byte taken, read as one slot)", dues(ds))
	}
}

// The worst case of a take with two measures (G11): late events of a
// tenant of 1/1s and 100B/1s whose seconds ahead are all full, every slot
// in them taken already (a pool of each measure in the record). The take
// scan reads the record's pools of a window beside its two counts, stops
// after take_reads windows, and the search goes on within the budget: the
// call's reads stay within its budget, nothing is counted or taken, and no
// call is slow.
func TestBoundedLateTakeMixed(t *testing.T) {
	ctx := context.Background()
	rdb := privateRedis(t)
	m := newWorkMeter(t, rdb)
	l := newTestLimiter(t, rdb, "*=1/1s,100B/1s", Options{Clock: func() time.Time { return t0 }})
	events, err := parseRule("1/1s")
	if err != nil {
		t.Fatal(err)
	}
	bytes, err := parseRule("100B/1s")
	if err != nil {
		t.Fatal(err)
	}
	const ahead = 3000 // seconds, every slot taken: past the take scan's reach
	p := rdb.Pipeline()
	record := l.keys.taken("hot")
	for i := range ahead + 1 {
		s := t0.Add(time.Duration(i) * time.Second)
		for _, r := range []struct {
			rule  Rule
			count int
		}{{events, 1}, {bytes, 30}} {
			key := l.keys.window("hot", r.rule, s)
			p.HSet(ctx, key, "count", r.count, "expire", s.Add(time.Second).UnixMilli())
			p.PExpire(ctx, key, time.Hour)
		}
		f := strconv.FormatInt(s.UnixMilli(), 10)
		p.HSet(ctx, record, f, 31, f+"/m", 3, f+"/0", 1, f+"/1", 30)
	}
	p.PExpire(ctx, record, time.Hour)
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	evs := hotEvents(10)
	m.reset()
	ds, err := l.AdmitLate(ctx, Source{Topic: "events.retry"}, evs, true)
	if err != nil {
		t.Fatal(err)
	}
	m.check("500 late events, 1/1s and 100B/1s, every slot ahead taken", 1, int64(DefaultMaxScan)+2)
	for i, d := range ds {
		if d.Kind != Defer || d.Took || !d.Due.Equal(d.Until) {
			t.Fatalf("event %d: got %+v, want deferred unreserved to where the search stopped", i, d)
		}
	}
	got, err := rdb.HLen(ctx, record).Result()
	if err != nil {
		t.Fatal(err)
	}
	if got != 4*(ahead+1) {
		t.Errorf("record of takes: %d fields, want %d (unchanged)", got, 4*(ahead+1))
	}
	for _, s := range []time.Time{t0.Add(time.Second), t0.Add(200 * time.Second)} {
		want := map[string]int64{"": 31, "/m": 3, "/0": 1, "/1": 30}
		if got := recordFields(t, rdb, l, "hot", s); !maps.Equal(got, want) {
			t.Errorf("record at %s: got %v, want %v", s.Sub(t0), got, want)
		}
	}
}

// A claim of cost zero (units may cost 0, and a claim whose cost cannot be
// read is sent at zero) whose slot was taken gives its slot up and gives
// nothing of the pool: the call must not fail on it (Redis refuses the
// increment "-0" that a pool given nothing would write). Found by review.
func TestLateZeroCostClaim(t *testing.T) {
	for _, spec := range []string{"acme=100B/1m", "acme=100u/1m", "acme=2/1m,100B/1m"} {
		t.Run(spec, func(t *testing.T) {
			ctx := context.Background()
			rdb := testRedis(t)
			clk := newFakeClock(t0)
			l := newTestLimiter(t, rdb, spec, Options{Clock: clk.Now})
			if _, err := l.AdmitFrom(ctx, Source{Topic: "events"}, costEvents("acme", 0, 50, 50, 60, 40)); err != nil {
				t.Fatal(err)
			}
			retry := Source{Topic: "events.retry"}
			clk.Set(t0.Add(30 * time.Second))
			ds, err := l.AdmitLate(ctx, retry, costEvents("acme", 100, 30), true)
			if err != nil || dues(ds) != "d@1m0s!" {
				t.Fatalf("late event: got %s (%v), want d@1m0s!", dues(ds), err)
			}
			clk.Set(t0.Add(time.Minute + 5*time.Second))
			claim := []Event{{Tenant: "acme", Offset: 3, InSlot: true, Due: t0.Add(time.Minute)}} // Cost{}
			ds, err = l.AdmitLate(ctx, retry, claim, true)
			if err != nil {
				t.Fatalf("claim of cost zero whose slot was taken: %v", err)
			}
			if ds[0].Kind == Keep {
				t.Errorf("claim of cost zero: kept, want given up")
			}
		})
	}
}

// A record of takes that holds no integer where a claim uses it up fails
// that tenant alone, as a broken window key does: its events go to the
// dead-letter topic with a reason naming the record, what its claims used
// up is taken back, and the batch's other tenants are decided (before, the
// whole call failed, every time the batch was tried: under
// ON_REDIS_ERROR=pause the retry partition waited for good).
func TestLateClaimFailureIsolated(t *testing.T) {
	for _, tc := range []struct {
		name, why string
		breaks    func(ctx context.Context, rdb redis.UniversalClient, record, field string) error
	}{
		{"pool not an integer", "not an integer", func(ctx context.Context, rdb redis.UniversalClient, record, field string) error {
			return rdb.HSet(ctx, record, field, "1.5").Err()
		}},
		{"record of the wrong type", "wrong type", func(ctx context.Context, rdb redis.UniversalClient, record, _ string) error {
			return rdb.Set(ctx, record, "1.5", time.Hour).Err()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			rdb := testRedis(t)
			clk := newFakeClock(t0)
			l := newTestLimiter(t, rdb, "*=100B/1m", Options{Clock: clk.Now})
			for _, tenant := range []string{"beta", "acme"} {
				if _, err := l.AdmitFrom(ctx, Source{Topic: "events." + tenant}, costEvents(tenant, 0, 50, 50, 60, 40)); err != nil {
					t.Fatal(err)
				}
			}
			retry := Source{Topic: "events.retry"}
			clk.Set(t0.Add(30 * time.Second))
			if _, err := l.AdmitLate(ctx, retry, append(costEvents("beta", 100, 30), costEvents("acme", 101, 30)...), true); err != nil {
				t.Fatal(err)
			}
			slot := t0.Add(time.Minute)
			record, field := l.keys.taken("acme"), strconv.FormatInt(slot.UnixMilli(), 10)
			if err := tc.breaks(ctx, rdb, record, field); err != nil {
				t.Fatal(err)
			}
			before := dump(t, rdb, record)
			clk.Set(t0.Add(time.Minute + 5*time.Second))
			claims := []Event{{Tenant: "acme", Offset: 4, InSlot: true, Due: slot, Cost: Cost{Bytes: 40}},
				{Tenant: "beta", Offset: 3, InSlot: true, Due: slot, Cost: Cost{Bytes: 40}},
				{Tenant: "acme", Offset: 5, InSlot: true, Due: slot, Cost: Cost{Bytes: 60}}}
			ds, err := l.AdmitLate(ctx, retry, claims, true)
			if err != nil {
				t.Fatalf("claims' call: %v, want acme's events failed alone", err)
			}
			for _, i := range []int{0, 2} {
				if ds[i].Kind != Fail || !strings.Contains(ds[i].Reason, record) || !strings.Contains(ds[i].Reason, tc.why) {
					t.Errorf("acme's claim %d: %v %q, want fail naming %s, %q", i, ds[i].Kind, ds[i].Reason, record, tc.why)
				}
			}
			if ds[1].Kind == Keep || ds[1].Kind == Fail {
				t.Errorf("beta's claim: %v, want given up (its slot was taken)", ds[1].Kind)
			}
			if _, tk := bytesState(t, rdb, l, "beta", "100B/1m", slot); tk != 0 {
				t.Errorf("beta's take after its claim: %d bytes, want 0 (used up)", tk)
			}
			if after := dump(t, rdb, record); after != before {
				t.Errorf("acme's record after the call: %q, want it untouched (%q)", after, before)
			}
		})
	}
}

// dump returns key's value as DUMP serializes it.
func dump(t *testing.T, rdb redis.UniversalClient, key string) string {
	t.Helper()
	v, err := rdb.Dump(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("DUMP %s: %v", key, err)
	}
	return v
}

// Reservations record bytes or units only in a finest window of events
// (85_late.lua, Reserved): with a finest rule of bytes (100B/10s beside
// 2/10s and 50u/1m) and events of 0 bytes, the bytes rule's windows are
// never written, and a record there would have left keys that never
// expire (found by a review of a993d7a). (That tenant's rules do not
// qualify: its record is by due time, in its window of events, Segments.)
// The same for a tenant of rules of bytes and units that do not nest
// (100B/10s beside 50u/15s): its record is by due time in a window of
// bytes, which reservations of 0 bytes open with an expiry.
func TestReservedRecordOnlyInWindowsOfEvents(t *testing.T) {
	for _, limits := range []string{"acme=100B/10s,2/10s,50u/1m", "acme=100B/10s,50u/15s"} {
		t.Run(limits, func(t *testing.T) {
			ctx := context.Background()
			rdb := privateRedis(t)
			l := newTestLimiter(t, rdb, limits, Options{Clock: newFakeClock(t0).Now})
			evs := make([]Event, 30)
			for i := range evs {
				evs[i] = Event{Tenant: "acme", Offset: int64(i), Cost: Cost{Units: 5}}
			}
			ds, err := l.AdmitFrom(ctx, Source{Topic: "events"}, evs)
			if err != nil {
				t.Fatal(err)
			}
			if ds[len(ds)-1].Kind != Defer {
				t.Fatalf("source batch: got %s, want the last ones deferred", dues(ds))
			}
			keys, err := rdb.Keys(ctx, "*").Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				if ttl, err := rdb.PTTL(ctx, k).Result(); err != nil || ttl < 0 {
					t.Errorf("key %s: PTTL %v (%v), want one set", k, ttl, err)
				}
			}
		})
	}
}
