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
// The result is index-aligned with tenants, one tenant's events decided in
// slice order. A non-nil error means Redis trouble and nothing was decided:
// the batch is tried again. A limit.Fail decision (a broken counter key of
// the event's tenant, which trying again does not mend) sends the event to
// the dead-letter topic with the decision's reason.
// Implementations must be safe for concurrent use.
type Admitter interface {
	Admit(ctx context.Context, tenants []string) ([]limit.Decision, error)
}

// itemPool recycles the Gate's per-batch items.
var itemPool slicePool[Item]

// Values of OnRedisError (GATEKEEPER_ON_REDIS_ERROR).
const (
	// RedisPause retries Admit with backoff, readiness false, until Redis
	// answers or the context ends; nothing is forwarded unchecked.
	RedisPause = "pause"
	// RedisForward forwards the batch's valid events downstream unchecked and
	// counts them in gatekeeper_redis_unchecked_total.
	RedisForward = "forward"
)

// defaultReason is the dead-letter reason of a rejection the limiter gave no reason for.
const defaultReason = "over limit"

// Gate handles batches from the source topics: it derives tenants, admits
// the valid events in one Admitter call and routes every event. It
// implements consume.Handler.
//
// A Gate is safe for concurrent use once configured (partitions may call
// Handle in parallel); do not change its fields while Handle may run.
type Gate struct {
	Extractor *Extractor
	Admitter  Admitter
	// Router writes the outcomes; its Topics name the destinations.
	Router *Router
	// OnRedisError is RedisPause (also when empty) or RedisForward.
	OnRedisError string
	// Shadow sends every event downstream, invalid ones included, while the
	// decisions are still made and counted.
	Shadow bool
	// Clock gives the time of gk-first-seen; nil means time.Now. Use the
	// Router's clock.
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

// Validate reports a missing part or a bad OnRedisError.
func (g *Gate) Validate() error {
	switch {
	case g.Extractor == nil:
		return errors.New("gate: no Extractor")
	case g.Admitter == nil:
		return errors.New("gate: no Admitter")
	case g.Router == nil || g.Router.Writer == nil:
		return errors.New("gate: no Router with a Writer")
	}
	return validPolicy(g.OnRedisError)
}

// Handle routes one batch of one source partition (offsets ascending) and
// returns nil only when every event has been written and acknowledged: to
// the downstream topic if admitted, to a retry tier if deferred, to the
// dead-letter topic if rejected or invalid. On error nothing may be taken
// as done, and the caller retries the batch.
func (g *Gate) Handle(ctx context.Context, msgs []kafka.Message) error {
	if err := g.Validate(); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	log := g.logger()
	// Debug lines per event cost their arguments even when discarded.
	debug := log.Enabled(ctx, slog.LevelDebug)
	now := g.now()

	items := itemPool.get(len(msgs))
	defer itemPool.put(items)
	counts := map[string]int{}
	tenants, valid := g.extract(msgs, items, counts, log)

	ds, unchecked, err := g.admission().admit(ctx, tenants, msgs[0])
	if err != nil {
		return fmt.Errorf("gate: %w", err)
	}

	for j, i := range valid {
		m, tenant := msgs[i], tenants[j]
		if unchecked {
			items[i] = Item{Msg: withOrigin(m, ""), Outcome: Forward}
			continue
		}
		d := ds[j]
		if d.Kind != limit.Admit && d.Kind != limit.Defer && d.Kind != limit.Reject && d.Kind != limit.Fail {
			return fmt.Errorf("gate: decision %d for tenant %q is not valid", d.Kind, tenant)
		}
		counts[d.Kind.String()]++
		items[i] = g.decided(m, tenant, d, now, log, debug)
	}

	if err := g.Router.Route(ctx, items); err != nil {
		return fmt.Errorf("gate: %w", err)
	}
	if !g.Shadow {
		warnFailed(log, msgs[0], ds, counts)
	}

	g.Metrics.batchIn(msgs)
	for label, n := range counts {
		g.Metrics.decision(label, n)
	}
	if unchecked {
		g.Metrics.unchecked(len(valid))
	}
	return nil
}

// extract works out the tenant of each of msgs. It returns the tenants found
// and the indexes in msgs of their events; an event without a tenant gets its
// item (dead-lettered, or forwarded in shadow mode) and is counted invalid.
func (g *Gate) extract(msgs []kafka.Message, items []Item, counts map[string]int, log *slog.Logger) (tenants []string, valid []int) {
	tenants = make([]string, 0, len(msgs))
	valid = make([]int, 0, len(msgs)) // indexes of msgs with a tenant
	for i, m := range msgs {
		tenant, err := g.Extractor.Tenant(m)
		if err != nil {
			counts[DecisionInvalid]++
			log.Debug("invalid event", "topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "reason", err.Error())
			if g.Shadow {
				items[i] = Item{Msg: withOrigin(m, ""), Outcome: Forward}
			} else {
				items[i] = Item{Msg: withOrigin(m, ""), Outcome: DeadLetter, Reason: err.Error()}
			}
			continue
		}
		tenants = append(tenants, tenant)
		valid = append(valid, i)
	}
	return tenants, valid
}

// decided returns the item of event m of tenant after decision d (Admit,
// Defer, Reject or Fail): forwarded, deferred or dead-lettered, and
// forwarded whatever d in shadow mode.
func (g *Gate) decided(m kafka.Message, tenant string, d limit.Decision, now time.Time, log *slog.Logger, debug bool) Item {
	if g.Shadow {
		return Item{Msg: withOrigin(m, tenant), Outcome: Forward}
	}
	switch d.Kind {
	case limit.Defer:
		if debug {
			log.Debug("event deferred", "tenant", tenant, "topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "due", d.Due)
		}
		return Item{Msg: m, Outcome: Defer, Deferral: Deferral{
			Attempt:         1,
			Due:             d.Due,
			Reserved:        d.Until,
			FirstSeen:       now,
			Tenant:          tenant,
			OriginTopic:     m.Topic,
			OriginPartition: m.Partition,
			OriginOffset:    m.Offset,
		}}
	case limit.Reject, limit.Fail:
		if debug {
			log.Debug("event dead-lettered", "tenant", tenant, "topic", m.Topic, "partition", m.Partition, "offset", m.Offset,
				"decision", d.Kind.String(), "reason", rejectReason(d))
		}
		return Item{Msg: withOrigin(m, tenant), Outcome: DeadLetter, Reason: rejectReason(d)}
	default: // limit.Admit
		return Item{Msg: withOrigin(m, tenant), Outcome: Forward}
	}
}

func (g *Gate) admission() admission {
	return admission{admitter: g.Admitter, policy: g.OnRedisError, backoff: g.Backoff, setReady: g.SetReady, logger: g.logger()}
}

func (g *Gate) now() time.Time {
	if g.Clock != nil {
		return g.Clock()
	}
	return time.Now()
}

func (g *Gate) logger() *slog.Logger {
	if g.Logger != nil {
		return g.Logger
	}
	return slog.Default()
}

func rejectReason(d limit.Decision) string {
	switch {
	case d.Reason != "":
		return d.Reason
	case d.Kind == limit.Fail:
		return "a counter key is broken"
	}
	return defaultReason
}

// warnFailed logs, once per batch, that events were dead-lettered for a
// broken counter key (an operator has to repair or delete it), with the
// first one's reason. counts holds the batch's decision counts.
func warnFailed(log *slog.Logger, first kafka.Message, ds []limit.Decision, counts map[string]int) {
	n := counts[limit.Fail.String()]
	if n == 0 {
		return
	}
	for _, d := range ds {
		if d.Kind == limit.Fail {
			log.Warn("events dead-lettered: a counter key is broken", "topic", first.Topic, "partition", first.Partition,
				"offset", first.Offset, "events", n, "reason", rejectReason(d))
			return
		}
	}
}

func validPolicy(p string) error {
	switch p {
	case "", RedisPause, RedisForward:
		return nil
	}
	return fmt.Errorf("on redis error %q: want %s or %s", p, RedisPause, RedisForward)
}

// admission runs one Admit call for a batch under the Redis error policy.
// It is shared by Gate and Retrier.
type admission struct {
	admitter Admitter
	policy   string
	backoff  consume.Backoff
	setReady func(bool)
	logger   *slog.Logger
}

// admit returns the decisions for tenants. Under RedisForward a failing Admit
// yields unchecked=true and no decisions. Under RedisPause it retries with
// backoff until Admit works or ctx ends, calling setReady(false) once it
// fails and setReady(true) once it works again. first locates the batch in logs.
func (a admission) admit(ctx context.Context, tenants []string, first kafka.Message) (ds []limit.Decision, unchecked bool, err error) {
	if len(tenants) == 0 {
		return nil, false, nil
	}
	failing := false
	for attempt := 0; ; attempt++ {
		ds, err := a.admitter.Admit(ctx, tenants)
		if err == nil {
			if len(ds) != len(tenants) {
				return nil, false, fmt.Errorf("admit: %d decisions for %d events", len(ds), len(tenants))
			}
			if failing {
				a.logger.Info("admit works again, resuming",
					"topic", first.Topic, "partition", first.Partition, "offset", first.Offset, "attempts", attempt+1)
				a.ready(true)
			}
			return ds, false, nil
		}
		if cerr := ctx.Err(); cerr != nil {
			return nil, false, fmt.Errorf("admit: %w (last error: %v)", cerr, err)
		}
		if a.policy == RedisForward {
			a.logger.Warn("admit failed, forwarding unchecked",
				"topic", first.Topic, "partition", first.Partition, "offset", first.Offset, "events", len(tenants), "err", err)
			return nil, true, nil
		}
		if !failing {
			failing = true
			a.ready(false)
		}
		wait := a.backoff.Delay(attempt)
		if attempt%10 == 0 {
			a.logger.Warn("admit failed, pausing",
				"topic", first.Topic, "partition", first.Partition, "offset", first.Offset,
				"attempt", attempt+1, "backoff", wait, "err", err)
		}
		if serr := sleep(ctx, wait); serr != nil {
			return nil, false, fmt.Errorf("admit: %w (last error: %v)", serr, err)
		}
	}
}

func (a admission) ready(ok bool) {
	if a.setReady != nil {
		a.setReady(ok)
	}
}
