package limit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"
)

// replayCases run against a single Redis and against a Redis Cluster.
var replayCases = map[string]admitCase{
	"SameBatchTwice":       testReplaySameBatch,
	"OtherBoundaries":      testReplayOtherBoundaries,
	"AfterLowMoved":        testReplayAfterLowMoved,
	"TimeoutThenRetry":     testReplayTimeoutThenRetry,
	"ReplayedBeforeNew":    testReplayedBeforeNew,
	"RecordKeyAndLifetime": testReplayRecordKey,
	"OtherDeployment":      testReplayOtherDeployment,
	"RecreatedTopic":       testReplayRecreatedTopic,
}

// A topic deleted and created again under the same name (a new topic ID)
// starts at the same offsets: its events get fresh decisions, never the
// old topic's, whose own record stays where it was.
func testReplayRecreatedTopic(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(10 * time.Second))
	l := newTestLimiter(t, rdb, "*=1/1m", Options{Clock: clk.Now, ReplayScope: "group"})
	old, recreated := src(0, 0), src(0, 0)
	old.TopicID, recreated.TopicID = "AAAAAAAAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBBBBBBBB"
	if got := kinds(admitFrom(t, l, old, []string{"x", "x", "x"})); got != "add" {
		t.Fatalf("old topic: got %s, want add", got)
	}
	if got := kinds(admitFrom(t, l, recreated, []string{"p", "q", "r"})); got != "aaa" {
		t.Errorf("re-created topic, same offsets, other tenants: got %s, want aaa (fresh decisions, not the old topic's)", got)
	}
	if got := kinds(admitFrom(t, l, old, []string{"x", "x", "x"})); got != "add" {
		t.Errorf("old topic replayed: got %s, want its first decisions add", got)
	}
}

// Two deployments sharing a Redis and a key prefix (but not a group) never
// take each other's decisions for the same topic, partition and offsets:
// the replay record is scoped by Options.ReplayScope.
func testReplayOtherDeployment(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(10 * time.Second))
	prefix := testPrefix(t)
	a := newTestLimiter(t, rdb, "*=1/1m", Options{Clock: clk.Now, Prefix: prefix, ReplayScope: "deploy-a"})
	b := newTestLimiter(t, rdb, "*=1/1m", Options{Clock: clk.Now, Prefix: prefix, ReplayScope: "deploy-b"})
	if got := kinds(admitFrom(t, a, src(0, 0), []string{"x", "x", "x"})); got != "add" {
		t.Fatalf("deployment a: got %s, want add", got)
	}
	if got := kinds(admitFrom(t, b, src(0, 0), []string{"p", "q", "r"})); got != "aaa" {
		t.Errorf("deployment b, same offsets, other tenants: got %s, want aaa (its own decisions, not a's)", got)
	}
	if got := kinds(admitFrom(t, a, src(0, 0), []string{"x", "x", "x"})); got != "add" {
		t.Errorf("deployment a replayed: got %s, want its first decisions add", got)
	}
}

func TestReplayRedis(t *testing.T) {
	rdb := testRedis(t)
	for name, tc := range replayCases {
		t.Run(name, func(t *testing.T) { tc(t, rdb) })
	}
}

func TestReplayRedisCluster(t *testing.T) {
	rdb := testCluster(t)
	for name, tc := range replayCases {
		t.Run(name, func(t *testing.T) { tc(t, rdb) })
	}
}

// testSource is a Source whose events sit at offsets from, from+1, ...
type testSource struct {
	Source
	from int64
}

// src returns the source of events at offsets from, from+1, ... of
// partition 3 of topic "in", with Low low.
func src(low, from int64) testSource {
	return testSource{Source: Source{Topic: "in", Partition: 3, Low: low}, from: from}
}

// events returns the events of tenants at s's offsets, with costs
// (index-aligned with tenants; nil: zero costs).
func (s testSource) events(tenants []string, costs []Cost) []Event {
	evs := make([]Event, len(tenants))
	for i, t := range tenants {
		evs[i] = Event{Tenant: t, Offset: s.from + int64(i)}
		if costs != nil {
			evs[i].Cost = costs[i]
		}
	}
	return evs
}

