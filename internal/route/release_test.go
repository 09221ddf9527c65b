package route

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// A deferred event that comes back after its slot (a crash held it up) is
// checked again as new and gives its first slot back: end to end on a real
// Redis and Redis Cluster, the window counts equal the events, one each,
// and a redelivered batch gives nothing back twice.
func TestRetrierGivesBackMissedSlotRedis(t *testing.T) {
	for name, rdb := range testRedisClients(t) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			clk := testenv.NewClock(time.Date(2026, 11, 30, 10, 0, 10, 0, time.UTC))
			lim, prefix := redisLimiter(t, ctx, rdb, "*=2/1m", clk.Now)
			w, m := &fakeWriter{}, newTestMetrics(t)
			fast := consume.Backoff{Min: time.Millisecond, Max: 2 * time.Millisecond}
			adm := Admission{Admitter: lim, Clock: clk.Now, Logger: testenv.DiscardLogger(), Metrics: m, Backoff: fast,
				Router: &Router{Writer: w, Topics: testTopics, Clock: clk.Now, Backoff: fast, Logger: testenv.DiscardLogger(), Metrics: m}}
			ex, err := ParseTenantFrom("key")
			if err != nil {
				t.Fatal(err)
			}
			gate := mustGate(t, Gate{Extractor: ex, Admission: adm})
			if err := gate.Handle(ctx, batchOf([]kafka.Message{srcMsg(1, "acme"), srcMsg(2, "acme"), srcMsg(3, "acme")})); err != nil {
				t.Fatal(err)
			}
			var deferred []kafka.Message
			for _, msg := range w.last(t) {
				if msg.Topic == "down.retry" {
					deferred = append(deferred, msg)
				}
			}
			if len(deferred) != 1 {
				t.Fatalf("got %d deferred events, want 1", len(deferred))
			}
			if got := windowCounts(t, ctx, rdb, prefix); got != 3 {
				t.Fatalf("after the gate: the windows count %d, want 3", got)
			}

			// The retry tier's owner crashed: the event comes back two
			// minutes after its slot ended, and is admitted again.
			clk.Set(clk.Now().Add(3 * time.Minute))
			back := deferred[0]
			back.Topic, back.Partition, back.Offset = "down.retry", 0, 40
			r := mustRetrier(t, Retrier{Admission: adm})
			for range 2 { // the second time: the batch redelivered
				if err := r.Handle(ctx, consumed(40, []kafka.Message{back})); err != nil {
					t.Fatal(err)
				}
				if got := w.last(t)[0].Topic; got != "down" {
					t.Fatalf("the late event went to %s, want down", got)
				}
				if got := windowCounts(t, ctx, rdb, prefix); got != 3 {
					t.Errorf("after the late event: the windows count %d, want 3 (one per event: its missed slot given back)", got)
				}
			}
			if got := counterValue(t, m.ReleasedSlots); got != 1 {
				t.Errorf("released_slots_total: got %v, want 1", got)
			}
		})
	}
}

// windowCounts sums the counts of every window key under prefix.
func windowCounts(t *testing.T, ctx context.Context, rdb redis.UniversalClient, prefix string) int64 {
	t.Helper()
	var sum int64
	scan := func(ctx context.Context, c *redis.Client) error {
		it := c.Scan(ctx, 0, prefix+":{*}:1m:*", 100).Iterator()
		for it.Next(ctx) {
			n, err := c.HGet(ctx, it.Val(), "count").Int64()
			if err != nil {
				return err
			}
			sum += n
		}
		return it.Err()
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		var mu = make(chan struct{}, 1)
		err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			mu <- struct{}{}
			defer func() { <-mu }()
			return scan(ctx, n)
		})
	case *redis.Client:
		err = scan(ctx, c)
	}
	if err != nil {
		t.Fatal(err)
	}
	return sum
}
