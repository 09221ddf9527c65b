package limit

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// costCases run against a single Redis and against a Redis Cluster.
var costCases = map[string]admitCase{
	"WeightedFirstThatFit": testCostFirstThatFit,
	"MixedRules":           testCostMixedRules,
	"OverWholeLimit":       testCostOverWholeLimit,
	"HorizonAndKnownFull":  testCostHorizonKnownFull,
	"TTLWindow":            testCostTTL,
	"Exactness":            testCostExactness,
	"MixedTenantsOneCall":  testCostMixedTenants,
	"OneRuleFastPath":      testCostFastPath,
	"Replayed":             testCostReplayed,
}

// testCostReplayed: a replayed event gets its first decision back and
// counts nothing; the new events of the batch are decided at their own
// costs (the replayed ones' costs taken out of the lists).
func testCostReplayed(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(10 * time.Second))
	l := newTestLimiter(t, rdb, "acme=1000B/1m,10/1m", Options{Clock: clk.Now, Horizon: time.Hour})
	ctx := context.Background()
	s := src(0, 10)
	ds, err := l.AdmitFrom(ctx, s.Source, s.events(repeat("acme", 2), bytesOf(400, 500)))
	if err != nil || kinds(ds) != "aa" {
		t.Fatalf("first batch: got %v, %v, want aa", kinds(ds), err)
	}
	// Offset 11 again, then 12 (300: over the 100 left) and 13 (50: after it).
	s = src(0, 11)
	ds, err = l.AdmitFrom(ctx, s.Source, s.events(repeat("acme", 3), bytesOf(500, 300, 50)))
	if err != nil || kinds(ds) != "add" {
		t.Fatalf("replaying batch: got %v, %v, want add", kinds(ds), err)
	}
	checkDues(t, ds, t0.Add(time.Minute), t0.Add(time.Minute))
	if us := usageOf(t, l, "acme"); us[0].Count != 900 || us[1].Count != 2 {
		t.Errorf("usage now: got %+v, want 900 bytes and 2 events (the replay counted nothing)", us)
	}
	clk.Add(time.Minute)
	if us := usageOf(t, l, "acme"); us[0].Count != 350 || us[1].Count != 2 {
		t.Errorf("usage at 10:01: got %+v, want 350 bytes (300 + 50) and 2 events", us)
	}
}

// testCostFastPath: a tenant with one byte rule is counted by its batch's
// total in one command when it all fits; when it does not, that count is
// taken back and the events are decided one by one.
func testCostFastPath(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(10 * time.Second))
	l := newTestLimiter(t, rdb, "acme=1000B/1m", Options{Clock: clk.Now, Horizon: time.Hour})
	steps := []struct {
		bytes []int64
		kinds string
		count int64
	}{
		{[]int64{100, 200}, "aa", 300},
		{[]int64{300, 300, 300}, "aad", 900}, // 1200 counted, taken back
		{[]int64{100}, "a", 1000},
		{[]int64{0}, "a", 1000}, // free
		{[]int64{1}, "d", 1000},
	}
	for i, st := range steps {
		if got := kinds(admitCosts(t, l, "acme", bytesOf(st.bytes...)...)); got != st.kinds {
			t.Errorf("step %d: got %s, want %s", i, got, st.kinds)
		}
		if us := usageOf(t, l, "acme"); us[0].Count != st.count {
			t.Errorf("step %d: got a count of %d, want %d", i, us[0].Count, st.count)
		}
	}
	// A ttl chain known from an earlier reply: counted in the chained
	// window, then taken back when it does not fit.
	tl := newTestLimiter(t, rdb, "acme=1000B/10s", Options{Clock: clk.Now, WindowKind: TTL, Horizon: time.Minute})
	first := clk.Now()
	if got := kinds(admitCosts(t, tl, "acme", bytesOf(600, 600)...)); got != "ad" {
		t.Fatalf("ttl: got %s, want ad", got)
	}
	clk.Set(first.Add(11 * time.Second)) // in the chained window holding 600
	if got := kinds(admitCosts(t, tl, "acme", bytesOf(300)...)); got != "a" {
		t.Errorf("ttl chained window: got %s, want a", got)
	}
	ds := admitCosts(t, tl, "acme", bytesOf(200)...)
	if kinds(ds) != "d" || !ds[0].Due.Equal(first.Add(20*time.Second)) {
		t.Errorf("ttl over the room: got %+v, want deferred to %v", ds[0], first.Add(20*time.Second))
	}
	if us := usageOf(t, tl, "acme"); us[0].Count != 900 {
		t.Errorf("ttl usage: got %+v, want 900 bytes", us[0])
	}
}