func admitFrom(t *testing.T, l *Limiter, s testSource, tenants []string) []Decision {
	t.Helper()
	ds, err := l.AdmitFrom(context.Background(), s.Source, s.events(tenants, nil))
	if err != nil {
		t.Fatalf("AdmitFrom(%s/%d from %d): %v", s.Topic, s.Partition, s.from, err)
	}
	return ds
}

// countsOf sums the counts of every window key under the limiter's prefix,
// current and future windows alike: what G9 compares with the events decided.
func countsOf(t *testing.T, rdb redis.UniversalClient, l *Limiter) int64 {
	t.Helper()
	ctx := context.Background()
	var total int64
	sum := func(ctx context.Context, c *redis.Client) error {
		it := c.Scan(ctx, 0, l.opts.Prefix+":*", 1000).Iterator()
		for it.Next(ctx) {
			n, err := c.HGet(ctx, it.Val(), "count").Int64()
			if err == nil {
				total += n
			}
		}
		return it.Err()
	}
	var err error
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		for _, addr := range clusterMasters(t, cc) {
			c := redis.NewClient(&redis.Options{Addr: addr})
			err = errors.Join(err, sum(ctx, c))
			c.Close()
		}
	} else {
		err = sum(ctx, rdb.(*redis.Client))
	}
	if err != nil {
		t.Fatalf("sum counts: %v", err)
	}
	return total
}

// clusterMasters returns the addresses of the Cluster's masters.
func clusterMasters(t *testing.T, cc *redis.ClusterClient) []string {
	t.Helper()
	slots, err := cc.ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatalf("cluster slots: %v", err)
	}
	seen := map[string]bool{}
	var out []string
	for _, s := range slots {
		if a := s.Nodes[0].Addr; !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	return out
}

// counted is how many of ds count in some window: admitted and deferred.
func counted(ds []Decision) int64 {
	var n int64
	for _, d := range ds {
		if d.Kind == Admit || d.Kind == Defer {
			n++
		}
	}
	return n
}

// replayBatch is a batch with every kind of decision: under 2/1m and a
// two-minute horizon, a's 9 events are admitted, deferred and rejected.
var replayBatch = strings.Fields("a b a a c a a b a a a d a")

// The same batch decided twice gets the same decisions (defer: the same due
// and until; reject: the same reason) and counts once. After the first call
// a is known to be full: its replayed events still go to Redis, for their
// recorded decisions.
func testReplaySameBatch(t *testing.T, rdb redis.UniversalClient) {
	for _, kind := range []WindowKind{Aligned, TTL} {
		t.Run(string(kind), func(t *testing.T) {
			clk := newFakeClock(t0.Add(10 * time.Second))
			l := newTestLimiter(t, rdb, "*=2/1m", Options{Clock: clk.Now, WindowKind: kind, Horizon: 2 * time.Minute})
			s := src(0, 100)
			first := admitFrom(t, l, s, replayBatch)
			if got, want := kinds(first), "aaadaddadrrar"; got != want {
				t.Fatalf("first decisions: got %s, want %s", got, want)
			}
			before := countsOf(t, rdb, l)
			if want := counted(first); before != want {
				t.Fatalf("counts after the first call: got %d, want %d", before, want)
			}
			clk.Add(5 * time.Second)
			again := admitFrom(t, l, s, replayBatch)
			if diff := cmp.Diff(first, again); diff != "" {
				t.Errorf("replayed decisions (-first +again):\n%s", diff)
			}
			if got := countsOf(t, rdb, l); got != before {
				t.Errorf("counts after the replay: got %d, want %d", got, before)
			}
			if got, want := testCounter(l.metrics.replayed), float64(len(replayBatch)); got != want {
				t.Errorf("replayed decisions metric: got %v, want %v", got, want)
			}
		})
	}
}

