package limit

import "time"

// Kind is the outcome of admission for one event.
type Kind uint8

// The kinds of decision the limiter makes. Invalid events never reach the
// limiter: the router decides those before admission.
const (
	// Admit: counted in the current window of every rule that applies.
	Admit Kind = iota + 1
	// Defer: a slot is reserved in a future window; forward at Due.
	Defer
	// Reject: no room within the deferral horizon.
	Reject
	// Fail: a counter key of the event's tenant is broken (it has the wrong
	// type, or holds a count that is not an integer), so the event cannot be
	// decided until someone repairs or deletes the key; Reason names it.
	// Nothing was counted for the tenant's events. Other tenants are not
	// affected, and retrying does not help: the event goes to the dead-letter
	// topic.
	Fail
	// Keep: the event came back from the first retry tier inside its
	// reserved slot, and the slot is still its own: forward it uncounted
	// (AdmitLate only).
	Keep
)

// String returns the kind's lower-case name, as used in metrics and logs.
func (k Kind) String() string {
	switch k {
	case Admit:
		return "admit"
	case Defer:
		return "defer"
	case Reject:
		return "reject"
	case Fail:
		return "fail"
	case Keep:
		return "keep"
	}
	return "unknown"
}

// Decision is the limiter's verdict on one event. It is a value type.
type Decision struct {
	Kind Kind
	// Due is, for Defer, the start of the reserved slot: the event must not
	// be forwarded before it.
	Due time.Time
	// Until is, for Defer, the end of the reserved slot (the earliest end of
	// the windows it was counted in). An event that comes back in [Due, Until)
	// is forwarded without being counted again; later, it is checked as new.
	Until time.Time
	// Took is, for Defer, that the slot was taken from a later reservation
	// of the tenant (AdmitLate): the event must come back with it marked,
	// so that its own claim is never taken for the reservation's.
	Took bool
	// Reason says why, for Reject and Fail.
	Reason string
	// Override is the version of the live override whose rules decided the
	// event (see Rules.WithOverlays), 0 when its tenant had none.
	Override int64
	// Windows is, for Defer under a capacity, the name of the windows the
	// reservation was counted in (its tenant's rules' and the capacity's
	// counters, without their limits; see Limiter.windowsID). The event
	// must come back with it (Waiting.Windows): Advance moves a reservation
	// only out of the windows that counted it.
	Windows string
}
