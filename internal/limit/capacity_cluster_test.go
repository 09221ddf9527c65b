package limit

import (
	"context"
	"errors"
	"math/rand"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// evalCounter counts the script calls a client sends (EVALSHA and EVAL).
type evalCounter struct{ n atomic.Int64 }

func (c *evalCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *evalCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := strings.ToLower(cmd.Name()); name == "evalsha" || name == "eval" {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (c *evalCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if name := strings.ToLower(cmd.Name()); name == "evalsha" || name == "eval" {
				c.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// On Redis Cluster a capacity's keys are global, and each tenant's keys sit
// in their own slot: under a plain key prefix a capacity is refused. A
// prefix with a hash tag ({...}) puts every key in one slot: the limiter
// then decides a batch of many tenants in one call, as on one Redis, and
// the capacity is kept exactly across limiters, as there.
func TestCapacityRedisClusterOneSlot(t *testing.T) {
	rdb := testCluster(t).(*redis.ClusterClient)
	c, err := ParseCapacity("300/1s,5000/1m")
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(context.Background(), rdb, mustRules(t, "*=1000/1m"), Options{Prefix: testPrefix(t), Capacity: c})
	if !errors.Is(err, ErrCapacityCluster) {
		t.Fatalf("a capacity on Redis Cluster under a plain prefix: got %v, want ErrCapacityCluster", err)
	}

	calls := &evalCounter{}
	rdb.AddHook(calls)
	prefix := "{" + testPrefix(t) + "}"
	l := newTestLimiter(t, rdb, "*=1000/1m", Options{Prefix: prefix, Capacity: c})
	tenants := make([]string, 200)
	for i := range tenants {
		tenants[i] = "t" + string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	before := calls.n.Load()
	if _, err := l.Admit(context.Background(), tenants); err != nil {
		t.Fatalf("Admit: %v", err)
	}
	if n := calls.n.Load() - before; n != 1 {
		t.Errorf("a batch of 200 tenants under a one-slot prefix took %d script calls, want 1", n)
	}

	exactAcross(t, rdb, "{"+testPrefix(t)+"}", "300/1s,5000/1m", "*=1000/1m;t0=weight:5;t1=floor:40/1s",
		func(*rand.Rand) Cost { return Cost{} })
}

// Without a tag in the prefix, Redis Cluster still takes a call per tenant
// (each tenant's keys in their own slot); with one, a call per batch.
func TestOneSlot(t *testing.T) {
	for prefix, want := range map[string]bool{"gk": false, "{gk}": true, "{gk}:x": true, "a{b}c": true,
		"{}": false, "}{": false, "{": false, "gk}": false, "{}{x}": false} {
		if got := OneSlot(prefix); got != want {
			t.Errorf("OneSlot(%q) = %v, want %v", prefix, got, want)
		}
	}
}
