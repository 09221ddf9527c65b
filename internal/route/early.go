package route

import (
	"context"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// DecisionEarly counts, in gatekeeper_decisions_total, deferred events
// admitted before their reserved slot because their tenant's rules were
// raised and the current window had room under the raised rules.
const DecisionEarly = "admit_early"

// NowAdmitter admits in the current window only, reserving nothing
// (*limit.Limiter implements it: limit.Limiter.AdmitNow).
type NowAdmitter interface {
	AdmitNow(ctx context.Context, src limit.Source, events []limit.Event) ([]limit.Decision, error)
}

// earlyCheck is an event released before its time after its tenant's
// rules were raised: msgs[i], with its deferral, as the limiter decides it.
type earlyCheck struct {
	i     int
	d     Deferral
	event limit.Event
}

// early takes m, released before its time, for an early check when the
// Retrier's Expedited says it was let go on purpose and its headers read;
// it reports whether it took it.
func (r *Retrier) early(b *retryBatch, i int, m kafka.Message) bool {
	if r.Expedited == nil || !r.Expedited(m) {
		return false
	}
	if _, ok := r.Admitter.(NowAdmitter); !ok {
		return false
	}
	d, err := ParseDeferral(m)
	if err != nil {
		return false
	}
	cost, err := r.CostFrom.Cost(m)
	if err != nil {
		return false
	}
	b.early = append(b.early, earlyCheck{i: i, d: d, event: limit.Event{Tenant: d.Tenant, Cost: cost}})
	return true
}

// checkEarly decides the events released early: each is admitted now if
// the rules in force have room for it in the current window (counted there:
// its reserved slot stays counted in its own window, unused), else it goes
// back, headers unchanged, to the retry tier of its remaining delay and
// waits for its reserved slot. Nothing is ever forwarded before the rules
// in force allow it. A failing Redis call sends them all back.
//
// The check names no source (limit.Source{}): a batch handled again after
// a crash may count an early-admitted event twice, which only makes its
// window stricter.
func (r *Retrier) checkEarly(ctx context.Context, b *retryBatch, msgs []kafka.Message) {
	if len(b.early) == 0 {
		return
	}
	events := make([]limit.Event, len(b.early))
	for j, e := range b.early {
		events[j] = e.event
	}
	ds, err := r.Admitter.(NowAdmitter).AdmitNow(ctx, limit.Source{}, events)
	if err != nil || len(ds) != len(events) {
		r.logger().Warn("early check of deferred events failed; they wait for their reserved slots", "events", len(events), "err", err)
		ds = nil
	}
	for j, e := range b.early {
		if ds != nil && ds[j].Kind == limit.Admit {
			b.counts[DecisionEarly]++
			b.items[e.i] = Item{Msg: msgs[e.i], Outcome: Forward}
			continue
		}
		b.items[e.i] = Item{Msg: msgs[e.i], Outcome: Requeue, Deferral: Deferral{Due: e.d.Due}}
	}
}
