package consume

import (
	"container/heap"
	"time"

	"github.com/segmentio/kafka-go"
)

// Expediter lets messages waiting in a Delayed consumer go before their
// release time, e.g. deferred events of a tenant whose limit was raised.
// Implementations must be safe for concurrent use.
type Expediter interface {
	// Changed returns a channel that is closed at the next change after
	// the call: each partition then asks Early about its waiting messages.
	// Each fetched message is asked about too, when it comes in.
	Changed() <-chan struct{}
	// Early reports whether m, waiting since since (by the consumer's
	// clock), may be handed to the Handler now. The Handler must accept
	// such a message before its release time. It is called for every
	// message fetched, so it must be cheap when nothing was raised.
	Early(m kafka.Message, since time.Time) bool
}

// expedite sets the release time of the waiting messages that early lets
// go to now, and returns how many.
func (h *releaseHeap) expedite(now time.Time, early func(kafka.Message, time.Time) bool) int {
	n := 0
	for i := range h.items {
		if w := &h.items[i]; w.at.After(now) && early(w.msg, w.since) {
			w.at = now
			n++
		}
	}
	if n > 0 {
		heap.Init(&h.items)
	}
	return n
}

// forgetWaiting tells OnWaitingMessage that the messages still waiting no
// longer do (the partition is given up).
func (r *delayedRun) forgetWaiting() {
	if r.c.OnWaitingMessage == nil {
		return
	}
	for _, w := range r.h.items {
		r.c.OnWaitingMessage(w.msg, -1)
	}
}
