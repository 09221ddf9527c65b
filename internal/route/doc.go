// Package route turns admission decisions into Kafka writes.
//
// A [Gate] handles batches from the source topics: it derives each event's
// tenant with an [Extractor] and its cost with a [CostFrom] (its bytes, and
// the units it carries when GATEKEEPER_COST_FROM is set; an event without a
// tenant or a readable cost is invalid), asks an [Admitter] (the limiter)
// about the whole batch in one call, and hands the outcome of every event to a [Router], which
// writes admitted events to the downstream topic, deferred events to a retry
// tier topic and rejected, failed (a broken counter key of their tenant) or
// invalid events to the dead-letter topic, in one acknowledged write per
// batch.
//
// A [Retrier] handles events released from the retry tiers: events from a tier
// with a lower bound move down to the tier of their remaining delay; events
// from the first tier are forwarded uncounted while their reserved slot lasts,
// and are admitted again once it has ended.
//
// Diverted events carry the gk- headers described in headers.go; their key,
// value, other headers and timestamp are kept as they were. Nothing handled
// here is ever dropped: every event ends up in exactly one of the three
// destinations, or the batch's Handle returns an error and writes nothing
// that the caller may count as done.
package route

// The roles a Gatekeeper process may run: the gate reads the source topics
// (Gate), the retry role the retry tiers (Retrier).
const (
	RoleGate  = "gate"
	RoleRetry = "retry"
)
