package consume

import "slices"

// offsetTracker finds the commit point of a partition whose messages finish
// out of order: the offset of the first fetched message not yet done, or,
// when all are done, the offset after the last fetched one. It never points
// beyond an unfinished message. Offsets need not be contiguous (compaction
// and transaction markers leave gaps): only fetched offsets count.
//
// It keeps only the unfinished offsets, so its memory is bounded by the
// look-ahead, however long one message holds the commit point back.
// Not safe for concurrent use.
type offsetTracker struct {
	undone  []int64 // fetched and not done, ascending
	next    int64   // offset after the last fetched message
	fetched bool
}

// add records a fetched message. Offsets must be added in ascending order.
func (t *offsetTracker) add(offset int64) {
	t.undone = append(t.undone, offset)
	t.next = offset + 1
	t.fetched = true
}

// done records that the messages at offsets are finished. Unknown offsets
// are ignored.
func (t *offsetTracker) done(offsets ...int64) {
	if len(offsets) == 0 {
		return
	}
	offsets = slices.Clone(offsets)
	slices.Sort(offsets)
	kept := t.undone[:0]
	j := 0
	for _, u := range t.undone {
		for j < len(offsets) && offsets[j] < u {
			j++
		}
		if j < len(offsets) && offsets[j] == u {
			continue
		}
		kept = append(kept, u)
	}
	t.undone = kept
}

// commitPoint returns the offset to commit, and false if nothing has been
// fetched yet.
func (t *offsetTracker) commitPoint() (int64, bool) {
	if !t.fetched {
		return 0, false
	}
	if len(t.undone) > 0 {
		return t.undone[0], true
	}
	return t.next, true
}

// pending returns the number of fetched offsets not done.
func (t *offsetTracker) pending() int { return len(t.undone) }
