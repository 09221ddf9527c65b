package limit

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// lateCall is what a call of AdmitLate adds to a batch (admit.lua's late
// argument, 85_late.lua): whether its late events may take the slots of
// later reservations, and which events came back inside their slot.
type lateCall struct {
	take bool
	// inSlot is index-aligned with the call's events: the event is a
	// claim (Event.InSlot); due is a claim's Event.Due in unix ms (0: none).
	inSlot []bool
	due    []int64
}

// replayKeep is the code of a claim that keeps its slot in admit.lua's
// replayed list (85_late.lua): it is not a replay, and is not recorded.
const replayKeep = 5

// AdmitLate decides a batch read back from the first retry tier: events
// that missed their reserved slot (late: checked again as new) and events
// that came back inside it (Event.InSlot: claims). One Redis round trip,
// as AdmitFrom.
//
// A claim gets Keep (forward it uncounted: its slot is its own) unless a
// late event of its tenant took its slot; then it is decided as a late
// event, after its tenant's late events of the batch. With take, a late
// event that the current window has no room for takes the slot of its
// tenant's earliest reservation in a later window that is full (one
// starting at least a second after now), ahead of what the tenant deferred
// after it: it is deferred there (Defer, Due the window's start), and the
// reservation's own event, when it comes back, finds its slot taken and is
// placed again (its claim is not Keep). A window's count never moves for a
// take, so no window goes over its limit; late events that find no slot to
// take are reserved as AdmitFrom does. Only tenants take slots whose every
// measure (events, bytes or units) has a rule of the finest windows (2/1m
// with 100B/1m, not 2/10s with 100B/1m): with aligned windows, rules that
// nest in the finest of them (every boundary of another rule is one of the
// finest rule's: 1m in 1h in 1d, not 10s with 15s), a slot being a window
// of the finest rule; with ttl windows and no capacity, one rule, a slot
// being a window of its chain (admit/85_late.lua). Under a capacity, its
// rules and the tenant's must nest too, and count what the tenant's finest
// rules count: a capacity of 1m beside 100/1m or 1000/1s qualifies, and
// one of 1s beside 50/5s is then the finest rule (a slot is a capacity
// window, its reservations what the tenant booked there). A capacity of another measure qualifies when its
// windows are the tenant's finest (400B/1m beside 100/1m: the tenant's
// booking is then what it reserved in a slot), or when it counts bytes or
// units in shorter windows beside rules of events (10MiB/1s beside
// 1000/1m): a capacity window where the tenant booked any bytes holds at
// least one reserved event (costs are never negative), and gives one late
// event a slot. By the same bound, rules whose finest counts bytes or
// units qualify beside coarser rules of events (10000B/1m with 100/1h).
// Every other tenant of aligned windows takes by segments (2/10s with
// 3/15s; a capacity of 4s beside 6s, or of events in 10s beside 10000B/1m):
// a slot is then the time between two bounds of any rule's windows, its
// own or the capacity's, and each reservation records what it holds there
// beside its home window's count (admit/85_late.lua, Segments).
// With bytes or units, a late event takes its cost of
// what is reserved in that window in each measure, and the window's claims
// give up their slots, the last first, until they have given up at least
// as much in every measure (the last ones may give up more than was taken:
// the window forwards less than it counted, never more). The others' late
// events are decided as by AdmitFrom. A take is recorded
// under its slot's due time, apart from the tenant's rules, and a claim
// (Event.Due) reads its own: it finds its slot taken whatever the tenant's
// rules are now. A claim's Cost is what it gives up.
//
// Every replica that may handle the first retry tier must check claims
// (call AdmitLate for in-slot events) before any calls it with take: an
// older one would forward a claim whose slot was taken, and its window
// would get one event over its limit. The result is index-aligned with
// events; a non-nil error means Redis trouble and nothing was decided.
func (l *Limiter) AdmitLate(ctx context.Context, src Source, events []Event, take bool) ([]Decision, error) {
	// Each tenant's claims go after its late events: the script reads the
	// last events of a tenant as its claims.
	order := make([]int, 0, len(events))
	for i, e := range events {
		if !e.InSlot {
			order = append(order, i)
		}
	}
	for i, e := range events {
		if e.InSlot {
			order = append(order, i)
		}
	}
	sorted := make([]Event, len(events))
	inSlot := make([]bool, len(events))
	due := make([]int64, len(events))
	for j, i := range order {
		sorted[j], inSlot[j] = events[i], events[i].InSlot
		if e := events[i]; e.InSlot && !e.Due.IsZero() {
			due[j] = e.Due.UnixMilli()
		}
	}
	s := getScratch()
	defer s.release()
	tenants, costs, at := s.split(src, sorted)
	at.late = &lateCall{take: take, inSlot: inSlot, due: due}
	ds, err := l.admitFrom(ctx, s, at, tenants, costs, false, time.Time{})
	if err != nil {
		return nil, err
	}
	out := make([]Decision, len(events))
	for j, i := range order {
		out[i] = ds[j]
	}
	return out, nil
}

