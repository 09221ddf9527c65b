package worker

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// testCluster returns the addresses of GATEKEEPER_TEST_REDIS_CLUSTER, and
// skips the test when it is not set.
func testCluster(t *testing.T) []string {
	t.Helper()
	env := os.Getenv("GATEKEEPER_TEST_REDIS_CLUSTER")
	if env == "" {
		t.Skip("GATEKEEPER_TEST_REDIS_CLUSTER is not set: run `make test`, which starts a real Redis Cluster")
	}
	return strings.Split(env, ",")
}

// TestNewRedisKind checks which client REDIS_ADDRS and REDIS_CLUSTER give,
// against a real Redis and a real Redis Cluster: with auto, more than one
// address is a cluster and one address is asked with CLUSTER INFO.
func TestNewRedisKind(t *testing.T) {
	_, single := testenv.Redis(t)
	nodes := testCluster(t)
	tests := []struct {
		name    string
		addrs   []string
		mode    string
		cluster bool
	}{
		{"auto, one Redis", []string{single}, RedisClusterAuto, false},
		{"empty is auto, one Redis", []string{single}, "", false},
		{"auto, one cluster node", nodes[:1], RedisClusterAuto, true},
		{"auto, three cluster nodes", nodes, RedisClusterAuto, true},
		{"true, one cluster node", nodes[:1], RedisClusterTrue, true},
		{"false, one Redis", []string{single}, RedisClusterFalse, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rdb, err := NewRedis(context.Background(), &Config{RedisConfig: RedisConfig{RedisAddrs: tt.addrs, RedisCluster: tt.mode, RedisTimeout: 2 * time.Second}})
			if err != nil {
				t.Fatalf("got %v, want a client", err)
			}
			defer rdb.Close()
			switch c := rdb.(type) {
			case *redis.ClusterClient:
				if !tt.cluster {
					t.Errorf("got a cluster client, want a single-node client")
				}
			case *redis.Client:
				if tt.cluster {
					t.Errorf("got a single-node client, want a cluster client")
				} else if got := c.Options().Addr; got != tt.addrs[0] {
					t.Errorf("got address %q, want %q", got, tt.addrs[0])
				}
			default:
				t.Errorf("got %T, want *redis.Client or *redis.ClusterClient", rdb)
			}
		})
	}
}

// TestNewRedisOneClusterAddress checks that one address of a Redis Cluster
// node is enough: the limiter counts tenants whose keys live on every
// master, where a single-node client would get MOVED.
func TestNewRedisOneClusterAddress(t *testing.T) {
	nodes := testCluster(t)
	cfg := &Config{RedisConfig: RedisConfig{RedisAddrs: nodes[:1], RedisTimeout: 2 * time.Second}}
	ctx := context.Background()
	rdb, err := NewRedis(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	rules, err := limit.ParseRules("*=10/1m")
	if err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf("gktest-onenode-%d", time.Now().UnixNano())
	lim, err := limit.New(ctx, rdb, rules, limit.Options{Prefix: prefix, WindowKind: limit.Aligned, Horizon: time.Hour, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("start limiter: %v", err)
	}
	var tenants []string
	for i := range 30 { // 30 tenants hash to slots on all three masters
		tenants = append(tenants, fmt.Sprintf("tenant-%d", i))
	}
	decisions, err := lim.Admit(ctx, tenants)
	if err != nil {
		t.Fatalf("admit: got %v, want every tenant counted", err)
	}
	for i, d := range decisions {
		if d.Kind != limit.Admit {
			t.Errorf("tenant %s: got %v, want admit", tenants[i], d.Kind)
		}
	}
	t.Cleanup(func() {
		if c, ok := rdb.(*redis.ClusterClient); ok {
			_ = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
				iter := n.Scan(ctx, 0, prefix+":*", 100).Iterator()
				for iter.Next(ctx) {
					n.Del(ctx, iter.Val())
				}
				return nil
			})
		}
	})
}

// TestNewRedisUnreachable checks that REDIS_CLUSTER=auto with one address
// that nothing answers fails with an error that waiting may cure, so that
// the worker waits for Redis instead of stopping.
func TestNewRedisUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	rdb, err := NewRedis(context.Background(), &Config{RedisConfig: RedisConfig{RedisAddrs: []string{addr}, RedisTimeout: 300 * time.Millisecond}})
	if err == nil {
		rdb.Close()
		t.Fatal("got a client, want an error")
	}
	if !transientRedisError(err) || !strings.Contains(err.Error(), addr) {
		t.Errorf("got %v, want a transient error naming %s", err, addr)
	}
}
