package route

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

const brokenReason = "counter key gk:{broken}:1m:0 has the wrong type"

// A Fail decision (a broken counter key of the event's tenant) sends the
// event to the dead-letter topic with the reason, in the same batch as the
// other tenants' events: the batch is not tried again.
func TestGateFailDeadLetters(t *testing.T) {
	f := newGate(t, byTenant(map[string]limit.Decision{"broken": {Kind: limit.Fail, Reason: brokenReason}}))
	batch := []kafka.Message{srcMsg(10, "ok"), srcMsg(11, "broken"), srcMsg(12, "ok"), srcMsg(13, "broken")}
	if err := f.gate.Handle(context.Background(), batchOf(batch)); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if got := len(f.admitter.Calls()); got != 1 {
		t.Errorf("got %d Admit calls, want 1", got)
	}
	dead := func(off int64) out {
		return srcOut("down.dlq", off, "broken", append(append([]string{"gk-tenant=broken"}, origin(off)...), "gk-reason="+brokenReason)...)
	}
	diffOut(t, []out{srcOut("down", 10, "ok", admitted("ok", 10)...), dead(11), srcOut("down", 12, "ok", admitted("ok", 12)...), dead(13)}, f.writer.last(t))
	for label, want := range map[string]float64{"admit": 2, "fail": 2} {
		if got := counterValue(t, f.metrics.Decisions.WithLabelValues(label)); got != want {
			t.Errorf("decisions_total{decision=%q}: got %v, want %v", label, got, want)
		}
	}
	if got := f.ready.Got(); len(got) != 0 {
		t.Errorf("got SetReady calls %v, want none", got)
	}
}

// testRedisClients returns clients of the real Redis and Redis Cluster named
// by GATEKEEPER_TEST_REDIS and GATEKEEPER_TEST_REDIS_CLUSTER (make test sets
// both), skipping the test when neither is set.
func testRedisClients(t *testing.T) map[string]redis.UniversalClient {
	t.Helper()
	out := map[string]redis.UniversalClient{}
	if addr := os.Getenv("GATEKEEPER_TEST_REDIS"); addr != "" {
		out["single"] = redis.NewClient(&redis.Options{Addr: addr})
	}
	if addrs := os.Getenv("GATEKEEPER_TEST_REDIS_CLUSTER"); addrs != "" {
		out["cluster"] = redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addrs, ",")})
	}
	if len(out) == 0 {
		t.Skip("GATEKEEPER_TEST_REDIS and GATEKEEPER_TEST_REDIS_CLUSTER are not set: run `make test`")
	}
	for _, c := range out {
		t.Cleanup(func() { c.Close() })
	}
	return out
}

// redisLimiter returns a limiter of rules over rdb with a key prefix of the
// test's own, on the given clock.
func redisLimiter(t *testing.T, ctx context.Context, rdb redis.UniversalClient, rules string, clock func() time.Time) (*limit.Limiter, string) {
	t.Helper()
	prefix := "gktest:route:" + strings.ReplaceAll(t.Name(), "/", ".") + ":" + time.Now().Format("150405.000000000")
	rs, err := limit.ParseRules(rules)
	if err != nil {
		t.Fatal(err)
	}
	lim, err := limit.New(ctx, rdb, rs, limit.Options{Prefix: prefix, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return lim, prefix
}

// The report, end to end on a real Redis and Redis Cluster: someone
// SET a string at tenant b's window key. The batch is handled once: a's
// events go downstream and are counted once, b's go to the dead-letter topic
// with a reason naming the key, and nothing pauses.
func TestGateBrokenCounterKeyRedis(t *testing.T) {
	for name, rdb := range testRedisClients(t) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			now := time.Date(2026, 11, 30, 10, 0, 10, 0, time.UTC)
			lim, prefix := redisLimiter(t, ctx, rdb, "*=10/1m", func() time.Time { return now })
			// b's window of this minute, as the key layout names it.
			key := prefix + ":{b}:1m:" + strconv.FormatInt(time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC).UnixMilli(), 10)
			if err := rdb.Set(ctx, key, "x", time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			f := newGate(t, func(_ int, tenants []string) ([]limit.Decision, error) { return lim.Admit(ctx, tenants) })
			batch := []kafka.Message{srcMsg(1, "a"), srcMsg(2, "b"), srcMsg(3, "a"), srcMsg(4, "b"), srcMsg(5, "a")}
			if err := f.gate.Handle(ctx, batchOf(batch)); err != nil {
				t.Fatalf("Handle: %v", err)
			}
			if got := len(f.admitter.Calls()); got != 1 {
				t.Errorf("got %d Admit calls, want 1", got)
			}
			var topics []string
			for _, m := range f.writer.last(t) {
				topics = append(topics, m.Topic)
				if reason, _ := LastHeader(m, HeaderReason); string(m.Key) == "b" && reason != "counter key "+key+" has the wrong type" {
					t.Errorf("b's gk-reason: got %q, want it to name %s", reason, key)
				}
			}
			if got, want := strings.Join(topics, " "), "down down.dlq down down.dlq down"; got != want {
				t.Errorf("destinations: got %s, want %s", got, want)
			}
			us, err := lim.Usage(ctx, "a")
			if err != nil || us[0].Count != 3 {
				t.Errorf("a's usage: got %+v %v, want count 3", us, err)
			}
		})
	}
}
