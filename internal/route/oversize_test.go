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

// An event that would be larger than its limit where it is going first loses
// the gk- headers it can do without there (downstream: all but its origin,
// then its origin); only a deferral, or an event too large by itself, goes to
// the dead-letter topic, with its value whenever the dead-letter topic can
// take it (then without its value, with its origin; then with its gk- headers
// only).
func TestRouterOversized(t *testing.T) {
	const max = 2000
	src := kafka.Message{Topic: "events", Partition: 2, Offset: 7, Key: []byte("acme"), Value: bytes.Repeat([]byte("v"), 1800)}
	origin := withOrigin(src, "acme")
	deferral := Deferral{Attempt: 1, Due: t0.Add(time.Second), Reserved: t0.Add(time.Minute), Tenant: strings.Repeat("t", 200),
		OriginTopic: "events", OriginPartition: 2, OriginOffset: 7, FirstSeen: t0}
	tests := []struct {
		name       string
		item       Item
		topicMax   map[string]int
		wantTopic  string
		wantValue  bool
		wantKey    bool
		wantOrigin bool
		wantTenant bool
		wantMore   string // a gk-reason substring; empty: not dead-lettered for its size
	}{
		{name: "fits downstream", item: Item{Msg: withOrigin(kafka.Message{Topic: "events", Value: []byte("small")}, "a"), Outcome: Forward},
			wantTopic: "down", wantValue: true, wantKey: false, wantOrigin: true, wantTenant: true},
		{name: "gk-tenant goes first downstream", item: Item{Msg: sized(origin, max+1), Outcome: Forward},
			wantTopic: "down", wantValue: true, wantKey: true, wantOrigin: true, wantTenant: false},
		{name: "then the origin downstream", item: Item{Msg: sized(origin, max+1+RecordSize(origin)-RecordSize(withHeaders(origin, func(k string) bool { return k == HeaderTenant }))), Outcome: Forward},
			wantTopic: "down", wantValue: true, wantKey: true, wantOrigin: false, wantTenant: false},
		{name: "headers push a deferral over: dead letter keeps the value", item: Item{Msg: origin, Outcome: Defer, Deferral: deferral},
			wantTopic: "down.dlq", wantValue: true, wantKey: true, wantOrigin: false, wantMore: "too large for down.retry"},
		{name: "a retry tier that takes more", item: Item{Msg: origin, Outcome: Defer, Deferral: deferral}, topicMax: map[string]int{"down.retry": 4000},
			wantTopic: "down.retry", wantValue: true, wantKey: true, wantOrigin: true, wantTenant: true},
		{name: "too large by itself", item: Item{Msg: withHeaders(origin, func(string) bool { return false }, kafka.Header{Key: "trace", Value: bytes.Repeat([]byte("x"), 300)}), Outcome: Forward},
			wantTopic: "down.dlq", wantValue: false, wantKey: true, wantOrigin: true, wantTenant: true, wantMore: "too large for down"},
		{name: "too large by itself, a dead-letter topic that takes it", item: Item{Msg: withHeaders(origin, func(string) bool { return false }, kafka.Header{Key: "trace", Value: bytes.Repeat([]byte("x"), 300)}), Outcome: Forward},
			topicMax: map[string]int{"down.dlq": 4000}, wantTopic: "down.dlq", wantValue: true, wantKey: true, wantOrigin: true, wantTenant: true, wantMore: "too large for down"},
		{name: "huge key", item: Item{Msg: withOrigin(kafka.Message{Topic: "events", Key: bytes.Repeat([]byte("k"), 3000), Value: []byte("v")}, ""), Outcome: DeadLetter, Reason: "no tenant"},
			wantTopic: "down.dlq", wantValue: false, wantKey: false, wantOrigin: true, wantMore: "no tenant; event too large for down.dlq"},
		{name: "a retry-tier record whose gk- headers alone are too large", item: Item{Msg: withHeaders(kafka.Message{Topic: "down.retry", Value: []byte("v")}, func(string) bool { return false },
			kafka.Header{Key: HeaderOriginOffset, Value: []byte("7")}, kafka.Header{Key: HeaderTenant, Value: bytes.Repeat([]byte("t"), 3000)}), Outcome: Requeue, Deferral: Deferral{Due: t0}},
			wantTopic: "down.dlq", wantValue: true, wantKey: false, wantOrigin: true, wantMore: "too large for down.retry"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			met := newTestMetrics(t)
			w := &fakeWriter{}
			r := &Router{Writer: w, Topics: testTopics, Clock: fixedClock(t0), Logger: testenv.DiscardLogger(), Metrics: met, MaxMessageBytes: max, TopicMaxBytes: tt.topicMax}
			if err := r.Route(context.Background(), []Item{tt.item}); err != nil {
				t.Fatalf("Route: %v", err)
			}
			m := w.last(t)[0]
			if m.Topic != tt.wantTopic || (m.Value != nil) != tt.wantValue || (m.Key != nil) != tt.wantKey {
				t.Errorf("got topic %s, value %v, key %v; want %s, %v, %v", m.Topic, m.Value != nil, m.Key != nil, tt.wantTopic, tt.wantValue, tt.wantKey)
			}
			if size, limit := RecordSize(m), r.limitFor(m.Topic); size > limit {
				t.Errorf("wrote %d bytes, over %d", size, limit)
			}
			if m.Value != nil && !bytes.Equal(m.Value, tt.item.Msg.Value) {
				t.Errorf("value changed: %d bytes, want %d", len(m.Value), len(tt.item.Msg.Value))
			}
			reason, _ := LastHeader(m, HeaderReason)
			if !strings.Contains(reason, tt.wantMore) || (tt.wantMore == "" && reason != "") {
				t.Errorf("gk-reason %q, want it to contain %q", reason, tt.wantMore)
			}
			_, hasOrigin := LastHeader(m, HeaderOriginOffset)
			_, hasTenant := LastHeader(m, HeaderTenant)
			if hasOrigin != tt.wantOrigin || hasTenant != tt.wantTenant {
				t.Errorf("gk-origin-offset %v, gk-tenant %v; want %v, %v", hasOrigin, hasTenant, tt.wantOrigin, tt.wantTenant)
			}
			if got := counterValue(t, met.Oversized); (got == 1) != (tt.wantMore != "") {
				t.Errorf("oversized_total = %v", got)
			}
		})
	}
}

