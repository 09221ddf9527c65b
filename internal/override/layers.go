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
	// OnRaise, if set, is told of the tenants whose rules a change raised
	// (limit.Raised), with the time of the change: their deferred events
	// may be checked early.
	OnRaise func(tenants []string, at time.Time)

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
	var changed []string
	if l.snap != nil {
		for t := range l.snap.Enforced {
			changed = append(changed, t)
		}
	}
	return l.setLocked(base, l.snap, changed, true)
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
		l.OnRaise(raised, at)
	}
	return nil
}
