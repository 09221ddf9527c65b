package limit

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisCalls returns the calls Redis has counted since the last CONFIG
// RESETSTAT (INFO commandstats: commands run inside scripts included),
// without the INFO and CONFIG calls of the measure itself, and the
// microseconds Redis spent in scripts.
func redisCalls(t *testing.T, rdb *redis.Client) (calls, usec int64) {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("info commandstats: %v", err)
	}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || strings.HasPrefix(name, "cmdstat_info") || strings.HasPrefix(name, "cmdstat_config") {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			if k != "calls" && k != "usec" {
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("commandstats %q: %v", line, err)
			}
			if k == "calls" {
				calls += n
			} else if strings.HasPrefix(name, "cmdstat_eval") {
				usec += n // a script's time holds its commands'
			}
		}
	}
	return calls, usec
}

// The replay record costs two Redis commands per batch (GET and SET in the
// script) on a single Redis: Redis commands per 1,000 events stay within
// 10% of deciding without a Source. Commands are counted by a private
// redis-server, the same skewed batches decided with a fixed clock.
func TestReplayRecordCommands(t *testing.T) {
	rdb := privateRedis(t)
	ctx := context.Background()
	batches := skewedBatches(64, benchBatch, benchTenants)
	perK := func(withSource bool) (calls, usec float64) {
		l := newTestLimiter(t, rdb, "*=1000/1m", Options{Clock: func() time.Time { return t0 }})
		if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		for i, batch := range batches {
			s := testSource{}
			if withSource {
				s = src(max(0, int64(i-1)*benchBatch), int64(i)*benchBatch)
			}
			if _, err := l.AdmitFrom(ctx, s.Source, s.events(batch, nil)); err != nil {
				t.Fatal(err)
			}
		}
		c, u := redisCalls(t, rdb)
		k := float64(len(batches)*benchBatch) / 1000
		return float64(c) / k, float64(u) / k
	}
	// Script time is noisy on a shared machine: take the least of 3 runs.
	without, usecWithout := perK(false)
	with, usecWith := perK(true)
	for range 2 {
		_, u := perK(false)
		usecWithout = min(usecWithout, u)
		_, u = perK(true)
		usecWith = min(usecWith, u)
	}
	t.Logf("Redis commands per 1,000 events: %.1f without a Source, %.1f with one", without, with)
	t.Logf("Redis time per 1,000 events (least of 3 runs; not asserted): %.0f µs without a Source, %.0f µs with one", usecWithout, usecWith)
	if with > 1.1*without {
		t.Errorf("commands per 1,000 events with a Source: got %.1f, want at most %.1f (110%% of %.1f)", with, 1.1*without, without)
	}
}

// A capacity that never binds costs few Redis commands more than none:
// every tenant's own rules are counted as in the fast path (one HINCRBY),
// and the capacity's hashes are read once per call (one HMGET for the
// current window's fields of all the call's tenants, one for the next
// window's) and written once at its end (one HSET per window, and the
// demand histogram's moved buckets summed per call). The same skewed
// batches, decided on a private redis-server over several one-second
// windows, with and without a capacity, and with a capacity of bytes
// (every event carries its bytes, 100 to 499); the version that wrote
// every tenant's fields with commands of their own took 2.7x the commands.
func TestCapacityCommands(t *testing.T) {
	rdb := privateRedis(t)
	ctx := context.Background()
	batches := skewedBatches(60, benchBatch, benchTenants)
	perK := func(capacity string) (float64, float64) {
		clk := newFakeClock(t0)
		opts := Options{Clock: clk.Now}
		opts.Capacity, _ = ParseCapacity(capacity)
		l := newTestLimiter(t, rdb, "*=1000/1m", opts)
		if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		cpu0 := redisCPU(t, rdb)
		for _, batch := range batches {
			clk.Add(100 * time.Millisecond)   // ten calls a window
			costs := make([]Cost, len(batch)) // 100 to 499 bytes
			for i := range costs {
				costs[i].Bytes = int64(100 + (i*37)%400)
			}
			ds, err := l.AdmitCosts(ctx, batch, costs)
			if err != nil {
				t.Fatal(err)
			}
			if len(ds) != len(batch) {
				t.Fatalf("%d decisions for %d events", len(ds), len(batch))
			}
		}
		cpu := redisCPU(t, rdb) - cpu0
		c, _ := redisCalls(t, rdb)
		k := float64(len(batches)*benchBatch) / 1000
		return float64(c) / k, cpu.Seconds() * 1e6 / k
	}
	without, usecWithout := perK("")
	with, usecWith := perK("100000000/1s")
	bytes, usecBytes := perK("100GB/1s") // every tenant's events carry their bytes
	t.Logf("Redis commands per 1,000 events: %.1f without a capacity, %.1f with one (%.2fx), %.1f with one of bytes (%.2fx)", without, with, with/without, bytes, bytes/without)
	t.Logf("Redis CPU per 1,000 events (not asserted): %.0f µs without a capacity, %.0f µs with one, %.0f µs with one of bytes", usecWithout, usecWith, usecBytes)
	if with > 1.25*without {
		t.Errorf("commands per 1,000 events with a capacity: got %.1f, want at most %.1f (125%% of %.1f)", with, 1.25*without, without)
	}
	if bytes > 1.25*without {
		t.Errorf("commands per 1,000 events with a capacity of bytes: got %.1f, want at most %.1f (125%% of %.1f)", bytes, 1.25*without, without)
	}
}

// redisCPU returns the CPU time the Redis server has used (INFO cpu: user
// and system), which a busy machine disturbs less than a script's time.
func redisCPU(t *testing.T, rdb *redis.Client) time.Duration {
	t.Helper()
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		t.Fatalf("info cpu: %v", err)
	}
	var sec float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("info cpu %q: %v", line, err)
			}
			sec += f
		}
	}
	return time.Duration(sec * float64(time.Second))
}
