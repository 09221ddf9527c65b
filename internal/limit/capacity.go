package limit

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A capacity is one budget for the service behind Gatekeeper, shared by every
// tenant (GATEKEEPER_CAPACITY): rules like a tenant's, kept on global keys, so
// that in every window what all tenants together are admitted or have
// reserved there is at most the capacity (G12). Tenants share it by weighted
// max-min fairness: see the README's "A shared capacity, shared fairly" and
// internal/lua/admit/35_capacity.lua, which keeps it.

// MaxWeight is the largest weight of a tenant.
const MaxWeight = 1000

// Capacity is the capacity rules, none when empty. It is a value type.
type Capacity []Rule

// String returns the capacity as written in GATEKEEPER_CAPACITY.
func (c Capacity) String() string {
	parts := make([]string, len(c))
	for i, r := range c {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}

// Measure returns what the capacity counts: events, bytes or units (all
// its rules count the same; Events without a capacity).
func (c Capacity) Measure() Measure {
	if len(c) == 0 {
		return Events
	}
	return c[0].Measure
}

// ParseCapacity parses GATEKEEPER_CAPACITY: comma-separated rules per aligned
// second, minute, hour, day or week window (hours: a count dividing 24; days
// and weeks: one; hours, days and weeks in a time zone without daylight
// saving: see CheckCapacityZone), of events, bytes or units as LIMITS writes them
// (e.g. "5000/1s", "5000/1s,200000/1m", "10MiB/1s", "2000u/1s"), all of one
// measure; empty means no capacity. Errors quote the bad part.
func ParseCapacity(spec string) (Capacity, error) {
	if strings.TrimSpace(spec) == "" {
		return nil, nil
	}
	var out Capacity
	for _, s := range strings.Split(spec, ",") {
		r, err := parseRule(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		if err := checkCapacityRule(r); err != nil {
			return nil, fmt.Errorf("rule %q: %w", s, err)
		}
		if err := checkTwice(out, r); err != nil {
			return nil, err
		}
		if len(out) > 0 && r.Measure != out[0].Measure {
			return nil, fmt.Errorf("rule %q counts %s, rule %q %s: the rules of a capacity count one measure", s, r.Measure, out[0], out[0].Measure)
		}
		out = append(out, r)
	}
	return out, nil
}

func checkCapacityRule(r Rule) error {
	switch {
	case r.Unit == Month:
		return fmt.Errorf("a capacity window is seconds, minutes, hours, a day or a week, not months (their lengths differ; e.g. 5000/1s, 200000/1m, 5000000/1h, 100000000/1d, 500000000/1w)")
	case r.Limit < 1:
		return fmt.Errorf("a capacity must be at least 1")
	}
	return r.checkAligned()
}

// Share is a tenant's part in the capacity: its weight (1 when not given) and
// its floors, one per capacity window at most: what it may always book in a
// window of that length, whatever the others do, in the capacity's measure
// (events, bytes or units, written as in LIMITS: "200/1s", "1MiB/1s",
// "500u/1s"). It is a value type.
type Share struct {
	Weight int64
	Floors []Rule
}

// floor returns the tenant's floor in the windows of capacity rule c, 0 when none.
func (s Share) floor(c Rule) int64 {
	for _, f := range s.Floors {
		if f.Counter() == c.Counter() {
			return f.Limit
		}
	}
	return 0
}

// weight returns the share's weight, 1 when unset.
func (s Share) weight() int64 {
	if s.Weight < 1 {
		return 1
	}
	return s.Weight
}

// Share returns the share of a tenant: its override's when it has one that
// sets a share, else its own when given, else that of "*", else weight 1
// and no floor.
func (rs *Rules) Share(tenant string) Share {
	if rs == nil {
		return Share{Weight: 1}
	}
	if rs.over != nil {
		if o, ok := rs.over.byTenant[tenant]; ok && o.Share != nil {
			return *o.Share
		}
	}
	if s, ok := rs.shares[tenant]; ok {
		return s
	}
	if rs.fallbackShare != nil {
		return Share{Weight: rs.fallbackShare.Weight}
	}
	return Share{Weight: 1}
}

// ParseShare parses a share as LIMITS writes it, e.g. "weight:3" and
// "floor:200/1s" (the items of a tenant's rule list that are not rules):
// a weight from 1 to MaxWeight (1 when not given), floors of events, bytes
// or units, one per window. Errors quote the bad item.
func ParseShare(items []string) (Share, error) {
	var s Share
	for _, it := range items {
		ok, err := shareItem(strings.TrimSpace(it), &s)
		if err != nil {
			return Share{}, err
		}
		if !ok {
			return Share{}, fmt.Errorf("%q: not weight:N or floor:N/window", it)
		}
	}
	if s.Weight == 0 {
		s.Weight = 1
	}
	return s, nil
}

// SplitShare separates a tenant's rule list as LIMITS writes it
// ("5000/1m,weight:3,floor:200/1s") into its rules and its share items,
// without checking either.
func SplitShare(items []string) (rules, share []string) {
	for _, it := range items {
		k, _, ok := strings.Cut(strings.TrimSpace(it), ":")
		if ok && (k == "weight" || k == "floor") {
			share = append(share, strings.TrimSpace(it))
			continue
		}
		rules = append(rules, it)
	}
	return rules, share
}

// Items returns the share as LIMITS writes it ("weight:3", "floor:200/1s").
func (s Share) Items() []string {
	out := []string{"weight:" + strconv.FormatInt(s.weight(), 10)}
	for _, f := range s.Floors {
		out = append(out, "floor:"+f.String())
	}
	return out
}

// EffectiveWeight returns the share's weight, 1 when unset.
func (s Share) EffectiveWeight() int64 { return s.weight() }

// FloorIn returns the share's floor in the windows of capacity rule c, 0
// when none.
func (s Share) FloorIn(c Rule) int64 { return s.floor(c) }

// shareItem reports whether a rule list item sets a share ("weight:2",
// "floor:200/1s") and, when so, applies it to s. Errors quote the item.
func shareItem(item string, s *Share) (bool, error) {
	k, v, ok := strings.Cut(item, ":")
	if !ok {
		return false, nil
	}
	v = strings.TrimSpace(v)
	switch strings.TrimSpace(k) {
	case "weight":
		w, err := strconv.ParseInt(v, 10, 64)
		if err != nil || w < 1 || w > MaxWeight {
			return true, fmt.Errorf("%q: a weight is a whole number from 1 to %d", item, MaxWeight)
		}
		if s.Weight != 0 {
			return true, fmt.Errorf("%q: weight given twice", item)
		}
		s.Weight = w
	case "floor":
		r, err := parseRule(v)
		if err != nil {
			return true, fmt.Errorf("%q: %w", item, err)
		}
		if err := checkFloorsWindow(s.Floors, r); err != nil {
			return true, fmt.Errorf("%q: %w", item, err)
		}
		s.Floors = append(s.Floors, r)
	default:
		return true, fmt.Errorf("%q: unknown setting %q (want weight: or floor:)", item, k)
	}
	return true, nil
}

// checkFloorsWindow reports a floor over the window of one of floors,
// whatever they count: a capacity counts one measure, so a tenant has one
// floor per window at most.
func checkFloorsWindow(floors []Rule, f Rule) error {
	for _, o := range floors {
		if o.WindowName() == f.WindowName() {
			return fmt.Errorf("two floors for window %s", f.WindowName())
		}
	}
	return nil
}

// splitShare separates a tenant's rule list into its rules and its share.
// who is "*" for the fallback, whose share may not have floors: "*" stands
// for any number of tenants, and floors must sum to at most the capacity.
func splitShare(who string, items []string) ([]string, *Share, error) {
	var rules []string
	var s Share
	shared := false
	for _, it := range items {
		ok, err := shareItem(strings.TrimSpace(it), &s)
		if err != nil {
			return nil, nil, err
		}
		if !ok {
			rules = append(rules, it)
			continue
		}
		shared = true
	}
	if !shared {
		return rules, nil, nil
	}
	if who == "*" && len(s.Floors) > 0 {
		return nil, nil, fmt.Errorf("a floor is for a named tenant (\"*\" stands for any number of tenants)")
	}
	if s.Weight == 0 {
		s.Weight = 1
	}
	return rules, &s, nil
}

// CheckCapacity reports whether the rules' shares, those of their
// overrides included, fit capacity c: every floor names the window of a
// capacity rule, and the floors of each capacity rule sum to at most its
// limit. With no capacity, shares are accepted and unused.
func CheckCapacity(rules *Rules, c Capacity) error {
	if rules == nil || len(c) == 0 {
		return nil
	}
	for _, t := range sortedShareTenants(rules) {
		for _, f := range rules.Share(t).Floors {
			if err := c.checkFloor(f); err != nil {
				return fmt.Errorf("tenant %q: %w", t, err)
			}
		}
	}
	sums := floorSums(rules, c)
	for i, r := range c {
		if sums[i] > r.Limit {
			return fmt.Errorf("the floors of window %s sum to %d, over the capacity %s", r.WindowName(), sums[i], r)
		}
	}
	return nil
}

// checkFloor reports whether floor f names the window of a rule of c and
// counts what it counts (a floor is in the capacity's measure).
func (c Capacity) checkFloor(f Rule) error {
	for _, r := range c {
		if r.WindowName() != f.WindowName() {
			continue
		}
		if r.Measure != f.Measure {
			return fmt.Errorf("floor %s counts %s, the capacity %s counts %s (a floor is in the capacity's measure)", f, f.Measure, r, r.Measure)
		}
		return nil
	}
	return fmt.Errorf("floor %s: no capacity rule of window %s (capacity %s)", f, f.WindowName(), c)
}

// floorMemo is floorSums of one Rules for one capacity.
type floorMemo struct {
	capacity string
	sums     []int64
}

// floorSums returns, per capacity rule, the sum of the named tenants'
// floors (each tenant's share in force: its override's when it sets one).
// Computed once per Rules and capacity (every call under a capacity reads
// it), so that a call costs nothing per override.
func floorSums(rules *Rules, c Capacity) []int64 {
	if rules == nil {
		return make([]int64, len(c))
	}
	key := c.String()
	if m := rules.floors.Load(); m != nil && m.capacity == key {
		return m.sums
	}
	sums := make([]int64, len(c))
	add := func(s Share) {
		for i, r := range c {
			sums[i] += s.floor(r)
		}
	}
	for t, s := range rules.shares {
		if o, ok := rules.overlay(t); ok && o.Share != nil {
			continue // counted with the overrides
		}
		add(s)
	}
	if rules.over != nil {
		for _, o := range rules.over.byTenant {
			if o.Share != nil {
				add(*o.Share)
			}
		}
	}
	rules.floors.Store(&floorMemo{capacity: key, sums: sums})
	return sums
}

// overlay returns the tenant's override in rs, if any.
func (rs *Rules) overlay(tenant string) (Overlay, bool) {
	if rs == nil || rs.over == nil {
		return Overlay{}, false
	}
	o, ok := rs.over.byTenant[tenant]
	return o, ok
}

// sortedShareTenants lists the tenants with a share of their own, in
// LIMITS or in an override, sorted.
func sortedShareTenants(rs *Rules) []string {
	m := make(map[string][]string, len(rs.shares))
	for t := range rs.shares {
		m[t] = nil
	}
	if rs.over != nil {
		for t, o := range rs.over.byTenant {
			if o.Share != nil {
				m[t] = nil
			}
		}
	}
	return sortedKeys(m)
}

// addShare records the share of tenant ("*": every other tenant), when given.
func (rs *Rules) addShare(tenant string, s *Share) error {
	if s == nil {
		return nil
	}
	if tenant == "*" {
		rs.fallbackShare = s
		return nil
	}
	if rs.shares == nil {
		rs.shares = map[string]Share{}
	}
	if _, dup := rs.shares[tenant]; dup {
		return fmt.Errorf("tenant %q: share given twice", tenant)
	}
	rs.shares[tenant] = *s
	return nil
}

// BaseFloors returns the floors that the rules of LIMITS or LIMITS_FILE
// (rs without its overrides) give, by tenant with some floor: one value per
// rule of c, 0 where it has none. The override store checks a write's
// floors against them and against the overrides' floors in Redis.
func BaseFloors(rs *Rules, c Capacity) map[string][]int64 {
	out := map[string][]int64{}
	if rs == nil {
		return out
	}
	for t, s := range rs.shares {
		fs := make([]int64, len(c))
		some := false
		for i, r := range c {
			fs[i] = s.floor(r)
			some = some || fs[i] > 0
		}
		if some {
			out[t] = fs
		}
	}
	return out
}

// CheckShareChange reports whether tenant may take share s under capacity
// c, the other tenants keeping their shares in rules: every floor of s
// names a capacity window, and the floors of each capacity rule, the
// tenant's new ones in place of its old, sum to at most its limit, unless
// the change does not raise the tenant's floor there (lowering a floor is
// always taken, so floors over the capacity never block a way back).
func CheckShareChange(rules *Rules, c Capacity, tenant string, s Share) error {
	for _, f := range s.Floors {
		if err := c.checkFloor(f); err != nil {
			return err
		}
	}
	sums := floorSums(rules, c)
	old := rules.Share(tenant)
	for i, r := range c {
		if n := sums[i] - old.floor(r) + s.floor(r); n > r.Limit && s.floor(r) > old.floor(r) {
			return fmt.Errorf("the floors of window %s would sum to %d, over the capacity %s", r.WindowName(), n, r)
		}
	}
	return nil
}

// ShareRaised reports whether share now lets a tenant book more of a
// capacity than before: a higher weight, or a floor higher than before (or
// new) in some window.
func ShareRaised(before, now Share) bool {
	if now.weight() > before.weight() {
		return true
	}
	for _, f := range now.Floors {
		if f.Limit > before.floor(f) {
			return true
		}
	}
	return false
}

// CheckCapacityZone reports whether the windows of capacity c tile time
// with a fixed step in zone loc, as the admission script keeps them (a
// capacity window is base + i × its length): always for seconds and
// minutes; for hours, days and weeks, when loc's offset from UTC does not
// change in the two years from now (UTC, or a zone without daylight
// saving), since a change of offset moves local hour boundaries, and local
// midnights, against that step.
func CheckCapacityZone(c Capacity, loc *time.Location, now time.Time) error {
	for _, r := range c {
		if r.Unit == Second || r.Unit == Minute {
			continue
		}
		_, off := now.In(loc).Zone()
		for d := 0; d <= 2*366; d++ {
			if _, o := now.AddDate(0, 0, d).In(loc).Zone(); o != off {
				return fmt.Errorf("capacity %s: %s windows need a time zone without daylight saving (TIMEZONE %s changes its offset from UTC)", r, unitName(r.Unit), loc)
			}
		}
	}
	return nil
}

// unitName names a capacity rule's window unit in an error.
func unitName(u Unit) string {
	switch u {
	case Hour:
		return "hour"
	case Day:
		return "day"
	default:
		return "week"
	}
}
