// Package pace sets the shared capacity from what the downstream drains (G13):
// GATEKEEPER_CAPACITY_FROM=group:<downstream group>.
//
// One replica at a time (a lease in Redis) reads, once per interval, the
// downstream group's committed offsets and the downstream topic's end
// offsets, estimates the group's drain rate and the time events wait
// downstream (lag / drain rate), and sets a rate in events a second so that
// the wait stays under its target, through a halving of the drain too (it
// holds half the target), between a floor and a ceiling. The rate is
// one value for the fleet, in Redis; every replica reads it and passes it to
// its limiter (limit.Limiter.SetCapacityRate), which fixes each window's
// capacity at the window's first call, so that the capacity in force is the
// same for every replica within a window and never exceeded there.
//
// Signal lost: when the downstream group has no members, or its offsets
// cannot be read, the last rate is held for the hold time, then the floor is
// used, until the signal is back. The state is in the fleet record, shown in
// /readyz and the metrics.
//
// Shadow: the rate is computed, stored and exported, never enforced.
//
// Manual cap: an operator may cap the capacity until a given time (the API's
// PUT /v1/capacity/cap, `gatekeeper capacity cap`), recorded with who and why
// in an audit stream; it applies whether or not the capacity is paced.
package pace
