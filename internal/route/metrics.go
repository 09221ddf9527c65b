package route

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
)

// Decision labels of gatekeeper_decisions_total besides limit.Kind's names
// ("admit", "defer", "reject", "fail": a broken counter key).
const (
	// DecisionInvalid counts events whose tenant could not be derived.
	DecisionInvalid = "invalid"
	// DecisionReserved counts events forwarded uncounted from the retry tier
	// because their reserved slot had not ended.
	DecisionReserved = "reserved"
	// DecisionMaxAttempts counts deferred events dead-lettered for having been
	// deferred MaxAttempts times.
	DecisionMaxAttempts = "max_attempts"
	// DecisionTookSlot counts late events deferred into the slot they took
	// from a later reservation of their tenant (Retrier.TakeSlots, gk-took).
	DecisionTookSlot = "took_slot"
	// DecisionSlotTaken counts events back inside their slot (claims) whose
	// slot a late event had taken: placed again, at the tenant's first free
	// slot.
	DecisionSlotTaken = "slot_taken"
)

// Metrics are the Prometheus collectors of this package. A nil *Metrics is
// valid and records nothing. Metrics is safe for concurrent use.
type Metrics struct {
	// Decisions counts events by decision: admit, defer, reject, fail,
	// invalid, reserved, max_attempts, admit_early, moved_forward, took_slot,
	// slot_taken. In shadow mode the decision is counted although
	// the event goes downstream.
	Decisions *prometheus.CounterVec
	// EventsIn counts handled events by the topic they were read from.
	EventsIn *prometheus.CounterVec
	// EventsOut counts acknowledged writes by the topic they were written to.
	EventsOut *prometheus.CounterVec
	// RedisUnchecked counts events forwarded without a limit check because
	// Redis failed and ON_REDIS_ERROR is forward.
	RedisUnchecked prometheus.Counter
	// BatchSize observes the number of events per handled batch.
	BatchSize prometheus.Histogram
	// Oversized counts events that would have been larger than
	// MaxMessageBytes where they were going, by that topic; they went to the
	// dead-letter topic instead.
	Oversized *prometheus.CounterVec
	// WritesFailing is the number of batches whose write has failed several
	// times in a row and is still being retried.
	WritesFailing prometheus.Gauge
	// SigFailures counts events read from a retry tier and dead-lettered
	// because their gk-sig was missing or did not match, by reason:
	// "missing" or "mismatch".
	SigFailures *prometheus.CounterVec
	// LateReservations counts deferred events that came back from the retry
	// tier after their reserved slot had ended (a partition that waited for
	// an owner, a lagging consumer) and were checked again as new: each
	// holds a second slot, its first one spent.
	LateReservations prometheus.Counter
	// ReleasedSlots counts the slots of late reservations given back (see
	// SlotReleaser): the window they were reserved in counts them no more.
	ReleasedSlots prometheus.Counter
}

// NewMetrics builds the collectors and registers them with reg; a nil reg
// leaves them unregistered.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gatekeeper",
			Name:      "decisions_total",
			Help:      "Events by decision (admit, defer, reject, fail, invalid, reserved, max_attempts).",
		}, []string{"decision"}),
		EventsIn: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gatekeeper",
			Name:      "events_in_total",
			Help:      "Events handled, by the topic they were read from.",
		}, []string{"topic"}),
		EventsOut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gatekeeper",
			Name:      "events_out_total",
			Help:      "Events written and acknowledged, by destination topic.",
		}, []string{"topic"}),
		RedisUnchecked: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "gatekeeper",
			Name:      "redis_unchecked_total",
			Help:      "Events forwarded without a limit check because Redis failed (ON_REDIS_ERROR=forward).",
		}),
		BatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gatekeeper",
			Name:      "batch_size",
			Help:      "Events per handled batch.",
			Buckets:   []float64{1, 5, 10, 25, 50, 100, 250, 500, 1000},
		}),
		Oversized: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gatekeeper",
			Name:      "oversized_total",
			Help:      "Events too large (MAX_MESSAGE_BYTES) for the topic they were going to, by that topic; dead-lettered instead, without their value if need be.",
		}, []string{"topic"}),
		WritesFailing: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "gatekeeper",
			Name:      "writes_failing",
			Help:      "Batches whose Kafka write has failed several times in a row and is being retried (their partition does not progress).",
		}),
		SigFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gatekeeper",
			Name:      "retry_sig_failures_total",
			Help:      "Events from a retry tier dead-lettered because gk-sig was missing or did not match (GATEKEEPER_RETRY_SECRET set), by reason.",
		}, []string{"reason"}),
		LateReservations: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "gatekeeper",
			Name:      "late_reservations_total",
			Help:      "Deferred events that came back after their reserved slot had ended and were checked again as new.",
		}),
		ReleasedSlots: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "gatekeeper",
			Name:      "released_slots_total",
			Help:      "Slots of late reservations given back: the window they were reserved in no longer counts them.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.Decisions, m.EventsIn, m.EventsOut, m.RedisUnchecked, m.BatchSize, m.Oversized, m.WritesFailing, m.SigFailures, m.LateReservations, m.ReleasedSlots} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register route metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) decision(label string, n int) {
	if m == nil || n == 0 {
		return
	}
	m.Decisions.WithLabelValues(label).Add(float64(n))
}

func (m *Metrics) batchIn(msgs []kafka.Message) {
	if m == nil {
		return
	}
	m.BatchSize.Observe(float64(len(msgs)))
	countTopics(m.EventsIn, msgs)
}

func (m *Metrics) eventsOut(msgs []kafka.Message) {
	if m == nil {
		return
	}
	countTopics(m.EventsOut, msgs)
}

func (m *Metrics) sigFailure(reason string, n int) {
	if m == nil || n == 0 {
		return
	}
	m.SigFailures.WithLabelValues(reason).Add(float64(n))
}

func (m *Metrics) late(n int) {
	if m == nil || n == 0 {
		return
	}
	m.LateReservations.Add(float64(n))
}

func (m *Metrics) released(n int) {
	if m == nil || n == 0 {
		return
	}
	m.ReleasedSlots.Add(float64(n))
}

func (m *Metrics) unchecked(n int) {
	if m == nil || n == 0 {
		return
	}
	m.RedisUnchecked.Add(float64(n))
}

// countTopics adds msgs to c by topic, with one label lookup per run of equal topics.
func countTopics(c *prometheus.CounterVec, msgs []kafka.Message) {
	for i := 0; i < len(msgs); {
		j := i + 1
		for j < len(msgs) && msgs[j].Topic == msgs[i].Topic {
			j++
		}
		c.WithLabelValues(msgs[i].Topic).Add(float64(j - i))
		i = j
	}
}

func (m *Metrics) oversized(topic string) {
	if m != nil {
		m.Oversized.WithLabelValues(topic).Inc()
	}
}

func (m *Metrics) writesFailing(delta float64) {
	if m != nil {
		m.WritesFailing.Add(delta)
	}
}