// testCostMixedTenants: one call holds tenants with and without costs (on
// one Redis node, one script call): each is decided by its own rules.
func testCostMixedTenants(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(10 * time.Second))
	l := newTestLimiter(t, rdb, "*=2/1m;acme=1KiB/1m;meter=5u/1m,3/1m", Options{Clock: clk.Now})
	tenants := []string{"plain", "acme", "plain", "meter", "acme", "plain", "meter", "other"}
	costs := []Cost{{Bytes: 9000}, {Bytes: 600}, {}, {Units: 3}, {Bytes: 600}, {}, {Units: 3}, {Bytes: 1}}
	ds, err := l.AdmitCosts(context.Background(), tenants, costs)
	if err != nil {
		t.Fatal(err)
	}
	// plain: 2 a minute whatever the bytes; acme: 600 + 600 > 1KiB; meter:
	// 3u + 3u > 5u; other: 2 a minute.
	if got, want := kinds(ds), "aaaaddda"; got != want {
		t.Errorf("kinds: got %s, want %s", got, want)
	}
	for tenant, want := range map[string]int64{"plain": 2, "acme": 600, "meter": 3, "other": 1} {
		if us := usageOf(t, l, tenant); us[0].Count != want {
			t.Errorf("tenant %s: got %+v, want a count of %d", tenant, us[0], want)
		}
	}
}

func TestAdmitCostsRedis(t *testing.T) {
	rdb := testRedis(t)
	for name, tc := range costCases {
		t.Run(name, func(t *testing.T) { tc(t, rdb) })
	}
}

func TestAdmitCostsRedisCluster(t *testing.T) {
	rdb := testCluster(t)
	for name, tc := range costCases {
		t.Run(name, func(t *testing.T) { tc(t, rdb) })
	}
}

// admitCosts admits the events of tenant, one per cost.
func admitCosts(t *testing.T, l *Limiter, tenant string, costs ...Cost) []Decision {
	t.Helper()
	ds, err := l.AdmitCosts(context.Background(), repeat(tenant, len(costs)), costs)
	if err != nil {
		t.Fatalf("AdmitCosts: %v", err)
	}
	if len(ds) != len(costs) {
		t.Fatalf("AdmitCosts: got %d decisions, want %d", len(ds), len(costs))
	}
	return ds
}

// bytesOf returns costs of the given bytes.
func bytesOf(bs ...int64) []Cost {
	out := make([]Cost, len(bs))
	for i, b := range bs {
		out[i] = Cost{Bytes: b}
	}
	return out
}

