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

// itemPool, eventPool and validPool recycle the Gate's per-batch slices.
var (
	itemPool  slicePool[Item]
	eventPool slicePool[limit.Event]
	validPool slicePool[int]
)

// defaultReason is the dead-letter reason of a rejection the limiter gave no reason for.
const defaultReason = "over limit"

// Gate handles batches from the source topics: it derives tenants, admits
// the valid events in one Admitter call and routes every event. It
// implements consume.Handler. Build it with NewGate, which checks its parts
// once: Handle does not check them again.
//
// A Gate is safe for concurrent use once built (partitions may call
// Handle in parallel); do not change its fields while Handle may run.
type Gate struct {
	// Admission holds the Admitter, the Router and what else the Gate
	// shares with the Retrier. Its Clock gives the time of gk-first-seen.
	Admission
	Extractor *Extractor
	// Shadow sends every event downstream, invalid ones included, while the
	// decisions are still made and counted.
	Shadow bool
}

var _ consume.Stager = (*Gate)(nil)

// NewGate returns a Gate with g's parts once Validate accepts them.
func NewGate(g Gate) (*Gate, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	return &g, nil
}

// Validate reports a missing part or a bad OnRedisError.
func (g *Gate) Validate() error {
	if g.Extractor == nil {
		return errors.New("gate: no Extractor")
	}
	if err := g.Admission.Validate(); err != nil {
		return fmt.Errorf("gate: %w", err)
	}
	return nil
}

// Handle routes one batch of one source partition (offsets ascending) and
// returns nil only when every event has been written and acknowledged: to
// the downstream topic if admitted, to a retry tier if deferred, to the
// dead-letter topic if rejected or invalid. On error nothing may be taken
// as done, and the caller retries the batch.
func (g *Gate) Handle(ctx context.Context, b consume.Batch) error {
	if len(b.Messages) == 0 {
		return nil
	}
	s, err := g.stage(ctx, b, false)
	if err != nil {
		return err
	}
	return s.Finish(ctx)
}

// Stage decides one batch, as Handle does, and returns what writes it: the
// Gate is a consume.Stager, so that a partition decides its next batch
// while this one is written. Unlike Handle it makes the limiter call once:
// when that fails (Redis trouble, a full replay record), it returns the
// error at once and the consumer handles the batch with Handle, which
// pauses or forwards as ON_REDIS_ERROR says.
func (g *Gate) Stage(ctx context.Context, b consume.Batch) (consume.Staged, error) {
	if len(b.Messages) == 0 {
		return &gateBatch{}, nil
	}
	return g.stage(ctx, b, true)
}

// gateBatch is a batch decided by the Gate and not yet written: its items,
// and what Finish reports once they are acknowledged.
type gateBatch struct {
	g         *Gate
	msgs      []kafka.Message
	items     []Item
	events    []limit.Event
	valid     []int
	ds        []limit.Decision
	orig      *origins
	counts    map[string]int
	unchecked bool
}

// stage extracts and decides b's events (once, without the Admission's
// pause, when once) and builds their items.
func (g *Gate) stage(ctx context.Context, b consume.Batch, once bool) (*gateBatch, error) {
	msgs := b.Messages
	log := g.logger()
	// Debug lines per event cost their arguments even when discarded.
	debug := log.Enabled(ctx, slog.LevelDebug)
	now := g.now()

	gb := &gateBatch{g: g, msgs: msgs, items: itemPool.get(len(msgs)), counts: map[string]int{}, orig: newOrigins(msgs)}
	gb.events, gb.valid = g.extract(msgs, gb.items, gb.orig, gb.counts, log)

	var err error
	if once {
		gb.ds, err = g.admitOnce(ctx, source(b), gb.events)
	} else {
		gb.ds, gb.unchecked, err = g.admit(ctx, source(b), gb.events, msgs[0])
	}
	if err != nil {
		gb.Drop()
		return nil, fmt.Errorf("gate: %w", err)
	}

	// Decisions are counted by kind here and named once per batch below.
	var kinds [limit.Fail + 1]int
	for j, i := range gb.valid {
		if gb.unchecked {
			gb.items[i] = Item{Msg: gb.orig.with(msgs[i], ""), Outcome: Forward}
			continue
		}
		d := &gb.ds[j]
		if d.Kind != limit.Admit && d.Kind != limit.Defer && d.Kind != limit.Reject && d.Kind != limit.Fail {
			err := fmt.Errorf("gate: decision %d for tenant %q is not valid", d.Kind, gb.events[j].Tenant)
			gb.Drop()
			return nil, err
		}
		kinds[d.Kind]++
		g.decided(&gb.items[i], &msgs[i], gb.events[j].Tenant, d, now, gb.orig, log, debug)
	}
	for k, n := range kinds {
		if n > 0 {
			gb.counts[limit.Kind(k).String()] += n
		}
	}
	return gb, nil
}

