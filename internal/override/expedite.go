package override

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// Expediter tells the retry consumers which tenants' rules were raised, so
// that their deferred events reserved before the raise are checked early
// (consume.Expediter, route.Retrier.Expedited): those the consumers hold
// when the raise comes, and those they fetch later (beyond the look-ahead,
// or in a later tier). It is safe for concurrent use.
type Expediter struct {
	// TenantOf reads a deferred event's tenant (its gk-tenant header).
	TenantOf func(kafka.Message) (string, bool)
	// CheckedSince, if set, reads when a deferred event was last deferred
	// or checked early (route.CheckedSince); a raise after it lets the
	// event be checked early, once. Without it (or without the headers),
	// the time the event started waiting in the consumer stands in.
	CheckedSince func(kafka.Message) (time.Time, bool)
	// Keep is how long a raise is remembered (the deferral horizon: no
	// event waits longer). Default 24h.
	Keep time.Duration

	any    atomic.Bool // a raise is remembered: the fast path of Early
	mu     sync.Mutex
	raised map[string]raise
	// bases are raises of the rules of LIMITS or LIMITS_FILE (a reload),
	// newest last, at most maxBaseRaises: any tenant may be raised by
	// them, which a tenant's rules before and after tell.
	bases []baseRaise
	ch    chan struct{}
}

// raise is a tenant's last raise: when, and its rules before it (whose
// windows counted the slots reserved before it).
type raise struct {
	at     time.Time
	before []limit.Rule
}

// baseRaise is a change of the base rules that raised some tenant.
type baseRaise struct {
	at          time.Time
	before, now *limit.Rules
}

// maxBaseRaises bounds the base raises remembered.
const maxBaseRaises = 16

func (e *Expediter) keep() time.Duration {
	if e.Keep == 0 {
		return 24 * time.Hour
	}
	return e.Keep
}

// Raise records that the tenants' rules were raised at at (their rules
// before it: before, by tenant, may be nil) and wakes the waiting
// partitions.
func (e *Expediter) Raise(tenants []string, before func(string) []limit.Rule, at time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.raised == nil {
		e.raised = map[string]raise{}
	}
	e.forgetLocked(at)
	for _, t := range tenants {
		r := raise{at: at}
		if before != nil {
			r.before = before(t)
		}
		e.raised[t] = r
	}
	e.wakeLocked()
}

// RaiseBase records that a change of the base rules (a LIMITS_FILE reload)
// from before to now at at raised some tenants: those whose rules or share
// now are higher (limit.Raised, limit.ShareRaised). Tenants of the "*"
// rules are not listed: Early asks about each event's tenant.
func (e *Expediter) RaiseBase(before, now *limit.Rules, at time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.forgetLocked(at)
	e.bases = append(e.bases, baseRaise{at: at, before: before, now: now})
	if len(e.bases) > maxBaseRaises {
		e.bases = e.bases[len(e.bases)-maxBaseRaises:]
	}
	e.wakeLocked()
}

func (e *Expediter) forgetLocked(now time.Time) {
	keep := e.keep()
	for t, r := range e.raised {
		if now.Sub(r.at) > keep {
			delete(e.raised, t)
		}
	}
	for len(e.bases) > 0 && now.Sub(e.bases[0].at) > keep {
		e.bases = e.bases[1:]
	}
}

func (e *Expediter) wakeLocked() {
	e.any.Store(len(e.raised) > 0 || len(e.bases) > 0)
	if e.ch != nil {
		close(e.ch)
	}
	e.ch = make(chan struct{})
}

// Changed returns a channel closed at the next Raise.
func (e *Expediter) Changed() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ch == nil {
		e.ch = make(chan struct{})
	}
	return e.ch
}

// Early reports whether m's tenant was raised after m was deferred or last
// checked early (CheckedSince; else after since, when m started waiting).
func (e *Expediter) Early(m kafka.Message, since time.Time) bool {
	if !e.any.Load() {
		return false
	}
	r, ok := e.raisedAt(m)
	if !ok {
		return false
	}
	if e.CheckedSince != nil {
		if at, ok := e.CheckedSince(m); ok {
			since = at
		}
	}
	return r.at.After(since)
}

// Expedited reports whether m's tenant was raised (within Keep): a message
// of such a tenant released before its time was let go on purpose. before
// are the tenant's rules before the raise, whose windows counted m's slot
// (nil: not known, the rules in force stand in).
func (e *Expediter) Expedited(m kafka.Message) (before []limit.Rule, ok bool) {
	if !e.any.Load() {
		return nil, false
	}
	r, ok := e.raisedAt(m)
	return r.before, ok
}

// raisedAt returns the last raise of m's tenant: by an override, or by a
// change of the base rules that raised its rules or share.
func (e *Expediter) raisedAt(m kafka.Message) (raise, bool) {
	t, ok := e.TenantOf(m)
	if !ok {
		return raise{}, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	r, ok := e.raised[t]
	for i := len(e.bases) - 1; i >= 0; i-- {
		b := e.bases[i]
		if ok && !b.at.After(r.at) {
			break
		}
		before, now := b.before.For(t), b.now.For(t)
		if limit.Raised(before, now) || limit.ShareRaised(b.before.Share(t), b.now.Share(t)) {
			r, ok = raise{at: b.at, before: before}, true
			break
		}
	}
	return r, ok
}
