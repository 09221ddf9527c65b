package override

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// MaxReasonBytes bounds the reason of a change, kept in the audit.
const MaxReasonBytes = 512

// Record is one tenant's live override as stored, with the version of its
// last change. It is a value type; its JSON is the API's.
type Record struct {
	Tenant string `json:"tenant"`
	// Rules replace the tenant's rules, as written in LIMITS ("1000/1m");
	// empty: the tenant is not limited while the override is in force,
	// unless KeepRules.
	Rules []string `json:"rules"`
	// KeepRules: the tenant keeps its rules of LIMITS or LIMITS_FILE (Rules
	// is empty); the override sets only its weight and floors.
	KeepRules bool `json:"keep_rules,omitempty"`
	// Shadow: counted and reported by a limiter of its own, not enforced.
	Shadow bool `json:"shadow,omitempty"`
	// Weight (1 to limit.MaxWeight) and Floors ("200/1s", at most one per
	// capacity window) replace the tenant's share of the shared capacity
	// (GATEKEEPER_CAPACITY) while the override is in force, as "weight:N"
	// and "floor:N/1s" do in LIMITS (a weight left out is 1). Neither set:
	// the tenant keeps its share of LIMITS or LIMITS_FILE.
	Weight int64    `json:"weight,omitempty"`
	Floors []string `json:"floors,omitempty"`
	// Expires, when set, ends the override (every replica within a second).
	Expires *time.Time `json:"expires,omitempty"`
	// Reason, By and At are those of the last change.
	Reason string    `json:"reason"`
	By     string    `json:"by"`
	At     time.Time `json:"at"`
	// Version is the version of the last change (not in the stored JSON:
	// the store keeps it beside it).
	Version int64 `json:"version"`
}

// parsed are the rules and share of a checked record.
type parsed struct {
	rules []limit.Rule
	share *limit.Share
}

// HasShare reports whether r sets a weight or floors.
func (r *Record) HasShare() bool { return r.Weight != 0 || len(r.Floors) > 0 }

// Share parses r's weight and floors with the rules of LIMITS (nil when r
// sets neither). Errors name the field.
func (r *Record) Share() (*limit.Share, error) {
	if !r.HasShare() {
		return nil, nil
	}
	items := make([]string, 0, 1+len(r.Floors))
	if r.Weight != 0 {
		if r.Weight < 1 || r.Weight > limit.MaxWeight {
			return nil, fmt.Errorf("weight: %d is not a whole number from 1 to %d", r.Weight, limit.MaxWeight)
		}
		items = append(items, "weight:"+strconv.FormatInt(r.Weight, 10))
	}
	for _, f := range r.Floors {
		items = append(items, "floor:"+f)
	}
	s, err := limit.ParseShare(items)
	if err != nil {
		return nil, fmt.Errorf("floors: %w", err)
	}
	return &s, nil
}

// CheckCapacity validates r's share against capacity c and the rules in
// force (with every other override): a share needs a capacity, each floor
// a capacity window, and the floors of all tenants must still sum to at
// most the capacity. Errors name the field.
func (r *Record) CheckCapacity(c limit.Capacity, inForce *limit.Rules) error {
	if !r.HasShare() {
		return nil
	}
	if len(c) == 0 {
		return errors.New("weight, floors: no GATEKEEPER_CAPACITY is set, so a share would change nothing")
	}
	s, err := r.Share()
	if err != nil {
		return err
	}
	if err := limit.CheckShareChange(inForce, c, r.Tenant, *s); err != nil {
		return fmt.Errorf("floors: %w", err)
	}
	return nil
}