// deferral is the Defer decision of a reservation in admit.lua's reply:
// a negated until marks a slot taken from a later reservation (85_late.lua).
func deferral(due, until int64) Decision {
	if until < 0 {
		return Decision{Kind: Defer, Due: time.UnixMilli(due), Until: time.UnixMilli(-until), Took: true}
	}
	return Decision{Kind: Defer, Due: time.UnixMilli(due), Until: time.UnixMilli(until)}
}

// lateArg returns admit.lua's late argument for the call over groups:
// [take, claims of each tenant, then each claim's due in unix ms, tenant
// by tenant in the call's order] (85_late.lua), or "" for a call of
// AdmitFrom.
func lateArg(groups []*group, late *lateCall) string {
	if late == nil {
		return ""
	}
	b := make([]byte, 0, 4+2*len(groups))
	b = append(b, '[')
	if late.take {
		b = append(b, '1')
	} else {
		b = append(b, '0')
	}
	for _, g := range groups {
		n := 0
		for _, i := range g.idx {
			if late.inSlot[i] {
				n++
			}
		}
		b = append(b, ',')
		b = strconv.AppendInt(b, int64(n), 10)
	}
	for _, g := range groups {
		for _, i := range g.idx {
			if late.inSlot[i] {
				b = append(b, ',')
				b = strconv.AppendInt(b, late.due[i], 10)
			}
		}
	}
	return string(append(b, ']'))
}

// hasClaims reports whether g holds a claim of a late call: such a group
// goes to Redis, never decided locally (a claim is never rejected).
func (p positions) hasClaims(g *group) bool {
	if p.late == nil {
		return false
	}
	for _, i := range g.idx {
		if p.late.inSlot[i] {
			return true
		}
	}
	return false
}

// TakesUntil returns a time at or after the end of every window in which a
// late event has taken a slot under the Limiter's key prefix (AdmitLate
// with take: the Defer decisions with Took, whose Until is that end), and
// first raises it to at (zero: only read it). A claim due after it cannot
// have lost its slot (it finds a take under its own due time or under the
// start of its tenant's finest window that holds now, both after it), so
// it may be forwarded without AdmitLate: the first retry tier's batches of
// events back inside their slot then make one small call instead of an
// admit call (route.Retrier.Takes). It holds while every replica that
// takes slots raises it before each attempt of a call that may take (to
// now plus ReplayRecordTTL: a batch whose takes were recorded but whose
// caller stopped before raising it again is replayed by the partition's
// next owner well within that) and after the call (to the end of the
// latest window taken in). When the bound is absent (never set, or lost
// with Redis's data), it starts at now plus the deferral horizon: takes
// made without it (an older release) or before it was lost may be due
// that late. One Redis call, within Options.Timeout; an error means
// nothing is known.
func (l *Limiter) TakesUntil(ctx context.Context, at time.Time) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	raise := int64(0)
	if !at.IsZero() {
		raise = at.UnixMilli()
	}
	start := l.opts.Clock().Add(l.opts.Horizon).UnixMilli()
	v, err := l.takesUntil.Run(ctx, l.rdb, []string{l.keys.takesUntil()}, raise, start).Int64()
	if err != nil {
		l.metrics.redisErrors.Inc()
		return time.Time{}, fmt.Errorf("takes until: %w", err)
	}
	return time.UnixMilli(v), nil
}
