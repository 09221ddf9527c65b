package override

import (
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// Expediter tells the retry consumers which tenants' rules were raised, so
// that their waiting deferred events are checked early (consume.Expediter,
// route.Retrier.Expedited). It is safe for concurrent use.
type Expediter struct {
	// TenantOf reads a deferred event's tenant (its gk-tenant header).
	TenantOf func(kafka.Message) (string, bool)
	// Keep is how long a raise is remembered (the deferral horizon: no
	// event waits longer). Default 24h.
	Keep time.Duration

	mu     sync.Mutex
	raised map[string]time.Time
	ch     chan struct{}
}

// Raise records that the tenants' rules were raised at at and wakes the
// waiting partitions.
func (e *Expediter) Raise(tenants []string, at time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.raised == nil {
		e.raised = map[string]time.Time{}
	}
	keep := e.Keep
	if keep == 0 {
		keep = 24 * time.Hour
	}
	for t, when := range e.raised {
		if at.Sub(when) > keep {
			delete(e.raised, t)
		}
	}
	for _, t := range tenants {
		e.raised[t] = at
	}
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

// Early reports whether m's tenant was raised after m started waiting.
func (e *Expediter) Early(m kafka.Message, since time.Time) bool {
	at, ok := e.raisedAt(m)
	return ok && at.After(since)
}

// Expedited reports whether m's tenant was raised (within Keep): a message
// of such a tenant released before its time was let go on purpose.
func (e *Expediter) Expedited(m kafka.Message) bool {
	_, ok := e.raisedAt(m)
	return ok
}

func (e *Expediter) raisedAt(m kafka.Message) (time.Time, bool) {
	t, ok := e.TenantOf(m)
	if !ok {
		return time.Time{}, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	at, ok := e.raised[t]
	return at, ok
}
