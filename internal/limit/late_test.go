package limit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestLateKeepsPlaceRedis(t *testing.T)        { testLateKeepsPlace(t, testRedis(t)) }
func TestLateKeepsPlaceRedisCluster(t *testing.T) { testLateKeepsPlace(t, testCluster(t)) }

// A deferred event that missed its slot goes ahead of what its tenant
// deferred after it: it takes the slot of the earliest later reservation,
// whose own event, back in its slot, finds it taken and is placed again at
// the first free slot (taking none in turn); no window counts more than its
// limit, and a replay decides the same. The same with several rules whose
// windows nest (2/1m inside 100/1h): a slot is a window of the finest rule.
func testLateKeepsPlace(t *testing.T, rdb redis.UniversalClient) {
	for _, spec := range []string{"acme=2/1m", "acme=2/1m,100/1h"} {
		t.Run(spec, func(t *testing.T) { testLateKeepsPlaceUnder(t, rdb, spec) })
	}
}

func testLateKeepsPlaceUnder(t *testing.T, rdb redis.UniversalClient, spec string) {
	ctx := context.Background()
	clk := newFakeClock(t0)
	l := newTestLimiter(t, rdb, spec, Options{Clock: clk.Now})
	src := Source{Topic: "events", Partition: 0}
	evs := make([]Event, 10)
	for i := range evs {
		evs[i] = Event{Tenant: "acme", Offset: int64(i)}
	}
	ds, err := l.AdmitFrom(ctx, src, evs)
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{0, 0, time.Minute, time.Minute, 2 * time.Minute, 2 * time.Minute, 3 * time.Minute, 3 * time.Minute,
		4 * time.Minute, 4 * time.Minute}
	for i, d := range ds {
		if w := want[i]; (w == 0 && d.Kind != Admit) || (w > 0 && !d.Due.Equal(t0.Add(w))) {
			t.Fatalf("event %d: got %v due %s, want due t0+%s", i, d.Kind, d.Due.Format("15:04:05"), w)
		}
	}
	count := func(at time.Duration) (count, taken int64) {
		t.Helper()
		return windowState(t, rdb, l, "acme", "2/1m", t0.Add(at))
	}

	// Event 2 (due t0+1m) missed its slot; events 4 and 5 are in theirs
	// (t0+2m), 6 and 7 wait for t0+3m.
	clk.Set(t0.Add(2*time.Minute + 30*time.Second))
	retry := Source{Topic: "events.retry", Partition: 0}
	late := []Event{{Tenant: "acme", Offset: 100}}
	ds, err = l.AdmitLate(ctx, retry, late, true)
	if err != nil {
		t.Fatal(err)
	}
	if ds[0].Kind != Defer || !ds[0].Due.Equal(t0.Add(3*time.Minute)) || !ds[0].Until.Equal(t0.Add(4*time.Minute)) || !ds[0].Took {
		t.Fatalf("late event: got %v due %s until %s took %v, want defer to the slot of t0+3m (ahead of events 6 and 7), taken",
			ds[0].Kind, ds[0].Due.Format("15:04:05"), ds[0].Until.Format("15:04:05"), ds[0].Took)
	}
	if c, tk := count(3 * time.Minute); c != 2 || tk != 1 {
		t.Errorf("window t0+3m: count %d taken %d, want 2 and 1", c, tk)
	}
	// A replay of the call decides the same and takes nothing more.
	again, err := l.AdmitLate(ctx, retry, late, true)
	if err != nil {
		t.Fatal(err)
	}
	if again[0] != ds[0] {
		t.Errorf("replayed late event: got %+v, want %+v", again[0], ds[0])
	}
	if c, tk := count(3 * time.Minute); c != 2 || tk != 1 {
		t.Errorf("window t0+3m after the replay: count %d taken %d, want 2 and 1", c, tk)
	}
	// Events 4 and 5 are in a slot nobody took: Keep.
	ds, err = l.AdmitLate(ctx, retry, []Event{{Tenant: "acme", Offset: 101, InSlot: true}, {Tenant: "acme", Offset: 102, InSlot: true}}, true)
	if err != nil {
		t.Fatal(err)
	}
	if got := kinds(ds); got != "kk" {
		t.Errorf("claims of t0+2m: got %s, want kk", got)
	}

	// At t0+3m, events 6 and 7 come back in their slot: the last finds it
	// taken and is placed at the first window with room, t0+5m (it takes
	// no slot of t0+4m in turn).
	clk.Set(t0.Add(3*time.Minute + 5*time.Second))
	claims := []Event{{Tenant: "acme", Offset: 103, InSlot: true}, {Tenant: "acme", Offset: 104, InSlot: true}}
	ds, err = l.AdmitLate(ctx, retry, claims, true)
	if err != nil {
		t.Fatal(err)
	}
	if ds[0].Kind != Keep || ds[1].Kind != Defer || !ds[1].Due.Equal(t0.Add(5*time.Minute)) || ds[1].Took {
		t.Fatalf("claims of t0+3m: got %v and %v due %s took %v, want keep, then defer to t0+5m, not taken",
			ds[0].Kind, ds[1].Kind, ds[1].Due.Format("15:04:05"), ds[1].Took)
	}
	if c, tk := count(3 * time.Minute); c != 2 || tk != 0 {
		t.Errorf("window t0+3m after the claims: count %d taken %d, want 2 and 0", c, tk)
	}
	if c, tk := count(4 * time.Minute); c != 2 || tk != 0 {
		t.Errorf("window t0+4m: count %d taken %d, want 2 and 0", c, tk)
	}
	if c, _ := count(5 * time.Minute); c != 1 {
		t.Errorf("window t0+5m: count %d, want 1 (the displaced event)", c)
	}
	// A replay of the claims' batch decides the same.
	again, err = l.AdmitLate(ctx, retry, claims, true)
	if err != nil {
		t.Fatal(err)
	}
	if again[0] != ds[0] || again[1] != ds[1] {
		t.Errorf("replayed claims: got %+v, want %+v", again, ds)
	}
	if c, _ := count(5 * time.Minute); c != 1 {
		t.Errorf("window t0+5m after the replay: count %d, want 1", c)
	}
	if strings.HasSuffix(spec, "100/1h") {
		// The hour: the ten events of the source batch and the displaced
		// one (the late event's missed slot is given back by Release).
		if c, _ := windowState(t, rdb, l, "acme", "100/1h", t0); c != 11 {
			t.Errorf("hour t0: count %d, want 11", c)
		}
	}
}

