package route

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// DecisionAdvanced counts, in gatekeeper_decisions_total, deferred events
// forwarded before their due time because their booking moved into idle
// capacity of the current window (limit.Limiter.Advance, issue 24).
const DecisionAdvanced = "advanced"

// BacklogAdvancer moves the bookings of deferred events waiting in a retry
// tier into the current windows when the capacity has room there that
// nobody is expected to take (*limit.Limiter implements it:
// limit.Limiter.Advance). It must be safe for concurrent use.
type BacklogAdvancer interface {
	// Advance reports which events moved, and the time at which the moves
	// were counted (the windows of at hold them): the moved events are
	// forwarded with gk-due rewritten to at.
	Advance(ctx context.Context, src limit.Source, events []limit.Waiting) (moved []bool, at time.Time, err error)
}

// advanced remembers the messages whose booking Advance moved, by position,
// with the time the move was counted at, until Handle has forwarded them.
type advanced struct {
	mu   sync.Mutex
	keys map[string]time.Time
}

func advancedKey(m kafka.Message) string {
	return m.Topic + "/" + strconv.Itoa(m.Partition) + "/" + strconv.FormatInt(m.Offset, 10)
}

func (a *advanced) add(m kafka.Message, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.keys == nil {
		a.keys = map[string]time.Time{}
	}
	a.keys[advancedKey(m)] = at
}

// at returns the time m's move was counted at, if Advance moved it.
func (a *advanced) at(m kafka.Message) (time.Time, bool) {
	if a == nil {
		return time.Time{}, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	at, ok := a.keys[advancedKey(m)]
	return at, ok
}

func (a *advanced) done(ms []kafka.Message) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, m := range ms {
		delete(a.keys, advancedKey(m))
	}
}

// Advance implements consume.Advancer (set it as the retry tiers'
// consume.DelayedConfig.Advance when Retrier.AdvanceBacklog is set): of a
// retry tier partition's earliest waiting messages (of any tier: a backlog
// deferred more than a minute ahead waits in the later tiers) it offers
// those that hold a reserved slot (gk-reserved after gk-due, not gk-took),
// whose gk-sig verifies and whose due time is still ahead, each with its
// cost (CostFrom, as the Gate and Handle read it), to the Admitter as a
// BacklogAdvancer, in one call for the batch (the tier partition as its
// Source, as Handle's: a replay of the call, or a moved event handled again
// after a crash, counts once). An event whose cost cannot be read is not
// offered, nor are its tenant's events due at or after it. It returns which
// may go now: Handle then forwards them with gk-due rewritten to the time
// the moves were counted at. Without AdvanceBacklog, or an Admitter that
// cannot move bookings, or when the call fails (logged), nothing goes.
func (r *Retrier) Advance(ctx context.Context, b consume.Batch) []bool {
	a, ok := r.Admitter.(BacklogAdvancer)
	if !ok || !r.AdvanceBacklog || r.advanced == nil || len(b.Messages) == 0 {
		return nil
	}
	now := r.now()
	if !r.AdvanceWanted(now) {
		return nil // nothing could move: no call
	}
	type offer struct {
		i int
		w limit.Waiting
	}
	var offers []offer
	// noCost: per tenant, the earliest due time of its events whose cost
	// cannot be read.
	var noCost map[string]time.Time
	for i, m := range b.Messages {
		c := r.checkedOf(b, i)
		if !c.inTier || c.sigErr != nil || c.lenient || c.dueErr != nil {
			continue
		}
		d, err := parseDeferral(m, c.dueOf())
		if err != nil || d.Took || !d.Reserved.After(d.Due) || !now.Before(d.Due) {
			continue
		}
		// Its cost as Handle and the Gate read it (its gk- headers do not
		// count).
		cost, err := r.CostFrom.Cost(m)
		if err != nil {
			if first, ok := noCost[d.Tenant]; !ok || d.Due.Before(first) {
				if noCost == nil {
					noCost = map[string]time.Time{}
				}
				noCost[d.Tenant] = d.Due
			}
		}
		offers = append(offers, offer{i, limit.Waiting{Tenant: d.Tenant, Offset: m.Offset, Due: d.Due, Cost: cost, Windows: d.Windows}})
	}
	// An event whose cost cannot be read is not offered, nor are its
	// tenant's events due at or after it (they must not move before it).
	var events []limit.Waiting
	var idx []int
	for _, o := range offers {
		if first, ok := noCost[o.w.Tenant]; ok && !o.w.Due.Before(first) {
			continue
		}
		events = append(events, o.w)
		idx = append(idx, o.i)
	}
	if len(events) == 0 {
		return nil
	}
	moved, at, err := a.Advance(ctx, source(b), events)
	if err != nil || len(moved) != len(events) {
		r.logger().Warn("moving waiting deferred events into idle capacity failed; they wait for their slots",
			"topic", b.Topic, "partition", b.Partition, "events", len(events), "err", err)
		return nil
	}
	out := make([]bool, len(b.Messages))
	for k, i := range idx {
		if moved[k] {
			out[i] = true
			r.advanced.add(b.Messages[i], at)
		}
	}
	return out
}

// AdvanceWanted implements consume.AdvanceWanter: false when an offer at now
// could move nothing, so that none is built (the Admitter's AdvanceWanted,
// limit.Limiter.AdvanceWanted: before the capacity window's ramp, or while
// its last call is recent); true when the Admitter does not say.
func (r *Retrier) AdvanceWanted(now time.Time) bool {
	w, ok := r.Admitter.(interface{ AdvanceWanted(time.Time) bool })
	return !ok || w.AdvanceWanted(now)
}

// forwardAdvanced sets b.items[i] when m, before its due time, had its
// booking moved by Advance: forwarded now, gk-due rewritten to the time the
// move was counted at (its other gk- headers kept), so that the window of
// gk-due is the one that counted it, however late Handle runs after the
// call. It reports whether it did.
func (r *Retrier) forwardAdvanced(b *retryBatch, i int, m kafka.Message) bool {
	at, ok := r.advanced.at(m)
	if !ok {
		return false
	}
	b.counts[DecisionAdvanced]++
	due := kafka.Header{Key: HeaderDue, Value: formatMillis(at.UnixMilli())}
	b.items[i] = Item{Msg: withHeaders(m, func(k string) bool { return k == HeaderDue }, due), Outcome: Forward}
	return true
}
