package consume

import (
	"context"
	"slices"
	"time"
)

// Passing over. A partition of a retry tier fetches ahead into a look-ahead
// bounded by count and bytes (DelayedConfig.LookAhead, LookAheadBytes). When
// it is full of messages that are not due, fetching would stop, and a message
// due sooner behind them would wait until enough of them were released: its
// lateness would grow with the bytes of later-due messages before it. Instead
// the partition passes over the waiting messages released last: it drops them
// from memory (they stay unfinished, so the committed offset never moves past
// them), keeps only their offsets, and fetches on. Shortly before the
// earliest of them is due (rescanLead) it fetches again from the lowest
// passed-over offset, takes in the passed-over messages as they come by and
// skips the others (done, or still waiting in memory); past the offset where
// the rescan began it goes on as before.
//
// The cost is reads, not writes: nothing is written again, so no copy can
// appear, and commits stay at the earliest unfinished offset. The done set a
// commit hands over (handover.go) spans more offsets, though, so it is more
// often too long for the offset metadata (left out, counted, handled again
// by a new owner). Each passed-over
// offset costs passedOffsetBytes of the byte budget, and at most half of it
// (without a byte budget, at most LookAhead offsets): beyond that the
// partition waits as before. A message released within 2×rescanLead is never
// passed over, so a partition rescans at most once per rescanLead.

// seeker is a fetcher that can start again at an earlier offset
// (committedFetcher). It is called only while no fetch goroutine runs.
type seeker interface {
	seek(offset int64)
}

const (
	// passedOffsetBytes is what the offset of a message passed over costs
	// the look-ahead's byte budget: it is held twice, by passedOver and as
	// unfinished by the offsetTracker.
	passedOffsetBytes = 16
	// rescanLead is how long before the earliest release time of the
	// messages passed over a partition starts reading them again.
	rescanLead = time.Second
)

// passedOver is what a partition remembers of the messages it passed over.
type passedOver struct {
	offsets  []int64   // passed over since the last rescan began, in no order
	earliest time.Time // the earliest release time of offsets
	reread   []int64   // passed over before the rescan in progress, not read again yet, ascending
	end      int64     // the rescan in progress reads again the offsets below end; 0: none
	n        int       // offsets held: len(offsets) + len(reread)
	capped   bool      // passing over stopped at the cap (logged once)
}

// rescanning reports whether a message fetched at offset is read again by
// the rescan in progress.
func (o *passedOver) rescanning(offset int64) bool { return o.end > 0 && offset < o.end }

// passCap is the most offsets a partition keeps passed over.
func (r *delayedRun) passCap() int {
	if r.c.LookAheadBytes > 0 {
		return r.c.LookAheadBytes / 2 / passedOffsetBytes
	}
	return r.c.LookAhead
}

// passOver passes over the waiting messages released last when the
// look-ahead is full and nothing is due (the caller found nothing due): about
// an eighth of the look-ahead, only messages released after now+2×rescanLead,
// within passCap. It reports whether it passed over any.
func (r *delayedRun) passOver(now time.Time) bool {
	if r.seek == nil || r.h.Len() == 0 || !r.room.full() {
		return false
	}
	o := &r.passed
	left := r.passCap() - o.n
	if left <= 0 {
		if !o.capped {
			o.capped = true
			r.p.log.Info("look-ahead full of messages not due and no room to pass over more; fetching waits for releases",
				"passed_over", o.n)
		}
		return false
	}
	taken := r.h.popLatest(now.Add(2*rescanLead), left, max(1, r.c.LookAhead/8), r.c.LookAheadBytes/8)
	if len(taken) == 0 {
		return false
	}
	o.capped = false
	size := 0
	for _, w := range taken {
		size += messageBytes(w.msg)
		o.offsets = append(o.offsets, w.msg.Offset)
		if o.earliest.IsZero() || w.at.Before(o.earliest) {
			o.earliest = w.at
		}
		if r.c.OnWaitingMessage != nil {
			r.c.OnWaitingMessage(w.msg, -1)
		}
	}
	o.n += len(taken)
	r.room.hold(len(taken) * passedOffsetBytes)
	r.room.give(len(taken), size)
	r.waitingDelta(-len(taken))
	if r.c.OnPassedOver != nil {
		r.c.OnPassedOver(r.p.topic, len(taken))
	}
	r.p.log.Debug("look-ahead full: passed over the messages released last, to be read again before they are due",
		"messages", len(taken), "bytes", size, "passed_over", o.n, "earliest", o.earliest)
	return true
}

