package limit

import "math"

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
	shortest := c[0].Length()
	for _, r := range c[1:] {
		shortest = min(shortest, r.Length())
	}
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
