package consume

import (
	"context"
	"time"

	"github.com/segmentio/kafka-go"
)

// Delayed consumes the retry tier topics as one member of a Kafka consumer
// group and hands each message to the Handler at its release time
// (DelayedConfig.ReleaseAt), never before it by DelayedConfig.Clock.
//
// Each assigned partition runs two goroutines. A fetch goroutine reads ahead
// into a buffer of at most DelayedConfig.LookAhead messages, pausing while it
// is full (until messages are released or passed over). The partition goroutine keeps the buffer as a min-heap by release
// time, sleeps until the earliest release, and hands whatever is due to the
// Handler in batches of at most BatchSize, in offset order. When the Handler
// returns nil, those messages are done; a failing batch is retried after a
// backoff. The committed offset is the first fetched message not yet done,
// so nothing is committed past a message still waiting.
//
// A message far in the future therefore holds back the committed offset of
// every later offset of its partition until it is released. So that those
// are not handed again by the partition's next owner, every commit carries
// the set of offsets beyond it that are done, in its offset metadata
// (handover.go), and a new owner skips them: a rebalance or a graceful
// shutdown hands nothing twice. A crash hands again at most the messages
// done since the last commit (one batch per partition: Delayed commits after
// each). If the done set does not fit in DelayedConfig.MetadataMax, its high
// end is left out and those messages are handed again. When the look-ahead
// (LookAhead messages, or LookAheadBytes) is full and nothing in it is due,
// the partition passes over the messages released last and reads on, to read
// them again before they are due (passover.go); only when it may keep no more
// passed-over offsets, or nothing is released more than 2×rescanLead ahead,
// does it fetch nothing more until one is released. The retry tiers keep both
// bounded: a tier holds only delays up to its own upper bound (1m, 1h, then
// the deferral horizon), and releases each message at due minus the tier's
// lower bound.
//
// Rebalance and shutdown behave as for Group. A Delayed is safe for
// concurrent use: Ready may be called from any goroutine while Run runs. Run
// may be called only once.
type Delayed struct {
	m   *member
	cfg DelayedConfig
}

// NewDelayed returns a Delayed that hands the messages of cfg.Topics to h at
// their release time. It does not connect: that happens in Run.
func NewDelayed(cfg DelayedConfig, h Handler) (*Delayed, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Delayed{cfg: cfg.withDefaults()}
	m, err := newMember(cfg.Config, h, func(p *partition, stop, hctx context.Context) {
		p.runDelayed(&d.cfg, stop, hctx)
	})
	if err != nil {
		return nil, err
	}
	m.handover = true
	for _, k := range cfg.MetadataKeys {
		d.cfg.metaKeys = append(d.cfg.metaKeys, metaKey(k))
	}
	m.metaKeys = d.cfg.metaKeys
	m.onDistrusted = cfg.OnDistrusted
	d.m = m
	return d, nil
}

// Run consumes until ctx is cancelled, then stops fetching, lets the
// in-flight batches finish (bounded by DrainTimeout), commits, leaves the
// group and returns nil. Messages still waiting are not committed and are
// fetched again by the next owner of their partition. A missing topic is
// handled as in Group.Run.
func (d *Delayed) Run(ctx context.Context) error { return d.m.run(ctx) }

// Ready reports whether the Delayed is a working member of its consumer
// group: it has joined a generation, and no join has failed since.
func (d *Delayed) Ready() bool { return d.m.ready.Load() }

