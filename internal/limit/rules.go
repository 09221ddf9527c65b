package limit

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
)

// Bounds of a rule. They are checked where rules are parsed (LIMITS and
// LIMITS_FILE alike, at start-up and on reload) and shown in the README's
// table of bounds.
const (
	// MaxLimit is the largest limit of a rule. Counts are Redis integers
	// and Lua doubles in the scripts: 2^40, plus any batch, stays far below
	// 2^53, where doubles stop being exact.
	MaxLimit = 1 << 40
	// MaxWindow is the longest window of a rule, by its nominal length (a
	// month counts 30 days): 366 days, so 366d, 52w and 12mo are the
	// longest of their units. Longer windows are configuration mistakes,
	// and far longer ones overflow Go durations (292 years) or Redis expiry
	// times.
	MaxWindow = 366 * 24 * time.Hour
	// MaxTenantBytes is the longest tenant name in rules.
	MaxTenantBytes = 256
)

// Unit is the unit of a rule's window.
type Unit uint8

// Window units, as written in LIMITS: s, m, h, d, w, mo.
const (
	Second Unit = iota + 1
	Minute
	Hour
	Day
	Week
	Month
)

var unitNames = map[string]Unit{"s": Second, "m": Minute, "h": Hour, "d": Day, "w": Week, "mo": Month}

// String returns the unit as written in LIMITS. It is on every Admit's path
// (rule keys), so it is a switch rather than a search of unitNames.
func (u Unit) String() string {
	switch u {
	case Second:
		return "s"
	case Minute:
		return "m"
	case Hour:
		return "h"
	case Day:
		return "d"
	case Week:
		return "w"
	case Month:
		return "mo"
	}
	return "?"
}

// nominal is the unit's length; days, weeks and months vary in a time zone.
func (u Unit) nominal() time.Duration {
	switch u {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return 24 * time.Hour
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 30 * 24 * time.Hour
	}
	return 0
}

// Rule is one limit: at most Limit of its Measure (events, bytes or units)
// per Count Units.
type Rule struct {
	Limit int64
	Count int
	Unit  Unit
	// Measure is what the rule counts; the zero value counts events.
	Measure Measure
}

// String returns the rule as written in LIMITS, e.g. "1000/1m", "10MiB/1m"
// or "5000u/1m" (a byte limit with the largest suffix that writes it whole).
func (r Rule) String() string {
	return r.Measure.format(r.Limit) + "/" + r.WindowName()
}

// Counter names what the rule counts in its window, the rule's part of every
// counter key: its window as written ("1m") for events, with "/bytes" or
// "/units" added for the other measures, so that a tenant may count events,
// bytes and units over the same window. The limit is not part of it, so that
// a changed limit applies to the counts already in the window.
func (r Rule) Counter() string {
	return r.WindowName() + r.Measure.keySuffix()
}

// WindowName returns the rule's window as written in LIMITS, e.g. "1m". It is the
// rule's part of every counter key, without the limit, so that a changed
// limit applies to the counts already in the window.
func (r Rule) WindowName() string {
	return strconv.FormatInt(int64(r.Count), 10) + r.Unit.String()
}

// Length is the window's nominal length (exact for s, m, h and ttl windows).
func (r Rule) Length() time.Duration {
	return time.Duration(r.Count) * r.Unit.nominal()
}

// checkAligned reports whether the rule can sit on calendar boundaries: the
// count must divide the next larger unit, so that windows tile it.
func (r Rule) checkAligned() error {
	var ok bool
	switch r.Unit {
	case Second, Minute:
		ok = 60%r.Count == 0
	case Hour:
		ok = 24%r.Count == 0
	case Day, Week:
		ok = r.Count == 1
	case Month:
		ok = 12%r.Count == 0
	}
	if !ok {
		return fmt.Errorf("aligned window %d%s does not tile the calendar (use a count dividing 60s, 60m, 24h, 12mo, or 1d, 1w, or WINDOW=ttl)", r.Count, r.Unit)
	}
	return nil
}