// rescanDue reports whether the messages passed over are to be read again:
// the earliest of them is due within rescanLead, and no rescan runs.
func (r *delayedRun) rescanDue(now time.Time) bool {
	o := &r.passed
	return o.end == 0 && len(o.offsets) > 0 && !now.Before(o.earliest.Add(-rescanLead))
}

// rescan fetches again from the lowest offset passed over: the fetch
// goroutine stops, what it fetched and the loop has not taken in is
// dropped (it is fetched again), and a new one starts there.
func (r *delayedRun) rescan(stop context.Context) {
	r.stopFetch()
	r.dropFetched()
	o := &r.passed
	slices.Sort(o.offsets)
	o.reread, o.offsets, o.earliest = o.offsets, nil, time.Time{}
	o.end = r.tr.next
	r.p.log.Debug("reading passed-over messages again", "from", o.reread[0], "to", o.end, "messages", len(o.reread))
	r.seek.seek(o.reread[0])
	r.startFetch(stop)
}

// rescanFound reports whether the rescan in progress has taken back every
// message it went back for: what it would read up to its end is done or
// waiting in memory already.
func (r *delayedRun) rescanFound() bool {
	o := &r.passed
	return o.end > 0 && len(o.reread) == 0
}

// endFoundRescan ends a rescan that found all it went back for (rescanFound)
// without reading on to its end: the fetch goroutine stops, what it fetched
// and the loop has not taken in is dropped, and a new one starts at the end.
// A rescan that waited for a message at its end would wait forever once the
// tier receives nothing more, and no rescan could start after it for the
// messages passed over meanwhile.
func (r *delayedRun) endFoundRescan(stop context.Context) {
	r.stopFetch()
	r.dropFetched()
	o := &r.passed
	r.seek.seek(o.end)
	o.end = 0
	r.startFetch(stop)
}

// dropFetched gives back the room of what the stopped fetch goroutine
// fetched and the loop has not taken in (it is fetched again).
func (r *delayedRun) dropFetched() {
	for {
		select {
		case m := <-r.in:
			r.room.give(1, messageBytes(m))
		default:
			return
		}
	}
}

// takeReread reports whether the message at offset, read again by a rescan,
// was passed over (it waits again) rather than done or still waiting.
func (r *delayedRun) takeReread(offset int64) bool {
	o := &r.passed
	i := 0
	for i < len(o.reread) && o.reread[i] < offset {
		i++
	}
	r.passedLost(o.reread[:i])
	o.reread = o.reread[i:]
	if len(o.reread) == 0 || o.reread[0] != offset {
		return false
	}
	o.reread = o.reread[1:]
	o.n--
	r.room.give(0, passedOffsetBytes)
	return true
}

// endRescan ends the rescan in progress, if any, at a message fetched at
// offset at or beyond its end.
func (r *delayedRun) endRescan(offset int64) {
	o := &r.passed
	if o.end == 0 || offset < o.end {
		return
	}
	r.passedLost(o.reread)
	o.reread, o.end = nil, 0
}

// passedLost gives up the offsets passed over that a rescan did not find
// again: Kafka deleted them (retention; the gap check reports it). They
// count as done, so that commits go on.
func (r *delayedRun) passedLost(offsets []int64) {
	if len(offsets) == 0 {
		return
	}
	r.p.log.Warn("messages passed over were not found when read again (deleted by Kafka?)",
		"first", offsets[0], "messages", len(offsets))
	r.passed.n -= len(offsets)
	r.room.give(0, len(offsets)*passedOffsetBytes)
	r.tr.done(offsets...)
}

// wakeAt returns when the partition loop must wake: the earliest release
// time, or the next rescan's time if sooner; false when neither.
func (r *delayedRun) wakeAt() (time.Time, bool) {
	var at time.Time
	ok := false
	if r.h.Len() > 0 {
		at, ok = r.h.next(), true
	}
	if o := &r.passed; o.end == 0 && len(o.offsets) > 0 {
		if t := o.earliest.Add(-rescanLead); !ok || t.Before(at) {
			at, ok = t, true
		}
	}
	return at, ok
}
