package limit

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
)

var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC) // a Monday, on every boundary

type admitCase func(t *testing.T, rdb redis.UniversalClient)

// admitCases run against a single Redis and against a Redis Cluster.
var admitCases = map[string]admitCase{
	"AdmitThenDeferInOrder":    testAdmitThenDeferInOrder,
	"MultiRuleAllOrNothing":    testMultiRuleAllOrNothing,
	"HorizonReject":            testHorizonReject,
	"AlignedWindowResets":      testAlignedWindowResets,
	"TTLWindowResetsAndChain":  testTTLWindow,
	"UsageMatchesCounts":       testUsageMatchesCounts,
	"Exactness":                testExactness,
	"ManyTenantsOneCall":       testManyTenants,
	"RulesChangeAtRunTime":     testRulesChange,
	"ScriptCacheFlushed":       testScriptFlushed,
	"TTLChainCachedByReplicas": testTTLChainCachedByReplicas,
	"TTLChainLost":             testTTLChainLost,
	"TTLChainLostSeveralRules": testTTLChainLostSeveralRules,
	"TTLChainNeverShrinks":     testTTLChainNeverShrinks,
	"WindowKeysExpire":         testWindowKeysExpire,
	"ReservedWindowKeyLives":   testReservedWindowKeyLives,
	"BrokenKeyIsolated":        testBrokenKeyIsolated,
}

// Redis loses its script cache on restart or failover: Admit loads it again.
func testScriptFlushed(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0)
	l := newTestLimiter(t, rdb, "acme=1/1m", Options{Clock: clk.Now})
	ctx := context.Background()
	flush := func() {
		if c, ok := rdb.(*redis.ClusterClient); ok {
			if err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return n.ScriptFlush(ctx).Err() }); err != nil {
				t.Fatal(err)
			}
			return
		}
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	flush()
	if got := kinds(admit(t, l, []string{"acme", "acme", "b", "c", "d"})); got != "adaaa" {
		t.Errorf("after SCRIPT FLUSH: got %s, want adaaa", got)
	}
}

func TestAdmitRedis(t *testing.T) {
	rdb := testRedis(t)
	for name, tc := range admitCases {
		t.Run(name, func(t *testing.T) { tc(t, rdb) })
	}
}

func TestAdmitRedisCluster(t *testing.T) {
	rdb := testCluster(t)
	for name, tc := range admitCases {
		t.Run(name, func(t *testing.T) { tc(t, rdb) })
	}
}

// TestAdmitRedisClusterOneSlot runs the same cases on Redis Cluster under
// key prefixes with a hash tag (testPrefix): every key in one slot, one
// call per batch as on one Redis (OneSlot).
func TestAdmitRedisClusterOneSlot(t *testing.T) {
	rdb := testCluster(t)
	for name, tc := range admitCases {
		t.Run(name, func(t *testing.T) { tc(t, rdb) })
	}
}

func admit(t *testing.T, l *Limiter, tenants []string) []Decision {
	t.Helper()
	ds, err := l.Admit(context.Background(), tenants)
	if err != nil {
		t.Fatalf("Admit: %v", err)
	}
	if len(ds) != len(tenants) {
		t.Fatalf("Admit: got %d decisions, want %d", len(ds), len(tenants))
	}
	return ds
}

func testAdmitThenDeferInOrder(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(10 * time.Second))
	l := newTestLimiter(t, rdb, "acme=3/1m", Options{Clock: clk.Now})
	ds := admit(t, l, repeat("acme", 10))
	if got, want := kinds(ds), "aaadddddd"+"d"; got != want {
		t.Fatalf("kinds: got %s, want %s", got, want)
	}
	// Deferred events get the earliest windows, in offset order, 3 a window.
	for i, d := range ds[3:] {
		wantDue := t0.Add(time.Duration(1+i/3) * time.Minute)
		if !d.Due.Equal(wantDue) || !d.Until.Equal(wantDue.Add(time.Minute)) {
			t.Errorf("event %d: got due %v until %v, want due %v until +1m", 3+i, d.Due, d.Until, wantDue)
		}
	}
	// Newer live events of the same tenant come after the reservations.
	clk.Add(time.Minute) // now in window 1, which holds 3 reservations: full
	ds = admit(t, l, repeat("acme", 1))
	// Windows 1 and 2 hold 3 reservations each, window 3 holds 1.
	if ds[0].Kind != Defer || !ds[0].Due.Equal(t0.Add(3*time.Minute)) {
		t.Errorf("live event after reservations: got %+v, want defer to %v", ds[0], t0.Add(3*time.Minute))
	}
	// Another tenant is untouched; a tenant with no rules is admitted.
	if got := kinds(admit(t, l, []string{"other", "other"})); got != "aa" {
		t.Errorf("tenant without rules: got %s, want aa", got)
	}
}

