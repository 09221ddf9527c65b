package consume

import "slices"

// offsetTracker finds the commit point of a partition whose messages finish
// out of order: the offset of the first fetched message not yet done, or,
// when all are done, the offset after the last fetched one. It never points
// beyond an unfinished message. Offsets need not be contiguous (compaction
// and transaction markers leave gaps): only fetched offsets count.
//
// It also knows which offsets beyond the commit point are done, so that a
// commit can hand them to the partition's next owner (see handover.go): those
// it finished itself, and those the previous owner had finished (inherited),
// which it skips when it fetches them.
//
// It keeps only the unfinished offsets and the inherited ranges, so its
// memory is bounded by the look-ahead and the metadata size, however long
// one message holds the commit point back. Not safe for concurrent use.
type offsetTracker struct {
	undone    []int64       // fetched and not done, ascending
	next      int64         // offset after the last fetched message
	fetched   bool          // something was fetched (or skipped)
	inherited []offsetRange // done by the previous owner, at or beyond next, ascending
}

// inherit records the done set the previous owner of the partition handed
// over. Call it before anything is fetched.
func (t *offsetTracker) inherit(done []offsetRange) {
	t.inherited = slices.Clone(done)
}

// add records a fetched message and reports whether it is to be handled:
// false means the previous owner already did, and it counts as done.
// Offsets must be added in ascending order.
func (t *offsetTracker) add(offset int64) bool {
	t.next = offset + 1
	t.fetched = true
	skip := false
	for len(t.inherited) > 0 {
		r := t.inherited[0]
		if offset >= r.hi {
			t.inherited = t.inherited[1:]
			continue
		}
		skip = offset >= r.lo
		if t.next >= r.hi {
			t.inherited = t.inherited[1:]
		} else if t.next > r.lo {
			t.inherited[0].lo = t.next
		}
		break
	}
	if !skip {
		t.undone = append(t.undone, offset)
	}
	return !skip
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
	// Everything fetched is done; inherited ranges that start right here
	// are done too.
	c := t.next
	if len(t.inherited) > 0 && t.inherited[0].lo <= c {
		c = max(c, t.inherited[0].hi)
	}
	return c, true
}

// doneBeyond returns the done offsets beyond the commit point, as ascending,
// disjoint, non-adjacent ranges: the gaps between unfinished fetched
// offsets, then the inherited ranges not fetched yet.
func (t *offsetTracker) doneBeyond() []offsetRange {
	c, ok := t.commitPoint()
	if !ok {
		return nil
	}
	var done []offsetRange
	appendRange := func(r offsetRange) {
		if r.lo < c {
			r.lo = c
		}
		if r.hi <= r.lo {
			return
		}
		if n := len(done); n > 0 && done[n-1].hi >= r.lo {
			done[n-1].hi = max(done[n-1].hi, r.hi)
			return
		}
		done = append(done, r)
	}
	for i, u := range t.undone {
		end := t.next
		if i+1 < len(t.undone) {
			end = t.undone[i+1]
		}
		appendRange(offsetRange{u + 1, end})
	}
	for _, r := range t.inherited {
		appendRange(r)
	}
	return done
}

// pending returns the number of fetched offsets not done.
func (t *offsetTracker) pending() int { return len(t.undone) }
