package consume

import (
	"cmp"
	"container/heap"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
)

// waiting is a fetched message held until its release time.
type waiting struct {
	msg   kafka.Message
	at    time.Time // zero: release at once
	note  any       // the release clock's Note (Release)
	since time.Time // when it started waiting
}

// releaseHeap is a min-heap of waiting messages by release time, then
// offset. The zero value is empty. Not safe for concurrent use.
type releaseHeap struct{ items releaseItems }

type releaseItems []waiting

func (h releaseItems) Len() int { return len(h) }
func (h releaseItems) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].msg.Offset < h[j].msg.Offset
}
func (h releaseItems) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *releaseItems) Push(x any)   { *h = append(*h, x.(waiting)) }
func (h *releaseItems) Pop() any {
	old := *h
	n := len(old) - 1
	w := old[n]
	old[n] = waiting{} // drop the message's buffers
	*h = old[:n]
	return w
}

// Len returns the number of waiting messages.
func (h *releaseHeap) Len() int { return len(h.items) }

// push adds m, to be released at at with the release clock's note; it
// waits from since.
func (h *releaseHeap) push(m kafka.Message, at time.Time, note any, since time.Time) {
	heap.Push(&h.items, waiting{msg: m, at: at, note: note, since: since})
}

// next returns the earliest release time; the heap must not be empty.
func (h *releaseHeap) next() time.Time { return h.items[0].at }

// popDue removes and returns up to limit messages whose release time is not
// after now, in offset order. A message is never returned before its time.
func (h *releaseHeap) popDue(now time.Time, limit int) []waiting {
	var due []waiting
	for len(due) < limit && h.Len() > 0 && !h.items[0].at.After(now) {
		due = append(due, heap.Pop(&h.items).(waiting))
	}
	slices.SortFunc(due, func(a, b waiting) int {
		return cmp.Compare(a.msg.Offset, b.msg.Offset)
	})
	return due
}

// popLatest removes and returns the messages released last, latest first,
// as long as they are released after after: at most max of them, and stops
// once it has taken n of them or (when bytes is positive) bytes of them.
func (h *releaseHeap) popLatest(after time.Time, max, n, bytes int) []waiting {
	// A slice sorted by the heap's order is a heap.
	slices.SortFunc(h.items, func(a, b waiting) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return cmp.Compare(a.msg.Offset, b.msg.Offset)
	})
	var out []waiting
	size := 0
	for len(h.items) > 0 && len(out) < max && len(out) < n && (bytes <= 0 || size < bytes) {
		last := len(h.items) - 1
		w := h.items[last]
		if !w.at.After(after) {
			break
		}
		h.items[last] = waiting{}
		h.items = h.items[:last]
		out = append(out, w)
		size += messageBytes(w.msg)
	}
	return out
}