// Without take (an older fleet, or the setting off) a late event goes
// behind what its tenant deferred after it, as before, and claims keep
// their slots.
func TestLateWithoutTake(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis(t)
	clk := newFakeClock(t0)
	l := newTestLimiter(t, rdb, "acme=2/1m", Options{Clock: clk.Now})
	evs := make([]Event, 8)
	for i := range evs {
		evs[i] = Event{Tenant: "acme", Offset: int64(i)}
	}
	if _, err := l.AdmitFrom(ctx, Source{Topic: "events"}, evs); err != nil {
		t.Fatal(err)
	}
	clk.Set(t0.Add(2*time.Minute + 30*time.Second))
	ds, err := l.AdmitLate(ctx, Source{Topic: "events.retry"}, []Event{{Tenant: "acme", Offset: 100}, {Tenant: "acme", Offset: 101, InSlot: true}}, false)
	if err != nil {
		t.Fatal(err)
	}
	if ds[0].Kind != Defer || !ds[0].Due.Equal(t0.Add(4*time.Minute)) || ds[0].Took || ds[1].Kind != Keep {
		t.Errorf("got %v due %s took %v and %v, want defer to t0+4m (the first free slot) and keep",
			ds[0].Kind, ds[0].Due.Format("15:04:05"), ds[0].Took, ds[1].Kind)
	}
}

// The worst case of a take (G11): a batch of late events of a tenant whose
// windows are full far ahead, every slot in them taken already. The take
// scan reads windows against the call's budget like a deferral search and
// stops when it is spent: the events are deferred unreserved to where it
// stopped, nothing is counted or taken, and the call's work stays bounded.
func TestBoundedLateTake(t *testing.T) {
	ctx := context.Background()
	rdb := privateRedis(t)
	m := newWorkMeter(t, rdb)
	l := newTestLimiter(t, rdb, "*=1/1s", Options{Clock: func() time.Time { return t0 }})
	r, err := parseRule("1/1s")
	if err != nil {
		t.Fatal(err)
	}
	const ahead = 2000
	fillAhead(t, rdb, l, r, ahead, "taken", 1)
	ds := lateHotBatch(t, l, m, "500 late events, every slot ahead taken", int64(DefaultMaxScan)+1)
	stop := t0.Add(time.Duration(DefaultMaxScan+1) * time.Second)
	for i, d := range ds {
		if d.Kind != Defer || d.Took || !d.Due.Equal(d.Until) || d.Due.After(stop) || !d.Due.After(t0) {
			t.Fatalf("event %d: got %+v, want deferred unreserved to where the scan stopped (at most %s)", i, d, stop.Format("15:04:05"))
		}
	}
	// Nothing counted or taken: every window holds count 1 and taken 1.
	p := rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, ahead+1)
	for i := range cmds {
		cmds[i] = p.HMGet(ctx, l.keys.window("hot", r, t0.Add(time.Duration(i)*time.Second)), "count", "taken")
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for i, c := range cmds {
		if v := c.Val(); v[0] != "1" || v[1] != "1" {
			t.Fatalf("window t0+%ds: count %v taken %v, want 1 and 1", i, v[0], v[1])
		}
	}
}

