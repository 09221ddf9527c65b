package consume

import (
	"context"
	"errors"
	"log/slog"

	"github.com/segmentio/kafka-go"
)

// fetcher is the part of *kafka.Reader a partition loop uses.
type fetcher interface {
	FetchMessage(ctx context.Context) (kafka.Message, error)
}

// partition is the state of one assigned partition. It is owned by its loop
// goroutine (Delayed's fetch goroutine uses only fetcher, cfg and log).
type partition struct {
	topic   string
	topicID string // Kafka's topic ID, read at assignment (topicid.go)
	id      int
	fetcher fetcher
	commit  func(c offsetCommit) error
	handler Handler
	cfg     *Config
	log     *slog.Logger

	assignment    uint64          // Batch.Assignment: this ownership's number (nextAssignment)
	committed     int64           // last offset committed (the assigned one at first)
	committedMeta string          // the metadata that went with it
	hwm           int64           // high watermark as of the last fetched message, -1 for none
	buf           []kafka.Message // the batch slice, reused by fetchBatch
	spare         []kafka.Message // runStaged: the other slice, the batch being finished's
	inherited     []offsetRange   // done by the previous owner beyond committed (Delayed)
	acked         int64           // Group: the offset after the last batch handled, 0 before one
	inflight      *pendingCommit  // Group: the commit in flight, nil when none
	recommit      func()          // run while a batch fails: sends again a failed commit (nil: none)
	gaps          *gapCheck       // watches for offsets deleted before they were consumed; nil in unit tests
	staleRoutes   func()          // refreshes the transport's metadata after a fetch found no leader (routes.go); nil: none
}

// handle calls the Handler with msgs (and their release clock's notes, nil
// for a source) until it returns nil (true), or until
// stop is done (false): then nothing of msgs may be committed. A failing
// batch is retried as it is, after a capped exponential backoff. The
// Batch carries the partition's committed offset; the context, the
// generation's write fence (FenceOf).
//
// Once that fence has ended, the batch is not handed over again: the
// partition may already have a new owner, and a decision made now could come
// after that owner's commit, where nothing recognises it as a replay (it
// would be counted twice).
func (p *partition) handle(stop, hctx context.Context, msgs []kafka.Message, notes []any) bool {
	b := p.batch(msgs, notes)
	fence, _ := FenceOf(hctx)
	for attempt := 0; ; attempt++ {
		if fence != nil && fence.Err() != nil {
			p.log.Warn("batch not handled: the generation's write fence ended; it will be redelivered to the partition's next owner",
				"offset", msgs[0].Offset, "count", len(msgs), "err", fence.Err())
			return false
		}
		err := p.handler.Handle(hctx, b)
		if err == nil {
			return true
		}
		if stop.Err() != nil {
			p.log.Warn("batch not handled before stop; it will be redelivered",
				"offset", msgs[0].Offset, "count", len(msgs), "err", err)
			return false
		}
		if p.recommit != nil {
			p.recommit()
		}
		d := p.cfg.backoff(attempt)
		p.log.Warn("handle batch failed; retrying",
			"offset", msgs[0].Offset, "count", len(msgs), "attempt", attempt+1, "retry_in", d, "err", err)
		if !sleep(stop, d) {
			return false
		}
	}
}

// batch is the Batch of msgs (and notes) as handed to the Handler.
func (p *partition) batch(msgs []kafka.Message, notes []any) Batch {
	return Batch{Topic: p.topic, TopicID: p.topicID, Partition: p.id, Committed: max(p.committed, 0), Assignment: p.assignment, Messages: msgs, Notes: notes}
}

// retryCommit is a Group's recommit: it commits again, while a batch
// fails, what the Group handled before it, if that commit failed (Delayed's
// is delayedRun.commit, which sends its commit point again): a failed commit is otherwise covered
// only by the next one, and a Handler may fail because its commits are
// behind (the limiter refuses new decisions once its replay record of the
// decisions since the last commit is full, limit.ErrReplayFull), which
// nothing else would end.
func (p *partition) retryCommit() {
	if p.acked <= 0 || p.acked <= p.committed {
		return
	}
	p.finishCommit(p.inflight)
	p.inflight = nil
	if p.acked > p.committed {
		p.inflight = p.startCommit(offsetCommit{next: p.acked})
	}
}

// commitNext commits c if it differs from the last commit, and waits for the
// result.
func (p *partition) commitNext(c offsetCommit) {
	p.finishCommit(p.startCommit(c))
}

// pendingCommit is a commit in flight.
type pendingCommit struct {
	c   offsetCommit
	err chan error
}

// startCommit starts committing c in the background if it advances the
// partition or says more about it (nil otherwise). The previous commit must
// be finished first. The outcome is logged, and the lag reported, as soon as
// the commit returns.
func (p *partition) startCommit(c offsetCommit) *pendingCommit {
	if c.next < p.committed || (c.next == p.committed && c.meta == p.committedMeta) {
		return nil
	}
	pc := &pendingCommit{c: c, err: make(chan error, 1)}
	hwm := p.hwm
	go func() {
		err := p.commit(c)
		p.committedOrNot(c.next, hwm, err)
		pc.err <- err
	}()
	return pc
}

// committedOrNot logs the outcome of a commit, reports the lag and calls
// OnCommitted. A failed commit is not retried: the next commit covers it,
// or the messages are redelivered (at least once). Safe to call from any
// goroutine.
func (p *partition) committedOrNot(next, hwm int64, err error) {
	switch {
	case errors.Is(err, kafka.IllegalGeneration), errors.Is(err, kafka.UnknownMemberId),
		errors.Is(err, kafka.RebalanceInProgress), errors.Is(err, kafka.FencedInstanceID):
		// The group moved on without this member: the partition's next
		// owner starts from the last commit that was accepted.
		p.log.Info("generation replaced; commit refused", "offset", next, "err", err)
	case err != nil:
		p.log.Warn("commit failed", "offset", next, "err", err)
	default:
		p.log.Debug("committed", "offset", next)
		if p.cfg.OnLag != nil && hwm >= 0 {
			p.cfg.OnLag(p.topic, p.id, max(hwm-next, 0))
		}
		if p.cfg.OnCommitted != nil {
			p.cfg.OnCommitted(p.topic, p.id, next)
		}
	}
}

// finishCommit waits for pc (nil: nothing to wait for).
func (p *partition) finishCommit(pc *pendingCommit) {
	if pc == nil {
		return
	}
	if err := <-pc.err; err == nil {
		p.committed, p.committedMeta = pc.c.next, pc.c.meta
	}
}

// fetchFailed logs a fetch error and waits before the next attempt; it
// reports false if stop ended the wait.
func (p *partition) fetchFailed(stop context.Context, attempt int, err error) bool {
	if p.staleRoutes != nil && staleRoute(err) {
		p.staleRoutes()
	}
	d := p.cfg.retryWait(attempt, err)
	p.log.Warn("fetch failed; retrying", "attempt", attempt+1, "retry_in", d, "err", err)
	return sleep(stop, d)
}
