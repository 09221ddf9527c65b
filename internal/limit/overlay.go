package limit

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Overlay is one tenant's rules from a live override, layered over the
// rules of LIMITS or LIMITS_FILE by Rules.WithOverlays. It is a value type.
type Overlay struct {
	// Rules replace the tenant's own rules (or the "*" rules) while the
	// override is in force; none admits everything, unless KeepRules.
	Rules []Rule
	// KeepRules: the tenant keeps its rules of LIMITS or LIMITS_FILE (Rules
	// is then empty), the override sets only its Share.
	KeepRules bool
	// Share, if set, replaces the tenant's weight and floors (its part of
	// the shared capacity, capacity.go) while the override is in force.
	Share *Share
	// Version is the override's version, carried by every decision made
	// under it (Decision.Override).
	Version int64
}

// overlays are the live overrides of one Rules, immutable once built.
type overlays struct {
	byTenant map[string]Overlay
	version  int64
}

// WithOverlays returns rules that give each tenant of over its overlay's
// rules and every other tenant its rules in rs (rs's own overlays are
// dropped); version names the whole set of overrides (Rules.Version). rs
// is not changed, and the result shares its maps and takes over, which the
// caller must not change afterwards. A limiter decides each batch on one
// Rules value (SetRules swaps a pointer), so a batch never sees half of a
// change.
//
// Overlays with the same rules are made to share one rule list, so that a
// batch names each distinct list once, however many tenants have it.
func (rs *Rules) WithOverlays(over map[string]Overlay, version int64) *Rules {
	shared := map[string][]Rule{}
	ids := map[*Rule]string{} // lists shared already are named once
	for t, o := range over {
		if len(o.Rules) == 0 {
			continue
		}
		k, ok := ids[&o.Rules[0]]
		if !ok {
			k = ruleSetID("", o.Rules)
			ids[&o.Rules[0]] = k
		}
		if s, ok := shared[k]; ok {
			if &s[0] != &o.Rules[0] {
				// Written only when not shared yet: a map handed to
				// WithOverlays again (a reload of the base rules) is read
				// by the batches in flight and is then left alone.
				o.Rules = s
				over[t] = o
			}
		} else {
			shared[k] = o.Rules
		}
	}
	out := &Rules{}
	if rs != nil {
		out.byTenant, out.fallback, out.spec = rs.byTenant, rs.fallback, rs.spec
		out.shares, out.fallbackShare = rs.shares, rs.fallbackShare
	}
	if out.byTenant == nil {
		out.byTenant = map[string][]Rule{}
	}
	if len(over) > 0 || version != 0 {
		out.over = &overlays{byTenant: over, version: version}
	}
	return out
}

// Base returns rs without its overlays: the rules of LIMITS or LIMITS_FILE.
func (rs *Rules) Base() *Rules {
	if rs == nil || rs.over == nil {
		return rs
	}
	return rs.WithOverlays(nil, 0)
}

// Version returns the version of the set of overrides layered over rs (0:
// none).
func (rs *Rules) Version() int64 {
	if rs == nil || rs.over == nil {
		return 0
	}
	return rs.over.version
}

// OverrideVersion returns the version of the tenant's override in rs, 0
// when it has none.
func (rs *Rules) OverrideVersion(tenant string) int64 {
	if rs == nil || rs.over == nil {
		return 0
	}
	return rs.over.byTenant[tenant].Version
}

// lookup returns the tenant's rules and the version of its override (0:
// none): For and OverrideVersion in one map lookup.
func (rs *Rules) lookup(tenant string) ([]Rule, int64) {
	if rs == nil {
		return nil, 0
	}
	var version int64
	if rs.over != nil {
		if o, ok := rs.over.byTenant[tenant]; ok {
			if !o.KeepRules {
				return o.Rules, o.Version
			}
			version = o.Version
		}
	}
	if r, ok := rs.byTenant[tenant]; ok {
		return r, version
	}
	return rs.fallback, version
}

// Overridden returns the number of tenants with an override in rs.
func (rs *Rules) Overridden() int {
	if rs == nil || rs.over == nil {
		return 0
	}
	return len(rs.over.byTenant)
}

// overlayLists returns the rule lists of the overlays, for CheckRules.
func (rs *Rules) overlayLists() [][]Rule {
	if rs == nil || rs.over == nil {
		return nil
	}
	out := make([][]Rule, 0, len(rs.over.byTenant))
	for _, o := range rs.over.byTenant {
		out = append(out, o.Rules)
	}
	return out
}