// Finish writes the batch's events and returns nil once every one is
// acknowledged; then its decisions are counted in the metrics. Either way
// the batch is released: on error the consumer hands it over again.
func (gb *gateBatch) Finish(ctx context.Context) error {
	if gb.g == nil {
		return nil
	}
	g := gb.g
	if err := g.Router.Route(ctx, gb.items); err != nil {
		gb.orig = nil // kept from the pool after a failed write, as ever
		gb.Drop()
		return fmt.Errorf("gate: %w", err)
	}
	defer gb.Drop()
	if !g.Shadow {
		warnFailed(g.logger(), gb.msgs[0], gb.ds, gb.counts)
	}
	g.Metrics.batchIn(gb.msgs)
	for label, n := range gb.counts {
		g.Metrics.decision(label, n)
	}
	if gb.unchecked {
		g.Metrics.unchecked(len(gb.valid))
	}
	return nil
}

// Drop releases the batch's pooled slices; Finish does it too.
func (gb *gateBatch) Drop() {
	if gb.g == nil {
		return
	}
	itemPool.put(gb.items)
	eventPool.put(gb.events)
	validPool.put(gb.valid)
	if gb.orig != nil {
		gb.orig.release() // every message acknowledged, or none written: the writer holds none
	}
	*gb = gateBatch{}
}

// extract works out the tenant and the cost of each of msgs. It returns the
// events found (tenant, cost, offset) and their indexes in msgs; an event
// without a tenant or a cost gets its item (dead-lettered, or forwarded in
// shadow mode) and is counted invalid.
func (g *Gate) extract(msgs []kafka.Message, items []Item, orig *origins, counts map[string]int, log *slog.Logger) (events []limit.Event, valid []int) {
	events = eventPool.get(len(msgs))[:0]
	valid = validPool.get(len(msgs))[:0] // indexes of msgs with a tenant
	seen := batchTenantsPool.Get().(batchTenants)
	defer seen.release()
	for i, m := range msgs {
		tenant, err := g.Extractor.tenantIn(m, seen)
		var cost limit.Cost
		if err == nil {
			cost, err = g.CostFrom.Cost(m)
		}
		if err != nil {
			counts[DecisionInvalid]++
			log.Debug("invalid event", "topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "reason", err.Error())
			if g.Shadow {
				items[i] = Item{Msg: orig.with(m, ""), Outcome: Forward}
			} else {
				items[i] = Item{Msg: orig.with(m, ""), Outcome: DeadLetter, Reason: err.Error()}
			}
			continue
		}
		events = append(events, limit.Event{Tenant: tenant, Cost: cost, Offset: m.Offset})
		valid = append(valid, i)
	}
	return events, valid
}

// decided sets it, the item of event m of tenant, after decision d (Admit,
// Defer, Reject or Fail): forwarded, deferred or dead-lettered, and
// forwarded whatever d in shadow mode. It works in place: an Item is about
// 300 bytes, and copies of it and of the message were a tenth of the Gate's
// work per event.
func (g *Gate) decided(it *Item, m *kafka.Message, tenant string, d *limit.Decision, now time.Time, orig *origins, log *slog.Logger, debug bool) {
	if g.Shadow || d.Kind == limit.Admit {
		*it = Item{Msg: *m, Outcome: Forward}
		orig.set(&it.Msg, tenant)
		return
	}
	*it = g.notAdmitted(*m, tenant, *d, now, orig, log, debug)
}

// notAdmitted returns the item of event m of tenant after decision d
// (Defer, Reject or Fail): deferred or dead-lettered.
func (g *Gate) notAdmitted(m kafka.Message, tenant string, d limit.Decision, now time.Time, orig *origins, log *slog.Logger, debug bool) Item {
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
			Windows:         d.Windows,
		}}
	case limit.Reject, limit.Fail:
		if debug {
			log.Debug("event dead-lettered", "tenant", tenant, "topic", m.Topic, "partition", m.Partition, "offset", m.Offset,
				"decision", d.Kind.String(), "reason", rejectReason(d))
		}
		return Item{Msg: orig.with(m, tenant), Outcome: DeadLetter, Reason: rejectReason(d)}
	default: // limit.Admit, handled by decided
		return Item{Msg: orig.with(m, tenant), Outcome: Forward}
	}
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
