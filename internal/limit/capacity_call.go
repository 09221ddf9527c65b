package limit

import (
	"errors"
	"hash/fnv"
	"strconv"
	"time"
)

// The capacity's part of an admit.lua call (see internal/lua/admit/35_capacity.lua).

// The ramp of the current window's level, in per mille of the window: it
// holds until capacityRampLow, then the capped tenants share what is spare
// (the capacity not booked less what the satisfied are still expected to
// ask, with a margin until capacityRampTight, and each at most what is
// spare and not taken yet), and from capacityRampHigh on what is left is
// anyone's (README: the model).
const (
	capacityRampLow   = 500
	capacityRampTight = 900
	capacityRampHigh  = 980
)

// ErrCapacityCluster is returned by New for a capacity on Redis Cluster
// under a key prefix without a hash tag: the capacity's keys are global, and
// a call per tenant there touches only that tenant's slot.
var ErrCapacityCluster = errors.New("a capacity on Redis Cluster needs every key in one slot, under a key prefix with a {hash tag} (its keys are global; each tenant's sit in a slot of their own)")

// checkCapacityUse reports whether the capacity of opts can be kept with
// these rules and this Redis.
func checkCapacityUse(rules *Rules, opts Options, cluster bool) error {
	if len(opts.Capacity) == 0 {
		return nil
	}
	if cluster {
		return ErrCapacityCluster
	}
	for _, r := range opts.Capacity {
		if err := checkCapacityRule(r); err != nil {
			return err
		}
	}
	if err := CheckCapacityZone(opts.Capacity, opts.Location, opts.Clock()); err != nil {
		return err
	}
	return CheckCapacity(rules, opts.Capacity)
}

// setID names a tenant's rule set under this limiter's capacity: a frontier
// found under one capacity is not used under another.
func (l *Limiter) setID(rules []Rule) string {
	id := ruleSetID(l.opts.WindowKind, rules)
	if len(l.opts.Capacity) > 0 {
		id += "+cap:" + l.opts.Capacity.String()
	}
	return id
}

// windowsID names the windows a tenant's events are counted in under rules
// and the capacity: the window kind and time zone, the rules' and the
// capacity's counters, without their limits (a changed limit counts in the
// same windows, see keys.go), hashed
// short (a deferred event carries it in a header, route.HeaderWindows).
// Advance moves a reservation only when it names the windows of the rules
// in force (Waiting.Windows): after a tenant's rules count in other windows
// (a live override, a reload, a redeploy with another capacity), its slot's
// windows under the new rules never counted it, and taking it out of them
// would let them admit more than their limits.
func (l *Limiter) windowsID(rules []Rule) string {
	h := fnv.New64a()
	h.Write([]byte(l.opts.WindowKind))
	h.Write([]byte(l.opts.Location.String())) // where days, weeks and months start (New sets it)
	for _, r := range rules {
		h.Write([]byte{0})
		h.Write([]byte(r.Counter()))
	}
	for _, r := range l.opts.Capacity {
		h.Write([]byte{1})
		h.Write([]byte(r.Counter()))
	}
	return strconv.FormatUint(h.Sum64(), 36)
}

// capacityKeys appends the capacity rules' keys.
func (l *Limiter) capacityKeys(ks []any) []any {
	for _, r := range l.opts.Capacity {
		ks = append(ks, l.keys.capacity(r))
	}
	return ks
}

// capacityArgs appends the capacity's arguments (35_capacity.lua's header),
// then "cap:<where they start>" (tests may add ":general", see capGeneral), last:
// first is the index in KEYS (1-based) of the first capacity key.
func (l *Limiter) capacityArgs(av []any, groups []*group, now time.Time, first int) []any {
	c := l.opts.Capacity
	if len(c) == 0 {
		return av
	}
	if len(groups) == 0 {
		return av
	}
	// The batch's own rules value, never the one in force now: a batch is
	// decided on one value, shares and floors included.
	rules := groups[0].from
	names := make([]byte, 0, 16*len(groups))
	shares := make([]byte, 0, 4*len(groups)*(1+len(c)))
	names = append(names, '[')
	shares = append(shares, '[')
	for i, g := range groups {
		if i > 0 {
			names = append(names, ',')
			shares = append(shares, ',')
		}
		names = strconv.AppendQuote(names, encodeTenant(g.tenant))
		s := rules.Share(g.tenant)
		shares = strconv.AppendInt(shares, s.weight(), 10)
		for _, r := range c {
			shares = append(shares, ',')
			shares = strconv.AppendInt(shares, s.floor(r), 10)
		}
	}
	names = append(names, ']')
	shares = append(shares, ']')
	at := len(av) + 1 // where the capacity's arguments start in ARGV
	av = append(av, len(c), first, capacityRampLow, capacityRampTight, capacityRampHigh, names, shares)
	sums := floorSums(rules, c)
	inForce := l.CapacityInForce()
	for i, r := range c {
		s, _ := WindowBounds(r, now, l.opts.Location)
		av = append(av, inForce[i].Limit, r.Length().Milliseconds(), s.UnixMilli(), retention(r, l.opts.Retention).Milliseconds(), sums[i], int(r.Measure),
			l.reserveBound(r, inForce[i].Limit))
	}
	tail := "cap:" + strconv.Itoa(at)
	if l.capGeneral {
		tail += ":general"
	}
	return append(av, tail)
}
