package limit

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Limiter caches the ttl chain of one-rule tenants so that the script need
// not read the anchor. Other Limiters (replicas) extend the same chain behind
// its back, and Redis may lose the keys: the cached chain must never shrink
// the anchor, and a lost chain must not be counted into.

// anchorOf reads the tenant's ttl anchor {start, until} (unix ms; 0 when absent).
func anchorOf(t *testing.T, rdb redis.UniversalClient, l *Limiter, tenant string) (start, until int64) {
	t.Helper()
	r := l.Rules().For(tenant)[0]
	v, err := rdb.HMGet(context.Background(), l.keys.anchor(tenant, r), "start", "until").Result()
	if err != nil {
		t.Fatal(err)
	}
	num := func(x any) int64 {
		s, ok := x.(string)
		if !ok {
			return 0
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("anchor field %q: %v", s, err)
		}
		return n
	}
	return num(v[0]), num(v[1])
}

// twoReplicas returns two Limiters sharing rdb and a clock, as two replicas
// would: "acme=2/10s" in ttl windows, a one-minute horizon.
func twoReplicas(t *testing.T, rdb redis.UniversalClient) (*fakeClock, *Limiter, *Limiter) {
	clk := newFakeClock(t0)
	opts := Options{Clock: clk.Now, WindowKind: TTL, Horizon: time.Minute, Prefix: testPrefix(t)}
	return clk, newTestLimiter(t, rdb, "acme=2/10s", opts), newTestLimiter(t, rdb, "acme=2/10s", opts)
}

func testTTLChainCachedByReplicas(t *testing.T, rdb redis.UniversalClient) {
	clk, a, b := twoReplicas(t, rdb)
	s := t0.UnixMilli()

	// a starts the chain and caches it: [s, s+10s).
	if got := kinds(admit(t, a, repeat("acme", 2))); got != "aa" {
		t.Fatalf("a: got %s, want aa", got)
	}
	// b (no cache) reserves the next two windows: the chain now ends at s+30s.
	ds := admit(t, b, repeat("acme", 3))
	if got := kinds(ds); got != "ddd" || !ds[2].Due.Equal(t0.Add(20*time.Second)) {
		t.Fatalf("b: got %s, last due %v; want ddd due +20s", got, ds[2].Due)
	}
	if st, un := anchorOf(t, rdb, a, "acme"); st != s || un != s+30000 {
		t.Fatalf("anchor after b: got [%d, %d), want [%d, %d)", st, un, s, s+30000)
	}
	// a, whose cache says the chain ends at s+10s, reserves the last slot of
	// the third window, then one in a fourth: the anchor only grows.
	ds = admit(t, a, repeat("acme", 2))
	if got := kinds(ds); got != "dd" || !ds[0].Due.Equal(t0.Add(20*time.Second)) || !ds[1].Due.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("a: got %s due %v, %v; want dd due +20s, +30s", got, ds[0].Due, ds[1].Due)
	}
	if st, un := anchorOf(t, rdb, a, "acme"); st != s || un != s+40000 {
		t.Fatalf("anchor after a: got [%d, %d), want [%d, %d)", st, un, s, s+40000)
	}
	// Inside the chain both count in the same windows: at +25s the third
	// window is full, so a takes the last slot of the fourth and b opens a
	// fifth (the chain now ends at +50s).
	clk.Set(t0.Add(25 * time.Second))
	da, db := admit(t, a, []string{"acme"}), admit(t, b, []string{"acme"})
	if kinds(da)+kinds(db) != "dd" || !da[0].Due.Equal(t0.Add(30*time.Second)) || !db[0].Due.Equal(t0.Add(40*time.Second)) {
		t.Fatalf("at +25s: got %s due %v and %s due %v; want d due +30s and d due +40s", kinds(da), da[0].Due, kinds(db), db[0].Due)
	}
	if _, un := anchorOf(t, rdb, a, "acme"); un != s+50000 {
		t.Fatalf("anchor end at +25s: got %d, want %d", un, s+50000)
	}
	// At +55s the chain has ended for everyone: a new window starts at now.
	clk.Set(t0.Add(55 * time.Second))
	if got := kinds(admit(t, a, repeat("acme", 1))) + kinds(admit(t, b, repeat("acme", 2))); got != "aad" {
		t.Errorf("new chain: got %s, want aad", got)
	}
	if st, _ := anchorOf(t, rdb, a, "acme"); st != s+55000 {
		t.Errorf("new chain start: got %d, want %d", st, s+55000)
	}
}

