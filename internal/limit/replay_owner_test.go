package limit

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"
)

// A batch decided by one owner and redelivered to the partition's next owner
// gets its first decisions back even when the next owner knows the tenant is
// full: a local rejection would not give back the slots the first owner took
// and would dead-letter events it admitted or deferred (G9). The next owner
// is another process (a crash, or a staged batch left unwritten), or this
// process owning the partition again after another did (a new Assignment).
// The tenant may be absent from the next owner's first batch of the
// partition: on Redis Cluster, where each tenant has a record of its own,
// the other tenants' records say nothing of its. Once a reply has said how
// far the record goes, the tenant's later events are decided locally again.
func TestReplayNextOwnerKnowsFull(t *testing.T) {
	cases := []struct {
		name string
		// again: this process owned partition 3 before the first owner
		// decided there (offset 0 of x, under assignment 1).
		again bool
		// others: the first owner's batch starts with two events of y,
		// which the next owner decides alone first.
		others bool
	}{
		{name: "another process"},
		{name: "this process again", again: true},
		{name: "absent from the first batch", others: true},
	}
	servers := []struct {
		name string
		rdb  func(t *testing.T) redis.UniversalClient
	}{
		{"redis", func(t *testing.T) redis.UniversalClient { return testRedis(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return testCluster(t) }},
	}
	for _, srv := range servers {
		for _, tc := range cases {
			t.Run(srv.name+"/"+tc.name, func(t *testing.T) {
				rdb := srv.rdb(t)
				clk := newFakeClock(t0.Add(10 * time.Second))
				opts := Options{Clock: clk.Now, Prefix: testPrefix(t), Horizon: 2 * time.Minute}
				first := newTestLimiter(t, rdb, "*=2/1m", opts)
				next := newTestLimiter(t, rdb, "*=2/1m", opts)

				p3 := src(0, 0)
				if tc.again {
					p3.Assignment = 1
					if got := kinds(admitFrom(t, next, p3, []string{"x"})); got != "a" {
						t.Fatalf("this process, first: got %s, want a", got)
					}
					p3.Low, p3.from = 1, 1
				}
				p3.Assignment = 7 // the first owner's
				batch := []string{"x", "x", "x"}
				if tc.others {
					batch = []string{"y", "y", "x", "x", "x"}
				}
				decided := admitFrom(t, first, p3, batch)
				if got, want := kinds(decided), map[bool]string{false: "aad", true: "add"}[tc.again]; got[len(got)-3:] != want {
					t.Fatalf("first owner: got %s, want x's %s", got, want)
				}
				// The next owner's own partition fills x up to the horizon:
				// x is known full there.
				p4 := src(0, 0)
				p4.Partition, p4.Assignment = 4, 2
				if got := kinds(admitFrom(t, next, p4, repeat("x", 9))); got[len(got)-1] != 'r' {
					t.Fatalf("next owner, partition 4: got %s, want x full by the end", got)
				}
				before := countsOf(t, rdb, first)
				// Partition 3 moves to the next owner, which decides the
				// same offsets again (y's first, alone, when there are).
				p3.Assignment = 3
				var again []Decision
				if tc.others {
					again = admitFrom(t, next, p3, batch[:2])
					p3.from += 2
				}
				again = append(again, admitFrom(t, next, p3, batch[len(again):])...)
				if diff := cmp.Diff(decided, again); diff != "" {
					t.Errorf("redelivered batch, decided by the next owner (-first +again):\n%s", diff)
				}
				if got := countsOf(t, rdb, first); got != before {
					t.Errorf("counts: %d after the replay, %d before", got, before)
				}
				// Past the record, x's events are decided without Redis.
				hits := testCounter(next.metrics.cacheHits)
				p3.from += 3
				if got := kinds(admitFrom(t, next, p3, []string{"x", "x"})); got != "rr" {
					t.Errorf("after the replay: got %s, want rr", got)
				}
				if got := testCounter(next.metrics.cacheHits) - hits; got != 2 {
					t.Errorf("after the replay: %v events decided from the cache, want 2", got)
				}
			})
		}
	}
}
