//go:build fault

package fault

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// capacityPerSecond is the capacity of the scenario that runs with one:
// below the load's rate (about 600 events a second), so that the hot
// tenants build a backlog whose reservations hold half their share a
// second, and the retry tiers move it into the idle capacity (#24): it
// drained 45 s after the load, every window within the capacity and the
// tenants' rules. (Before the moves it took over two minutes: 1,053 events
// still waited when the drain's wait of 90 s ran out; at 1000/1s, above the
// load, the scenario ran with the capacity before.)
const capacityPerSecond = 450

// checkCapacityWindows checks that every window of the 1s capacity of the
// key prefix still in Redis (they are kept a minute after they end) holds at
// most limit events (G12), through the scenario's faults.
func checkCapacityWindows(t *testing.T, prefix string, limit int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ReadTimeout: 10 * time.Second})
	defer rdb.Close()
	var n, fullest int64
	iter := rdb.Scan(ctx, 0, prefix+":cap:1s:*", 1000).Iterator()
	for iter.Next(ctx) {
		c, err := rdb.HGet(ctx, iter.Val(), "count").Result()
		if err != nil && err != redis.Nil {
			t.Fatal(err)
		}
		count, _ := strconv.ParseInt(c, 10, 64)
		n++
		fullest = max(fullest, count)
		if count > limit {
			t.Errorf("capacity window %s: %d booked, over the capacity %d", iter.Val(), count, limit)
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("capacity %d/1s: %d windows, the fullest %d", limit, n, fullest)
	if n == 0 {
		t.Errorf("no capacity windows under %s:cap:1s", prefix)
	}
}