// A replay whose batches have other boundaries (overlapping the first ones
// and going past them) gets the recorded decisions of the offsets decided
// before and decides the others as new.
func testReplayOtherBoundaries(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(10 * time.Second))
	l := newTestLimiter(t, rdb, "*=4/1m", Options{Clock: clk.Now, Horizon: 10 * time.Minute})
	tenants := repeat("a", 12)
	first := append(admitFrom(t, l, src(0, 0), tenants[:5]), admitFrom(t, l, src(0, 5), tenants[5:8])...)
	if got, want := kinds(first), "aaaadddd"; got != want {
		t.Fatalf("first decisions: got %s, want %s", got, want)
	}
	// Offsets 3 to 11 in one batch: 3 to 7 replayed, 8 to 11 new.
	again := admitFrom(t, l, src(0, 3), tenants[3:12])
	if diff := cmp.Diff(first[3:8], again[:5]); diff != "" {
		t.Errorf("replayed decisions (-first +again):\n%s", diff)
	}
	if got, want := kinds(again[5:]), "dddd"; got != want {
		t.Errorf("new decisions: got %s, want %s", got, want)
	}
	if again[5].Due.Equal(first[7].Due) {
		t.Errorf("offset 8: got due %v, the full window of offset 7: want the next one", again[5].Due)
	}
	if got, want := countsOf(t, rdb, l), int64(12); got != want {
		t.Errorf("counts: got %d, want %d (12 distinct events)", got, want)
	}
}

// Once Low has passed an offset, the record forgets it: decided again, the
// event is counted as new (no replay can reach below Low in practice).
func testReplayAfterLowMoved(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(10 * time.Second))
	l := newTestLimiter(t, rdb, "*=100/1m", Options{Clock: clk.Now})
	tenants := repeat("a", 5)
	admitFrom(t, l, src(0, 0), tenants)
	admitFrom(t, l, src(5, 5), tenants) // commits up to 5 known: 0 to 4 are dropped
	admitFrom(t, l, src(5, 5), tenants) // a replay of 5 to 9
	if got, want := countsOf(t, rdb, l), int64(10); got != want {
		t.Fatalf("counts before the stale replay: got %d, want %d", got, want)
	}
	admitFrom(t, l, src(5, 0), tenants)
	if got, want := countsOf(t, rdb, l), int64(15); got != want {
		t.Errorf("counts after replaying offsets below Low: got %d, want %d (counted as new)", got, want)
	}
}

// lostReply runs commands but reports the first script reply as timed out:
// the call ran in Redis and the client did not hear back.
type lostReply struct{ lost int }

func (h *lostReply) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *lostReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && h.lost == 0 && strings.HasPrefix(cmd.Name(), "eval") {
			h.lost++
			cmd.SetErr(context.DeadlineExceeded)
			return context.DeadlineExceeded
		}
		return err
	}
}

func (h *lostReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err == nil && h.lost == 0 {
			h.lost++
			cmds[0].SetErr(context.DeadlineExceeded)
			return context.DeadlineExceeded
		}
		return err
	}
}