// lateHotBatch decides boundedBatch late events of tenant "hot" in one
// AdmitLate call that may take slots, and checks with m that it was one
// script call of at most reads window reads (the bounded-take tests).
func lateHotBatch(t *testing.T, l *Limiter, m *workMeter, what string, reads int64) []Decision {
	t.Helper()
	evs := make([]Event, boundedBatch)
	for i := range evs {
		evs[i] = Event{Tenant: "hot", Offset: int64(i)}
	}
	m.reset()
	ds, err := l.AdmitLate(context.Background(), Source{Topic: "events.retry"}, evs, true)
	if err != nil {
		t.Fatal(err)
	}
	m.check(what, 1, reads)
	return ds
}

// The worst case of a take by what reservations recorded (85_late.lua,
// Reserved): rules of events in 1s windows and of bytes in an hour, every
// 1s window ahead full, and the bytes recorded in each too few for a late
// event. The take scan reads each window's record (one HGET beside its
// read) and stops at its bound of windows; the call's work stays bounded
// and nothing is counted or taken.
func TestBoundedLateTakeByReserved(t *testing.T) {
	ctx := context.Background()
	rdb := privateRedis(t)
	m := newWorkMeter(t, rdb)
	l := newTestLimiter(t, rdb, "*=1/1s,1000000B/1h", Options{Clock: func() time.Time { return t0 }})
	r := l.Rules().For("hot")[0]
	fillAhead(t, rdb, l, r, 2000, "r1", 5)
	evs := hotEvents(10)
	m.reset()
	hget0 := m.calls("hget")
	ds, err := l.AdmitLate(ctx, Source{Topic: "events.retry"}, evs, true)
	if err != nil {
		t.Fatal(err)
	}
	m.check("500 late events of 10 bytes, 5 bytes recorded in every full window ahead", 1, int64(DefaultMaxScan)+2)
	hgets := m.calls("hget") - hget0
	t.Logf("HGETs: %d", hgets)
	if hgets > int64(DefaultMaxScan) {
		t.Errorf("HGETs of the records: %d, want at most %d (one a window read)", hgets, DefaultMaxScan)
	}
	for i, d := range ds {
		if d.Kind != Defer || d.Took || !d.Due.After(t0) {
			t.Fatalf("event %d: got %+v, want deferred, no slot taken", i, d)
		}
	}
	if n, err := rdb.Exists(ctx, l.keys.taken("hot")).Result(); err != nil || n != 0 {
		t.Errorf("record of takes: %d keys (%v), want none", n, err)
	}
}

// fillAhead fills tenant hot's windows of r (of 1s) from t0 on, ahead of
// them: count 1 and fields.
func fillAhead(t *testing.T, rdb redis.UniversalClient, l *Limiter, r Rule, ahead int, fields ...any) {
	t.Helper()
	ctx := context.Background()
	p := rdb.Pipeline()
	for i := range ahead + 1 {
		s := t0.Add(time.Duration(i) * time.Second)
		key := l.keys.window("hot", r, s)
		p.HSet(ctx, key, append([]any{"count", 1, "expire", s.Add(time.Second).UnixMilli()}, fields...)...)
		p.PExpire(ctx, key, time.Hour)
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
}

// hotEvents returns a bounded batch of tenant hot's events of bytes each.
func hotEvents(bytes int64) []Event {
	evs := make([]Event, boundedBatch)
	for i := range evs {
		evs[i] = Event{Tenant: "hot", Offset: int64(i), Cost: Cost{Bytes: bytes}}
	}
	return evs
}
