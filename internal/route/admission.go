package route

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// Admitter decides a batch of events by tenant; *limit.Limiter implements it.
// The result is index-aligned with events, one tenant's events decided in
// slice order. An event's Cost says what it costs the rules that count
// bytes or units (event rules count 1 an event); an event over a rule's
// whole limit is rejected. src says which partition the events were
// consumed from (each event's Offset is its position there): an event
// decided again after a replay gets its first decision back, uncounted (see
// limit.Source); a zero src names no source. A non-nil error means Redis
// trouble and nothing was decided:
// the batch is tried again. A limit.Fail decision (a broken counter key of
// the event's tenant, which trying again does not mend) sends the event to
// the dead-letter topic with the decision's reason.
// Implementations must be safe for concurrent use, and must not keep
// events once AdmitFrom returned (the Gate reuses the slice).
type Admitter interface {
	AdmitFrom(ctx context.Context, src limit.Source, events []limit.Event) ([]limit.Decision, error)
}

// Values of OnRedisError (GATEKEEPER_ON_REDIS_ERROR).
const (
	// RedisPause retries Admit with backoff, readiness false, until Redis
	// answers or the context ends; nothing is forwarded unchecked.
	RedisPause = "pause"
	// RedisForward forwards the batch's valid events downstream unchecked and
	// counts them in gatekeeper_redis_unchecked_total.
	RedisForward = "forward"
)

// Admission is what Gate and Retrier share to admit a batch and route its
// events: the Admitter asked under the Redis error policy, the Router that
// writes the outcomes, and the clock, logger, metrics and readiness hook
// both use. Gate and Retrier embed it.
//
// An Admission is safe for concurrent use once configured; do not change its
// fields while a Handle that uses it may run.
type Admission struct {
	Admitter Admitter
	// Router writes the outcomes; its Topics name the retry tiers and the
	// destinations.
	Router *Router
	// CostFrom reads what each event costs (GATEKEEPER_COST_FROM): nil reads
	// its bytes only. An event whose cost cannot be read is invalid.
	CostFrom *CostFrom
	// OnRedisError is RedisPause (also when empty) or RedisForward.
	OnRedisError string
	// Clock: nil means time.Now. Use the Router's clock (for the Retrier,
	// also the one the caller releases messages by).
	Clock func() time.Time
	// Logger: nil means slog.Default().
	Logger *slog.Logger
	// Metrics, if set, counts events and decisions of successful batches.
	Metrics *Metrics
	// SetReady, if set, is called with false when Admit starts failing under
	// RedisPause and with true when it works again.
	SetReady func(ready bool)
	// Backoff paces the Admit retries under RedisPause.
	Backoff consume.Backoff
}

// Validate reports a missing Admitter or Router, or a bad OnRedisError.
func (a *Admission) Validate() error {
	switch {
	case a.Admitter == nil:
		return errors.New("no Admitter")
	case a.Router == nil || a.Router.Writer == nil:
		return errors.New("no Router with a Writer")
	}
	return validPolicy(a.OnRedisError)
}

func validPolicy(p string) error {
	switch p {
	case "", RedisPause, RedisForward:
		return nil
	}
	return fmt.Errorf("on redis error %q: want %s or %s", p, RedisPause, RedisForward)
}

// admit returns the decisions for events. Under RedisForward a failing Admit
// yields unchecked=true and no decisions. A full replay record
// (limit.ErrReplayFull) is an error under either policy. Under RedisPause it retries with
// backoff until Admit works or ctx ends, calling SetReady(false) once it
// fails and SetReady(true) once it works again. Every attempt names the
// same src, so an attempt whose call ran in Redis although it failed here
// (a timeout) is not counted again by the next. first locates the batch in
// logs.
func (a *Admission) admit(ctx context.Context, src limit.Source, events []limit.Event, first kafka.Message) (ds []limit.Decision, unchecked bool, err error) {
	return a.admitWith(ctx, src, events, first, a.Admitter.AdmitFrom)
}

