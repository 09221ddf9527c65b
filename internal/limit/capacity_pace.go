package limit

import (
	"math"
	"time"
)

// A paced capacity (GATEKEEPER_CAPACITY_FROM, an operator's cap; see
// internal/pace): the configured capacity is the ceiling, and a rate in
// events a second, set at run time, may lower it. Each call passes the
// capacity in force then; the script fixes a window's capacity at its first
// call while current (cap_fix in 35_capacity.lua), so every replica keeps
// the same capacity for the whole window whatever their view of the rate.

// SetCapacityRate sets the capacity in force to rate events a second: the
// limit of the capacity's rule of the shortest window becomes rate times
// that window, rounded down, at least 1 and at most the configured limit.
// Its longer rules keep their configured limits: a window's capacity is
// fixed at its first call, so a longer rule paced too would hold the rate
// of its first second for the whole window (an hour at the floor after a
// cut at the hour's start), and the shortest rule already bounds every
// longer window by the rate. A rate that is not positive and finite
// restores the configured capacity. Safe for concurrent use.
func (l *Limiter) SetCapacityRate(rate float64) {
	c := l.opts.Capacity
	if len(c) == 0 {
		return
	}
	if !(rate > 0) || math.IsInf(rate, 0) {
		l.capNow.Store(nil)
		return
	}
	shortest := c.shortest()
	now := make(Capacity, len(c))
	copy(now, c)
	for i, r := range c {
		if r.Length() == shortest {
			n := int64(math.Floor(rate * r.Length().Seconds()))
			now[i].Limit = max(1, min(n, r.Limit))
		}
	}
	l.capNow.Store(&now)
}

// shortest returns the length of c's shortest rule, the one a paced rate
// sets.
func (c Capacity) shortest() time.Duration {
	d := c[0].Length()
	for _, r := range c[1:] {
		d = min(d, r.Length())
	}
	return d
}

// PaceReservations bounds, under a paced capacity (enforced: not shadow),
// what all tenants together may reserve in a window of the paced rule that
// is not yet current: at most floor events a second (the pacing's floor)
// times the window, or an eighth of the capacity in force there when that
// is more; each tenant's part of it is its entitlement's (35_capacity.lua,
// cap_room). A reservation is final, and a window's capacity in force is
// at least what it holds at its first call: reserved at the old rate, the
// windows after a cut would hold the old rate's reservations (up to half of
// it) while the pacing sets the floor to drain the backlog it left. Bounded
// so, they hold at most what the pacing may set. 0 removes the bound. Safe
// for concurrent use.
func (l *Limiter) PaceReservations(floor float64) {
	if !(floor > 0) || math.IsInf(floor, 0) {
		floor = 0
	}
	l.capResv.Store(math.Float64bits(floor))
}

// PacedReservations returns the floor PaceReservations set, 0 when none.
func (l *Limiter) PacedReservations() float64 {
	return math.Float64frombits(l.capResv.Load())
}

// reserveBound returns what all tenants together may reserve in a window
// of capacity rule r (in force: limit) that is not yet current, 0 for no
// bound (see PaceReservations).
func (l *Limiter) reserveBound(r Rule, limit int64) int64 {
	floor := l.PacedReservations()
	if floor == 0 || r.Length() != l.opts.Capacity.shortest() {
		return 0
	}
	b := max(int64(math.Floor(floor*r.Length().Seconds())), limit/reserveShare, 1)
	if b >= limit {
		return 0
	}
	return b
}

// reserveShare: a paced window not yet current may hold an eighth of the
// capacity in force even when the floor is lower (PaceReservations), so
// that a backlog deferred under a low floor still drains by reservations
// at an eighth of the capacity and the horizon has room for it.
const reserveShare = 8

// CapacityInForce returns the capacity that calls pass now: the configured
// one unless SetCapacityRate lowered it.
func (l *Limiter) CapacityInForce() Capacity {
	if c := l.capNow.Load(); c != nil {
		return *c
	}
	return l.opts.Capacity
}

// Rate returns the capacity as a rate in events a second
// (the tightest of its rules), 0 without a capacity.
func (c Capacity) Rate() float64 {
	rate := 0.0
	for i, r := range c {
		x := float64(r.Limit) / r.Length().Seconds()
		if i == 0 || x < rate {
			rate = x
		}
	}
	return rate
}
