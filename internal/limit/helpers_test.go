package limit

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// testRedis returns a client of the real Redis of GATEKEEPER_TEST_REDIS
// (make test starts one and sets it).
func testRedis(t testing.TB) redis.UniversalClient {
	c, _ := testenv.Redis(t)
	return c
}

// testCluster returns a client of the real Redis Cluster of
// GATEKEEPER_TEST_REDIS_CLUSTER (make test starts one).
func testCluster(t testing.TB) redis.UniversalClient { return testenv.RedisCluster(t) }

var prefixSeq atomic.Int64

// testPrefix returns a key prefix no other test run uses.
func testPrefix(t testing.TB) string {
	p := fmt.Sprintf("gktest:%d:%d:%s", time.Now().UnixNano(), prefixSeq.Add(1), strings.ReplaceAll(t.Name(), "/", "."))
	if strings.Contains(t.Name(), "OneSlot/") {
		return "{" + p + "}" // every key in one Redis Cluster slot (OneSlot)
	}
	return p
}

// fakeClock is testenv's settable clock.
type fakeClock = testenv.Clock

func newFakeClock(t time.Time) *fakeClock { return testenv.NewClock(t) }

func mustRules(t testing.TB, spec string) *Rules {
	t.Helper()
	r, err := ParseRules(spec)
	if err != nil {
		t.Fatalf("ParseRules(%q): %v", spec, err)
	}
	return r
}

func newTestLimiter(t testing.TB, rdb redis.UniversalClient, spec string, opts Options) *Limiter {
	t.Helper()
	if opts.Prefix == "" {
		opts.Prefix = testPrefix(t)
	}
	l, err := New(context.Background(), rdb, mustRules(t, spec), opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return l
}

func repeat(tenant string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = tenant
	}
	return out
}

// kinds summarises decisions as a string of a/d/r letters.
func kinds(ds []Decision) string {
	var b strings.Builder
	for _, d := range ds {
		b.WriteString(d.Kind.String()[:1])
	}
	return b.String()
}