// admitOnce is admit's first attempt alone: its error, whatever it is, is
// returned at once (Gate.Stage).
func (a *Admission) admitOnce(ctx context.Context, src limit.Source, events []limit.Event) ([]limit.Decision, error) {
	if len(events) == 0 {
		return nil, nil
	}
	ds, err := a.Admitter.AdmitFrom(ctx, src, events)
	if err != nil {
		return nil, fmt.Errorf("admit: %w", err)
	}
	return ds, decisionsFor(ds, events)
}

// decisionsFor reports a reply that does not decide each of events once.
func decisionsFor(ds []limit.Decision, events []limit.Event) error {
	if len(ds) != len(events) {
		return fmt.Errorf("admit: %d decisions for %d events", len(ds), len(events))
	}
	return nil
}

// admitWith is admit with call in place of the Admitter's AdmitFrom.
func (a *Admission) admitWith(ctx context.Context, src limit.Source, events []limit.Event, first kafka.Message,
	call func(context.Context, limit.Source, []limit.Event) ([]limit.Decision, error)) (ds []limit.Decision, unchecked bool, err error) {
	if len(events) == 0 {
		return nil, false, nil
	}
	log := a.logger()
	failing := false
	for attempt := 0; ; attempt++ {
		ds, err := call(ctx, src, events)
		if err == nil {
			if err := decisionsFor(ds, events); err != nil {
				return nil, false, err
			}
			if failing {
				log.Info("admit works again, resuming",
					"topic", first.Topic, "partition", first.Partition, "offset", first.Offset, "attempts", attempt+1)
				a.ready(true)
			}
			return ds, false, nil
		}
		if cerr := ctx.Err(); cerr != nil {
			return nil, false, fmt.Errorf("admit: %w (last error: %v)", cerr, err)
		}
		if errors.Is(err, limit.ErrReplayFull) {
			// Not Redis trouble: the partition's commits are behind. The
			// batch fails, under either policy, so that the consumer
			// retries it after a backoff and sends its failed commit again
			// meanwhile; forwarding it unchecked would pass the limits,
			// and retrying here would wait for a commit nothing sends.
			return nil, false, fmt.Errorf("admit: %w", err)
		}
		if a.OnRedisError == RedisForward {
			log.Warn("admit failed, forwarding unchecked",
				"topic", first.Topic, "partition", first.Partition, "offset", first.Offset, "events", len(events), "err", err)
			return nil, true, nil
		}
		if !failing {
			failing = true
			a.ready(false)
		}
		wait := a.Backoff.Delay(attempt)
		if attempt%10 == 0 {
			log.Warn("admit failed, pausing",
				"topic", first.Topic, "partition", first.Partition, "offset", first.Offset,
				"attempt", attempt+1, "backoff", wait, "err", err)
		}
		if serr := sleep(ctx, wait); serr != nil {
			return nil, false, fmt.Errorf("admit: %w (last error: %v)", serr, err)
		}
	}
}

// source returns where b's events were consumed from, for replay-safe
// counting: b's partition and, as the low bound, b's committed offset (each
// event's limit.Event.Offset is its position there), under b's assignment. A batch that names no
// topic (one not handed over by a consumer of package consume) names no
// source: nothing bounds what a record would have to remember.
func source(b consume.Batch) limit.Source {
	if b.Topic == "" {
		return limit.Source{}
	}
	return limit.Source{Topic: b.Topic, TopicID: b.TopicID, Partition: b.Partition, Low: b.Committed, Assignment: b.Assignment}
}

func (a *Admission) ready(ok bool) {
	if a.SetReady != nil {
		a.SetReady(ok)
	}
}

func (a *Admission) now() time.Time {
	if a.Clock != nil {
		return a.Clock()
	}
	return time.Now()
}

func (a *Admission) logger() *slog.Logger {
	if a.Logger != nil {
		return a.Logger
	}
	return slog.Default()
}