func testMultiRuleAllOrNothing(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(5 * time.Second))
	l := newTestLimiter(t, rdb, "acme=5/1s,7/1m", Options{Clock: clk.Now, Horizon: 5 * time.Minute})
	ds := admit(t, l, repeat("acme", 20))
	// 5 now (1s rule), then 2 in the next second (the minute rule's 7th), then
	// nothing fits until the next minute: 5 at 10:01:00, 5 at 10:01:01, ...
	if got, want := kinds(ds[:7]), "aaaaadd"; got != want {
		t.Fatalf("kinds: got %s, want %s", got, want)
	}
	if !ds[5].Due.Equal(t0.Add(6*time.Second)) || !ds[6].Due.Equal(t0.Add(6*time.Second)) {
		t.Errorf("events 5, 6: got due %v %v, want %v", ds[5].Due, ds[6].Due, t0.Add(6*time.Second))
	}
	for i := 7; i < 12; i++ {
		if !ds[i].Due.Equal(t0.Add(time.Minute)) {
			t.Errorf("event %d: got due %v, want %v", i, ds[i].Due, t0.Add(time.Minute))
		}
	}
	if !ds[12].Due.Equal(t0.Add(time.Minute+time.Second)) || !ds[12].Until.Equal(t0.Add(time.Minute+2*time.Second)) {
		t.Errorf("event 12: got due %v until %v, want %v until +1s", ds[12].Due, ds[12].Until, t0.Add(time.Minute+time.Second))
	}
	// No window of either rule holds more than its limit.
	us, err := l.Usage(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	if us[0].Count != 5 || us[1].Count != 7 {
		t.Errorf("usage now: got %+v, want 5 and 7", us)
	}
}

func testHorizonReject(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(500 * time.Millisecond))
	l := newTestLimiter(t, rdb, "acme=2/1s", Options{Clock: clk.Now, Horizon: 3 * time.Second})
	ds := admit(t, l, repeat("acme", 10))
	// Now: 2; windows 1s, 2s, 3s start by the horizon end (3.5s): 6; rest rejected.
	if got, want := kinds(ds), "aaddddddrr"; got != want {
		t.Fatalf("kinds: got %s, want %s", got, want)
	}
	if ds[9].Reason == "" {
		t.Errorf("reject without a reason")
	}
	// Known full: the next batch is rejected without Redis, until the horizon moves.
	calls := l.metrics.redisSeconds.WithLabelValues("admit")
	_ = calls
	before := testCounter(l.metrics.cacheHits)
	if got := kinds(admit(t, l, repeat("acme", 3))); got != "rrr" {
		t.Errorf("while full: got %s, want rrr", got)
	}
	if got := testCounter(l.metrics.cacheHits) - before; got != 3 {
		t.Errorf("cache hits: got %v, want 3", got)
	}
	clk.Add(time.Second) // the horizon now reaches window 4s
	if got := kinds(admit(t, l, repeat("acme", 3))); got != "ddr" {
		t.Errorf("after a second: got %s, want ddr", got)
	}
	// A limit of zero rejects everything.
	z := newTestLimiter(t, rdb, "acme=0/1m", Options{Clock: clk.Now, Horizon: time.Hour})
	if got := kinds(admit(t, z, repeat("acme", 2))); got != "rr" {
		t.Errorf("limit 0: got %s, want rr", got)
	}
}

func testAlignedWindowResets(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(59 * time.Second))
	l := newTestLimiter(t, rdb, "acme=2/1m", Options{Clock: clk.Now, Horizon: time.Nanosecond})
	if got := kinds(admit(t, l, repeat("acme", 3))); got != "aar" {
		t.Fatalf("first minute: got %s, want aar", got)
	}
	clk.Add(time.Second) // the next aligned minute: a fresh window
	if got := kinds(admit(t, l, repeat("acme", 3))); got != "aar" {
		t.Errorf("next minute: got %s, want aar", got)
	}
	// Day windows in a zone reset at local midnight.
	berlin, _ := time.LoadLocation("Europe/Berlin")
	clk.Set(time.Date(2026, 11, 30, 23, 59, 0, 0, berlin))
	d := newTestLimiter(t, rdb, "acme=1/1d", Options{Clock: clk.Now, Location: berlin, Horizon: time.Nanosecond})
	if got := kinds(admit(t, d, repeat("acme", 2))); got != "ar" {
		t.Errorf("day: got %s, want ar", got)
	}
	clk.Add(time.Minute)
	if got := kinds(admit(t, d, repeat("acme", 2))); got != "ar" {
		t.Errorf("next day: got %s, want ar", got)
	}
}