// runDelayed is the partition loop of Delayed.
func (p *partition) runDelayed(c *DelayedConfig, stop, hctx context.Context) {
	// room bounds the messages fetched and not yet handled, by count and
	// bytes: the fetch goroutine waits for room before each fetch; room is
	// given back when a message has been handled.
	r := &delayedRun{p: p, c: c, room: newBudget(c.LookAhead, c.LookAheadBytes), clock: p.cfg.Clock}
	p.recommit = r.commit // while a batch fails, a failed commit is sent again
	r.in = make(chan kafka.Message, min(c.LookAhead, p.cfg.BatchSize))
	r.seek, _ = p.fetcher.(seeker)
	r.startFetch(stop)
	defer func() { r.stopFetch() }() // the last one started (rescan starts others)
	defer func() {
		r.waitingDelta(-r.h.Len())
		r.forgetWaiting()
	}()
	if c.Expedite != nil {
		r.changed = c.Expedite.Changed()
	}
	r.tr.inherit(p.inherited)
	p.inherited = nil

	for {
		if stop.Err() != nil {
			return
		}
		r.takeFetched(r.in)
		now := r.clock.Now()
		if due := r.h.popDue(now, p.cfg.BatchSize); len(due) > 0 {
			if !r.release(stop, hctx, due) {
				return
			}
			continue
		}
		if r.rescanFound() {
			r.endFoundRescan(stop)
			continue
		}
		if r.rescanDue(now) {
			r.rescan(stop)
			continue
		}
		if r.passOver(now) {
			continue
		}
		if r.advanceDue(now) {
			r.advance(hctx, now) // (advance.go)
			continue
		}
		if !r.wait(stop, r.in, now) {
			return
		}
	}
}

// startFetch starts the fetch goroutine, which fetches into r.in until
// stopFetch or stop.
func (r *delayedRun) startFetch(stop context.Context) {
	fctx, fcancel := context.WithCancel(stop)
	fetched := make(chan struct{})
	go func() {
		defer close(fetched)
		r.p.fetchAhead(fctx, r.room, r.in)
	}()
	r.stopFetch = func() {
		fcancel()
		<-fetched
	}
}

// delayedRun is the state of one partition's runDelayed: the messages
// waiting for their release time, the offsets done and the room to fetch
// ahead. Only the partition's goroutine uses it.
type delayedRun struct {
	p     *partition
	c     *DelayedConfig
	room  *budget
	clock Clock
	h     releaseHeap
	tr    offsetTracker
	// truncated: the last commit's done set did not fit.
	truncated bool
	// timerC fires at timerAt, the earliest release time when it was set.
	timerAt time.Time
	timerC  <-chan time.Time
	// changed is closed at the Expediter's next change (nil: none).
	changed <-chan struct{}
	// advanceAt is when the waiting messages are next offered to the
	// Advancer (advance.go).
	advanceAt time.Time
	// in carries the fetched messages; stopFetch stops the fetch goroutine
	// that fills it (startFetch).
	in        chan kafka.Message
	stopFetch func()
	// seek, when the fetcher has it, lets the partition pass over messages
	// when the look-ahead is full and read them again later (passover.go).
	seek   seeker
	passed passedOver
}

// waitingDelta reports a change of n in the messages waiting.
func (r *delayedRun) waitingDelta(n int) {
	if r.c.OnWaiting != nil && n != 0 {
		r.c.OnWaiting(r.p.topic, n)
	}
}

// push takes in a fetched message: it waits for its release time, or is
// done already when the previous owner handled it.
func (r *delayedRun) push(m kafka.Message) {
	r.p.hwm = m.HighWaterMark
	if r.passed.rescanning(m.Offset) {
		// Read again: wait only if it was passed over.
		if !r.takeReread(m.Offset) {
			r.room.give(1, messageBytes(m))
			return
		}
	} else {
		r.endRescan(m.Offset)
		if !r.tr.add(m.Offset) {
			// The previous owner handled it: it is done.
			r.room.give(1, messageBytes(m))
			if r.c.OnSkipped != nil {
				r.c.OnSkipped(r.p.topic, 1)
			}
			return
		}
	}
	now := r.clock.Now()
	rel := r.c.ReleaseAt(m)
	at := rel.At
	if e := r.c.Expedite; e != nil && at.After(now) && e.Early(m, now) {
		// Fetched after a raise that it waited through (beyond the
		// look-ahead, or in a later tier): released at once.
		at = now
	}
	r.h.push(m, at, rel.Note, now)
	r.waitingDelta(1)
	if r.c.OnWaitingMessage != nil {
		r.c.OnWaitingMessage(m, 1)
	}
}

// takeFetched takes in everything fetched so far, so that a batch gathers
// all that is due.
func (r *delayedRun) takeFetched(in <-chan kafka.Message) {
	for {
		select {
		case m := <-in:
			r.push(m)
		default:
			return
		}
	}
}

