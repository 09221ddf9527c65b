// Package testenv holds what the tests of several packages share: the Kafka
// broker and Redis named by GATEKEEPER_TEST_*, a Redis key prefix of a test's
// own, configuration variables set for one test, and a logger that discards;
// and, for the end-to-end suites (integration and integration/fault), the
// gatekeeper binary run as a process (Binary, Start, Process), a private
// redis-server (StartRedisServer), free ports, the group-coordinator warm-up
// and a topic reader (ReadTopic). Only tests import it.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// skipShort skips a test that needs a server under -short (make check).
func skipShort(t testing.TB, server string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: skipping the test against %s (make test runs it)", server)
	}
}

// Kafka returns the broker address of GATEKEEPER_TEST_KAFKA (host:port), and
// skips the test when it is not set or under -short.
func Kafka(t testing.TB) string {
	t.Helper()
	skipShort(t, "a real Kafka broker")
	addr := os.Getenv("GATEKEEPER_TEST_KAFKA")
	if addr == "" {
		t.Skip("GATEKEEPER_TEST_KAFKA is not set: skipping the test against a real Kafka broker " +
			"(start one with deploy/local/kafka.sh start, or set it to host:port, e.g. via deploy/local/test-env.sh)")
	}
	return addr
}

// Redis returns a client of GATEKEEPER_TEST_REDIS (required to work when
// set) or of 127.0.0.1:6379 (test skipped if nothing answers there), and its
// address. The client is closed when the test ends. Under -short the test is
// skipped.
func Redis(t testing.TB) (*redis.Client, string) {
	t.Helper()
	skipShort(t, "Redis")
	addr := os.Getenv("GATEKEEPER_TEST_REDIS")
	required := addr != ""
	if !required {
		addr = "127.0.0.1:6379"
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		if required {
			t.Fatalf("GATEKEEPER_TEST_REDIS=%s: %v", addr, err)
		}
		t.Skipf("no Redis at %s (set GATEKEEPER_TEST_REDIS): %v", addr, err)
	}
	t.Cleanup(func() { rdb.Close() })
	return rdb, addr
}

// RedisCluster returns a client of the Redis Cluster named by
// GATEKEEPER_TEST_REDIS_CLUSTER (comma-separated seed addresses; make test
// starts one). Unset or under -short, the test is skipped; set but not
// answering, it fails.
func RedisCluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	skipShort(t, "a Redis Cluster")
	addrs := os.Getenv("GATEKEEPER_TEST_REDIS_CLUSTER")
	if addrs == "" {
		t.Skip("GATEKEEPER_TEST_REDIS_CLUSTER is not set: run `make test`, which starts a real Redis Cluster")
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addrs, ",")})
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("GATEKEEPER_TEST_REDIS_CLUSTER=%s: %v", addrs, err)
	}
	return c
}

// Prefix returns a key prefix of the test's own and deletes its keys when
// the test ends.
func Prefix(t testing.TB, rdb *redis.Client) string {
	t.Helper()
	b := make([]byte, 6)
	rand.Read(b)
	prefix := "gktest-" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, prefix+":*", 100).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
	})
	return prefix
}

// SetEnv unsets every variable of keys for the test, then sets each
// KEY=value of vars as PREFIX_KEY. The old values come back when the test
// ends.
func SetEnv(t *testing.T, prefix string, keys []string, vars map[string]string) {
	t.Helper()
	for _, k := range keys {
		if old, ok := os.LookupEnv(k); ok {
			t.Cleanup(func() { os.Setenv(k, old) })
			os.Unsetenv(k)
		}
	}
	for k, v := range vars {
		t.Setenv(prefix+"_"+k, v)
	}
}

// With returns a copy of base with the pairs of kv (key, value, key,
// value...) set; the value "<unset>" removes the key.
func With(base map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range base {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "<unset>" {
			delete(out, kv[i])
			continue
		}
		out[kv[i]] = kv[i+1]
	}
	return out
}

// DiscardLogger returns a logger that writes nothing.
func DiscardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// MinimalConfig is the least Gatekeeper configuration that validates:
// variable names without the GATEKEEPER_ prefix, and their values.
func MinimalConfig() map[string]string {
	return map[string]string{
		"SOURCE_TOPICS":    "events",
		"DOWNSTREAM_TOPIC": "events.out",
		"LIMITS":           "*=100/1m",
	}
}
