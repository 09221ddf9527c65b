package limit

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// testRedis returns a client for the real Redis named by GATEKEEPER_TEST_REDIS
// (make test starts one and sets it).
func testRedis(t testing.TB) redis.UniversalClient {
	t.Helper()
	addr := os.Getenv("GATEKEEPER_TEST_REDIS")
	if addr == "" {
		t.Skip("GATEKEEPER_TEST_REDIS is not set: run `make test`, which starts a real Redis")
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis %s: %v", addr, err)
	}
	return c
}

// testCluster returns a client for the real Redis Cluster named by
// GATEKEEPER_TEST_REDIS_CLUSTER (comma-separated; make test starts one).
func testCluster(t testing.TB) redis.UniversalClient {
	t.Helper()
	addrs := os.Getenv("GATEKEEPER_TEST_REDIS_CLUSTER")
	if addrs == "" {
		t.Skip("GATEKEEPER_TEST_REDIS_CLUSTER is not set: run `make test`, which starts a real Redis Cluster")
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addrs, ",")})
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis cluster %s: %v", addrs, err)
	}
	return c
}

var prefixSeq atomic.Int64

// testPrefix returns a key prefix no other test run uses.
func testPrefix(t testing.TB) string {
	return fmt.Sprintf("gktest:%d:%d:%s", time.Now().UnixNano(), prefixSeq.Add(1), strings.ReplaceAll(t.Name(), "/", "."))
}

// fakeClock is a settable clock, safe for concurrent use.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock(t time.Time) *fakeClock { return &fakeClock{t: t} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

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
