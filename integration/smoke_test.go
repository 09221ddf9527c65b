package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// TestPipelineSmoke runs one gatekeeper over a small mixed stream and checks
// that every event lands in exactly one output, the limit holds and deferred
// events carry a future due time.
func TestPipelineSmoke(t *testing.T) {
	t.Parallel()
	f := newFlow(t, 3)
	gk := startGatekeeper(t, "gk", f.env(t, "GATEKEEPER_LIMITS", "*=1000/1m;acme=20/1m", "GATEKEEPER_ROLES", "gate"))
	gk.waitReady(90 * time.Second)
	var msgs []kafka.Message
	for i := 0; i < 200; i++ {
		tenant := "acme"
		if i%2 == 1 {
			tenant = fmt.Sprintf("t%d", i%5)
		}
		msgs = append(msgs, kafka.Message{Partition: i % 3, Key: []byte(tenant), Value: []byte(fmt.Sprintf("%d", i))})
	}
	msgs = append(msgs, kafka.Message{Partition: 0, Value: []byte("no key")})
	start := time.Now()
	produce(t, f.Source, msgs)
	var down, retry, dlq []kafka.Message
	waitFor(t, 60*time.Second, "all events routed", func() (bool, string) {
		down, retry, dlq = readTopic(t, f.Downstream), f.readRetry(t), readTopic(t, f.DLQ)
		n := len(down) + len(retry) + len(dlq)
		return n >= len(msgs), fmt.Sprintf("%d downstream + %d retry + %d dlq of %d", len(down), len(retry), len(dlq), len(msgs))
	})
	acme := 0
	for _, m := range down {
		if string(m.Key) == "acme" {
			acme++
		}
	}
	if acme > 20 {
		t.Errorf("acme downstream: got %d, want at most 20", acme)
	}
	if len(dlq) != 1 || header(dlq[0], "gk-reason") == "" {
		t.Errorf("dead letters: got %d (%v), want 1 with a reason", len(dlq), dlq)
	}
	for _, m := range retry {
		due := header(m, "gk-due")
		var ms int64
		fmt.Sscan(due, &ms)
		if !time.UnixMilli(ms).After(start) {
			t.Errorf("deferred event due %q, want after %v", due, start)
		}
	}
	t.Logf("downstream %d (acme %d), retry %d, dlq %d", len(down), acme, len(retry), len(dlq))
	if code, took := gk.terminate(30 * time.Second); code != 0 {
		t.Errorf("exit code after SIGTERM: got %d, want 0 (took %v)", code, took)
	}
}

// A missing topic stops start-up with one line naming it, instead of a
// consumer that spins on a topic that is not there.
func TestMissingTopicStopsStartup(t *testing.T) {
	t.Parallel()
	f := newFlow(t, 1)
	gk := startGatekeeper(t, "gk", f.env(t, "GATEKEEPER_LIMITS", "*=10/1m", "GATEKEEPER_SOURCE_TOPICS", f.Source+",no-such-topic-"+f.Source))
	select {
	case <-gk.Done():
	case <-time.After(60 * time.Second):
		t.Fatalf("still running a minute after start with a missing source topic")
	}
	if code := gk.ExitCode(); code != 1 {
		t.Errorf("exit code: got %d, want 1", code)
	}
	if !gk.LogContains(`no-such-topic-` + f.Source) {
		t.Errorf("log does not name the missing topic:\n%s", gk.Tail(10))
	}
}
