package route

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
)

// Outcome says where the Router sends one event. It is a value type.
type Outcome uint8

// The outcomes of routing.
const (
	// Forward sends the event downstream with its headers as they are.
	Forward Outcome = iota + 1
	// Defer sends the event to the retry tier of Deferral.Due with the
	// deferral's gk- headers (replacing any it had).
	Defer
	// Requeue sends the event to the retry tier of Deferral.Due with its
	// headers unchanged (only Deferral.Due is read), but for gk-sig, which
	// is made again with the current key. The caller must have verified the
	// event's gk-sig: Requeue signs what it is given.
	Requeue
	// DeadLetter sends the event to the dead-letter topic with gk-reason set to Reason.
	DeadLetter
)

// String returns the outcome's lower-case name.
func (o Outcome) String() string {
	switch o {
	case Forward:
		return "forward"
	case Defer:
		return "defer"
	case Requeue:
		return "requeue"
	case DeadLetter:
		return "dead_letter"
	}
	return "unknown"
}

// Item is one event to route. It is a value type.
type Item struct {
	// Msg is the event as consumed. Its key, value, headers and timestamp are
	// kept; its topic, partition and offset are not written.
	Msg     kafka.Message
	Outcome Outcome
	// Deferral is read for Defer and (its Due only) Requeue.
	Deferral Deferral
	// Reason is read for DeadLetter.
	Reason string
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Router builds the output messages of a batch and writes them.
//
// A Router is safe for concurrent use once configured; do not change its
// fields while Route may run.
type Router struct {
	Writer Writer
	Topics Topics
	// Clock gives the time used to pick retry tiers; nil means time.Now.
	Clock func() time.Time
	// Backoff paces the retries of a failed write.
	Backoff consume.Backoff
	// Logger receives write failures; nil means slog.Default().
	Logger *slog.Logger
	// Metrics, if set, counts written events per topic.
	Metrics *Metrics
	// MaxMessageBytes, if positive, is the largest record the Router writes
	// (GATEKEEPER_MAX_MESSAGE_BYTES; at most the output topics'
	// max.message.bytes). An event that would be larger where it is going,
	// its gk- headers included, goes to the dead-letter topic instead, without
	// its value (and then its key and other headers) if that is what it takes.
	MaxMessageBytes int
	// TopicMaxBytes, if set, gives the largest record of some output topics
	// instead of MaxMessageBytes (the retry tiers' max.message.bytes, read
	// at start-up). An event too large where it goes loses Gatekeeper's
	// optional headers first (downstream and dead-letter topics); only an
	// event too large by itself, or a deferral too large for its retry tier,
	// goes to the dead-letter topic, with its value if that topic can take it.
	TopicMaxBytes map[string]int

	failing atomic.Int64 // batches whose write keeps failing
	// Signer, if set, signs every event written to a retry tier (gk-sig),
	// and the Retrier (Handle and ReleaseAt) verifies the events read back with it.
	Signer *Signer
}

// sign returns m signed by r.Signer, or m itself without a Signer.
func (r *Router) sign(m kafka.Message) kafka.Message {
	if r.Signer == nil {
		return m
	}
	return r.Signer.Sign(m)
}

// writeFailingAfter is the number of failed attempts after which a batch's
// write counts as failing (WritesFailing, gatekeeper_writes_failing).
const writeFailingAfter = 3

// WritesFailing returns the number of batches whose write has failed
// writeFailingAfter times or more in a row and is still being retried: their
// partitions do not progress. Readiness reports it.
func (r *Router) WritesFailing() int64 { return r.failing.Load() }

// Build returns the messages Route would write for items, in item order.
// It returns an error if an item has no valid outcome.
func (r *Router) Build(items []Item) ([]kafka.Message, error) {
	out := make([]kafka.Message, len(items))
	if err := r.build(items, out); err != nil {
		return nil, err
	}
	return out, nil
}

// msgPool recycles Route's output slices.
var msgPool slicePool[kafka.Message]

// build fills out (len(items) long) as Build returns it.
func (r *Router) build(items []Item, out []kafka.Message) error {
	now := r.now()
	retryTiers := r.Topics.Tiers() // once per batch, not per deferred event
	for i, it := range items {
		m := kafka.Message{
			Key:     it.Msg.Key,
			Value:   it.Msg.Value,
			Headers: it.Msg.Headers,
			Time:    it.Msg.Time,
		}
		switch it.Outcome {
		case Forward:
			m = withoutSig(m) // gk-sig stays in the retry tiers
			m.Topic = r.Topics.Downstream
		case Defer:
			m = WithDeferral(m, it.Deferral)
			m.Topic = pickTier(retryTiers, it.Deferral.Due.Sub(now)).Topic
			m = r.sign(m) // bound to the tier
		case Requeue:
			m.Topic = pickTier(retryTiers, it.Deferral.Due.Sub(now)).Topic
			m = r.sign(m)
		case DeadLetter:
			m = WithReason(withoutSig(m), it.Reason)
			m.Topic = r.Topics.DLQ
		default:
			return fmt.Errorf("item %d (topic %s partition %d offset %d): outcome %d is not valid",
				i, it.Msg.Topic, it.Msg.Partition, it.Msg.Offset, it.Outcome)
		}
		if !r.fits(m) {
			t, ok := r.trimmed(m)
			if ok && (it.Outcome == Forward || it.Outcome == DeadLetter) {
				m = t // without the gk- headers it can do without
			} else {
				m = r.oversized(it.Msg, m, fmt.Sprintf("event too large for %s: %d bytes with its headers, over its limit of %d", m.Topic, RecordSize(m), r.limitFor(m.Topic)))
			}
		}
		out[i] = m
	}
	return nil
}

// RecordSize is an upper bound of the bytes m takes in a Kafka record batch
// of its own (the unit the brokers' max.message.bytes limits): the batch
// header, the record's fields with their length prefixes, key, value and
// headers.
func RecordSize(m kafka.Message) int {
	const batchOverhead, recordOverhead, perField = 61, 21, 5
	n := batchOverhead + recordOverhead + len(m.Key) + len(m.Value) + 2*perField
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value) + 2*perField
	}
	return n
}

