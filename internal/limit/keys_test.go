package limit

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"
)

// TestAdmitScriptKeys holds admit.lua to the key layout of keys.go: the
// script gets only rule keys (and frontier keys) in KEYS and adds the window
// and anchor suffixes itself, so the keys it writes must be exactly those
// keys.window and keys.anchor return. Two tenants (one plain, one encoded)
// each admit two events and defer three into the next two windows of
// "*=2/10s", in aligned and in ttl windows.
func TestAdmitScriptKeys(t *testing.T) {
	rdb := testRedis(t)
	tenants := []string{"acme", "odd tenant{x}"}
	starts := []time.Time{t0, t0.Add(10 * time.Second), t0.Add(20 * time.Second)}
	for _, kind := range []WindowKind{Aligned, TTL} {
		t.Run(string(kind), func(t *testing.T) {
			clk := newFakeClock(t0)
			prefix := testPrefix(t)
			l := newTestLimiter(t, rdb, "*=2/10s", Options{Prefix: prefix, Clock: clk.Now, WindowKind: kind, Horizon: time.Minute})
			var want, frontiers []string
			for _, tenant := range tenants {
				if got := kinds(admit(t, l, repeat(tenant, 5))); got != "aaddd" {
					t.Fatalf("tenant %q: got decisions %s, want aaddd", tenant, got)
				}
				rules := l.Rules().For(tenant)
				for _, s := range starts {
					want = append(want, l.keys.window(tenant, rules[0], s))
				}
				if kind == TTL {
					want = append(want, l.keys.anchor(tenant, rules[0]))
				}
				frontiers = append(frontiers, l.keys.frontier(tenant, ruleSetID(kind, rules)))
			}
			got := scanKeys(t, rdb, prefix)
			// Frontier keys are built in Go and passed in KEYS: whether the
			// script wrote one here is not what this test is about.
			got = slices.DeleteFunc(got, func(k string) bool { return slices.Contains(frontiers, k) })
			slices.Sort(got)
			slices.Sort(want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("keys admit.lua wrote (-keys.go +script):\n%s", diff)
			}
		})
	}
}

// scanKeys returns every key under prefix.
func scanKeys(t *testing.T, rdb redis.UniversalClient, prefix string) []string {
	t.Helper()
	ctx := context.Background()
	var out []string
	iter := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		out = append(out, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("scan %s:*: %v", prefix, err)
	}
	return out
}
