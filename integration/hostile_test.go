package integration

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// An event whose gk- headers push it over MAX_MESSAGE_BYTES once deferred
// is dead-lettered without its value, with its origin and the reason, and
// the events behind it on the same partition still go through: one large
// event cannot wedge a partition.
func TestHostileOversizedDeferralDoesNotWedge(t *testing.T) {
	t.Parallel()
	f := newFlow(t, 1)
	for _, tier := range []string{"", ".1h", ".long"} { // retry tiers take up to their own max.message.bytes
		alterTopicConfig(t, f.Retry+tier, "max.message.bytes", "20000")
	}
	env := f.env(t, "GATEKEEPER_LIMITS", "big=1/1h;*=100/1m", "GATEKEEPER_MAX_MESSAGE_BYTES", "20000")
	p := startGatekeeper(t, "gk", env)
	p.waitReady(90 * time.Second)

	large := bytes.Repeat([]byte("x"), 19700)
	produce(t, f.Source, []kafka.Message{
		{Key: []byte("big"), Value: large},                     // admitted: fits downstream with its origin headers
		{Key: []byte("big"), Value: large},                     // deferred: the deferral headers push it over
		{Key: []byte("small"), Value: []byte("behind it")},     // same partition, after it
		{Key: []byte("small"), Value: []byte("behind it too")}, // and another
	})
	var o outputs
	waitFor(t, 60*time.Second, "downstream and dead letter", func() (bool, string) {
		o = readOutputs(t, f)
		return len(o.down) == 3 && len(o.dlq) == 1, o.String()
	})
	dl := o.dlq[0]
	reason := header(dl, "gk-reason")
	// The dead-letter topic takes the value once the deferral headers and
	// the origin are dropped: the value goes first.
	if !bytes.Equal(dl.Value, large) || !strings.Contains(reason, "too large") {
		t.Errorf("dead letter: value %d bytes, gk-reason %q; want its value, a size reason", len(dl.Value), reason)
	}
	if n := opsCountKey(o.down, "small"); n != 2 {
		t.Errorf("%d events behind the large one reached downstream, want 2", n)
	}
	if got := p.metric(t, "gatekeeper_oversized_total"); got != 1 {
		t.Errorf("gatekeeper_oversized_total = %v, want 1", got)
	}
}

// TestHostileRetryTierCleanup: a retry tier bounded in bytes or compacted
// deletes deferred events before they are due whatever DEFER_HORIZON says;
// start-up refuses it with one line naming the topic and the setting.
func TestHostileRetryTierCleanup(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ tier, name, value string }{
		{"", "retention.bytes", "1073741824"},
		{".1h", "cleanup.policy", "compact"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFlow(t, 1)
			topic := f.Retry + tc.tier
			alterTopicConfig(t, topic, tc.name, tc.value)
			env := f.env(t, "GATEKEEPER_LIMITS", "*=10/1m", "GATEKEEPER_HTTP_ADDR", "127.0.0.1:0")
			_, stderr, code := opsRun(t, env, "run")
			if code == 0 || !strings.Contains(stderr, "GATEKEEPER_RETRY_TOPIC") || !strings.Contains(stderr, topic+" has "+tc.name+" "+tc.value) {
				t.Errorf("exit %d, stderr:\n%s\nwant a non-zero exit and a line naming GATEKEEPER_RETRY_TOPIC and %s's %s %s", code, stderr, topic, tc.name, tc.value)
			}
		})
	}
}

// alterTopicConfig sets one setting of topic.
func alterTopicConfig(t *testing.T, topic, name, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := adminClient().IncrementalAlterConfigs(ctx, &kafka.IncrementalAlterConfigsRequest{
		Resources: []kafka.IncrementalAlterConfigsRequestResource{{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: topic,
			Configs: []kafka.IncrementalAlterConfigsRequestConfig{{Name: name, Value: value, ConfigOperation: kafka.ConfigOperationSet}},
		}},
	})
	if err != nil {
		t.Fatalf("alter %s of %s: %v", name, topic, err)
	}
	for _, r := range res.Resources {
		if r.Error != nil {
			t.Fatalf("alter %s of %s: %v", name, r.ResourceName, r.Error)
		}
	}
	// The broker applies the change through its metadata log: wait until it
	// describes the topic with it, or Gatekeeper may read the old value.
	waitFor(t, 30*time.Second, name+" of "+topic+" applied", func() (bool, string) {
		dres, err := adminClient().DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{
			Resources: []kafka.DescribeConfigRequestResource{{ResourceType: kafka.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{name}}},
		})
		if err != nil {
			return false, err.Error()
		}
		for _, r := range dres.Resources {
			for _, e := range r.ConfigEntries {
				if e.ConfigName == name && e.ConfigValue == value {
					return true, ""
				}
			}
		}
		return false, "not yet"
	})
}

// A deferral horizon longer than the last retry tier keeps events stops
// start-up with one line naming the variable, the topic and its retention.
func TestHostileHorizonPastRetention(t *testing.T) {
	t.Parallel()
	f := newFlow(t, 1)
	alterTopicConfig(t, f.Retry+".long", "retention.ms", "3600000")
	env := f.env(t, "GATEKEEPER_LIMITS", "*=10/1m", "GATEKEEPER_DEFER_HORIZON", "24h", "GATEKEEPER_HTTP_ADDR", "127.0.0.1:0")
	_, stderr, code := opsRun(t, env, "run")
	if code == 0 || !strings.Contains(stderr, "GATEKEEPER_DEFER_HORIZON") || !strings.Contains(stderr, f.Retry+".long") ||
		!strings.Contains(stderr, "1h0m0s") {
		t.Errorf("exit %d, stderr:\n%s\nwant a non-zero exit and a line naming GATEKEEPER_DEFER_HORIZON, %s.long and its 1h retention", code, stderr, f.Retry)
	}
}