// oversized returns the dead-letter version of m (built from src) that is
// too large to be written where it was going: gk-reason says why. It keeps
// the value whenever the dead-letter topic can take it: the gk- headers but
// gk-reason and the origin go first, then the value, then the key and the
// event's own headers, and at last everything but gk-reason and the origin.
// It is counted and logged.
func (r *Router) oversized(src, m kafka.Message, reason string) kafka.Message {
	r.Metrics.oversized(m.Topic)
	if prev, ok := lastHeader(m.Headers, HeaderReason); ok && m.Topic == r.Topics.DLQ {
		reason = prev + "; " + reason
	}
	dl := WithReason(m, reason)
	dl.Topic = r.Topics.DLQ
	kept := "everything"
	if t, ok := r.trimmed(dl); ok {
		if len(t.Headers) < len(dl.Headers) {
			kept = "value, reason and origin"
		}
		dl = t
	} else {
		dl.Value, kept = nil, "no value"
		if t, ok := r.trimmed(dl); ok {
			dl = t
		} else {
			dl.Key, kept = nil, "gk- headers only"
			dl = withHeaders(dl, func(k string) bool { return !isGK(k) })
			if !r.fits(dl) {
				dl, kept = r.minimalDeadLetter(dl, reason), "reason and origin only"
			}
		}
	}
	r.logger().Warn("event too large, dead-lettered", "topic", src.Topic, "partition", src.Partition, "offset", src.Offset,
		"to", m.Topic, "size", RecordSize(m), "limit", r.limitFor(m.Topic), "kept", kept)
	return dl
}

// Route writes the output messages of items in one WriteMessages call. If
// the write fails it is retried, after a backoff, until it succeeds or ctx
// is done: when the writer reports which messages failed (kafka.WriteErrors)
// only those are written again, otherwise all of them. Route returns nil
// only when every message has been acknowledged; an event may be written
// more than once, never lost.
func (r *Router) Route(ctx context.Context, items []Item) error {
	msgs := msgPool.get(len(items))
	defer msgPool.put(msgs) // the writer keeps no reference once it returns
	if err := r.build(items, msgs); err != nil {
		return fmt.Errorf("route: %w", err)
	}
	if err := r.write(ctx, msgs); err != nil {
		return fmt.Errorf("route: %w", err)
	}
	r.Metrics.eventsOut(msgs)
	return nil
}

