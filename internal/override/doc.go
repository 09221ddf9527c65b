// Package override keeps live overrides of tenants' rules in Redis and
// layers them over the rules of LIMITS or LIMITS_FILE on every replica.
//
// # Model
//
// An override replaces one tenant's rules (its own, or the "*" rules it
// falls under) until it is deleted or expires. Every change is a write of
// the Store: it names who (a token's name) and why, is compare-and-set on
// the tenant's current version (a write naming an older version is refused,
// never merged), takes the next version of a counter shared by all changes,
// and appends an audit entry (before and after) in the same script call. A
// shadow override is counted by a limiter of its own and reported, never
// enforced. With a shared capacity, an override may also set the tenant's
// weight and floors (its share), checked as LIMITS checks them and against
// the floors of every other tenant.
//
// # Propagation
//
// Each replica runs a Watcher: it loads every override once (HSCAN in
// bounded pages), then reads the version counter every PollInterval (one
// GET) and, when it moved, the audit entries since the last one it applied
// (XRANGE, bounded pages); a gap (entries trimmed before it read them)
// makes it load everything again. After each read it builds one immutable
// snapshot and hands it on: the limiter swaps one pointer, so a batch is
// decided on the rules before or after a change, never on half of one.
// Expiry is applied locally from the records' expiry times (no Redis call),
// and the Store's expiry sweep deletes expired records with an audit entry.
package override