// release hands the due messages to the Handler, gives their room back and
// commits what is done; it reports false if stop ended the handling.
func (r *delayedRun) release(stop, hctx context.Context, due []waiting) bool {
	r.waitingDelta(-len(due))
	if r.c.OnWaitingMessage != nil {
		for _, w := range due {
			r.c.OnWaitingMessage(w.msg, -1)
		}
	}
	msgs := make([]kafka.Message, len(due))
	notes := make([]any, len(due))
	offsets := make([]int64, len(due))
	for i, w := range due {
		msgs[i], notes[i], offsets[i] = w.msg, w.note, w.msg.Offset
	}
	if !r.p.handle(stop, hctx, msgs, notes) {
		return false
	}
	// Lateness runs to the Handler's success (its writes are
	// acknowledged), not to the hand-over: it covers the write and
	// any retries of a failing batch.
	if r.c.OnLateness != nil {
		handled := r.clock.Now()
		for _, w := range due {
			if !w.at.IsZero() {
				r.c.OnLateness(r.p.topic, handled.Sub(w.at))
			}
		}
	}
	r.tr.done(offsets...)
	size := 0
	for _, m := range msgs {
		size += messageBytes(m)
	}
	r.room.give(len(msgs), size)
	r.commit()
	return true
}

// commit commits the contiguous done offsets, with the done set beyond
// them in the metadata, when there is something new to commit.
func (r *delayedRun) commit() {
	next, ok := r.tr.commitPoint()
	if !ok {
		return
	}
	room := r.c.MetadataMax
	if len(r.c.MetadataKeys) > 0 {
		room -= sigLen
	}
	meta, left := encodeDone(next, r.tr.doneBeyond(), room)
	meta = signMeta(r.c.metaKeys, r.p.cfg.GroupID, r.p.topic, r.p.id, meta)
	if left > 0 {
		if !r.truncated {
			r.p.log.Warn("done offsets beyond the commit do not fit in the offset metadata; a new owner would handle them again",
				"offset", next, "left_out", left, "metadata_max", r.c.MetadataMax)
		}
		if r.c.OnTruncated != nil {
			r.c.OnTruncated(r.p.topic, left)
		}
	}
	r.truncated = left > 0
	r.p.commitNext(offsetCommit{next: next, meta: meta})
}

// wait sleeps, when nothing is due, until the earliest release time or the
// next fetched message; it reports false if stop is done. The timer is only
// replaced when the earliest release time changes.
func (r *delayedRun) wait(stop context.Context, in <-chan kafka.Message, now time.Time) bool {
	if at, ok := r.nextWake(); ok {
		if r.timerC == nil || !at.Equal(r.timerAt) {
			r.timerAt, r.timerC = at, r.clock.After(at.Sub(now))
		}
	} else {
		r.timerC = nil
	}
	select {
	case <-stop.Done():
		return false
	case m := <-in:
		r.push(m)
	case <-r.timerC:
		r.timerC = nil
	case <-r.changed:
		r.changed = r.c.Expedite.Changed()
		if len(r.passed.offsets) > 0 {
			r.passed.earliest = r.clock.Now() // read them again now: some may go early
		}
		if n := r.h.expedite(r.clock.Now(), r.c.Expedite.Early); n > 0 {
			r.timerC = nil
			r.p.log.Info("waiting messages released early after a raise", "topic", r.p.topic, "partition", r.p.id, "messages", n)
		}
	}
	return true
}

// fetchAhead fetches messages into in, waiting for room before each fetch,
// until ctx is done.
func (p *partition) fetchAhead(ctx context.Context, room *budget, in chan<- kafka.Message) {
	for attempt := 0; ; {
		if !room.wait(ctx) {
			return
		}
		m, err := p.fetcher.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil || !p.fetchFailed(ctx, attempt, err) {
				return
			}
			attempt++
			continue
		}
		attempt = 0
		p.gaps.fetched(ctx, m.Offset)
		room.take(messageBytes(m))
		select {
		case in <- m:
		case <-ctx.Done():
			room.give(1, messageBytes(m)) // fetched again after a rescan
			return
		}
	}
}