func testTTLWindow(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(1234 * time.Millisecond))
	l := newTestLimiter(t, rdb, "acme=2/10s", Options{Clock: clk.Now, WindowKind: TTL, Horizon: 25 * time.Second})
	first := clk.Now()
	ds := admit(t, l, repeat("acme", 5))
	if got := kinds(ds); got != "aaddd" {
		t.Fatalf("kinds: got %s, want aaddd", got)
	}
	// The window starts at the first event; deferred windows chain from it.
	for i, want := range []time.Time{first.Add(10 * time.Second), first.Add(10 * time.Second), first.Add(20 * time.Second)} {
		if !ds[2+i].Due.Equal(want) || !ds[2+i].Until.Equal(want.Add(10*time.Second)) {
			t.Errorf("event %d: got due %v until %v, want %v until +10s", 2+i, ds[2+i].Due, ds[2+i].Until, want)
		}
	}
	// Inside the chain, the current window is the chained one.
	clk.Set(first.Add(21 * time.Second))
	if got := kinds(admit(t, l, repeat("acme", 1))); got != "a" {
		t.Errorf("in chained window: got %s, want a", got)
	}
	us, err := l.Usage(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	if us[0].Count != 2 || !us[0].Reset.Equal(first.Add(30*time.Second)) {
		t.Errorf("usage: got %+v, want count 2 reset %v", us[0], first.Add(30*time.Second))
	}
	// After the chain ends, a new window starts at the next event.
	clk.Set(first.Add(47 * time.Second))
	later := clk.Now()
	ds = admit(t, l, repeat("acme", 3))
	if got := kinds(ds); got != "aad" || !ds[2].Due.Equal(later.Add(10*time.Second)) {
		t.Errorf("new window: got %s due %v, want aad due %v", kinds(ds), ds[2].Due, later.Add(10*time.Second))
	}
}

func testUsageMatchesCounts(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(90 * time.Minute))
	l := newTestLimiter(t, rdb, "*=10/1m,100/1h;vip=1000/1d", Options{Clock: clk.Now})
	admit(t, l, append(repeat("a b/c{d}", 4), repeat("vip", 7)...))
	us, err := l.Usage(context.Background(), "a b/c{d}")
	if err != nil {
		t.Fatal(err)
	}
	want := []Usage{
		{Rule: "10/1m", Count: 4, Limit: 10, Remaining: 6, Reset: t0.Add(91 * time.Minute)},
		{Rule: "100/1h", Count: 4, Limit: 100, Remaining: 96, Reset: t0.Add(2 * time.Hour)},
	}
	for i := range want {
		if us[i].Rule != want[i].Rule || us[i].Count != want[i].Count || us[i].Remaining != want[i].Remaining || !us[i].Reset.Equal(want[i].Reset) {
			t.Errorf("usage[%d]: got %+v, want %+v", i, us[i], want[i])
		}
	}
	us, err = l.Usage(context.Background(), "vip")
	if err != nil || len(us) != 1 || us[0].Count != 7 || !us[0].Reset.Equal(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("vip usage: got %+v %v, want count 7 reset 2026-12-01", us, err)
	}
	us, err = l.Usage(context.Background(), "nobody")
	if err != nil || us[0].Count != 0 || us[0].Remaining != 10 {
		t.Errorf("unused tenant: got %+v %v, want count 0 remaining 10", us, err)
	}
	var m dto.Metric
	if err := l.metrics.redisSeconds.WithLabelValues("usage").(prometheus.Histogram).Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetHistogram().GetSampleCount(); got != 3 {
		t.Errorf("gatekeeper_redis_call_seconds{op=usage} count: got %d, want 3", got)
	}
}

// Three limiters, as three replicas would, hammer the same tenants in parallel.
func testExactness(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(30 * time.Second))
	prefix := testPrefix(t)
	const spec = "*=50/1m,120/1h;hot=200/1m"
	var ls []*Limiter
	for i := 0; i < 3; i++ {
		ls = append(ls, newTestLimiter(t, rdb, spec, Options{Prefix: prefix, Clock: clk.Now, Horizon: time.Nanosecond}))
	}
	tenants := []string{"hot", "t1", "t2", "t3", "t 4"}
	offered := map[string]int{}
	var mu sync.Mutex
	admitted := map[string]int{}
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		batch := make([]string, 0, 100)
		for i := 0; i < 100; i++ {
			batch = append(batch, tenants[(i*7+w)%len(tenants)])
		}
		for _, tn := range batch {
			offered[tn] += 5
		}
		wg.Add(1)
		go func(l *Limiter, batch []string) {
			defer wg.Done()
			for r := 0; r < 5; r++ {
				ds, err := l.Admit(context.Background(), batch)
				if err != nil {
					t.Errorf("Admit: %v", err)
					return
				}
				mu.Lock()
				for i, d := range ds {
					if d.Kind == Admit {
						admitted[batch[i]]++
					}
				}
				mu.Unlock()
			}
		}(ls[w%3], batch)
	}
	wg.Wait()
	limits := map[string]int{"hot": 200, "t1": 50, "t2": 50, "t3": 50, "t 4": 50}
	for _, tn := range tenants {
		want := min(offered[tn], limits[tn])
		if admitted[tn] != want {
			t.Errorf("tenant %q: admitted %d, want min(offered %d, limit %d) = %d", tn, admitted[tn], offered[tn], limits[tn], want)
		}
		us, err := ls[0].Usage(context.Background(), tn)
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range us {
			if u.Count > u.Limit || u.Count != int64(want) {
				t.Errorf("tenant %q rule %s: counted %d, want %d (limit %d)", tn, u.Rule, u.Count, want, u.Limit)
			}
		}
	}
}

