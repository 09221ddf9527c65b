package limit

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// privateRedis starts a redis-server of the test's own on a unix socket, with
// extra settings (args) that the shared test Redis must not be changed to,
// and stops it when the test ends.
func privateRedis(t *testing.T, args ...string) *redis.Client {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("no redis-server on PATH")
	}
	dir, err := os.MkdirTemp("", "gk") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "redis.sock")
	cmd := exec.Command(bin, append([]string{"--port", "0", "--unixsocket", sock, "--dir", dir, "--save", "", "--appendonly", "no"}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	c := redis.NewClient(&redis.Options{Network: "unix", Addr: sock})
	t.Cleanup(func() { c.Close() })
	for deadline := time.Now().Add(5 * time.Second); c.Ping(context.Background()).Err() != nil; {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server %v did not answer on %s", args, sock)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return c
}

func TestCheckEviction(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		warning string // "" for none; else a part of the warning
		err     bool
	}{
		{"noeviction", []string{"--maxmemory-policy", "noeviction"}, "", false},
		{"allkeys-lru", []string{"--maxmemory-policy", "allkeys-lru"}, "maxmemory-policy is allkeys-lru (", false},
		{"volatile-ttl", []string{"--maxmemory-policy", "volatile-ttl"}, "maxmemory-policy is volatile-ttl (", false},
		{"volatile-lru", []string{"--maxmemory-policy", "volatile-lru"}, "maxmemory-policy is volatile-lru (", false},
		{"CONFIG refused", []string{"--rename-command", "CONFIG", ""}, "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CheckEviction(context.Background(), privateRedis(t, tc.args...))
			t.Logf("warning %q, error %v", got, err)
			if (err != nil) != tc.err {
				t.Fatalf("error: got %v, want error %v", err, tc.err)
			}
			if (got == "") != (tc.warning == "") || !strings.Contains(got, tc.warning) {
				t.Errorf("warning: got %q, want one with %q", got, tc.warning)
			}
		})
	}
}

// On the shared test servers (single and Cluster, every master read), the
// warning is there exactly when the policy is not noeviction.
func TestCheckEvictionShared(t *testing.T) {
	for name, connect := range map[string]func(testing.TB) redis.UniversalClient{"single": testRedis, "cluster": testCluster} {
		t.Run(name, func(t *testing.T) {
			rdb := connect(t)
			policy, err := rdb.ConfigGet(context.Background(), "maxmemory-policy").Result()
			if err != nil {
				t.Fatal(err)
			}
			got, err := CheckEviction(context.Background(), rdb)
			if err != nil {
				t.Fatal(err)
			}
			if want := policy["maxmemory-policy"] != "noeviction"; (got != "") != want {
				t.Errorf("policy %s: got warning %q, want one: %v", policy["maxmemory-policy"], got, want)
			}
		})
	}
}
