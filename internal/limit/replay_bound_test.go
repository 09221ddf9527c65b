package limit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// While commits fail (Low stays put), each batch adds its decisions to the
// replay record until it reaches its bound (ReplayRecordBytes): the next
// batch with new events is refused with ErrReplayFull and counts nothing,
// a batch already in the record still gets its decisions back, and once
// Low moves past the oldest batches the refused one is decided. Every call
// reads and rewrites at most the bound plus one batch: the slowest call is
// printed and held to the ceilings of the bounded-work tests.
func TestReplayRecordBounded(t *testing.T) {
	rdb := privateRedis(t)
	m := newWorkMeter(t, rdb)
	l := newTestLimiter(t, rdb, "*=1/1s", Options{Clock: func() time.Time { return t0 }})
	ctx := context.Background()
	key := l.keys.replay(src(0, 0).Source)
	// Each batch: 250 tenants new to it, two events each (one admitted, one
	// deferred), so that every tenant leaves an exception in the record.
	batch := func(b int) []string {
		out := make([]string, 0, boundedBatch)
		for i := range boundedBatch / 2 {
			n := fmt.Sprintf("b%d-%d", b, i)
			out = append(out, n, n)
		}
		return out
	}
	var first []Decision
	var chunk, refused int64
	full := -1
	for b := 0; b < 1000; b++ {
		before, _ := rdb.StrLen(ctx, key).Result()
		counts := countsOf(t, rdb, l)
		m.reset()
		ds, err := l.AdmitFrom(ctx, src(0, int64(b*boundedBatch)).Source, src(0, int64(b*boundedBatch)).events(batch(b), nil))
		m.check(fmt.Sprintf("batch %d, record of %d bytes", b, before), 1, int64(l.opts.MaxScan))
		if errors.Is(err, ErrReplayFull) {
			full, refused = b, before
			if got := countsOf(t, rdb, l); got != counts {
				t.Errorf("refused batch %d: counts went from %d to %d, want unchanged", b, counts, got)
			}
			if after := rdb.StrLen(ctx, key).Val(); after != before {
				t.Errorf("refused batch %d: record went from %d to %d bytes, want unchanged", b, before, after)
			}
			break
		}
		if err != nil {
			t.Fatalf("batch %d: %v", b, err)
		}
		if b == 0 {
			first = ds
		}
		chunk = max(chunk, rdb.StrLen(ctx, key).Val()-before)
	}
	if full < 0 {
		t.Fatalf("the record never reached its bound of %d bytes in 1000 batches", l.replayBound)
	}
	t.Logf("refused batch %d: record of %d bytes (bound %d, largest chunk %d)", full, refused, l.replayBound, chunk)
	if refused < int64(l.replayBound) || refused > int64(l.replayBound)+chunk {
		t.Errorf("record at the refusal: got %d bytes, want between the bound %d and the bound plus a chunk %d", refused, l.replayBound, int64(l.replayBound)+chunk)
	}
	// At the bound, a batch already decided gets its decisions back.
	m.reset()
	again := admitFrom(t, l, src(0, 0), batch(0))
	m.check("a replay at the bound", 1, 0)
	if kinds(again) != kinds(first) {
		t.Errorf("replay at the bound: got %s, want the first decisions %s", kinds(again), kinds(first))
	}
	// A commit past the first half of the batches frees the record.
	low := int64(full / 2 * boundedBatch)
	s := src(low, int64(full*boundedBatch))
	if _, err := l.AdmitFrom(ctx, s.Source, s.events(batch(full), nil)); err != nil {
		t.Errorf("refused batch after the commit moved to %d: %v", low, err)
	}
	if n := rdb.StrLen(ctx, key).Val(); n > refused {
		t.Errorf("record after the commit moved: got %d bytes, want at most %d", n, refused)
	}
}

// On Redis Cluster each tenant has its own record per partition: the
// records of tenants seen once (made-up names) are deleted as soon as a
// later call of the partition names a Low past them, not after
// ReplayRecordTTL. A record that another owner has since written to at or
// above that Low is kept.
// sweepCase is the start of the Cluster sweep tests: two owners of one
// partition on a real Cluster, and a batch of 200 made-up tenants and x
// (offsets 0 to 200) decided by a.
type sweepCase struct {
	rdb    redis.UniversalClient
	prefix string
	a, b   *Limiter
	made   []string
	first  testSource
}

