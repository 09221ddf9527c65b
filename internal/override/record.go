package override

import (
	"errors"
	"fmt"
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
	// empty: the tenant is not limited while the override is in force.
	Rules []string `json:"rules"`
	// Shadow: counted and reported by a limiter of its own, not enforced.
	Shadow bool `json:"shadow,omitempty"`
	// Weight and Floor are the tenant's share of the shared capacity
	// (issue #24). Refused by Check until that capacity exists.
	Weight float64 `json:"weight,omitempty"`
	Floor  string  `json:"floor,omitempty"`
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

// parsed are the rules of a checked record.
type parsed struct {
	rules []limit.Rule
}

// ErrCapacityUnsupported refuses weight and floor until the shared capacity
// exists.
var ErrCapacityUnsupported = errors.New("weight and floor need the shared capacity (issue #24), which this build does not have")

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
	if r.Weight != 0 || r.Floor != "" {
		return parsed{}, ErrCapacityUnsupported
	}
	if r.Expires != nil && !r.Expires.After(now) {
		return parsed{}, fmt.Errorf("expires: %s is not in the future", r.Expires.Format(time.RFC3339))
	}
	return parsed{rules: rules}, nil
}

// expired reports whether r has expired at now.
func (r *Record) expired(now time.Time) bool {
	return r.Expires != nil && !now.Before(*r.Expires)
}
