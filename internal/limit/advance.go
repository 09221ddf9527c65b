package limit

import (
	"cmp"
	"context"
	"slices"
	"time"
)

// Waiting is a deferred event waiting in a retry tier before its due time
// (issue 24): its tenant, its position in the tier's partition (read when
// the call names a Source), its gk-due, the start of its reserved slot, and
// its Cost, what the Gate counted it as (read from the event the same way:
// route.CostFrom; its gk- headers do not count), which rules and a capacity
// of bytes or units count. It is a value type.
type Waiting struct {
	Tenant string
	Offset int64
	Due    time.Time
	Cost   Cost
	// Windows is the Decision.Windows it was deferred with (its
	// gk-windows): it moves only if that names the windows of its tenant's
	// rules in force, the ones whose slot windows counted it.
	Windows string
}

// advanceCall is what a call of Advance adds to a batch (admit.lua's
// advance argument, 87_advance.lua): each event's due time, index-aligned
// with the call's events.
type advanceCall struct {
	due []int64
}

// Advance moves deferred events into the current windows when the capacity
// has room there that nobody is expected to take (87_advance.lua): per
// tenant, its waiting events in due order from the head, each while its
// tenant's own rules and its entitlement in the current capacity window
// have room and the window has idle room (the capacity not booked, less
// what its satisfied tenants other than the event's are still expected to
// ask there), each for the event's cost (1 for a rule of events, its bytes
// or units for one of bytes or units). A moved event's booking leaves its
// slot's windows (their counts go down by its cost, the capacity's too) and
// is counted in the current
// windows; the caller forwards it now, with gk-due rewritten to at, the
// time the call counted the moves at (its clock, in the windows of at). The
// result is index-aligned with events: true for a moved event. An event
// that does not move keeps its slot, and so do the later events of its
// tenant in the call (a tenant's events leave in order).
//
// With a Source (the tier's partition), a moved event is recorded, like an
// admission, in the partition's replay record: a replay of the call gets
// it back as moved and counts nothing (G9). One script call, as
// AdmitFrom; its window reads are bounded by Options.MaxScan.
//
// Only a limiter with a capacity and aligned windows moves anything, only in
// the second half of the capacity's windows (from the ramp's start, where
// what nobody is expected to take is known), and only tenants whose rules
// are aligned; otherwise Advance returns without a Redis call and nothing
// moves. An event whose cost no rule may count (see AdmitFrom) does not
// move, nor does one whose Windows are not those of its tenant's rules in
// force (deferred before they changed, or by a release that did not name
// them), nor do the later events of its tenant. A non-nil error means Redis
// trouble and nothing moved.
func (l *Limiter) Advance(ctx context.Context, src Source, events []Waiting) (moved []bool, at time.Time, err error) {
	moved = make([]bool, len(events))
	if len(events) == 0 || len(l.opts.Capacity) == 0 || l.opts.WindowKind != Aligned {
		return moved, at, nil
	}
	// The script moves nothing before the ramp's start in every capacity
	// window (idle in 87_advance.lua): no call then.
	now := l.opts.Clock()
	if !l.AdvanceWanted(now) || !l.takeAdvance(now) {
		return moved, at, nil
	}
	// Each tenant's events in due order (groups keeps the order within a
	// tenant): the script moves a tenant's head first.
	order := make([]int, len(events))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		if c := events[a].Due.Compare(events[b].Due); c != 0 {
			return c
		}
		return cmp.Compare(events[a].Offset, events[b].Offset)
	})
	s := getScratch()
	defer s.release()
	s.tenants = grow(s.tenants, len(events))
	pos := positions{Source: src}
	if src.Topic != "" {
		s.offsets = grow(s.offsets, len(events))
		pos.offsets = s.offsets
	}
	adv := &advanceCall{due: make([]int64, len(events))}
	costs := make([]Cost, len(events))
	for j, i := range order {
		s.tenants[j] = events[i].Tenant
		adv.due[j] = events[i].Due.UnixMilli()
		costs[j] = events[i].Cost
		if pos.offsets != nil {
			pos.offsets[j] = events[i].Offset
		}
	}
	pos.advance = adv
	if err := checkSource(pos); err != nil {
		return nil, at, err
	}
	groups, err := l.groups(s, s.tenants, false)
	if err != nil {
		return nil, at, err
	}
	ds := make([]Decision, len(events))
	takeCosts(groups, costs, ds, l.CapacityInForce())
	for _, g := range groups {
		for _, j := range g.idx {
			if events[order[j]].Windows != g.windows {
				ds[j] = Decision{Kind: Reject, Reason: otherWindows}
			}
		}
	}
	inOrder(groups, s.tenants, ds)
	var calls []*group
	l.mu.Lock()
	for _, g := range groups {
		if len(g.idx) == 0 || len(g.rules) == 0 {
			continue
		}
		g.st = l.stateLocked(g, now)
		g.chains = g.st.chains
		calls = append(calls, g)
	}
	l.mu.Unlock()
	if len(calls) == 0 {
		return moved, at, nil
	}
	replies, err := l.call(ctx, s, now, calls, pos, now.Add(l.opts.Horizon))
	if err != nil {
		return nil, at, err
	}
	for j, g := range calls {
		if err := l.apply(g, replies[j], now, ds, false); err != nil {
			return nil, at, err
		}
	}
	for j, i := range order {
		moved[i] = ds[j].Kind == Admit
	}
	return moved, now, nil
}