// checkDues checks the due times of the deferred events of ds, in order.
func checkDues(t *testing.T, ds []Decision, want ...time.Time) {
	t.Helper()
	var got []time.Time
	for _, d := range ds {
		if d.Kind == Defer {
			got = append(got, d.Due)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("dues: got %v, want %v", got, want)
	}
	for i := range got {
		if !got[i].Equal(want[i]) {
			t.Errorf("deferral %d: got due %v, want %v", i, got[i], want[i])
		}
	}
}

func usageOf(t *testing.T, l *Limiter, tenant string) []Usage {
	t.Helper()
	us, err := l.Usage(context.Background(), tenant)
	if err != nil {
		t.Fatal(err)
	}
	return us
}

// testCostFirstThatFit: the events that fit by their bytes are admitted in
// order, the next are placed by their bytes in the earliest windows, and the
// usage speaks bytes.
func testCostFirstThatFit(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(10 * time.Second))
	l := newTestLimiter(t, rdb, "acme=1000B/1m", Options{Clock: clk.Now, Horizon: 3 * time.Minute})
	// 400+500 fit now (200 more would pass 1000); 200+100 at 10:01 (900
	// more would pass); 900+50 at 10:02.
	ds := admitCosts(t, l, "acme", bytesOf(400, 500, 200, 100, 900, 50)...)
	if got, want := kinds(ds), "aadddd"; got != want {
		t.Fatalf("kinds: got %s, want %s", got, want)
	}
	checkDues(t, ds, t0.Add(time.Minute), t0.Add(time.Minute), t0.Add(2*time.Minute), t0.Add(2*time.Minute))
	us := usageOf(t, l, "acme")
	want := Usage{Rule: "1KB/1m", Unit: "bytes", Count: 900, Limit: 1000, Remaining: 100, Reset: t0.Add(time.Minute)}
	if len(us) != 1 || !us[0].Reset.Equal(want.Reset) {
		t.Fatalf("usage: got %+v, want %+v", us, want)
	}
	if us[0].Reset = want.Reset; us[0] != want {
		t.Errorf("usage: got %+v, want %+v", us, want)
	}
	// A later event that fits the room left now is admitted; one that does
	// not goes after the reservations: 10:02 has 50 left, too little for 60.
	ds = admitCosts(t, l, "acme", bytesOf(100, 60)...)
	if got, want := kinds(ds), "ad"; got != want {
		t.Fatalf("second batch: got %s, want %s", got, want)
	}
	checkDues(t, ds, t0.Add(3*time.Minute))
	clk.Add(time.Minute)
	if us := usageOf(t, l, "acme"); us[0].Count != 300 {
		t.Errorf("usage at 10:01: got %+v, want the 300 bytes reserved there", us[0])
	}
}

// testCostMixedRules: an event is admitted only when every rule, of events,
// bytes or units, has room for its cost.
func testCostMixedRules(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(10 * time.Second))
	l := newTestLimiter(t, rdb, "acme=3/1m,1KiB/1m;meter=5u/1s,1KiB/1s",
		Options{Clock: clk.Now, Horizon: 5 * time.Minute})
	// The event rule stops at three (800 bytes); the next two fit at 10:01.
	ds := admitCosts(t, l, "acme", bytesOf(100, 600, 100, 100, 100)...)
	if got, want := kinds(ds), "aaadd"; got != want {
		t.Fatalf("acme: got %s, want %s", got, want)
	}
	checkDues(t, ds, t0.Add(time.Minute), t0.Add(time.Minute))
	us := usageOf(t, l, "acme")
	if us[0].Unit != "events" || us[0].Count != 3 || us[1].Unit != "bytes" || us[1].Count != 800 || us[1].Remaining != 224 {
		t.Errorf("acme usage: got %+v, want 3 events and 800 bytes (224 left)", us)
	}
	// The byte rule stops before the event rule: 1000 + 24 fills 1KiB.
	l2 := newTestLimiter(t, rdb, "acme=3/1m,1KiB/1m", Options{Clock: clk.Now, Horizon: 5 * time.Minute})
	if got, want := kinds(admitCosts(t, l2, "acme", bytesOf(1000, 24, 1)...)), "aad"; got != want {
		t.Errorf("bytes first: got %s, want %s", got, want)
	}
	// Units and bytes: 3u + 2u fill 5u/1s; the third waits a second.
	ds = admitCosts(t, l, "meter", Cost{Bytes: 10, Units: 3}, Cost{Bytes: 10, Units: 2}, Cost{Bytes: 10, Units: 1})
	if got, want := kinds(ds), "aad"; got != want {
		t.Fatalf("meter: got %s, want %s", got, want)
	}
	checkDues(t, ds, t0.Add(11*time.Second))
	us = usageOf(t, l, "meter")
	if us[0].Rule != "5u/1s" || us[0].Unit != "units" || us[0].Count != 5 || us[1].Count != 20 {
		t.Errorf("meter usage: got %+v, want 5 units and 20 bytes", us)
	}
}

