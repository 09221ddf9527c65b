package route

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestNewMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := NewMetrics(reg); err != nil {
		t.Fatalf("first registration: %v", err)
	}
	if _, err := NewMetrics(reg); err == nil {
		t.Error("got no error registering twice, want one")
	}
	if _, err := NewMetrics(nil); err != nil {
		t.Errorf("nil registerer: got %v, want nil", err)
	}
	var m *Metrics // a nil *Metrics records nothing and does not panic
	m.decision("admit", 1)
	m.batchIn(nil)
	m.eventsOut(nil)
	m.unchecked(1)
	m.sigFailure("missing", 1)
}

func TestNewMetricsNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.decision("admit", 1)
	m.EventsIn.WithLabelValues("t").Inc()
	m.EventsOut.WithLabelValues("t").Inc()
	m.RedisUnchecked.Inc()
	m.BatchSize.Observe(3)
	m.oversized("t")
	m.sigFailure("missing", 1)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range families {
		got = append(got, f.GetName())
	}
	want := []string{"gatekeeper_batch_size", "gatekeeper_decisions_total", "gatekeeper_events_in_total",
		"gatekeeper_events_out_total", "gatekeeper_late_reservations_total", "gatekeeper_oversized_total", "gatekeeper_redis_unchecked_total",
		"gatekeeper_released_slots_total", "gatekeeper_retry_sig_failures_total", "gatekeeper_writes_failing"}
	if len(got) != len(want) {
		t.Fatalf("got families %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("got family %q, want %q", got[i], want[i])
		}
	}
}