// sized returns m with its value grown or shrunk so that RecordSize(m) is size.
func sized(m kafka.Message, size int) kafka.Message {
	m.Value = bytes.Repeat([]byte("v"), len(m.Value)+size-RecordSize(m))
	return m
}

// A batch the broker refuses as too large (the records fit one by one, not
// together) is split: every record is written again in a request of its
// own, and arrives where it was going with its value. Nothing is
// dead-lettered.
func TestRouterSplitsBatchRefusedAsTooLarge(t *testing.T) {
	for _, code := range []error{kafka.MessageSizeTooLarge, kafka.RecordListTooLarge} {
		t.Run(code.(kafka.Error).Title(), func(t *testing.T) {
			w := &fakeWriter{fail: func(_ int, msgs []kafka.Message) error {
				if len(msgs) == 1 {
					return nil
				}
				errs := make(kafka.WriteErrors, len(msgs))
				for i := range errs {
					errs[i] = code
				}
				return errs
			}}
			met := newTestMetrics(t)
			r := &Router{Writer: w, Topics: testTopics, Clock: fixedClock(t0), Logger: testenv.DiscardLogger(), Metrics: met,
				MaxMessageBytes: 2000, Backoff: consume.Backoff{Min: time.Hour, Max: time.Hour}}
			var items []Item
			for i := range 3 {
				items = append(items, Item{Msg: withOrigin(kafka.Message{Topic: "events", Offset: int64(i), Value: bytes.Repeat([]byte("v"), 1500)}, "a"), Outcome: Forward})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := r.Route(ctx, items); err != nil { // an hour of backoff would end the context
				t.Fatalf("Route: %v", err)
			}
			calls := w.Calls()
			if len(calls) != 4 {
				t.Fatalf("got %d calls, want the batch, then each record alone", len(calls))
			}
			for _, c := range calls[1:] {
				if len(c) != 1 || c[0].Topic != "down" || len(c[0].Value) != 1500 {
					t.Errorf("got %d records to %s (value %d bytes), want one downstream with its value", len(c), c[0].Topic, len(c[0].Value))
				}
			}
			if got := counterValue(t, met.Oversized); got != 0 {
				t.Errorf("oversized_total = %v, want 0", got)
			}
		})
	}
}

// A record the broker keeps refusing as too large even alone (its topic's
// max.message.bytes is below the limit Gatekeeper uses) is written alone a
// few times, then to the dead-letter topic (with its value, which the
// dead-letter topic takes here), and the other records of the batch are
// written as they were. A dead letter the broker refuses too becomes its
// reason and origin alone: nothing is retried forever for its size.
func TestRouterBrokerRefusesTooLarge(t *testing.T) {
	for _, tt := range []struct {
		name      string
		refuse    func(m kafka.Message) bool
		wantCalls int
		wantValue bool
	}{
		{name: "downstream refuses", refuse: func(m kafka.Message) bool { return m.Topic == "down" && len(m.Value) > 100 }, wantCalls: 1 + sizeRefusalsAlone + 1, wantValue: true},
		{name: "every topic refuses", refuse: func(m kafka.Message) bool { return len(m.Value) > 100 }, wantCalls: 1 + sizeRefusalsAlone + 2, wantValue: false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := &fakeWriter{fail: func(n int, msgs []kafka.Message) error {
				errs := make(kafka.WriteErrors, len(msgs))
				for i, m := range msgs {
					if tt.refuse(m) {
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
			if len(calls) != tt.wantCalls {
				t.Fatalf("got %d calls, want %d: the batch, the refused event alone %d times, then the dead letter", len(calls), tt.wantCalls, sizeRefusalsAlone)
			}
			m := calls[len(calls)-1][0]
			reason, _ := LastHeader(m, HeaderReason)
			if m.Topic != "down.dlq" || (m.Value != nil) != tt.wantValue || !strings.Contains(reason, "refused by Kafka as too large") {
				t.Errorf("got %s value %d bytes reason %q, want the dead-letter topic, value %v", m.Topic, len(m.Value), reason, tt.wantValue)
			}
			if off, _ := LastHeader(m, HeaderOriginOffset); off != "1" {
				t.Errorf("dead letter's gk-origin-offset %q, want 1", off)
			}
		})
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
