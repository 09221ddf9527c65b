package override

import (
	"sync"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// Layers joins the rules of LIMITS or LIMITS_FILE (the base, which a file
// reload replaces) and the live overrides (which the Watcher replaces) into
// the rules the limiter enforces, and the shadow overrides into the rules
// of the shadow limiter. Whenever either changes it hands on a new Rules
// value. It is safe for concurrent use.
type Layers struct {
	// Enforce receives the rules to enforce; Shadow, if set, those of the
	// shadow limiter. Errors are returned to the caller of SetBase or
	// logged by Apply's caller.
	Enforce func(*limit.Rules) error
	Shadow  func(*limit.Rules) error
	// OnRaise, if set, is told of the tenants whose rules or share an
	// override change raised (limit.Raised, limit.ShareRaised), with their
	// rules before and the time of the change: their deferred events may
	// be checked early. OnRaiseBase, if set, is told of a change of the
	// base rules (a LIMITS_FILE reload) that raised some tenant, with the
	// rules enforced before and after (limit.AnyRaised).
	OnRaise     func(tenants []string, before func(string) []limit.Rule, at time.Time)
	OnRaiseBase func(before, now *limit.Rules, at time.Time)

	mu       sync.Mutex
	base     *limit.Rules
	snap     *Snapshot
	enforced *limit.Rules
}

// Current returns the last snapshot applied (nil before the first) and the
// rules enforced.
func (l *Layers) Current() (*Snapshot, *limit.Rules) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.snap, l.enforced
}

// SetBase replaces the rules of LIMITS or LIMITS_FILE, keeping the
// overrides over them.
func (l *Layers) SetBase(base *limit.Rules) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	prev := l.enforced
	// The overrides stay: only the base changed.
	if err := l.setLocked(base, l.snap, nil, false); err != nil {
		return err
	}
	if l.OnRaiseBase != nil && prev != nil && limit.AnyRaised(prev, l.enforced) {
		l.OnRaiseBase(prev, l.enforced, time.Now())
	}
	return nil
}

// Apply replaces the overrides with s. Its error (the rules do not fit the
// limiter) leaves the rules in force.
func (l *Layers) Apply(s *Snapshot) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.setLocked(l.base, s, s.Changed, s.All)
}

func (l *Layers) setLocked(base *limit.Rules, s *Snapshot, changed []string, all bool) error {
	var enforced, shadow *limit.Rules
	if s == nil {
		enforced = base.Base()
	} else {
		enforced = base.WithOverlays(s.Enforced, s.Version)
		shadow = (*limit.Rules)(nil).WithOverlays(s.Shadow, s.Version)
	}
	if err := l.Enforce(enforced); err != nil {
		return err
	}
	if l.Shadow != nil && shadow != nil {
		if err := l.Shadow(shadow); err != nil {
			return err
		}
	}
	prev := l.enforced
	l.base, l.snap, l.enforced = base, s, enforced
	if l.OnRaise == nil || prev == nil {
		return nil
	}
	if all {
		// Any tenant with an override before or after may have changed.
		changed = append(enforced.OverlayTenants(), prev.OverlayTenants()...)
	}
	var raised []string
	seen := map[string]bool{}
	for _, t := range changed {
		if !seen[t] && (limit.Raised(prev.For(t), enforced.For(t)) || limit.ShareRaised(prev.Share(t), enforced.Share(t))) {
			raised = append(raised, t)
		}
		seen[t] = true
	}
	if len(raised) > 0 {
		at := time.Now()
		if s != nil {
			at = s.Applied
		}
		l.OnRaise(raised, prev.For, at)
	}
	return nil
}