func newSweepCase(t *testing.T) sweepCase {
	t.Helper()
	rdb := testCluster(t)
	clk := newFakeClock(t0.Add(10 * time.Second))
	c := sweepCase{rdb: rdb, prefix: testPrefix(t), made: madeUp(200, "made-up"), first: src(0, 0)}
	c.a = newTestLimiter(t, rdb, "*=1/1m", Options{Clock: clk.Now, Prefix: c.prefix, ReplayScope: "g"})
	c.b = newTestLimiter(t, rdb, "*=1/1m", Options{Clock: clk.Now, Prefix: c.prefix, ReplayScope: "g"})
	c.first.TopicID = "AAAAAAAAAAAAAAAAAAAAAA"
	admitFrom(t, c.a, c.first, append(append([]string{}, c.made...), "x"))
	return c
}

func TestReplayRecordClusterSweep(t *testing.T) {
	c := newSweepCase(t)
	rdb, ctx, prefix, a, b, made, first := c.rdb, context.Background(), c.prefix, c.a, c.b, c.made, c.first
	exists := func(tenant string) bool {
		return rdb.Exists(ctx, a.keys.tenantReplay(tenant, first.Source)).Val() == 1
	}
	live := 0
	for _, n := range made {
		if exists(n) {
			live++
		}
	}
	if live != len(made) || !exists("x") {
		t.Fatalf("after the first batch: %d of %d made-up records, x's: %v; want all", live, len(made), exists("x"))
	}
	// Another owner (a later generation, its Low still 0) decides x at 500.
	other := src(0, 500)
	other.TopicID = first.TopicID
	firstX := kinds(admitFrom(t, b, other, []string{"x", "x"}))
	// The batch after the commit of the first: Low 201.
	next := src(201, 201)
	next.TopicID = first.TopicID
	admitFrom(t, a, next, []string{"good"})
	live = 0
	for _, n := range made {
		if exists(n) {
			live++
		}
	}
	if live != 0 {
		t.Errorf("made-up records after the commit passed them: got %d of %d, want 0", live, len(made))
	}
	if !exists("good") {
		t.Errorf("the record of the batch after the commit is gone")
	}
	if !exists("x") {
		t.Fatalf("x's record, which holds another owner's decisions above the commit, is gone")
	}
	if got := kinds(admitFrom(t, b, other, []string{"x", "x"})); got != firstX {
		t.Errorf("x replayed by the other owner: got %s, want %s", got, firstX)
	}
	n := 0
	for _, addr := range clusterMasters(t, rdb.(*redis.ClusterClient)) {
		c := redis.NewClient(&redis.Options{Addr: addr})
		keys, err := c.Keys(ctx, prefix+":*:replay:*").Result()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		n += len(keys)
		for _, k := range keys {
			if !strings.Contains(k, "{good}") && !strings.Contains(k, "{x}") {
				t.Errorf("replay record left: %s", k)
			}
		}
	}
	t.Logf("replay records left after the sweep: %d (good's and x's)", n)
}

// A partition that receives nothing after a batch of made-up tenants: the
// commit past the batch deletes their records on Cluster (Committed), not
// their lifetime; a record holding another owner's decisions above the
// commit stays, and so does every record of another partition.
func TestReplayRecordClusterSweepOnCommit(t *testing.T) {
	c := newSweepCase(t)
	rdb, ctx, a, b, made, first := c.rdb, context.Background(), c.a, c.b, c.made, c.first
	elsewhere := src(0, 0)
	elsewhere.Partition = 4
	elsewhere.TopicID = first.TopicID
	admitFrom(t, a, elsewhere, []string{"other-partition"})
	other := src(0, 500)
	other.TopicID = first.TopicID
	firstX := kinds(admitFrom(t, b, other, []string{"x", "x"}))
	exists := func(tenant string, s Source) bool {
		return rdb.Exists(ctx, a.keys.tenantReplay(tenant, s)).Val() == 1
	}
	live := func() (n int) {
		for _, m := range made {
			if exists(m, first.Source) {
				n++
			}
		}
		return n
	}
	if n := live(); n != len(made) {
		t.Fatalf("after the batch: %d of %d made-up records; want all", n, len(made))
	}
	// A commit inside the batch passes the records of offsets 0 to 149 only.
	a.Committed(first.Topic, first.Partition, 150)
	if n := live(); n != len(made)-150 {
		t.Errorf("after a commit at 150: %d of %d made-up records; want %d", n, len(made), len(made)-150)
	}
	a.Committed(first.Topic, first.Partition, 201)
	if n := live(); n != 0 {
		t.Errorf("after the commit past the batch: %d of %d made-up records; want 0", n, len(made))
	}
	if !exists("x", first.Source) {
		t.Fatalf("x's record, which holds another owner's decisions above the commit, is gone")
	}
	if !exists("other-partition", elsewhere.Source) {
		t.Errorf("the record of partition 4 is gone after a commit of partition 3")
	}
	if got := kinds(admitFrom(t, b, other, []string{"x", "x"})); got != firstX {
		t.Errorf("x replayed by the other owner: got %s, want %s", got, firstX)
	}
}
