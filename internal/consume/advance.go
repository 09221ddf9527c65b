package consume

import (
	"container/heap"
	"context"
	"time"

	"github.com/segmentio/kafka-go"
)

// DefaultAdvanceEvery is the default of DelayedConfig.AdvanceEvery.
const DefaultAdvanceEvery = 100 * time.Millisecond

// Advancer lets a Delayed consumer's waiting messages go before their
// release time when it says they may, e.g. deferred events whose bookings
// it moved into idle capacity (route.Retrier.Advance). Implementations must
// be safe for concurrent use.
type Advancer interface {
	// Advance is offered a partition's earliest waiting messages (at most
	// BatchSize, none of them due yet), earliest release first, as a
	// Batch like a Handler's (its Notes are the release clock's); it
	// returns, index-aligned, which of them may be handed to the Handler
	// now (nil: none). The Handler must accept those before their release
	// time. It is called from the partition's goroutine, at most once per
	// DelayedConfig.AdvanceEvery while messages wait, and may make a
	// network call (bounded by its own timeout).
	Advance(ctx context.Context, b Batch) []bool
}

// AdvanceWanter is an Advancer that says beforehand whether an offer at now
// could let anything go: when it says no, the partition builds no offer
// (route.Retrier: before the capacity window's ramp, or while another
// partition's offer is recent).
type AdvanceWanter interface {
	AdvanceWanted(now time.Time) bool
}

// advanceDue reports whether the partition offers its waiting messages to
// the Advancer now.
func (r *delayedRun) advanceDue(now time.Time) bool {
	return r.c.Advance != nil && r.h.Len() > 0 && !now.Before(r.advanceAt)
}

// advance offers the earliest waiting messages to the Advancer and
// releases at once those it lets go.
func (r *delayedRun) advance(hctx context.Context, now time.Time) {
	r.advanceAt = now.Add(r.c.AdvanceEvery)
	if w, ok := r.c.Advance.(AdvanceWanter); ok && !w.AdvanceWanted(now) {
		return
	}
	n := min(r.h.Len(), r.p.cfg.BatchSize)
	head := make([]waiting, 0, n)
	for len(head) < n {
		head = append(head, heap.Pop(&r.h.items).(waiting))
	}
	b := Batch{Topic: r.p.topic, TopicID: r.p.topicID, Partition: r.p.id, Committed: max(r.p.committed, 0), Assignment: r.p.assignment}
	b.Messages, b.Notes = make([]kafka.Message, 0, n), make([]any, 0, n)
	for _, w := range head {
		b.Messages = append(b.Messages, w.msg)
		b.Notes = append(b.Notes, w.note)
	}
	lets := r.c.Advance.Advance(hctx, b)
	moved := 0
	for i, w := range head {
		if i < len(lets) && lets[i] {
			w.at = now
			moved++
		}
		heap.Push(&r.h.items, w)
	}
	if moved > 0 {
		r.timerC = nil
		if r.c.OnAdvanced != nil {
			r.c.OnAdvanced(r.p.topic, moved)
		}
	}
}

// nextWake is wakeAt, or the next offer to the Advancer when that comes
// first.
func (r *delayedRun) nextWake() (time.Time, bool) {
	at, ok := r.wakeAt()
	if r.c.Advance != nil && r.h.Len() > 0 && (!ok || r.advanceAt.Before(at)) {
		at, ok = r.advanceAt, true
	}
	return at, ok
}
