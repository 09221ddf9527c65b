package route

import (
	"context"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// DecisionEarly counts, in gatekeeper_decisions_total, deferred events
// admitted before their reserved slot because their tenant's rules were
// raised and the current window had room under the raised rules.
const DecisionEarly = "admit_early"

// HeaderChecked is when a deferred event released early after a raise was
// checked and found no room (unix ms): it went back to its retry tier with
// it, and is not checked early again but after a later raise. Internal to
// the retry tiers; it stays on the event downstream like every gk- header.
const HeaderChecked = "gk-checked"

// NowAdmitter admits in the current window only, reserving nothing
// (*limit.Limiter implements it: limit.Limiter.AdmitNow).
type NowAdmitter interface {
	AdmitNow(ctx context.Context, src limit.Source, events []limit.Event) ([]limit.Decision, error)
}

// CheckedSince returns when m, a deferred event, was last deferred or
// checked early: its gk-checked, else its gk-first-seen (its first
// deferral: an event deferred again after a missed slot may be checked
// once more than needed); false when it has neither.
func CheckedSince(m kafka.Message) (time.Time, bool) {
	for _, h := range []string{HeaderChecked, HeaderFirstSeen} {
		if v, ok := lastHeader(m.Headers, h); ok {
			if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
				return time.UnixMilli(ms), true
			}
		}
	}
	return time.Time{}, false
}

// earlyCheck is an event released before its time after its tenant's
// rules were raised: msgs[i], with its deferral, as the limiter decides
// it, and the rules whose windows counted its slot (nil: the rules in
// force).
type earlyCheck struct {
	i      int
	d      Deferral
	event  limit.Event
	before []limit.Rule
}

// early takes m, released before its time, for an early check when the
// Retrier's Expedited says it was let go on purpose and its headers read
// (c: what the release clock read of them); it reports whether it took it.
func (r *Retrier) early(b *retryBatch, i int, m kafka.Message, c *checked) bool {
	if r.Expedited == nil {
		return false
	}
	before, ok := r.Expedited(m)
	if !ok {
		return false
	}
	if _, ok := r.Admitter.(NowAdmitter); !ok {
		return false
	}
	d, err := parseDeferral(m, c.dueOf())
	if err != nil {
		return false
	}
	cost, err := r.CostFrom.Cost(m)
	if err != nil {
		return false
	}
	b.early = append(b.early, earlyCheck{i: i, d: d, event: limit.Event{Tenant: d.Tenant, Cost: cost}, before: before})
	return true
}

// checkEarly decides the events released early: each is admitted now if
// the rules in force have room for it in the current window (counted
// there), and its reserved slot is given back (when the Admitter is a
// SlotReleaser: limit.Limiter.Release, in the windows of the rules before
// the raise), so that it counts once; else it goes back to the retry tier
// of its remaining delay with gk-checked, other headers unchanged, and
// waits for its reserved slot. Nothing is ever forwarded before the rules
// in force allow it. A failing Redis call sends them all back unchecked.
//
// The check names no source (limit.Source{}): a batch handled again after
// a crash may count an early-admitted event twice (its slot is given back
// once), which only makes its window stricter.
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
	checked := []byte(strconv.FormatInt(r.now().UnixMilli(), 10))
	var slots []limit.MissedSlot
	for j, e := range b.early {
		if ds != nil && ds[j].Kind == limit.Admit {
			b.counts[DecisionEarly]++
			b.items[e.i] = Item{Msg: msgs[e.i], Outcome: Forward}
			s := missedSlot(e.d, e.event.Cost)
			s.Rules = e.before
			slots = append(slots, s)
			continue
		}
		m := msgs[e.i]
		if ds != nil {
			m = withHeaders(m, func(k string) bool { return k == HeaderChecked || k == HeaderSig },
				kafka.Header{Key: HeaderChecked, Value: checked})
		}
		b.items[e.i] = Item{Msg: m, Outcome: Requeue, Deferral: Deferral{Due: e.d.Due}}
	}
	if err := r.releaseMissed(ctx, slots); err != nil {
		// Forwarded anyway: the slots stay counted, each window stricter
		// by the events whose slot was not given back.
		r.logger().Warn("slots of events admitted early not given back", "events", len(slots), "err", err)
	}
}
