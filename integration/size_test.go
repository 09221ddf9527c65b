package integration

import (
	"bytes"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// nearLimitValue is the value size of an event that the source topic takes
// (Kafka's default max.message.bytes, 1048588) with a short key, and that
// Gatekeeper's origin headers alone would push over MAX_MESSAGE_BYTES (1 MiB).
const nearLimitValue = 1048445

// TestSizeNearLimitArrivesWithValue: an event just under the limits, admitted,
// reaches downstream with its value: Gatekeeper's optional headers (origin,
// tenant) go first. One deferred through a retry tier that takes it (its
// max.message.bytes raised, as the README says) comes back downstream with
// its value too. Nothing goes to the dead-letter topic.
func TestSizeNearLimitArrivesWithValue(t *testing.T) {
	t.Parallel()
	f := newFlow(t, 1)
	for _, tier := range []string{"", ".1h", ".long"} {
		alterTopicConfig(t, f.Retry+tier, "max.message.bytes", "1100000")
	}
	env := f.env(t, "GATEKEEPER_LIMITS", "big=1/2s;*=100/1m")
	p := startGatekeeper(t, "gk", env)
	p.waitReady(90 * time.Second)

	value := func(b byte) []byte { return bytes.Repeat([]byte{b}, nearLimitValue) }
	// Produce just after a 2s window begins: a fetch may hand the two
	// events over in two batches, and batches on both sides of a window's
	// end would admit both (seen once in CI, 2026-12-05).
	const w = int64(2000)
	now := time.Now().UnixMilli()
	time.Sleep(time.Duration((now/w+1)*w+100-now) * time.Millisecond)
	produce(t, f.Source, []kafka.Message{
		{Key: []byte("big"), Value: value('a')}, // admitted
		{Key: []byte("big"), Value: value('b')}, // deferred to the next 2s window, back through the retry tier
	})
	var o outputs
	waitFor(t, 60*time.Second, "both events downstream", func() (bool, string) {
		o = readOutputs(t, f)
		return len(o.down) == 2 || len(o.dlq) > 0, o.String()
	})
	if len(o.dlq) > 0 {
		t.Fatalf("%d dead letters (reason %q), want none", len(o.dlq), header(o.dlq[0], "gk-reason"))
	}
	for i, want := range []byte{'a', 'b'} {
		if m := o.down[i]; !bytes.Equal(m.Value, value(want)) {
			t.Errorf("downstream event %d: value of %d bytes, want %d bytes of %q", i, len(m.Value), nearLimitValue, want)
		}
	}
	if len(o.retry) != 1 {
		t.Errorf("%d events in the retry tiers, want the deferred one", len(o.retry))
	}
	if got := p.metric(t, "gatekeeper_oversized_total"); got != 0 {
		t.Errorf("gatekeeper_oversized_total = %v, want 0", got)
	}
}