func (r *Router) write(ctx context.Context, msgs []kafka.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	err := r.Writer.WriteMessages(ctx, msgs...)
	if err == nil {
		return nil // the common case, without allocations
	}
	pending := make([]pendingWrite, len(msgs))
	for i, m := range msgs {
		pending[i].msg = m
	}
	failing := false
	defer func() {
		if failing {
			r.failing.Add(-1)
			r.Metrics.writesFailing(-1)
		}
	}()
	for attempt := 0; ; attempt++ {
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("write %d messages: %w (last error: %v)", len(pending), cerr, err)
		}
		if errors.Is(err, consume.ErrFenced) {
			// This member may no longer own the partition: retrying
			// could only write after its next owner.
			return fmt.Errorf("write %d messages: %w", len(pending), err)
		}
		var sizeOnly bool
		pending, sizeOnly = r.refusals(pending, err, attempt == 0)
		if len(pending) == 0 {
			return nil
		}
		if attempt+1 == writeFailingAfter {
			failing = true
			r.failing.Add(1)
			r.Metrics.writesFailing(1)
		}
		if !sizeOnly { // a record refused for its size is split off and written again at once
			wait := r.Backoff.Delay(attempt)
			level := slog.LevelWarn
			if isTooLarge(err) {
				// A record the broker refuses even as a minimal dead letter:
				// retrying will not help until an operator raises the size
				// limit, but dropping it is not an option either.
				level = slog.LevelError
			}
			r.logger().Log(ctx, level, "kafka write failed, retrying",
				"topic", topicListOf(pending), "messages", len(pending),
				"attempt", attempt+1, "backoff", wait, "err", err)
			if serr := sleep(ctx, wait); serr != nil {
				return fmt.Errorf("write %d messages: %w (last error: %v)", len(pending), serr, err)
			}
		}
		err = r.writeOnce(ctx, pending)
		if err == nil {
			return nil
		}
	}
}

// pendingWrite is a record that write retries: its last error, how often
// the broker refused it as too large, and whether it goes in a request of
// its own.
type pendingWrite struct {
	msg          kafka.Message
	err          error
	sizeRefusals int
	alone        bool
}

// writeOnce writes pending: the records to write alone in a request each,
// the others in one. It sets each record's err and returns the first error.
func (r *Router) writeOnce(ctx context.Context, pending []pendingWrite) error {
	var first error
	note := func(idx []int, err error) {
		if err != nil && first == nil {
			first = err
		}
		var werrs kafka.WriteErrors
		aligned := err != nil && errors.As(err, &werrs) && len(werrs) == len(idx)
		for k, i := range idx {
			pending[i].err = err
			if aligned {
				pending[i].err = werrs[k]
			}
		}
	}
	var together []int
	for i := range pending {
		if pending[i].alone {
			note([]int{i}, r.Writer.WriteMessages(ctx, pending[i].msg))
		} else {
			together = append(together, i)
		}
	}
	if len(together) > 0 {
		msgs := make([]kafka.Message, len(together))
		for k, i := range together {
			msgs[k] = pending[i].msg
		}
		note(together, r.Writer.WriteMessages(ctx, msgs...))
	}
	return first
}

// refusals returns the records of pending to write again after a write
// failed; on the first failure (first), err is for all of them, or its
// kafka.WriteErrors entry, else each record's own err. A record refused as
// too large is split off or dead-lettered (refusedTooLarge). sizeOnly is
// true when every record left was refused for its size and may go again at
// once.
func (r *Router) refusals(pending []pendingWrite, err error, first bool) (left []pendingWrite, sizeOnly bool) {
	if first {
		var werrs kafka.WriteErrors
		aligned := errors.As(err, &werrs) && len(werrs) == len(pending)
		for i := range pending {
			pending[i].err = err
			if aligned {
				pending[i].err = werrs[i]
			}
		}
	}
	sizeOnly = true
	for _, p := range pending {
		if p.err == nil {
			continue
		}
		if isTooLarge(p.err) {
			p.sizeRefusals++
			ref := r.refusedTooLarge(p.msg, p.sizeRefusals)
			p.msg, p.alone = ref.msg, ref.alone
		} else {
			sizeOnly = false
		}
		left = append(left, p)
	}
	return left, sizeOnly
}

func topicListOf(pending []pendingWrite) string {
	msgs := make([]kafka.Message, len(pending))
	for i, p := range pending {
		msgs[i] = p.msg
	}
	return topicList(msgs)
}

// topicList returns the distinct topics of msgs, comma-separated, for logs.
func topicList(msgs []kafka.Message) string {
	var topics []string
	for _, m := range msgs {
		if !slices.Contains(topics, m.Topic) {
			topics = append(topics, m.Topic)
		}
	}
	return strings.Join(topics, ",")
}

func (r *Router) now() time.Time {
	if r.Clock != nil {
		return r.Clock()
	}
	return time.Now()
}

func (r *Router) logger() *slog.Logger {
	if r.Logger != nil {
		return r.Logger
	}
	return slog.Default()
}
