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
	id      int
	fetcher fetcher
	commit  func(next int64) error
	handler Handler
	cfg     *Config
	log     *slog.Logger

	committed int64           // last offset committed by this loop, -1 for none
	hwm       int64           // high watermark as of the last fetched message, -1 for none
	buf       []kafka.Message // the batch slice, reused by fetchBatch
}

// handle calls the Handler with msgs until it returns nil (true), or until
// stop is done (false): then nothing of msgs may be committed. A failing
// batch is retried as it is, after a capped exponential backoff.
func (p *partition) handle(stop, hctx context.Context, msgs []kafka.Message) bool {
	for attempt := 0; ; attempt++ {
		err := p.handler.Handle(hctx, msgs)
		if err == nil {
			return true
		}
		if stop.Err() != nil {
			p.log.Warn("batch not handled before stop; it will be redelivered",
				"offset", msgs[0].Offset, "count", len(msgs), "err", err)
			return false
		}
		d := backoff(attempt, p.cfg.BackoffMin, p.cfg.BackoffMax)
		p.log.Warn("handle batch failed; retrying",
			"offset", msgs[0].Offset, "count", len(msgs), "attempt", attempt+1, "retry_in", d, "err", err)
		if !sleep(stop, d) {
			return false
		}
	}
}

// commitNext commits next (the offset of the next message to consume) if it
// advances the partition, and waits for the result.
func (p *partition) commitNext(next int64) {
	p.finishCommit(p.startCommit(next))
}

// pendingCommit is a commit in flight.
type pendingCommit struct {
	next int64
	err  chan error
}

// startCommit starts committing next in the background if it advances the
// partition (nil otherwise). The previous commit must be finished first. The
// outcome is logged, and the lag reported, as soon as the commit returns.
func (p *partition) startCommit(next int64) *pendingCommit {
	if next <= p.committed {
		return nil
	}
	pc := &pendingCommit{next: next, err: make(chan error, 1)}
	hwm := p.hwm
	go func() {
		err := p.commit(next)
		p.committedOrNot(next, hwm, err)
		pc.err <- err
	}()
	return pc
}

// committedOrNot logs the outcome of a commit and reports the lag. A failed
// commit is not retried: the next commit covers it, or the messages are
// redelivered (at least once). Safe to call from any goroutine.
func (p *partition) committedOrNot(next, hwm int64, err error) {
	switch {
	case errors.Is(err, kafka.ErrGenerationEnded):
		p.log.Info("generation ended; not committing", "offset", next)
	case err != nil:
		p.log.Warn("commit failed", "offset", next, "err", err)
	default:
		p.log.Debug("committed", "offset", next)
		if p.cfg.OnLag != nil && hwm >= 0 {
			p.cfg.OnLag(p.topic, p.id, max(hwm-next, 0))
		}
	}
}

// finishCommit waits for pc (nil: nothing to wait for).
func (p *partition) finishCommit(pc *pendingCommit) {
	if pc == nil {
		return
	}
	if err := <-pc.err; err == nil {
		p.committed = pc.next
	}
}

// fetchFailed logs a fetch error and waits before the next attempt; it
// reports false if stop ended the wait.
func (p *partition) fetchFailed(stop context.Context, attempt int, err error) bool {
	d := backoff(attempt, p.cfg.BackoffMin, p.cfg.BackoffMax)
	p.log.Warn("fetch failed; retrying", "attempt", attempt+1, "retry_in", d, "err", err)
	return sleep(stop, d)
}