// testCostOverWholeLimit: an event that costs more than a rule's whole
// limit is rejected with its own reason, counts nothing, and does not hold
// up the events after it.
func testCostOverWholeLimit(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(10 * time.Second))
	l := newTestLimiter(t, rdb, "acme=1KiB/1m,10/1m;meter=5u/1s", Options{Clock: clk.Now})
	ds := admitCosts(t, l, "acme", bytesOf(2000, 10, 1025, 10)...)
	if got, want := kinds(ds), "rara"; got != want {
		t.Fatalf("kinds: got %s, want %s", got, want)
	}
	for _, i := range []int{0, 2} {
		if want := "over the whole limit of rule 1KiB/1m"; !strings.Contains(ds[i].Reason, want) {
			t.Errorf("event %d: got reason %q, want it to contain %q", i, ds[i].Reason, want)
		}
	}
	if us := usageOf(t, l, "acme"); us[0].Count != 20 || us[1].Count != 2 {
		t.Errorf("usage: got %+v, want 20 bytes and 2 events", us)
	}
	ds = admitCosts(t, l, "meter", Cost{Units: 6}, Cost{Units: -1})
	if !strings.Contains(ds[0].Reason, "cost of 6 units over the whole limit of rule 5u/1s") ||
		!strings.Contains(ds[1].Reason, "-1 units is negative") || kinds(ds) != "rr" {
		t.Errorf("meter: got %+v, want both rejected with their reasons", ds)
	}
	// Costs are required for a tenant with a byte rule, and must match.
	if _, err := l.Admit(context.Background(), []string{"acme"}); err == nil {
		t.Errorf("Admit without costs for a byte rule: got no error")
	}
	if _, err := l.AdmitCosts(context.Background(), []string{"acme", "acme"}, bytesOf(1)); err == nil {
		t.Errorf("AdmitCosts with 1 cost for 2 events: got no error")
	}
}

// testCostHorizonKnownFull: events that find no room within the horizon
// are rejected, and the tenant is known full for events that cost as much:
// those are rejected without Redis, a cheaper one still goes there.
func testCostHorizonKnownFull(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(500 * time.Millisecond))
	l := newTestLimiter(t, rdb, "acme=1000B/1s", Options{Clock: clk.Now, Horizon: 2 * time.Second})
	ds := admitCosts(t, l, "acme", bytesOf(600, 600, 600, 600, 600)...)
	if got, want := kinds(ds), "addrr"; got != want {
		t.Fatalf("kinds: got %s, want %s", got, want)
	}
	checkDues(t, ds, t0.Add(time.Second), t0.Add(2*time.Second))
	if ds[4].Reason != l.fullReason {
		t.Errorf("reason: got %q, want %q", ds[4].Reason, l.fullReason)
	}
	before := testCounter(l.metrics.cacheHits)
	if got := kinds(admitCosts(t, l, "acme", bytesOf(600, 700)...)); got != "rr" {
		t.Errorf("as costly while full: got %s, want rr", got)
	}
	if got := testCounter(l.metrics.cacheHits) - before; got != 2 {
		t.Errorf("cache hits: got %v, want 2", got)
	}
	// 300 bytes fit the 400 left now: not decided from the cache.
	if got := kinds(admitCosts(t, l, "acme", bytesOf(300)...)); got != "a" {
		t.Errorf("cheaper while full: got %s, want a", got)
	}
	if got := testCounter(l.metrics.cacheHits) - before; got != 2 {
		t.Errorf("cache hits after a cheaper event: got %v, want still 2", got)
	}
}

