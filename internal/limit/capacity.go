package limit

import (
	"fmt"
	"strconv"
	"strings"
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

// ParseCapacity parses GATEKEEPER_CAPACITY: comma-separated rules of events
// per aligned second or minute window, e.g. "5000/1s" or "5000/1s,200000/1m";
// empty means no capacity. Errors quote the bad part.
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
		out = append(out, r)
	}
	return out, nil
}

func checkCapacityRule(r Rule) error {
	switch {
	case r.Measure != Events:
		return fmt.Errorf("a capacity counts events (bytes and units are not supported yet)")
	case r.Unit != Second && r.Unit != Minute:
		return fmt.Errorf("a capacity window is seconds or minutes (e.g. 5000/1s, 200000/1m)")
	case r.Limit < 1:
		return fmt.Errorf("a capacity must be at least 1")
	}
	return r.checkAligned()
}

// Share is a tenant's part in the capacity: its weight (1 when not given) and
// its floors, one per capacity window at most: events it may always book in
// a window of that length, whatever the others do. It is a value type.
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

// Share returns the share of a tenant: its own when given, else that of "*",
// else weight 1 and no floor.
func (rs *Rules) Share(tenant string) Share {
	if rs == nil {
		return Share{Weight: 1}
	}
	if s, ok := rs.shares[tenant]; ok {
		return s
	}
	if rs.fallbackShare != nil {
		return Share{Weight: rs.fallbackShare.Weight}
	}
	return Share{Weight: 1}
}

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
		if r.Measure != Events {
			return true, fmt.Errorf("%q: a floor counts events", item)
		}
		if err := checkTwice(s.Floors, r); err != nil {
			return true, fmt.Errorf("%q: two floors for one window", item)
		}
		s.Floors = append(s.Floors, r)
	default:
		return true, fmt.Errorf("%q: unknown setting %q (want weight: or floor:)", item, k)
	}
	return true, nil
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

// CheckCapacity reports whether the rules' shares fit capacity c: every
// floor names the window of a capacity rule, and the floors of each
// capacity rule sum to at most its limit. With no capacity, shares are
// accepted and unused.
func CheckCapacity(rules *Rules, c Capacity) error {
	if rules == nil || len(c) == 0 {
		return nil
	}
	sums := make([]int64, len(c))
	for _, t := range sortedShareTenants(rules) {
		for _, f := range rules.shares[t].Floors {
			found := false
			for i, r := range c {
				if r.Counter() == f.Counter() {
					found = true
					sums[i] += f.Limit
				}
			}
			if !found {
				return fmt.Errorf("tenant %q: floor %s: no capacity rule of window %s (capacity %s)", t, f, f.WindowName(), c)
			}
		}
	}
	for i, r := range c {
		if sums[i] > r.Limit {
			return fmt.Errorf("the floors of window %s sum to %d, over the capacity %s", r.WindowName(), sums[i], r)
		}
	}
	return nil
}

// floorSums returns, per capacity rule, the sum of the named tenants' floors.
func floorSums(rules *Rules, c Capacity) []int64 {
	sums := make([]int64, len(c))
	if rules == nil {
		return sums
	}
	for _, s := range rules.shares {
		for i, r := range c {
			sums[i] += s.floor(r)
		}
	}
	return sums
}

func sortedShareTenants(rs *Rules) []string {
	m := make(map[string][]string, len(rs.shares))
	for t := range rs.shares {
		m[t] = nil
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
