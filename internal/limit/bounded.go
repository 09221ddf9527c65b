package limit

import "fmt"

// Bounded work (G11). The Redis work of one admit.lua call is bounded by
// its batch, whatever the rules, the horizon or the windows' length:
//
//   - an event that a rule of its tenant can never admit is rejected here,
//     without Redis: an event rule of limit 0 (never), and, in takeCosts, an
//     event whose cost is over the whole limit of a byte or unit rule;
//   - the deferral searches of one call read at most Options.MaxScan windows
//     all together (see "Budget" in internal/lua/admit/10_call.lua): when the budget is spent, a
//     tenant's events that were not placed are deferred, unreserved, to the
//     point where its search stopped (a Decision whose Until equals its Due)
//     and are checked as new when they come back; a search past its first
//     two reads per rule stops once the budget is down to what the tenants
//     after it in the call may need (two reads each, at most a quarter of
//     the budget), so that a flood's far search cannot defer a light tenant
//     unreserved (TestBoundedFloodLeavesLightTenants);
//   - a tenant that got nothing in a call keeps its search frontier at most
//     a minute (80_reserve.lua), and a tenant whose events are all rejected here
//     writes no key at all.

// DefaultMaxScan is the default of Options.MaxScan: window reads per script
// call, all tenants together. A read and the search's work around it cost
// Redis 6 to 16 µs of CPU (measured on a loaded machine by
// TestBoundedFitsFarAhead), so a call that spends the budget costs Redis
// 6 to 17 ms of CPU. Normal traffic reads a window or two per rule of each
// deferred tenant (about 24 window and anchor reads a call in make bench),
// far below it; past it, a tenant's events wait unreserved until the window
// where its search stopped (see above).
//
// It was 512 for a while: half the CPU of a call that spends it, but in the
// fault suite's mix (TestFaultMix) the flooding tenants' far-ahead searches
// then spent the budget of most calls, the light tenants after them in a
// call were deferred unreserved, came back checked as new behind the retry
// tier's backlog, and the retry lateness p99 went from 2 s to 30 s (the
// same binary with 1,024: 2.0 s).
const DefaultMaxScan = 1024

// never returns the reason why rules never admit an event of their tenant
// (an event rule of limit 0), or "".
func never(rules []Rule) string {
	for _, r := range rules {
		if r.Measure == Events && r.Limit < 1 {
			return fmt.Sprintf("rule %s never admits an event: its limit is 0", r)
		}
	}
	return ""
}

// rejectNever decides without Redis the events of g when a rule of g never
// admits one, unless one of them may have been decided by Redis before
// (src, see sentOffsets): that one gets its recorded decision back from
// Redis. It reports whether g was decided. l.mu must be held.
func (l *Limiter) rejectNever(g *group, src positions, out []Decision) bool {
	why := never(g.rules)
	if why == "" || l.sent.mayReplay(src, g) {
		return false
	}
	for _, i := range g.idx {
		out[i] = Decision{Kind: Reject, Reason: why}
	}
	return true
}

// scanBudget returns the window reads each of calls script calls may spend
// on deferral searches: Options.MaxScan for the one call of a single Redis;
// on Redis Cluster, where each tenant has a call of its own, a share of it
// each (at least minScanShare), so that one batch costs about as much.
func (l *Limiter) scanBudget(calls int) int {
	if calls <= 1 {
		return l.opts.MaxScan
	}
	return max(minScanShare, (l.opts.MaxScan+calls-1)/calls)
}

// minScanShare is the least budget of one tenant's call on Redis Cluster:
// enough to reserve a few windows ahead.
const minScanShare = 16
