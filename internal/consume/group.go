package consume

import (
	"context"

	"github.com/segmentio/kafka-go"
)

// Group consumes source topics as one member of a Kafka consumer group. Each
// assigned partition runs in its own goroutine: it fetches a batch (up to
// Config.BatchSize messages, waiting at most Config.BatchWait after the first),
// hands it to the Handler, and once the Handler returns nil commits the
// offset after the batch's last message. That commit runs while the next
// batch is fetched and handled, and the commits of all partitions that fall
// due while one is in flight go in one request. A failing batch is retried as it is;
// the partition does not move on until it succeeds. Partitions progress
// independently.
//
// When a rebalance ends the generation, each partition stops after its
// in-flight Handle call returns and commits it with the ending generation:
// the coordinator accepts that commit while the group prepares the rebalance
// (this member has not rejoined yet, so nobody else owns the partition), and
// refuses it if the group has moved on without this member. The next owner
// starts exactly after the last accepted commit.
//
// A Group is safe for concurrent use: Ready may be called from any goroutine
// while Run runs. Run may be called only once.
type Group struct {
	m *member
}

// NewGroup returns a Group that hands the messages of cfg.Topics to h. It
// does not connect: that happens in Run.
func NewGroup(cfg Config, h Handler) (*Group, error) {
	m, err := newMember(cfg, h, (*partition).runBatches)
	if err != nil {
		return nil, err
	}
	return &Group{m: m}, nil
}

// Run consumes until ctx is cancelled, then stops fetching, lets the
// in-flight batches finish (their Handle context is not cancelled by ctx but
// by Config.DrainTimeout), commits them, leaves the group and returns nil.
// Errors joining the group are logged and retried, not returned. While a
// subscribed topic does not exist (deleted under the group), the member
// stays out of the group, not Ready, logs an error, and rejoins once the
// topic exists again.
func (g *Group) Run(ctx context.Context) error { return g.m.run(ctx) }

// Ready reports whether the Group is a working member of its consumer group:
// it has joined a generation, and no join has failed since.
func (g *Group) Ready() bool { return g.m.ready.Load() }

// runBatches is the partition loop of Group.
//
// The commit of a batch runs while the next batch is fetched and handled;
// it is finished before the next commit starts and before the loop returns.
//
// While a batch fails, the commit of the batches before it is sent again
// if it failed (retryCommit).
func (p *partition) runBatches(stop, hctx context.Context) {
	p.recommit = p.retryCommit
	defer func() { p.finishCommit(p.inflight) }()
	if st, ok := p.handler.(Stager); ok && p.cfg.DecideAhead {
		p.runStaged(stop, hctx, st)
		return
	}
	for attempt := 0; ; {
		batch, err := p.fetchBatch(stop, stop)
		if stop.Err() != nil {
			// A batch fetched but not yet handed over is redelivered later.
			return
		}
		if err != nil {
			if !p.fetchFailed(stop, attempt, err) {
				return
			}
			attempt++
			continue
		}
		attempt = 0
		if !p.handle(stop, hctx, batch, nil) {
			return
		}
		p.done(batch)
	}
}

// done takes batch as handled: its commit starts once the one before it is
// finished.
func (p *partition) done(batch []kafka.Message) {
	last := batch[len(batch)-1]
	clear(batch) // keep no message alive until the next batch
	p.hwm = last.HighWaterMark
	p.acked = last.Offset + 1
	p.finishCommit(p.inflight)
	p.inflight = p.startCommit(offsetCommit{next: p.acked})
}

// writing is a staged batch whose Finish runs in a goroutine of its own.
type writing struct {
	msgs []kafka.Message
	err  error         // Finish's result, once done is closed
	done chan struct{} // closed when Finish has returned
	// fetch is the context of the wait for the next batch's first message:
	// stop's, ended too once Finish has returned (endFetch).
	fetch    context.Context
	endFetch context.CancelFunc
}

