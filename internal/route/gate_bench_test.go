package route

import (
	"context"
	"fmt"
	"math/rand"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// discardWriter acknowledges every write at once and keeps nothing.
type discardWriter struct{}

func (discardWriter) WriteMessages(context.Context, ...kafka.Message) error { return nil }

// admitAll admits every event.
type admitAll struct{ out []limit.Decision }

func (a *admitAll) AdmitFrom(_ context.Context, _ limit.Source, events []limit.Event) ([]limit.Decision, error) {
	if cap(a.out) < len(events) {
		a.out = make([]limit.Decision, len(events))
	}
	out := a.out[:len(events)]
	for i := range out {
		out[i] = limit.Decision{Kind: limit.Admit}
	}
	return out, nil
}

// gateBench returns a Gate over an admitter that admits at once and a
// writer that discards, and batches of 500 events of 1,000 Zipf tenants (the
// tenant from the key, 200-byte values).
func gateBench(tb testing.TB) (*Gate, []consume.Batch) {
	ex, err := ParseTenantFrom("key")
	if err != nil {
		tb.Fatal(err)
	}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		tb.Fatal(err)
	}
	g, err := NewGate(Gate{Extractor: ex, Admission: Admission{
		Admitter: &admitAll{},
		Router:   &Router{Writer: discardWriter{}, Topics: testTopics, Logger: testenv.DiscardLogger(), Metrics: m},
		Logger:   testenv.DiscardLogger(),
		Metrics:  m,
	}})
	if err != nil {
		tb.Fatal(err)
	}
	r := rand.New(rand.NewSource(1))
	z := rand.NewZipf(r, 1.1, 1, 999)
	value := make([]byte, 200)
	for i := range value {
		value[i] = 'x'
	}
	const n = 500
	batches := make([]consume.Batch, 16)
	for bi := range batches {
		msgs := make([]kafka.Message, n)
		for i := range msgs {
			msgs[i] = kafka.Message{Topic: "events", Partition: 1, Offset: int64(bi*n + i),
				Key: fmt.Appendf(nil, "t-%d", z.Uint64()), Value: value}
		}
		batches[bi] = consume.Batch{Topic: "events", Partition: 1, Messages: msgs}
	}
	return g, batches
}

// BenchmarkGateHandle is the Gate's own work on a batch of 500 events of
// 1,000 Zipf tenants that are all admitted (the tenant from the key, 200-byte
// values), without Redis or Kafka: the admitter admits at once and the
// writer discards. It is the route layer's share of what the gate costs
// traffic within its limits (issue 23), per event.
func BenchmarkGateHandle(b *testing.B) {
	g, batches := gateBench(b)
	n := len(batches[0].Messages)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := g.Handle(ctx, batches[i%len(batches)]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
}

// The Gate allocates per tenant of a batch, not per event (issue 23): one
// string per distinct tenant, the batch's own slices besides. It made one
// string per event before (506 allocations for these 500 events).
func TestGateHandleAllocations(t *testing.T) {
	g, batches := gateBench(t)
	ctx := context.Background()
	b := batches[0]
	distinct := map[string]bool{}
	for _, m := range b.Messages {
		distinct[string(m.Key)] = true
	}
	if err := g.Handle(ctx, b); err != nil { // the pools' first buffers
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(20, func() {
		if err := g.Handle(ctx, b); err != nil {
			t.Fatal(err)
		}
	})
	bound := float64(len(distinct) + 16)
	if raceEnabled {
		bound += 100 // the race detector makes sync.Pool drop a share of what is put back
	}
	if allocs > bound {
		t.Errorf("a batch of %d events of %d tenants: got %.0f allocations, want at most %.0f (one per tenant and a few per batch)", len(b.Messages), len(distinct), allocs, bound)
	}
	t.Logf("%.0f allocations for %d events of %d tenants", allocs, len(b.Messages), len(distinct))
}
