package limit

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// testState returns a state named like the Limiter names them, not cached.
func testState(tenant string) *tenantState {
	k := keys{prefix: "gk", kind: Aligned}
	set := "aligned:1/1m"
	return &tenantState{
		key:  stateKey{tenant, set},
		keys: []any{k.frontier(tenant, set), k.tenant(tenant) + ":1m"},
	}
}

// testCache returns a cache with room for n states of testState's size with
// 8-byte tenant names, and its states a..: added in that order.
func testCache(t *testing.T, n int, names ...string) (*stateCache, map[string]*tenantState) {
	t.Helper()
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newStateCache(int64(n)*stateBytes(testState("tenant-0")), m)
	sts := map[string]*tenantState{}
	for _, name := range names {
		sts[name] = testState(name)
		c.add(sts[name], t0)
	}
	return c, sts
}

func cached(c *stateCache, st *tenantState) bool { return c.m[st.key] == st }

// A flood of new tenants evicts the least recently used plain states and
// never a tenant known full, and the bytes stay within the budget.
func TestStateCacheFloodKeepsFull(t *testing.T) {
	c, sts := testCache(t, 10, "full-a", "plain-b", "full-c", "plain-d")
	for _, name := range []string{"full-a", "full-c"} {
		c.markFull(sts[name], t0.Add(time.Hour))
	}
	for i := range 1000 {
		c.add(testState(fmt.Sprintf("new-%04d", i)), t0)
		if c.bytes > c.budget {
			t.Fatalf("after %d new tenants: %d bytes, want at most %d", i+1, c.bytes, c.budget)
		}
		for _, name := range []string{"full-a", "full-c"} {
			if !cached(c, sts[name]) {
				t.Fatalf("after %d new tenants: %s evicted, want kept", i+1, name)
			}
		}
	}
	if cached(c, sts["plain-b"]) || cached(c, sts["plain-d"]) {
		t.Errorf("plain-b, plain-d: still cached after the flood, want evicted")
	}
	if got := c.len(); got != 10 {
		t.Errorf("states: got %d, want 10", got)
	}
	if got := testCounter(c.evictedPlain); got != 994 {
		t.Errorf("plain evictions: got %v, want 994", got)
	}
	if got := testCounter(c.evictedFull); got != 0 {
		t.Errorf("full evictions: got %v, want 0", got)
	}
	if got := testGauge(c.size); got != float64(c.bytes) {
		t.Errorf("bytes gauge: got %v, want %d", got, c.bytes)
	}

	// Once their fullness ran out they are plain, and least recently used
	// of all: the next two new tenants evict them first (counted as plain).
	later := t0.Add(2 * time.Hour)
	c.add(testState("late-1"), later)
	if cached(c, sts["full-a"]) || !cached(c, sts["full-c"]) {
		t.Errorf("after late-1: got full-a cached %v, full-c cached %v; want false, true",
			cached(c, sts["full-a"]), cached(c, sts["full-c"]))
	}
	c.add(testState("late-2"), later)
	if cached(c, sts["full-c"]) {
		t.Errorf("after late-2: full-c still cached, want evicted")
	}
	if got := testCounter(c.evictedPlain); got != 996 {
		t.Errorf("plain evictions: got %v, want 996", got)
	}
}

// When full states alone fill the budget, the least recently used of them
// goes; a plain one that fits goes before any of them.
func TestStateCacheEvictionOrder(t *testing.T) {
	tests := []struct {
		name string
		// full are marked full in order; used are then looked up in order.
		full, used []string
		// evicted is the state a new one evicts, and whether it was full.
		evicted     string
		evictedFull bool
	}{
		{name: "least recently used plain", used: []string{"a"}, evicted: "b"},
		{name: "plain before full", full: []string{"a", "b"}, evicted: "c"},
		{name: "plain before full, even used earlier", full: []string{"b", "c"}, used: []string{"b", "c"}, evicted: "a"},
		{name: "all full: least recently marked", full: []string{"a", "b", "c"}, evicted: "a", evictedFull: true},
		{name: "all full: least recently used", full: []string{"a", "b", "c"}, used: []string{"a"}, evicted: "b", evictedFull: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, sts := testCache(t, 3, "a", "b", "c")
			for _, name := range tt.full {
				c.markFull(sts[name], t0.Add(time.Minute))
			}
			for _, name := range tt.used {
				if got := c.get(sts[name].key, t0); got != sts[name] {
					t.Fatalf("get %s: got %p, want %p", name, got, sts[name])
				}
			}
			c.add(testState("d"), t0)
			var gone []string
			for _, name := range []string{"a", "b", "c"} {
				if !cached(c, sts[name]) {
					gone = append(gone, name)
				}
			}
			if len(gone) != 1 || gone[0] != tt.evicted {
				t.Errorf("evicted: got %v, want [%s]", gone, tt.evicted)
			}
			wantFull := 0.0
			if tt.evictedFull {
				wantFull = 1
			}
			if got := testCounter(c.evictedFull); got != wantFull {
				t.Errorf("full evictions: got %v, want %v", got, wantFull)
			}
			if got := testCounter(c.evictedPlain); got != 1-wantFull {
				t.Errorf("plain evictions: got %v, want %v", got, 1-wantFull)
			}
		})
	}
}