// Check validates r for a write: tenant, rules (aligned windows when
// aligned), reason, expiry after now. Errors name the field.
func (r *Record) Check(now time.Time, kind limit.WindowKind) (parsed, error) {
	if err := limit.CheckTenant(r.Tenant); err != nil {
		return parsed{}, fmt.Errorf("tenant: %w", err)
	}
	if r.Tenant == "*" {
		return parsed{}, errors.New(`tenant: an override names one tenant; "*" is every other tenant's rules, set in LIMITS or LIMITS_FILE`)
	}
	rules, err := limit.ParseRuleList(r.Rules)
	if err != nil {
		return parsed{}, fmt.Errorf("rules: %w", err)
	}
	share, err := r.Share()
	if err != nil {
		return parsed{}, err
	}
	if r.KeepRules && len(rules) > 0 {
		return parsed{}, errors.New("keep_rules: the override keeps the tenant's rules, so it gives none")
	}
	if r.KeepRules && share == nil {
		return parsed{}, errors.New("keep_rules: without a weight or floors the override would change nothing")
	}
	rs, err := limit.ParseRules("*=1/1s")
	if err != nil {
		return parsed{}, err
	}
	if err := limit.CheckRules(rs.WithOverlays(map[string]limit.Overlay{r.Tenant: {Rules: rules}}, 0), kind); err != nil {
		return parsed{}, fmt.Errorf("rules: %w", err)
	}
	switch reason := strings.TrimSpace(r.Reason); {
	case reason == "":
		return parsed{}, errors.New("reason: required (say why, for the audit)")
	case len(r.Reason) > MaxReasonBytes:
		return parsed{}, fmt.Errorf("reason: over %d bytes", MaxReasonBytes)
	case strings.ContainsFunc(r.Reason, func(c rune) bool { return c < ' ' || c == 0x7f }):
		return parsed{}, errors.New("reason: must not hold control characters")
	}
	if r.Expires != nil && !r.Expires.After(now) {
		return parsed{}, fmt.Errorf("expires: %s is not in the future", r.Expires.Format(time.RFC3339))
	}
	return parsed{rules: rules, share: share}, nil
}

// Expired reports whether r has expired at now (a snapshot's Records hold
// an expired record until the expiry sweep deletes it).
func (r *Record) Expired(now time.Time) bool { return r.expired(now) }

// expired reports whether r has expired at now.
func (r *Record) expired(now time.Time) bool {
	return r.Expires != nil && !now.Before(*r.Expires)
}

// SetRulesText sets r's rules and share from text as LIMITS writes a
// tenant's rule list, the CLI's RULES: "5000/1m,weight:3,floor:200/1s";
// "none" (not limited), alone or before share items; share items alone
// keep the tenant's rules of LIMITS or LIMITS_FILE (KeepRules). The items
// are checked by Check and CheckCapacity; here only their form.
func (r *Record) SetRulesText(text string) error {
	items := strings.Split(text, ",")
	for i := range items {
		items[i] = strings.TrimSpace(items[i])
	}
	none := len(items) > 0 && items[0] == "none"
	if none {
		items = items[1:]
	}
	rules, share := limit.SplitShare(items)
	if none && len(rules) > 0 {
		return fmt.Errorf("rules %q: none gives no rules, so none may be followed only by weight: or floor:", text)
	}
	r.Rules, r.KeepRules, r.Weight, r.Floors = []string{}, false, 0, nil
	for _, it := range rules {
		if it == "" {
			return fmt.Errorf("rules %q: an empty item", text)
		}
		r.Rules = append(r.Rules, it)
	}
	r.KeepRules = !none && len(rules) == 0
	for _, it := range share {
		k, v, _ := strings.Cut(it, ":")
		switch strings.TrimSpace(k) {
		case "weight":
			w, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || w < 1 {
				return fmt.Errorf("%q: a weight is a whole number from 1 to %d", it, limit.MaxWeight)
			}
			if r.Weight != 0 {
				return fmt.Errorf("%q: weight given twice", it)
			}
			r.Weight = w
		default:
			r.Floors = append(r.Floors, strings.TrimSpace(v))
		}
	}
	return nil
}

// RulesText returns r's rules and share as SetRulesText reads them.
func (r *Record) RulesText() string {
	var items []string
	switch {
	case r.KeepRules:
	case len(r.Rules) == 0:
		items = append(items, "none")
	default:
		items = append(items, r.Rules...)
	}
	if r.Weight != 0 {
		items = append(items, "weight:"+strconv.FormatInt(r.Weight, 10))
	}
	for _, f := range r.Floors {
		items = append(items, "floor:"+f)
	}
	if r.KeepRules {
		return "(its rules)," + strings.Join(items, ",")
	}
	return strings.Join(items, ",")
}