// Redis loses the tenant's keys (a restart without persistence) while a
// Limiter still caches the chain: when the cached chain would open a new
// window, the script finds the anchor gone and starts a chain at now, the
// one a replica without the cache starts too.
func testTTLChainLost(t *testing.T, rdb redis.UniversalClient) {
	clk, a, b := twoReplicas(t, rdb)
	ds := admit(t, a, repeat("acme", 3)) // chain [t0, t0+20s): one reserved at +10s
	if got := kinds(ds); got != "aad" {
		t.Fatalf("a: got %s, want aad", got)
	}
	ctx := context.Background()
	r := a.Rules().For("acme")[0]
	lost := a.keys.window("acme", r, t0.Add(10*time.Second))
	for _, k := range []string{a.keys.anchor("acme", r), a.keys.window("acme", r, t0), lost} {
		if n, err := rdb.Del(ctx, k).Result(); err != nil || n != 1 {
			t.Fatalf("DEL %s: %d %v", k, n, err)
		}
	}
	// At +12s a's cache points into the chain's second window, now lost.
	clk.Set(t0.Add(12 * time.Second))
	if got := kinds(admit(t, a, repeat("acme", 1))); got != "a" {
		t.Fatalf("a after loss: got %s, want a", got)
	}
	if st, un := anchorOf(t, rdb, a, "acme"); st != t0.Add(12*time.Second).UnixMilli() || un != t0.Add(22*time.Second).UnixMilli() {
		t.Errorf("anchor after loss: got [%d, %d), want the chain starting at +12s", st, un)
	}
	// b reads the same new chain: one slot left in its window.
	if got := kinds(admit(t, b, repeat("acme", 2))); got != "ad" {
		t.Errorf("b: got %s, want ad", got)
	}
	if n, err := rdb.Exists(ctx, lost).Result(); err != nil || n != 0 {
		t.Errorf("the lost chain's window was recreated (%d, %v)", n, err)
	}
}