// Rules maps tenants to their rules. A nil or empty Rules admits everything.
// It is immutable once parsed and safe for concurrent use.
type Rules struct {
	byTenant map[string][]Rule
	fallback []Rule // "*"
	spec     string
	// over are the live overrides layered over byTenant and fallback (see
	// WithOverlays); nil when none.
	over *overlays
	// shares are the tenants' weights and floors (capacity.go); fallbackShare "*"'s.
	shares        map[string]Share
	fallbackShare *Share
	// floors memoizes floorSums for one capacity: the sums are read by
	// every call under a capacity, and overrides may hold many shares.
	floors atomic.Pointer[floorMemo]
}

// String returns the spec the rules were parsed from.
func (rs *Rules) String() string { return rs.spec }

// For returns the rules of a tenant: its own, else those of "*", else none.
func (rs *Rules) For(tenant string) []Rule {
	if rs == nil {
		return nil
	}
	r, _ := rs.lookup(tenant)
	return r
}

// Tenants lists the tenants with rules of their own, sorted.
func (rs *Rules) Tenants() []string {
	if rs == nil {
		return nil
	}
	var out []string
	for t := range rs.byTenant {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// ParseRules parses a LIMITS spec: `tenant=rule,rule;tenant=rule`, where a rule
// is `<limit>/<count><unit>` (units s, m, h, d, w, mo; a count of 1 may be left
// out) and the tenant `*` stands for every tenant without rules of its own.
// A limit counts events ("1000"), bytes ("10MiB", "500KB": see parseLimit)
// or units of the events' cost ("5000u"); a tenant has at most one rule per
// measure and window.
// Errors quote the bad part. Tenants are taken as written, spaces trimmed;
// they must pass checkTenant.
func ParseRules(spec string) (*Rules, error) {
	rs := &Rules{byTenant: map[string][]Rule{}, spec: spec}
	for _, part := range strings.Split(spec, ";") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		eq := strings.LastIndex(part, "=")
		if eq < 0 {
			return nil, fmt.Errorf("%q: want tenant=limit/window", part)
		}
		tenant := strings.TrimSpace(part[:eq])
		if tenant == "" {
			return nil, fmt.Errorf("%q: empty tenant", part)
		}
		if err := checkTenant(tenant); err != nil {
			return nil, fmt.Errorf("%q: %w", part, err)
		}
		var rules []Rule
		items, share, err := splitShare(tenant, strings.Split(part[eq+1:], ","))
		if err != nil {
			return nil, fmt.Errorf("%q: %w", part, err)
		}
		if err := rs.addShare(tenant, share); err != nil {
			return nil, fmt.Errorf("%q: %w", part, err)
		}
		for _, rs := range items {
			r, err := parseRule(strings.TrimSpace(rs))
			if err != nil {
				return nil, fmt.Errorf("%q: %w", part, err)
			}
			if err := checkTwice(rules, r); err != nil {
				return nil, fmt.Errorf("%q: %w", part, err)
			}
			rules = append(rules, r)
		}
		if len(rules) == 0 {
			continue // a share alone: the tenant keeps the rules of "*"
		}
		if tenant == "*" {
			if rs.fallback != nil {
				return nil, fmt.Errorf("%q: tenant \"*\" given twice", part)
			}
			rs.fallback = rules
			continue
		}
		if _, dup := rs.byTenant[tenant]; dup {
			return nil, fmt.Errorf("%q: tenant %q given twice", part, tenant)
		}
		rs.byTenant[tenant] = rules
	}
	if len(rs.byTenant) == 0 && rs.fallback == nil && len(rs.shares) == 0 && rs.fallbackShare == nil {
		return nil, fmt.Errorf("%q: no rules", spec)
	}
	return rs, nil
}

// checkTwice reports a rule counting the same measure over the same window
// as one of rules: its counts would share a key.
func checkTwice(rules []Rule, r Rule) error {
	for _, o := range rules {
		if o.Counter() == r.Counter() {
			if r.Measure == Events {
				return fmt.Errorf("two rules for window %d%s", r.Count, r.Unit)
			}
			return fmt.Errorf("two %s rules for window %d%s", r.Measure, r.Count, r.Unit)
		}
	}
	return nil
}

// checkTenant checks a non-empty tenant name of a rule: at most
// MaxTenantBytes, no control characters (they would reach logs and
// terminals), and no "=" (LIMITS separates tenant and rules with it, so
// "a=b=10/1m" must not become tenant "a=b"). Errors quote the name.
func checkTenant(t string) error {
	switch {
	case len(t) > MaxTenantBytes:
		return fmt.Errorf("tenant %q: over %d bytes", t, MaxTenantBytes)
	case strings.Contains(t, "="):
		return fmt.Errorf("tenant %q: must not hold \"=\"", t)
	case strings.ContainsFunc(t, unicode.IsControl):
		return fmt.Errorf("tenant %q: must not hold control characters", t)
	}
	return nil
}

// parseRule parses `<limit>/<count><unit>`, where the limit is a number of
// events, of bytes (with a suffix: B, kB or KB, MB, GB, TB, KiB, MiB, GiB,
// TiB) or of units (with the suffix u), from 0 (nothing is admitted) to
// MaxLimit (MaxBytesLimit for bytes); and a window from 1s to MaxWindow.
func parseRule(s string) (Rule, error) {
	slash := strings.Index(s, "/")
	if slash < 0 {
		return Rule{}, fmt.Errorf("rule %q: want <limit>/<window>, e.g. 100/1m", s)
	}
	limit, measure, err := parseLimit(strings.TrimSpace(s[:slash]))
	if err != nil {
		return Rule{}, fmt.Errorf("rule %q: %w", s, err)
	}
	w := strings.TrimSpace(s[slash+1:])
	i := 0
	for i < len(w) && w[i] >= '0' && w[i] <= '9' {
		i++
	}
	unit, ok := unitNames[w[i:]]
	if !ok {
		return Rule{}, fmt.Errorf("rule %q: unknown unit %q (want s, m, h, d, w or mo)", s, w[i:])
	}
	count := 1
	if i > 0 {
		count, err = strconv.Atoi(w[:i])
		if err != nil || count < 1 {
			return Rule{}, fmt.Errorf("rule %q: window count %q is not a whole number from 1", s, w[:i])
		}
	}
	// Compared without multiplying, which could overflow.
	if most := int(MaxWindow / unit.nominal()); count > most {
		return Rule{}, fmt.Errorf("rule %q: window longer than a year (at most %d%s; the longest windows are 366d, 52w, 12mo)", s, most, unit)
	}
	return Rule{Limit: limit, Count: count, Unit: unit, Measure: measure}, nil
}

// NewRules builds rules from lists of rule strings ("100/1m"): fallback for
// every tenant without rules of its own (none: such tenants are not limited),
// and byTenant for the others, whose names (1 to MaxTenantBytes) may hold
// any characters but "=" and control characters (checkTenant).
// Errors quote the bad part.
func NewRules(fallback []string, byTenant map[string][]string) (*Rules, error) {
	rs := &Rules{byTenant: map[string][]Rule{}}
	parse := func(who, tenant string, specs []string) ([]Rule, error) {
		if len(specs) == 0 {
			return nil, fmt.Errorf("%s: no rules", who)
		}
		specs, share, err := splitShare(tenant, specs)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", who, err)
		}
		if err := rs.addShare(tenant, share); err != nil {
			return nil, fmt.Errorf("%s: %w", who, err)
		}
		var out []Rule
		for _, s := range specs {
			r, err := parseRule(strings.TrimSpace(s))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", who, err)
			}
			if err := checkTwice(out, r); err != nil {
				return nil, fmt.Errorf("%s: %w", who, err)
			}
			out = append(out, r)
		}
		return out, nil
	}
	var specs []string
	if fallback != nil {
		r, err := parse("default", "*", fallback)
		if err != nil {
			return nil, err
		}
		rs.fallback = r
		specs = append(specs, "*="+strings.Join(fallback, ","))
	}
	for _, t := range sortedKeys(byTenant) {
		if t == "" {
			return nil, errors.New(`tenant "": empty tenant`)
		}
		if err := checkTenant(t); err != nil {
			return nil, err
		}
		r, err := parse(fmt.Sprintf("tenant %q", t), t, byTenant[t])
		if err != nil {
			return nil, err
		}
		if len(r) > 0 { // a share alone: the tenant keeps the default rules
			rs.byTenant[t] = r
		}
		specs = append(specs, fmt.Sprintf("%q=%s", t, strings.Join(byTenant[t], ",")))
	}
	if len(rs.byTenant) == 0 && rs.fallback == nil && len(rs.shares) == 0 && rs.fallbackShare == nil {
		return nil, fmt.Errorf("no rules")
	}
	rs.spec = strings.Join(specs, ";")
	return rs, nil
}

func sortedKeys(m map[string][]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