// A script call that ran in Redis but whose reply the client lost, sent
// again (route.Admission retries Admit): the retry counts nothing more.
func testReplayTimeoutThenRetry(t *testing.T, rdb redis.UniversalClient) {
	var c redis.UniversalClient
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: clusterMasters(t, cc)})
	} else {
		c = redis.NewClient(&redis.Options{Addr: rdb.(*redis.Client).Options().Addr})
	}
	t.Cleanup(func() { c.Close() })
	clk := newFakeClock(t0.Add(10 * time.Second))
	l, err := New(context.Background(), c, mustRules(t, "*=3/1m"), Options{Prefix: testPrefix(t), Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	c.AddHook(&lostReply{})
	s := src(0, 40)
	tenants := repeat("a", 5)
	if _, err := l.AdmitFrom(context.Background(), s.Source, s.events(tenants, nil)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first call: got %v, want the lost reply", err)
	}
	if got, want := countsOf(t, rdb, l), int64(5); got != want {
		t.Fatalf("counts after the lost reply: got %d, want %d (the call ran)", got, want)
	}
	ds := admitFrom(t, l, s, tenants)
	if got, want := kinds(ds), "aaadd"; got != want {
		t.Errorf("retried decisions: got %s, want %s", got, want)
	}
	if got, want := countsOf(t, rdb, l), int64(5); got != want {
		t.Errorf("counts after the retry: got %d, want %d", got, want)
	}
}

// Replayed events of a tenant that come before its new events in a batch:
// the new ones are decided after what the replayed ones were counted as.
func testReplayedBeforeNew(t *testing.T, rdb redis.UniversalClient) {
	for _, kind := range []WindowKind{Aligned, TTL} {
		t.Run(string(kind), func(t *testing.T) {
			clk := newFakeClock(t0.Add(10 * time.Second))
			l := newTestLimiter(t, rdb, "*=4/1m;b=2/1m,3/1h", Options{Clock: clk.Now, WindowKind: kind})
			first := admitFrom(t, l, src(0, 0), strings.Fields("a b a c a"))
			if got, want := kinds(first), "aaaaa"; got != want {
				t.Fatalf("first decisions: got %s, want %s", got, want)
			}
			ds := admitFrom(t, l, src(0, 0), strings.Fields("a b a c a a b a b c"))
			if got, want := kinds(ds), "aaaaaaadda"; got != want {
				t.Errorf("decisions: got %s, want %s", got, want)
			}
			want := []int64{4, 2, 2}
			for i, tenant := range []string{"a", "b", "c"} {
				us, err := l.Usage(context.Background(), tenant)
				if err != nil || us[0].Count != want[i] {
					t.Errorf("%s's usage: got %+v %v, want count %d", tenant, us, err, want[i])
				}
			}
			if got, want := countsOf(t, rdb, l), int64(5+6+2); got != want {
				t.Errorf("counts: got %d, want %d (a 5; b 3 in each of its two rules, one deferred; c 2)", got, want)
			}
		})
	}
}

// The record is one key per partition on a single Redis, one per tenant and
// partition on a Cluster, and lives ReplayRecordTTL after its last write.
func testReplayRecordKey(t *testing.T, rdb redis.UniversalClient) {
	clk := newFakeClock(t0.Add(10 * time.Second))
	l := newTestLimiter(t, rdb, "*=3/1m", Options{Clock: clk.Now})
	admitFrom(t, l, src(0, 0), []string{"a", "b", "a"})
	want := []string{l.opts.Prefix + ":replay:in:3"}
	if _, ok := rdb.(*redis.ClusterClient); ok {
		want = []string{l.opts.Prefix + ":{a}:replay:in:3", l.opts.Prefix + ":{b}:replay:in:3"}
	}
	for _, k := range want {
		if got := pttl(t, rdb, k); got <= ReplayRecordTTL-time.Minute || got > ReplayRecordTTL {
			t.Errorf("%s: got PTTL %v, want about %v", k, got, ReplayRecordTTL)
		}
	}
	// A record key of another type is taken as empty and replaced.
	if err := rdb.Del(context.Background(), want[0]).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(context.Background(), want[0], "x", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if got := kinds(admitFrom(t, l, src(0, 3), []string{"a"})); got != "a" {
		t.Errorf("with a hash at the record key: got %s, want a", got)
	}
	if typ := rdb.Type(context.Background(), want[0]).Val(); typ != "string" {
		t.Errorf("record key type after the call: got %s, want string", typ)
	}
}

func TestAdmitFromBadSource(t *testing.T) {
	rdb := testRedis(t)
	l := newTestLimiter(t, rdb, "*=3/1m", Options{})
	for name, evs := range map[string][]Event{
		"negative": {{Tenant: "a", Offset: 1}, {Tenant: "b", Offset: -1}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := l.AdmitFrom(context.Background(), Source{Topic: "in"}, evs); err == nil {
				t.Errorf("got no error, want one for %v", fmt.Sprint(evs))
			}
		})
	}
}
