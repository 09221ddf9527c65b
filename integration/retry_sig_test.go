package integration

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// TestRetrySigned runs a gatekeeper with GATEKEEPER_RETRY_SECRET, defers
// real events and writes forged ones straight into the retry tiers, as
// anyone allowed to write those topics could: an unsigned event whose
// gk-reserved is a year away (it would be forwarded uncounted), an unsigned
// one in the .long tier due in 20 hours (it would hold the partition's
// commits until then), and a real deferral whose gk-reserved was changed.
// The real events must reach downstream signed; the forged ones must be
// dead-lettered at once with the reason, and counted.
func TestRetrySigned(t *testing.T) {
	t.Parallel()
	f := newFlow(t, 1)
	gk := startGatekeeper(t, "gk", f.env(t,
		"GATEKEEPER_LIMITS", "*=1/1s",
		"GATEKEEPER_RETRY_SECRET", "integration-test-secret-of-32-bytes!"))
	gk.waitReady(90 * time.Second)

	var real []kafka.Message
	for i := range 3 {
		real = append(real, kafka.Message{Key: []byte("a"), Value: fmt.Appendf(nil, "real-%d", i)})
	}
	produce(t, f.Source, real)
	var deferred kafka.Message
	waitFor(t, 60*time.Second, "a deferral in the first retry tier", func() (bool, string) {
		rs := readTopic(t, f.Retry)
		if len(rs) == 0 {
			return false, "none yet"
		}
		deferred = rs[0]
		return true, ""
	})

	now := time.Now()
	year := strconv.FormatInt(now.Add(365*24*time.Hour).UnixMilli(), 10)
	forgedHeaders := func(due time.Time, reserved string) []kafka.Header {
		return []kafka.Header{
			{Key: "gk-attempt", Value: []byte("1")},
			{Key: "gk-due", Value: []byte(strconv.FormatInt(due.UnixMilli(), 10))},
			{Key: "gk-reserved", Value: []byte(reserved)},
			{Key: "gk-tenant", Value: []byte("victim")},
			{Key: "gk-origin-topic", Value: []byte(f.Source)},
			{Key: "gk-origin-partition", Value: []byte("0")},
			{Key: "gk-origin-offset", Value: []byte("0")},
			{Key: "gk-first-seen", Value: []byte(strconv.FormatInt(now.UnixMilli(), 10))},
		}
	}
	altered := kafka.Message{Key: deferred.Key, Value: deferred.Value}
	for _, h := range deferred.Headers {
		if h.Key == "gk-reserved" {
			h.Value = []byte(year)
		}
		altered.Headers = append(altered.Headers, h)
	}
	produce(t, f.Retry, []kafka.Message{
		{Key: []byte("victim"), Value: []byte("forged-unsigned"), Headers: forgedHeaders(now.Add(-time.Second), year)},
		altered,
	})
	produce(t, f.Retry+".long", []kafka.Message{
		{Key: []byte("victim"), Value: []byte("forged-far"), Headers: forgedHeaders(now.Add(20*time.Hour), year)},
	})

	wantDLQ := map[string]string{ // value -> gk-reason
		"forged-unsigned":     "gk-sig missing",
		"forged-far":          "gk-sig missing",
		string(altered.Value): "gk-sig does not match",
	}
	var down, dlq []kafka.Message
	waitFor(t, 60*time.Second, "real events downstream and forged ones dead-lettered", func() (bool, string) {
		down, dlq = readTopic(t, f.Downstream), readTopic(t, f.DLQ)
		return len(down) >= len(real) && len(dlq) >= len(wantDLQ),
			fmt.Sprintf("%d downstream, %d dead-lettered", len(down), len(dlq))
	})
	for _, m := range dlq {
		want, ok := wantDLQ[string(m.Value)]
		if got := header(m, "gk-reason"); !ok || got != want {
			t.Errorf("dead-lettered %q with gk-reason %q, want %q", m.Value, got, want)
		}
		delete(wantDLQ, string(m.Value))
	}
	signed := 0
	for _, m := range down {
		if !strings.HasPrefix(string(m.Value), "real-") || string(m.Key) != "a" {
			t.Errorf("downstream got %q (key %q), want only the real events", m.Value, m.Key)
		}
		if header(m, "gk-due") != "" {
			if len(header(m, "gk-sig")) != 43 {
				t.Errorf("deferred event %q downstream has gk-sig %q, want a signature", m.Value, header(m, "gk-sig"))
			}
			signed++
		}
	}
	if signed != 2 {
		t.Errorf("got %d events downstream through the retry path, want 2", signed)
	}
	// The counter follows the acknowledgement of the batch's writes.
	waitFor(t, 10*time.Second, "signature failures counted", func() (bool, string) {
		missing := gk.metric(t, "gatekeeper_retry_sig_failures_total", `reason="missing"`)
		mismatch := gk.metric(t, "gatekeeper_retry_sig_failures_total", `reason="mismatch"`)
		return missing == 2 && mismatch == 1, fmt.Sprintf("missing %v, mismatch %v; want 2 and 1", missing, mismatch)
	})
}
