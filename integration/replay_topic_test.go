package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// A source topic deleted and created again under the same name starts at
// offset 0 again. Its events must get fresh decisions, never the ones the
// replay record kept for the old topic's events at the same offsets (it
// lives ReplayRecordTTL): the record is known by Kafka's topic ID. Before
// it was keyed by the topic's name, and here p, q and r, each under its
// own limit of 1/1h, got a, a, a's decisions back (admit, defer, defer):
// two of them went to the retry tier instead of downstream, and counted
// nothing.
func TestReplayAfterTopicRecreated(t *testing.T) {
	t.Parallel()
	f := newFlow(t, 1)
	env := f.env(t, "GATEKEEPER_LIMITS", "*=1/1h", "GATEKEEPER_ROLES", "gate")
	run := func(name string, tenants ...string) {
		gk := startGatekeeper(t, name, env)
		gk.waitReady(90 * time.Second)
		var msgs []kafka.Message
		for i, tn := range tenants {
			msgs = append(msgs, kafka.Message{Partition: 0, Key: []byte(tn), Value: []byte(fmt.Sprintf("%s-%d", name, i))})
		}
		produce(t, f.Source, msgs)
		want := len(tenants)
		waitFor(t, 60*time.Second, name+": events routed", func() (bool, string) {
			n := 0
			for _, m := range append(readTopic(t, f.Downstream), f.readRetry(t)...) {
				if len(m.Value) > len(name) && string(m.Value[:len(name)+1]) == name+"-" {
					n++
				}
			}
			return n >= want, fmt.Sprintf("%d of %d", n, want)
		})
		if code, _ := gk.terminate(30 * time.Second); code != 0 {
			t.Fatalf("%s: exit code %d", name, code)
		}
	}
	run("old", "a", "a", "a")
	if err := deleteTopic(f.Source); err != nil {
		t.Fatalf("delete %s: %v", f.Source, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		// Deletion is asynchronous: create again once the name is free.
		err := createTopic(ctx, f.Source, 1)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("create %s again: %v", f.Source, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	run("new", "p", "q", "r")
	down := map[string]int{}
	for _, m := range readTopic(t, f.Downstream) {
		down[string(m.Key)]++
	}
	retried := map[string]int{}
	for _, m := range f.readRetry(t) {
		retried[string(m.Key)]++
	}
	t.Logf("downstream %v, retry %v", down, retried)
	for _, tn := range []string{"p", "q", "r"} {
		if down[tn] != 1 || retried[tn] != 0 {
			t.Errorf("tenant %s of the re-created topic: %d downstream, %d deferred; want 1 downstream (its own first event under 1/1h), not the old topic's decision",
				tn, down[tn], retried[tn])
		}
	}
	if down["a"] != 1 || retried["a"] != 2 {
		t.Errorf("tenant a of the old topic: %d downstream, %d deferred; want 1 and 2", down["a"], retried["a"])
	}
}