// runStaged is runBatches with a Stager and Config.DecideAhead: a batch is
// staged (its limiter call) while the batch before it is finished (written
// and acknowledged) in a goroutine; it is finished only once that one is
// done and its commit started, so that writes keep the partition's order
// and a commit still follows its acknowledgements. A batch that cannot be
// staged (Stage failed, or the write fence has ended) is handled with
// Handle, as runBatches does, once the batch before it is done. While the
// partition waits for its next message, the batch being finished is
// committed as soon as it is done. At a stop, a batch already staged is
// finished and committed too, once the one before it is done (as an
// in-flight Handle call is finished); it is dropped only when that one
// failed.
func (p *partition) runStaged(stop, hctx context.Context, st Stager) {
	var w *writing
	defer func() {
		if w != nil {
			p.finishWriting(stop, hctx, w)
		}
	}()
	for attempt := 0; ; {
		// The wait for the next batch's first message ends when the batch
		// being finished is done, so that its commit is not held back by
		// an idle partition.
		first := stop
		if w != nil {
			first = w.fetch
		}
		batch, err := p.fetchBatch(stop, first)
		waited := first.Err() != nil
		if stop.Err() != nil {
			// A batch fetched but not yet handed over is redelivered later;
			// the one being finished is finished by the deferred call.
			return
		}
		if err != nil {
			if w != nil {
				ok := p.finishWriting(stop, hctx, w)
				w = nil
				if !ok {
					return
				}
				if waited {
					continue
				}
			}
			if !p.fetchFailed(stop, attempt, err) {
				return
			}
			attempt++
			continue
		}
		attempt = 0
		var staged Staged
		if fence, _ := FenceOf(hctx); fence == nil || fence.Err() == nil {
			s, serr := st.Stage(hctx, p.batch(batch, nil))
			if serr == nil {
				staged = s
			} else {
				p.log.Debug("batch not staged; it is handled once the one before it is done",
					"offset", batch[0].Offset, "count", len(batch), "err", serr)
			}
		}
		if w != nil {
			ok := p.finishWriting(stop, hctx, w)
			w = nil
			if !ok || (staged == nil && stop.Err() != nil) {
				// The batch before it is not done, or stopped with nothing
				// decided: the batch is redelivered later.
				if staged != nil {
					staged.Drop()
				}
				return
			}
			// Stopped after the batch before it was done: a staged batch
			// goes on below like any other, and the deferred finishWriting
			// finishes and commits it (as an in-flight Handle call is),
			// since its next owner, in another process, may know a tenant
			// full and reject its events locally, without the replay
			// record that holds their first decisions (G9).
		}
		if staged == nil {
			if !p.handle(stop, hctx, batch, nil) {
				return
			}
			p.done(batch)
			continue
		}
		w = &writing{msgs: batch, done: make(chan struct{})}
		w.fetch, w.endFetch = context.WithCancel(stop)
		go func(w *writing, s Staged) {
			defer w.endFetch()
			defer close(w.done)
			w.err = s.Finish(hctx)
		}(w, staged)
		// The next batch is fetched into the other slice.
		p.buf, p.spare = p.spare, batch
	}
}

// finishWriting waits for w's Finish. When it failed, the batch is handled
// again with Handle, as handle retries a failing batch (after a backoff;
// not once stop is done). It reports whether the batch is done; then its
// commit has started.
func (p *partition) finishWriting(stop, hctx context.Context, w *writing) bool {
	<-w.done
	if w.err != nil {
		if stop.Err() != nil {
			p.log.Warn("batch not handled before stop; it will be redelivered",
				"offset", w.msgs[0].Offset, "count", len(w.msgs), "err", w.err)
			return false
		}
		if p.recommit != nil {
			p.recommit()
		}
		d := p.cfg.backoff(0)
		p.log.Warn("handle batch failed; retrying",
			"offset", w.msgs[0].Offset, "count", len(w.msgs), "attempt", 1, "retry_in", d, "err", w.err)
		if !sleep(stop, d) || !p.handle(stop, hctx, w.msgs, nil) {
			return false
		}
	}
	p.done(w.msgs)
	return true
}

// fetchBatch waits for one message (until first is done), then gathers more
// until the batch holds BatchSize messages or BatchBytes bytes, or BatchWait
// has passed since the first one (or stop is done). Messages come in offset
// order.
func (p *partition) fetchBatch(stop, firstCtx context.Context) ([]kafka.Message, error) {
	first, err := p.fetcher.FetchMessage(firstCtx)
	if err != nil {
		return nil, err
	}
	p.gaps.fetched(stop, first.Offset)
	// The previous batch's slice is reused: Handlers keep no reference to
	// msgs once Handle returns.
	batch := append(p.buf[:0], first)
	defer func() { p.buf = batch }()
	size := messageBytes(first)
	full := func() bool {
		return len(batch) >= p.cfg.BatchSize || (p.cfg.BatchBytes > 0 && size >= p.cfg.BatchBytes)
	}
	if full() {
		return batch, nil
	}
	wait, cancel := context.WithTimeout(stop, p.cfg.BatchWait)
	defer cancel()
	for !full() {
		m, err := p.fetcher.FetchMessage(wait)
		if err != nil {
			// kafka-go keeps an unfetched message queued when the context
			// ends, so nothing is lost here.
			if wait.Err() == nil {
				p.log.Warn("fetch failed", "err", err)
			}
			break
		}
		p.gaps.fetched(stop, m.Offset)
		batch = append(batch, m)
		size += messageBytes(m)
	}
	return batch, nil
}