// testCostTTL: byte rules on ttl windows chain their reservations.
func testCostTTL(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(1234 * time.Millisecond))
	l := newTestLimiter(t, rdb, "acme=1000B/10s", Options{Clock: clk.Now, WindowKind: TTL, Horizon: 25 * time.Second})
	first := clk.Now()
	ds := admitCosts(t, l, "acme", bytesOf(600, 600, 300, 600)...)
	if got, want := kinds(ds), "addd"; got != want {
		t.Fatalf("kinds: got %s, want %s", got, want)
	}
	checkDues(t, ds, first.Add(10*time.Second), first.Add(10*time.Second), first.Add(20*time.Second))
	clk.Set(first.Add(11 * time.Second))
	if us := usageOf(t, l, "acme"); us[0].Count != 900 || us[0].Unit != "bytes" {
		t.Errorf("usage in the chained window: got %+v, want 900 bytes", us[0])
	}
}

// testCostExactness: three limiters decide batches of mixed costs at once;
// per tenant and rule the bytes counted never pass the limit, equal the
// bytes admitted, and each batch admits the most of its events that fit in
// order: the room left at the end is less than the cost of the first event
// each batch rejected.
func testCostExactness(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(30 * time.Second))
	prefix := testPrefix(t)
	const spec = "*=5000B/1m,40/1m;hot=20000B/1m"
	var ls []*Limiter
	for i := 0; i < 3; i++ {
		ls = append(ls, newTestLimiter(t, rdb, spec, Options{Prefix: prefix, Clock: clk.Now, Horizon: time.Nanosecond}))
	}
	tenants := []string{"hot", "t1", "t2"}
	var mu sync.Mutex
	admitted := map[string]int64{}
	events := map[string]int64{}
	firstRejected := map[string]int64{} // the least cost of a batch's first rejected event
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		batch := make([]string, 0, 60)
		costs := make([]Cost, 0, 60)
		for i := 0; i < 60; i++ {
			batch = append(batch, tenants[(i*7+w)%len(tenants)])
			costs = append(costs, Cost{Bytes: int64(50 + (i*37+w*11)%400)})
		}
		wg.Add(1)
		go func(l *Limiter) {
			defer wg.Done()
			for r := 0; r < 4; r++ {
				ds, err := l.AdmitCosts(context.Background(), batch, costs)
				if err != nil {
					t.Errorf("AdmitCosts: %v", err)
					return
				}
				mu.Lock()
				seen := map[string]bool{}
				for i, d := range ds {
					tn := batch[i]
					switch {
					case d.Kind == Admit:
						admitted[tn] += costs[i].Bytes
						events[tn]++
					case d.Kind == Reject && !seen[tn]:
						seen[tn] = true
						if c, ok := firstRejected[tn]; !ok || costs[i].Bytes < c {
							firstRejected[tn] = costs[i].Bytes
						}
					}
				}
				mu.Unlock()
			}
		}(ls[w%3])
	}
	wg.Wait()
	for _, tn := range tenants {
		us := usageOf(t, ls[0], tn)
		byteUse := us[0]
		if byteUse.Count > byteUse.Limit || byteUse.Count != admitted[tn] {
			t.Errorf("tenant %s: counted %d bytes, admitted %d, limit %d", tn, byteUse.Count, admitted[tn], byteUse.Limit)
		}
		if len(us) > 1 && (us[1].Count > us[1].Limit || us[1].Count != events[tn]) {
			t.Errorf("tenant %s: counted %d events, admitted %d, limit %d", tn, us[1].Count, events[tn], us[1].Limit)
		}
		c, ok := firstRejected[tn]
		if !ok {
			t.Errorf("tenant %s: nothing rejected, want the traffic over its limit", tn)
			continue
		}
		// A rejection for the event rule leaves bytes room: only check
		// tenants whose event rule still has room.
		if events[tn] < 40 && byteUse.Remaining >= c {
			t.Errorf("tenant %s: %d bytes left, yet a batch rejected a first event of %d", tn, byteUse.Remaining, c)
		}
	}
}
