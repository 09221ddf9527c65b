package route

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// An event that would be larger than MaxMessageBytes where it is going goes
// to the dead-letter topic instead: whole if it fits there, else without its
// value, else with its gk- headers only. Its origin always stays.
func TestRouterOversized(t *testing.T) {
	const max = 2000
	src := kafka.Message{Topic: "events", Partition: 2, Offset: 7, Key: []byte("acme"), Value: bytes.Repeat([]byte("v"), 1800)}
	origin := withOrigin(src, "acme")
	tests := []struct {
		name      string
		item      Item
		wantTopic string
		wantValue bool
		wantKey   bool
		wantMore  string // a gk-reason substring
	}{
		{name: "fits downstream", item: Item{Msg: withOrigin(kafka.Message{Topic: "events", Value: []byte("small")}, "a"), Outcome: Forward},
			wantTopic: "down", wantValue: true, wantKey: false},
		{name: "headers push a deferral over", item: Item{Msg: origin, Outcome: Defer, Deferral: Deferral{Attempt: 1, Due: t0.Add(time.Second),
			Reserved: t0.Add(time.Minute), Tenant: strings.Repeat("t", 200), OriginTopic: "events", OriginPartition: 2, OriginOffset: 7, FirstSeen: t0}},
			wantTopic: "down.dlq", wantValue: false, wantKey: true, wantMore: "too large for down.retry"},
		{name: "too large downstream", item: Item{Msg: withHeaders(origin, func(string) bool { return false }, kafka.Header{Key: "trace", Value: bytes.Repeat([]byte("x"), 300)}), Outcome: Forward},
			wantTopic: "down.dlq", wantValue: false, wantKey: true, wantMore: "too large for down"},
		{name: "huge key", item: Item{Msg: withOrigin(kafka.Message{Topic: "events", Key: bytes.Repeat([]byte("k"), 3000), Value: []byte("v")}, ""), Outcome: DeadLetter, Reason: "no tenant"},
			wantTopic: "down.dlq", wantValue: false, wantKey: false, wantMore: "no tenant; event too large for down.dlq"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			met := newTestMetrics(t)
			w := &fakeWriter{}
			r := &Router{Writer: w, Topics: testTopics, Clock: fixedClock(t0), Logger: testenv.DiscardLogger(), Metrics: met, MaxMessageBytes: max}
			if err := r.Route(context.Background(), []Item{tt.item}); err != nil {
				t.Fatalf("Route: %v", err)
			}
			m := w.last(t)[0]
			if m.Topic != tt.wantTopic || (m.Value != nil) != tt.wantValue || (m.Key != nil) != tt.wantKey {
				t.Errorf("got topic %s, value %v, key %v; want %s, %v, %v", m.Topic, m.Value != nil, m.Key != nil, tt.wantTopic, tt.wantValue, tt.wantKey)
			}
			if size := RecordSize(m); size > max {
				t.Errorf("wrote %d bytes, over %d", size, max)
			}
			reason, _ := LastHeader(m, HeaderReason)
			if !strings.Contains(reason, tt.wantMore) {
				t.Errorf("gk-reason %q, want it to contain %q", reason, tt.wantMore)
			}
			if off, _ := LastHeader(m, HeaderOriginOffset); tt.wantMore != "" && off == "" {
				t.Errorf("dead-lettered without gk-origin-offset")
			}
			if got := counterValue(t, met.Oversized); (got == 1) != (tt.wantMore != "") {
				t.Errorf("oversized_total = %v", got)
			}
		})
	}
}

// A record the broker refuses as too large (its topic's max.message.bytes is
// below MAX_MESSAGE_BYTES) is written to the dead-letter topic without its
// value instead of being retried forever, and the other records of the
// batch are written as they were.
func TestRouterBrokerRefusesTooLarge(t *testing.T) {
	w := &fakeWriter{fail: func(n int, msgs []kafka.Message) error {
		errs := make(kafka.WriteErrors, len(msgs))
		for i, m := range msgs {
			if m.Value != nil && len(m.Value) > 100 {
				errs[i] = kafka.MessageSizeTooLarge
			}
		}
		if errs.Count() == 0 {
			return nil
		}
		return errs
	}}
	r := &Router{Writer: w, Topics: testTopics, Clock: fixedClock(t0), Logger: testenv.DiscardLogger(), Backoff: consume.Backoff{Min: time.Millisecond, Max: time.Millisecond}}
	big := withOrigin(kafka.Message{Topic: "events", Offset: 1, Value: bytes.Repeat([]byte("v"), 200)}, "a")
	small := withOrigin(kafka.Message{Topic: "events", Offset: 2, Value: []byte("ok")}, "a")
	if err := r.Route(context.Background(), []Item{{Msg: big, Outcome: Forward}, {Msg: small, Outcome: Forward}}); err != nil {
		t.Fatalf("Route: %v", err)
	}
	calls := w.Calls()
	if len(calls) != 2 || len(calls[1]) != 1 {
		t.Fatalf("got calls %v, want the batch, then the refused event alone", len(calls))
	}
	m := calls[1][0]
	reason, _ := LastHeader(m, HeaderReason)
	if m.Topic != "down.dlq" || m.Value != nil || !strings.Contains(reason, "refused by Kafka as too large") {
		t.Errorf("got %s value %q reason %q, want the dead-letter topic without value", m.Topic, m.Value, reason)
	}
}

// A write that keeps failing shows in WritesFailing and the gauge until it
// succeeds.
func TestRouterWritesFailing(t *testing.T) {
	met := newTestMetrics(t)
	release := make(chan struct{})
	seen := make(chan int, 100)
	w := &fakeWriter{fail: func(n int, _ []kafka.Message) error {
		seen <- n
		if n < 5 {
			return kafka.LeaderNotAvailable
		}
		<-release
		return nil
	}}
	r := &Router{Writer: w, Topics: testTopics, Logger: testenv.DiscardLogger(), Metrics: met, Backoff: consume.Backoff{Min: time.Millisecond, Max: time.Millisecond}}
	done := make(chan error, 1)
	go func() {
		done <- r.Route(context.Background(), []Item{{Msg: kafka.Message{Value: []byte("x")}, Outcome: Forward}})
	}()
	for n := range seen {
		if n == 5 {
			break
		}
	}
	if got := r.WritesFailing(); got != 1 {
		t.Errorf("WritesFailing() = %d while failing, want 1", got)
	}
	if got := gaugeValue(t, met.WritesFailing); got != 1 {
		t.Errorf("writes_failing = %v while failing, want 1", got)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("Route: %v", err)
	}
	if got := r.WritesFailing(); got != 0 {
		t.Errorf("WritesFailing() = %d after success, want 0", got)
	}
}
