package route

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

var t0 = time.Date(2025, 3, 4, 10, 0, 0, 0, time.UTC)

func fixedClock(t time.Time) func() time.Time { return func() time.Time { return t } }

// fakeWriter records every WriteMessages call. fail, if set, decides the
// result of call n (0-based) from the messages it was given.
type fakeWriter struct {
	mu    sync.Mutex
	calls [][]kafka.Message
	fail  func(n int, msgs []kafka.Message) error
}

func (w *fakeWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(w.calls)
	// Deep copies: the Gate reuses the headers' memory once a write succeeded.
	kept := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		m.Headers = append([]kafka.Header(nil), m.Headers...)
		for j, h := range m.Headers {
			m.Headers[j].Value = append([]byte(nil), h.Value...)
		}
		kept[i] = m
	}
	w.calls = append(w.calls, kept)
	if err := ctx.Err(); err != nil {
		return err
	}
	if w.fail != nil {
		return w.fail(n, msgs)
	}
	return nil
}

func (w *fakeWriter) Calls() [][]kafka.Message {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([][]kafka.Message(nil), w.calls...)
}

// last returns the messages of the last call, which is the successful one
// when the writer only fails earlier calls.
func (w *fakeWriter) last(t *testing.T) []kafka.Message {
	t.Helper()
	calls := w.Calls()
	if len(calls) == 0 {
		t.Fatal("got no WriteMessages call, want at least one")
	}
	return calls[len(calls)-1]
}

// fakeAdmitter answers AdmitFrom with decide, recording the tenants, the
// costs and the source of each call.
type fakeAdmitter struct {
	mu      sync.Mutex
	calls   [][]string
	costs   [][]limit.Cost
	sources []sourceAt
	decide  func(n int, tenants []string) ([]limit.Decision, error)
	// from, if set, answers instead of decide, with the call's source.
	from func(n int, src limit.Source, events []limit.Event) ([]limit.Decision, error)
}

// sourceAt is the source a call named and, when it named one, the offsets
// of its events.
type sourceAt struct {
	limit.Source
	Offsets []int64
}

func (a *fakeAdmitter) AdmitFrom(ctx context.Context, src limit.Source, events []limit.Event) ([]limit.Decision, error) {
	tenants := make([]string, len(events))
	costs := make([]limit.Cost, len(events))
	at := sourceAt{Source: src}
	for i, e := range events {
		tenants[i], costs[i] = e.Tenant, e.Cost
		if src.Topic != "" {
			at.Offsets = append(at.Offsets, e.Offset)
		}
	}
	a.mu.Lock()
	n := len(a.calls)
	a.calls = append(a.calls, tenants)
	a.costs = append(a.costs, costs)
	a.sources = append(a.sources, at)
	a.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if a.from != nil {
		return a.from(n, src, events)
	}
	return a.decide(n, tenants)
}

func (a *fakeAdmitter) Costs() [][]limit.Cost {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([][]limit.Cost(nil), a.costs...)
}

func (a *fakeAdmitter) Sources() []sourceAt {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]sourceAt(nil), a.sources...)
}

func (a *fakeAdmitter) Calls() [][]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([][]string(nil), a.calls...)
}

// byTenant returns a decide func that looks decisions up by tenant.
func byTenant(m map[string]limit.Decision) func(int, []string) ([]limit.Decision, error) {
	return func(_ int, tenants []string) ([]limit.Decision, error) {
		ds := make([]limit.Decision, len(tenants))
		for i, t := range tenants {
			d, ok := m[t]
			if !ok {
				d = limit.Decision{Kind: limit.Admit}
			}
			ds[i] = d
		}
		return ds, nil
	}
}

func hdr(kv ...string) []kafka.Header {
	hs := make([]kafka.Header, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		hs = append(hs, kafka.Header{Key: kv[i], Value: []byte(kv[i+1])})
	}
	return hs
}

// out is the comparable view of a written message.
type out struct {
	Topic   string
	Key     string
	Value   string
	Headers []string // "k=v"
	Time    time.Time
}

func view(msgs []kafka.Message) []out {
	res := make([]out, len(msgs))
	for i, m := range msgs {
		o := out{Topic: m.Topic, Key: string(m.Key), Value: string(m.Value), Time: m.Time}
		for _, h := range m.Headers {
			o.Headers = append(o.Headers, h.Key+"="+string(h.Value))
		}
		res[i] = o
	}
	return res
}

func diffOut(t *testing.T, want []out, got []kafka.Message) {
	t.Helper()
	if d := cmp.Diff(want, view(got)); d != "" {
		t.Errorf("written messages mismatch (-want +got):\n%s", d)
	}
}

func counterValue(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric)
	go func() {
		c.Collect(ch)
		close(ch)
	}()
	var total float64
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		total += pb.GetCounter().GetValue() + pb.GetGauge().GetValue()
	}
	return total
}

// gaugeValue is counterValue for gauges (it sums both kinds).
func gaugeValue(t *testing.T, c prometheus.Collector) float64 { return counterValue(t, c) }

func newTestMetrics(t *testing.T) *Metrics {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatalf("NewMetrics: %v", err)
	}
	return m
}

var testTopics = Topics{Downstream: "down", Retry: "down.retry", DLQ: "down.dlq"}

func ms(t time.Time) string {
	return formatMillisString(t.UnixMilli())
}

func formatMillisString(n int64) string { return string(formatMillis(n)) }

// batchOf is msgs as a batch that no consumer handed over: it names no
// source, so nothing is recorded for a replay.
func batchOf(msgs []kafka.Message) consume.Batch {
	return consume.Batch{Messages: msgs}
}

// consumed is msgs as a consumer hands them over: their partition (that of
// msgs[0]) with committed as its committed offset.
func consumed(committed int64, msgs []kafka.Message) consume.Batch {
	return consume.Batch{Topic: msgs[0].Topic, Partition: msgs[0].Partition, Committed: max(committed, 0), Messages: msgs}
}

// mustGate is NewGate(g), failing the test on error.
func mustGate(t *testing.T, g Gate) *Gate {
	t.Helper()
	built, err := NewGate(g)
	if err != nil {
		t.Fatal(err)
	}
	return built
}

// mustRetrier is NewRetrier(r), failing the test on error.
func mustRetrier(t *testing.T, r Retrier) *Retrier {
	t.Helper()
	built, err := NewRetrier(r)
	if err != nil {
		t.Fatal(err)
	}
	return built
}