// otherWindows is why Advance keeps an event deferred under rules that
// count in other windows than its tenant's rules in force (or by a release
// that did not name them): its slot's windows under these rules never
// counted it, so its booking cannot leave them. It keeps its slot.
const otherWindows = "deferred under rules counting in other windows"

// inOrder cuts each group of an Advance call over tenants before its
// tenant's first event that takeCosts took out or that was deferred under
// other windows (ds holds its Reject): the later events of the tenant must
// not move before it (a tenant's events leave in order).
func inOrder(groups []*group, tenants []string, ds []Decision) {
	first := map[string]int{}
	for i := len(ds) - 1; i >= 0; i-- {
		if ds[i].Kind == Reject {
			first[tenants[i]] = i
		}
	}
	if len(first) == 0 {
		return
	}
	for _, g := range groups {
		at, ok := first[g.tenant]
		if !ok {
			continue
		}
		n := 0
		for n < len(g.idx) && g.idx[n] < at {
			n++
		}
		g.idx = g.idx[:n]
		if g.costs != nil { // nil: the group's rules and the capacity count events
			g.costs = g.costs[:n]
		}
	}
}

// advanceArg returns admit.lua's advance argument for the call over groups:
// "A" and, per tenant, the due times of its events (87_advance.lua).
func advanceArg(groups []*group, adv *advanceCall) string {
	b := append(make([]byte, 0, 2+16*len(adv.due)), 'A')
	return string(appendPerGroup(b, groups, func(i int) int64 { return adv.due[i] }))
}

// AdvanceEvery is the least time between two Advance calls of one Limiter,
// for all the partitions that offer their waiting events together: each
// offers ten times a second while events wait (consume.DefaultAdvanceEvery),
// and with a retry tier partition per offer a replica made up to 180 calls a
// second of up to a batch each, nearly all of which found no idle room in a
// capacity used to the full, which doubled the gate's CPU in the paced
// harness (#25's runs AZ to BB). A call moves as many of its events as the
// room takes, so one a tenth of a second is enough for a backlog to follow
// the room.
const AdvanceEvery = 100 * time.Millisecond

// AdvanceWanted reports whether an Advance call at now may move anything:
// with a capacity on aligned windows, once every capacity window
// has reached its ramp (before, a call moves nothing, and none is made),
// and when this Limiter's last call is at least AdvanceEvery old. A caller
// checks it before it builds an offer (route.Retrier.Advance), so that an
// offer that cannot move anything costs nothing.
func (l *Limiter) AdvanceWanted(now time.Time) bool {
	if len(l.opts.Capacity) == 0 || l.opts.WindowKind != Aligned {
		return false
	}
	for _, r := range l.opts.Capacity {
		s, e := WindowBounds(r, now, l.opts.Location)
		if now.Sub(s)*1000 < e.Sub(s)*capacityRampLow {
			return false
		}
	}
	return now.UnixNano() >= l.advNext.Load()
}

// takeAdvance claims the Limiter's next Advance call for now: false when
// another call took it since AdvanceWanted.
func (l *Limiter) takeAdvance(now time.Time) bool {
	next := l.advNext.Load()
	if now.UnixNano() < next {
		return false
	}
	return l.advNext.CompareAndSwap(next, now.Add(l.advanceEvery).UnixNano())
}