// A Limiter whose cached chain end is behind the anchor's reserves slots
// between the two (a raised limit opens room in a window the other replica
// already filled): the anchor keeps its later end.
func testTTLChainNeverShrinks(t *testing.T, rdb redis.UniversalClient) {
	_, a, b := twoReplicas(t, rdb)
	s := t0.UnixMilli()
	if got := kinds(admit(t, a, repeat("acme", 2))); got != "aa" { // a caches [s, s+10s)
		t.Fatalf("a: got %s, want aa", got)
	}
	if got := kinds(admit(t, b, repeat("acme", 4))); got != "dddd" { // the chain ends at s+30s
		t.Fatalf("b: got %s, want dddd", got)
	}
	if err := a.SetRules(mustRules(t, "acme=4/10s")); err != nil {
		t.Fatal(err)
	}
	// Two more fit now, two go to the second window (b left it at 2 of 4):
	// a's reservations end at s+20s, inside the chain b extended.
	ds := admit(t, a, repeat("acme", 4))
	if got := kinds(ds); got != "aadd" || !ds[2].Due.Equal(t0.Add(10*time.Second)) || !ds[3].Due.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("a after raising the limit: got %s due %v, %v; want aadd due +10s, +10s", got, ds[2].Due, ds[3].Due)
	}
	if st, un := anchorOf(t, rdb, a, "acme"); st != s || un != s+30000 {
		t.Errorf("anchor: got [%d, %d), want [%d, %d)", st, un, s, s+30000)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// The Limiter remembers tenants up to its cache budget: past that it forgets
// the least recently used plain ones, and keeps a tenant known to be full.
func TestLimiterStatesBounded(t *testing.T) {
	rdb := testRedis(t)
	clk := newFakeClock(t0.Add(500 * time.Millisecond))
	l := newTestLimiter(t, rdb, "*=2/1s", Options{Clock: clk.Now, Horizon: time.Second})
	if got := kinds(admit(t, l, repeat("hog", 6))); got != "aaddrr" {
		t.Fatalf("hog: got %s, want aaddrr", got)
	}
	// Room for 4 states of hog's size: the tenants t0..t19 are no larger.
	l.states.budget = 4 * l.states.bytes
	for i := range 20 {
		tenant := "t" + itoa(int64(i))
		if got := kinds(admit(t, l, []string{tenant})); got != "a" {
			t.Fatalf("%s: got %s, want a", tenant, got)
		}
		if n := l.states.len(); n > 4 {
			t.Fatalf("after %s: %d states, want at most 4", tenant, n)
		}
	}
	if got := testCounter(l.states.evictedPlain); got != 17 {
		t.Errorf("plain evictions: got %v, want 17", got)
	}
	if got := testCounter(l.states.evictedFull); got != 0 {
		t.Errorf("full evictions: got %v, want 0", got)
	}
	before := testCounter(l.metrics.cacheHits)
	if got := kinds(admit(t, l, repeat("hog", 2))); got != "rr" {
		t.Errorf("hog still full: got %s, want rr", got)
	}
	if got := testCounter(l.metrics.cacheHits) - before; got != 2 {
		t.Errorf("hog decided locally: %v cache hits, want 2", got)
	}
}

// A tenant with several ttl rules takes its chains from the cache too, and
// when they are lost (keys gone) it starts new ones at now, as a tenant of
// one rule does: the cache never reopens a window of a chain that is gone.
func testTTLChainLostSeveralRules(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0)
	opts := Options{Clock: clk.Now, WindowKind: TTL, Horizon: time.Minute, Prefix: testPrefix(t)}
	a := newTestLimiter(t, rdb, "acme=2/10s,100/1m", opts)
	b := newTestLimiter(t, rdb, "acme=2/10s,100/1m", opts)
	if got := kinds(admit(t, a, repeat("acme", 3))); got != "aad" { // chains [t0, +20s) and [t0, +60s)
		t.Fatalf("a: got %s, want aad", got)
	}
	ctx := context.Background()
	rs := a.Rules().For("acme")
	lost := a.keys.window("acme", rs[0], t0.Add(10*time.Second))
	for _, k := range []string{a.keys.anchor("acme", rs[0]), a.keys.window("acme", rs[0], t0), lost,
		a.keys.anchor("acme", rs[1]), a.keys.window("acme", rs[1], t0)} {
		if n, err := rdb.Del(ctx, k).Result(); err != nil || n != 1 {
			t.Fatalf("DEL %s: %d %v", k, n, err)
		}
	}
	// At +12s a's cache points into the first rule's second window, lost.
	clk.Set(t0.Add(12 * time.Second))
	if got := kinds(admit(t, a, repeat("acme", 1))); got != "a" {
		t.Fatalf("a after loss: got %s, want a", got)
	}
	if st, un := anchorOf(t, rdb, a, "acme"); st != t0.Add(12*time.Second).UnixMilli() || un != t0.Add(22*time.Second).UnixMilli() {
		t.Errorf("anchor after loss: got [%d, %d), want the chain starting at +12s", st, un)
	}
	if got := kinds(admit(t, b, repeat("acme", 2))); got != "ad" {
		t.Errorf("b: got %s, want ad", got)
	}
	if n, err := rdb.Exists(ctx, lost).Result(); err != nil || n != 0 {
		t.Errorf("the lost chain's window was recreated (%d, %v)", n, err)
	}
}