func testManyTenants(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0)
	l := newTestLimiter(t, rdb, "*=3/1s", Options{Clock: clk.Now, Horizon: 2 * time.Second})
	var batch []string
	for i := 0; i < 200; i++ {
		batch = append(batch, fmt.Sprintf("tenant-%d", i%40), fmt.Sprintf("ünï {%d}:x", i%13))
	}
	ds := admit(t, l, batch)
	per := map[string]map[Kind]int{}
	for i, d := range ds {
		if per[batch[i]] == nil {
			per[batch[i]] = map[Kind]int{}
		}
		per[batch[i]][d.Kind]++
	}
	for tn, k := range per {
		n := k[Admit] + k[Defer] + k[Reject]
		want := map[Kind]int{Admit: min(n, 3), Defer: min(max(n-3, 0), 6), Reject: max(n-9, 0)}
		for _, kind := range []Kind{Admit, Defer, Reject} {
			if k[kind] != want[kind] {
				t.Errorf("tenant %q: %s %d, want %d", tn, kind, k[kind], want[kind])
			}
		}
	}
}

func testRulesChange(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0)
	l := newTestLimiter(t, rdb, "acme=2/1s", Options{Clock: clk.Now, Horizon: time.Second})
	if got := kinds(admit(t, l, repeat("acme", 6))); got != "aaddrr" {
		t.Fatalf("got %s, want aaddrr", got)
	}
	if got := kinds(admit(t, l, repeat("acme", 1))); got != "r" { // from the cache
		t.Fatalf("cached: got %s, want r", got)
	}
	// Tighter rules: the cache of the old rule set does not apply, and the
	// new limit applies to what the windows already hold: the current window
	// (2 admitted) and the next (2 reserved) are over the new limit of 1.
	if err := l.SetRules(mustRules(t, "acme=1/1s")); err != nil {
		t.Fatal(err)
	}
	if got := kinds(admit(t, l, repeat("acme", 2))); got != "rr" {
		t.Errorf("after lowering: got %s, want rr", got)
	}
	// Raised: the room is the new limit minus what the window holds.
	if err := l.SetRules(mustRules(t, "acme=5/1s")); err != nil {
		t.Fatal(err)
	}
	if got := kinds(admit(t, l, repeat("acme", 7))); got != "aaadddr" {
		t.Errorf("after raising: got %s, want aaadddr", got)
	}
	if err := l.SetRules(mustRules(t, "acme=1/7m")); err == nil {
		t.Errorf("SetRules with a window that does not tile: got nil error")
	}
}

// TestAdmitFrontierPerRuleSet checks that, in a batch mixing tenants of the
// "*" rules and a tenant with rules of its own, each tenant's search frontier
// is kept under its own rule set (Admit names the shared "*" set once per batch).
func TestAdmitFrontierPerRuleSet(t *testing.T) {
	rdb := testRedis(t)
	ctx := context.Background()
	clk := newFakeClock(time.Date(2026, 3, 2, 10, 0, 30, 0, time.UTC))
	prefix := testPrefix(t)
	l := newTestLimiter(t, rdb, "*=1/1h;acme=1/1m", Options{Prefix: prefix, Clock: clk.Now})
	ds, err := l.Admit(ctx, []string{"x", "acme", "y", "acme", "x", "acme", "y"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := kinds(ds), "aaadddd"; got != want {
		t.Fatalf("decisions: got %s, want %s", got, want)
	}
	for tenant, set := range map[string]string{"x": "aligned:1/1h", "y": "aligned:1/1h", "acme": "aligned:1/1m"} {
		key := prefix + ":{" + tenant + "}:frontier:" + set
		n, err := rdb.Exists(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("tenant %s: got no frontier key %q, want one (its own rule set)", tenant, key)
		}
	}
}
