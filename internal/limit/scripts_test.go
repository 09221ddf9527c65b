package limit

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/gatekeeper-dev/gatekeeper/internal/lua"
)

func runScript(t *testing.T, rdb redis.UniversalClient, src string, key string, args ...any) []int64 {
	t.Helper()
	v, err := redis.NewScript(src).Run(context.Background(), rdb, []string{key}, args...).Int64Slice()
	if err != nil {
		t.Fatalf("script on %q: %v", key, err)
	}
	return v
}

// The seed's ttl scripts: count and seconds left, window from the first hit.
func TestScriptTTL(t *testing.T) {
	rdb := testRedis(t)
	key := testPrefix(t) + ":k"
	if diff := cmp.Diff([]int64{0, 0}, runScript(t, rdb, lua.TTLGet, key)); diff != "" {
		t.Errorf("get on absent key (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{1, 2}, runScript(t, rdb, lua.TTLIncr, key, 2)); diff != "" {
		t.Errorf("first incr (-want +got):\n%s", diff)
	}
	got := runScript(t, rdb, lua.TTLIncr, key, 2)
	if got[0] != 2 || got[1] < 1 || got[1] > 2 {
		t.Errorf("second incr: got %v, want {2, 1..2}", got)
	}
	got = runScript(t, rdb, lua.TTLGet, key)
	if got[0] != 2 || got[1] < 1 || got[1] > 2 {
		t.Errorf("get: got %v, want {2, 1..2}", got)
	}
	// The window resets once the key's TTL has run out: a real wait.
	time.Sleep(2100 * time.Millisecond)
	if diff := cmp.Diff([]int64{0, 0}, runScript(t, rdb, lua.TTLGet, key)); diff != "" {
		t.Errorf("get after expiry (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{1, 2}, runScript(t, rdb, lua.TTLIncr, key, 2)); diff != "" {
		t.Errorf("incr after expiry (-want +got):\n%s", diff)
	}
}

// The seed's aligned scripts: logical expiry in the hash, reset when it has
// passed even though the key lives on for its retention.
func TestScriptAligned(t *testing.T) {
	rdb := testRedis(t)
	ctx := context.Background()
	key := testPrefix(t) + ":1000/1m:60000"
	const start, end = int64(60000), int64(120000)
	retention := int64(7 * 24 * 3600 * 1000)
	if diff := cmp.Diff([]int64{0, 61000}, runScript(t, rdb, lua.AlignedGet, key, 61000)); diff != "" {
		t.Errorf("get absent (-want +got):\n%s", diff)
	}
	for i := int64(1); i <= 3; i++ {
		if diff := cmp.Diff([]int64{i, end}, runScript(t, rdb, lua.AlignedIncr, key, end, end-61000+retention, 61000)); diff != "" {
			t.Errorf("incr %d (-want +got):\n%s", i, diff)
		}
	}
	if diff := cmp.Diff([]int64{3, end}, runScript(t, rdb, lua.AlignedGet, key, 119999)); diff != "" {
		t.Errorf("get live (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{0, 120000}, runScript(t, rdb, lua.AlignedGet, key, 120000)); diff != "" {
		t.Errorf("get after logical expiry (-want +got):\n%s", diff)
	}
	ttl, err := rdb.PTTL(ctx, key).Result()
	if err != nil || ttl < time.Duration(retention)*time.Millisecond-time.Minute {
		t.Errorf("physical ttl: got %v %v, want about window end + 7 days", ttl, err)
	}
	// Incr after the logical expiry resets the count (same key, next use).
	if diff := cmp.Diff([]int64{1, 180000}, runScript(t, rdb, lua.AlignedIncr, key, 180000, 1000, 120001)); diff != "" {
		t.Errorf("incr after logical expiry (-want +got):\n%s", diff)
	}
	_ = start
}