// A state larger than the whole budget is used but not remembered, and
// marking it full does not put it in the cache.
func TestStateCacheTooLarge(t *testing.T) {
	c, _ := testCache(t, 1)
	st := testState("a-tenant-name-longer-than-the-budget-allows")
	c.add(st, t0)
	c.markFull(st, t0.Add(time.Minute))
	if got := c.len(); got != 0 {
		t.Errorf("states: got %d, want 0", got)
	}
	if c.bytes != 0 || st.list != nil {
		t.Errorf("got %d bytes, list %p; want 0, nil", c.bytes, st.list)
	}
	if !st.full.Equal(t0.Add(time.Minute)) {
		t.Errorf("full: got %v, want %v", st.full, t0.Add(time.Minute))
	}
}

// The estimate errs on the safe side: inserting many more tenants than fit
// keeps the heap the cache holds (measured after a GC) within its budget,
// for 256-byte tenants (route.MaxTenantBytes) as for short ones.
func TestStateCacheHeapWithinBudget(t *testing.T) {
	const budget = 4 << 20
	for _, size := range []int{256, 8} {
		t.Run(fmt.Sprintf("%d-byte tenants", size), func(t *testing.T) {
			m, err := newMetrics(nil)
			if err != nil {
				t.Fatal(err)
			}
			rules := mustRules(t, "*=1000/1m").For("x")
			set := ruleSetID(Aligned, rules)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			l := &Limiter{keys: keys{prefix: "gk", kind: Aligned}, states: newStateCache(budget, m)}
			const n = 100000
			for i := range n {
				tenant := fmt.Sprintf("%0*d", size, i)
				l.stateLocked(&group{tenant: tenant, rules: rules, set: set}, t0)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
			c := l.states
			t.Logf("%d states: %d bytes held (%d per state), %d estimated (%d per state), budget %d",
				c.len(), held, held/int64(c.len()), c.bytes, c.bytes/int64(c.len()), budget)
			if held > budget {
				t.Errorf("heap held: got %d bytes, want at most %d", held, budget)
			}
			if c.bytes > budget || c.bytes < budget-2048 {
				t.Errorf("estimated bytes: got %d, want from %d to %d", c.bytes, budget-2048, budget)
			}
			runtime.KeepAlive(l)
		})
	}
}

// The cache's metrics are registered with the limiter's, the evictions by
// state from zero.
func TestStateCacheMetricsRegistered(t *testing.T) {
	reg := prometheus.NewRegistry()
	newTestLimiter(t, testRedis(t), "*=1/1m", Options{Registerer: reg})
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, f := range fams {
		got[f.GetName()] = len(f.GetMetric())
	}
	want := map[string]int{"gatekeeper_limiter_cache_bytes": 1, "gatekeeper_limiter_cache_evictions_total": 2}
	for name, n := range want {
		if got[name] != n {
			t.Errorf("%s: got %d series, want %d", name, got[name], n)
		}
	}
}

// BenchmarkStateCacheHit measures looking up a remembered state (the path of
// every tenant of every batch once it is known): a map lookup and moving the
// state to the front of its list, without allocating.
func BenchmarkStateCacheHit(b *testing.B) {
	m, err := newMetrics(nil)
	if err != nil {
		b.Fatal(err)
	}
	l := &Limiter{keys: keys{prefix: "gk", kind: Aligned}, states: newStateCache(DefaultCacheBytes, m)}
	rules := mustRules(b, "*=1000/1m").For("x")
	set := ruleSetID(Aligned, rules)
	groups := make([]*group, benchTenants)
	for i := range groups {
		groups[i] = &group{tenant: fmt.Sprintf("tenant-%d", i), rules: rules, set: set}
		l.stateLocked(groups[i], t0)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l.stateLocked(groups[i%len(groups)], t0)
	}
}