// ParseRuleList parses the rules of one tenant, as written after "=" in
// LIMITS ("1000/1m", "10MiB/1m", "5000u/1m"): each at most once per measure
// and window. Errors quote the bad rule.
func ParseRuleList(specs []string) ([]Rule, error) {
	var out []Rule
	for _, s := range specs {
		r, err := parseRule(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		if err := checkTwice(out, r); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// CheckTenant reports a tenant name that rules cannot name: empty, over
// MaxTenantBytes, holding "=" or control characters.
func CheckTenant(t string) error {
	if t == "" {
		return fmt.Errorf("empty tenant")
	}
	return checkTenant(t)
}

// RuleStrings returns rules as written in LIMITS, sorted as given.
func RuleStrings(rules []Rule) []string {
	out := make([]string, len(rules))
	for i, r := range rules {
		out[i] = r.String()
	}
	return out
}

// Raised reports whether the rules now let a tenant have more than the
// rules before in some window: a counter of before has no rule in now, or
// a higher limit there. Rules without counters (none) admit everything.
// It allocates nothing (rule lists are short).
func Raised(before, now []Rule) bool {
	if len(before) == 0 {
		return false
	}
	if len(now) == 0 {
		return true
	}
	for _, r := range before {
		found := false
		for _, n := range now {
			if n.Count == r.Count && n.Unit == r.Unit && n.Measure == r.Measure {
				found = true
				if n.Limit > r.Limit {
					return true
				}
				break
			}
		}
		if !found {
			return true
		}
	}
	return false
}

// AnyRaised reports whether some tenant's rules or share are higher in now
// than in before (Raised, ShareRaised): a named tenant of either, or every
// other tenant (the "*" rules).
func AnyRaised(before, now *Rules) bool {
	const other = "\x00" // no tenant is named so: the "*" rules
	for _, t := range append(append([]string{other}, before.Tenants()...), now.Tenants()...) {
		if Raised(before.For(t), now.For(t)) || ShareRaised(before.Share(t), now.Share(t)) {
			return true
		}
	}
	for _, rs := range []*Rules{before, now} {
		if rs == nil {
			continue
		}
		for t := range rs.shares {
			if ShareRaised(before.Share(t), now.Share(t)) {
				return true
			}
		}
	}
	return false
}

// NowReason is the reason of events AdmitNow did not admit: no room in the
// current window (nothing was reserved for them).
const NowReason = "no room in the current window"

// AdmitNow decides a batch as AdmitFrom does, except that it reserves
// nothing: the events that fit in the current window of every rule are
// admitted and counted there, the others are rejected with NowReason and
// counted nowhere. It is how an event deferred under lower rules is
// checked early after its tenant's rules were raised: admitted now if the
// rules in force have room now, else left to its reserved slot.
func (l *Limiter) AdmitNow(ctx context.Context, src Source, events []Event) ([]Decision, error) {
	s := getScratch()
	defer s.release()
	tenants, costs, at := s.split(src, events)
	return l.admitFrom(ctx, s, at, tenants, costs, true, time.Time{})
}

// AdmitBefore decides a batch as AdmitFrom does, except that it reserves
// only in windows that start before before (at most the horizon away):
// the events that fit now are admitted, those that fit in such a window
// are deferred to the earliest one (the same order and rules as AdmitFrom),
// the others are rejected with NowReason and counted nowhere. It is how an
// event deferred under lower rules moves forward after its tenant's rules
// were raised: to a slot the rules in force allow before its old one.
func (l *Limiter) AdmitBefore(ctx context.Context, src Source, events []Event, before time.Time) ([]Decision, error) {
	s := getScratch()
	defer s.release()
	tenants, costs, at := s.split(src, events)
	return l.admitFrom(ctx, s, at, tenants, costs, true, before)
}

// markGroups gives every decision of a tenant under an override the
// override's version, and every deferral under a capacity the name of the
// windows it was counted in (group.windows).
func markGroups(order []*group, out []Decision) {
	for _, g := range order {
		if g.override == 0 && g.windows == "" {
			continue
		}
		for _, i := range g.idx {
			out[i].Override = g.override
			if out[i].Kind == Defer {
				out[i].Windows = g.windows
			}
		}
	}
}

// OverlayTenants lists the tenants with an override in rs, in no order.
func (rs *Rules) OverlayTenants() []string {
	if rs == nil || rs.over == nil {
		return nil
	}
	out := make([]string, 0, len(rs.over.byTenant))
	for t := range rs.over.byTenant {
		out = append(out, t)
	}
	return out
}

// UsageUnder returns the tenant's usage as Usage does, but under rules
// instead of the rules in force: what its counters hold now against them
// (a dry run of an override). It reads only.
func (l *Limiter) UsageUnder(ctx context.Context, tenant string, rules []Rule) ([]Usage, error) {
	return l.usageUnder(ctx, tenant, rules)
}
