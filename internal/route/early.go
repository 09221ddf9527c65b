package route

import (
	"context"
	"slices"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// DecisionEarly counts, in gatekeeper_decisions_total, deferred events
// admitted before their reserved slot because their tenant's rules were
// raised and the current window had room under the raised rules.
const DecisionEarly = "admit_early"

// DecisionMoved counts, in gatekeeper_decisions_total, deferred events moved
// to an earlier reserved slot because their tenant's rules were raised: no
// room now, but room under the rules in force in a window before their old
// slot.
const DecisionMoved = "moved_forward"

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

// BeforeAdmitter admits now or reserves in a window that starts before a
// time (*limit.Limiter implements it: limit.Limiter.AdmitBefore).
type BeforeAdmitter interface {
	AdmitBefore(ctx context.Context, src limit.Source, events []limit.Event, before time.Time) ([]limit.Decision, error)
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
// there); else, when the Admitter is a BeforeAdmitter, it takes the
// earliest slot the rules in force allow before its old one, if any
// (reserved there, and it goes back to the retry tier of its new due with
// the new deferral's headers and gk-checked); else it goes back to the
// retry tier of its remaining delay with gk-checked, other headers
// unchanged, and waits for its reserved slot. The old slot of an event
// admitted or moved is given back (when the Admitter is a SlotReleaser:
// limit.Limiter.Release, in the windows of the rules before the raise),
// so that it counts once. Nothing is ever forwarded before the rules in
// force allow it. A failing Redis call sends the events it was for back
// unchecked.
//
// The check names no source (limit.Source{}): a batch handled again after
// a crash may count an early-admitted or moved event twice (its old slot
// is given back once), which only makes a window stricter.
func (r *Retrier) checkEarly(ctx context.Context, b *retryBatch, msgs []kafka.Message) {
	if len(b.early) == 0 {
		return
	}
	ds, ok := r.decideEarly(ctx, b.early)
	checked := []byte(strconv.FormatInt(r.now().UnixMilli(), 10))
	var slots []limit.MissedSlot
	for j, e := range b.early {
		d := ds[j]
		switch {
		case ok[j] && d.Kind == limit.Admit:
			b.counts[DecisionEarly]++
			b.items[e.i] = Item{Msg: msgs[e.i], Outcome: Forward}
		case ok[j] && d.Kind == limit.Defer && d.Due.Before(e.d.Due):
			b.counts[DecisionMoved]++
			next := e.d
			next.Due, next.Reserved, next.Windows = d.Due, d.Until, d.Windows
			m := withHeaders(WithDeferral(msgs[e.i], next), func(k string) bool { return k == HeaderChecked },
				kafka.Header{Key: HeaderChecked, Value: checked})
			b.items[e.i] = Item{Msg: m, Outcome: Requeue, Deferral: Deferral{Due: next.Due}}
		default:
			if ok[j] && d.Kind == limit.Defer {
				// Reserved no earlier than its old slot: give the new one back.
				unused := e.d
				unused.Due = d.Due
				s := missedSlot(unused, e.event.Cost)
				s.Trip += ":unused"
				slots = append(slots, s)
			}
			m := msgs[e.i]
			if ok[j] {
				m = withHeaders(m, func(k string) bool { return k == HeaderChecked || k == HeaderSig },
					kafka.Header{Key: HeaderChecked, Value: checked})
			}
			b.items[e.i] = Item{Msg: m, Outcome: Requeue, Deferral: Deferral{Due: e.d.Due}}
			continue
		}
		s := missedSlot(e.d, e.event.Cost)
		s.Rules = e.before
		slots = append(slots, s)
	}
	if err := r.releaseMissed(ctx, slots); err != nil {
		// Forwarded or moved anyway: the slots stay counted, each window
		// stricter by the events whose slot was not given back.
		r.logger().Warn("slots of events admitted early or moved not given back", "events", len(slots), "err", err)
	}
}

// decideEarly decides the events released early (see checkEarly): with a
// BeforeAdmitter, one call per distinct old due, the earliest first, each
// reaching only before that due (so that an event never takes a slot that
// is not earlier than its own, and those waiting longest are not
// outrun); else one AdmitNow call. ok[j] is false for the events whose
// call failed.
func (r *Retrier) decideEarly(ctx context.Context, early []earlyCheck) (ds []limit.Decision, ok []bool) {
	ds, ok = make([]limit.Decision, len(early)), make([]bool, len(early))
	decide := func(idx []int, call func([]limit.Event) ([]limit.Decision, error)) {
		events := make([]limit.Event, len(idx))
		for k, j := range idx {
			events[k] = early[j].event
		}
		got, err := call(events)
		if err != nil || len(got) != len(events) {
			r.logger().Warn("early check of deferred events failed; they wait for their reserved slots", "events", len(events), "err", err)
			return
		}
		for k, j := range idx {
			ds[j], ok[j] = got[k], true
		}
	}
	ba, before := r.Admitter.(BeforeAdmitter)
	if !before {
		all := make([]int, len(early))
		for j := range all {
			all[j] = j
		}
		decide(all, func(ev []limit.Event) ([]limit.Decision, error) {
			return r.Admitter.(NowAdmitter).AdmitNow(ctx, limit.Source{}, ev)
		})
		return ds, ok
	}
	byDue := map[int64][]int{}
	for j, e := range early {
		byDue[e.d.Due.UnixMilli()] = append(byDue[e.d.Due.UnixMilli()], j)
	}
	dues := make([]int64, 0, len(byDue))
	for due := range byDue {
		dues = append(dues, due)
	}
	slices.Sort(dues)
	for _, due := range dues {
		decide(byDue[due], func(ev []limit.Event) ([]limit.Decision, error) {
			return ba.AdmitBefore(ctx, limit.Source{}, ev, time.UnixMilli(due-1))
		})
	}
	return ds, ok
}
