package route

import (
	"errors"
	"fmt"

	"github.com/segmentio/kafka-go"
)

// BatchOverhead is the size of a Kafka record batch's header (format v2):
// what a produce request's batch takes beyond its records. A writer's batch
// must leave it free below the topic's max.message.bytes.
const BatchOverhead = 61

// WriterBatchBytes returns the writer batch size (kafka-go's BatchBytes,
// which counts records only) for topics that take records of at most
// maxMessageBytes: a full batch, with its header, stays within the topics'
// limit, and every record RecordSize allows fits in a batch alone.
func WriterBatchBytes(maxMessageBytes int) int64 {
	return int64(maxMessageBytes - BatchOverhead)
}

// sizeRefusalsAlone is how many times the broker may refuse a record as too
// large, while it fits by RecordSize and is written alone, before it is taken
// not to fit (the topic's max.message.bytes was lowered under us).
const sizeRefusalsAlone = 3

// limitFor returns the largest record r writes to topic: the topic's own
// max.message.bytes when TopicMaxBytes has it, else MaxMessageBytes (0: no
// limit).
func (r *Router) limitFor(topic string) int {
	if n, ok := r.TopicMaxBytes[topic]; ok && n > 0 {
		return n
	}
	return r.MaxMessageBytes
}

// fits reports whether m may be written to its topic.
func (r *Router) fits(m kafka.Message) bool {
	l := r.limitFor(m.Topic)
	return l <= 0 || RecordSize(m) <= l
}

// isOrigin reports whether name is one of the origin headers, which a
// downstream consumer drops copies by.
func isOrigin(name string) bool {
	return name == HeaderOriginTopic || name == HeaderOriginPartition || name == HeaderOriginOffset
}

// trimmed returns m without the gk- headers it can do without where it is
// going, when m is too large for its topic with them: first every gk- header
// but the origin (and gk-reason in the dead-letter topic), then the origin.
// The event's key, value and own headers are never touched here. ok is false
// when m is still too large without any of them: the event is too large by
// itself.
func (r *Router) trimmed(m kafka.Message) (out kafka.Message, ok bool) {
	if r.fits(m) {
		return m, true
	}
	keep := func(k string) bool { return k == HeaderReason && m.Topic == r.Topics.DLQ }
	m = withHeaders(m, func(k string) bool { return isGK(k) && !isOrigin(k) && !keep(k) })
	if r.fits(m) {
		return m, true
	}
	m = withHeaders(m, func(k string) bool { return isGK(k) && !keep(k) })
	return m, r.fits(m)
}

// minimalDeadLetter returns the smallest dead-letter record of m: its
// gk-reason and origin, nothing else, and the origin dropped too if even
// that is too large (a forged, huge origin). It always fits a dead-letter
// topic of 1 KiB, the least MAX_MESSAGE_BYTES allows.
func (r *Router) minimalDeadLetter(m kafka.Message, reason string) kafka.Message {
	const maxReason = 512
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	dl := kafka.Message{Topic: r.Topics.DLQ, Time: m.Time}
	for _, h := range m.Headers {
		if isOrigin(h.Key) {
			dl.Headers = append(dl.Headers, h)
		}
	}
	dl = WithReason(dl, reason)
	if !r.fits(dl) {
		dl.Headers = []kafka.Header{{Key: HeaderReason, Value: []byte(reason)}}
	}
	return dl
}

// sizeRefusal is what write does with a record the broker refused as too
// large.
type sizeRefusal struct {
	msg   kafka.Message
	alone bool // write it again in a request of its own
}

// refusedTooLarge returns what to write after the broker refused m as too
// large, for the n-th time. A record that fits its topic by RecordSize was
// refused for the batch it was in (or the topic's limit was lowered): it is
// written again alone, up to sizeRefusalsAlone times. Otherwise the event
// goes to the dead-letter topic, with its value if the dead-letter topic
// can take it, and as a minimal record if it was already a dead letter.
func (r *Router) refusedTooLarge(m kafka.Message, n int) sizeRefusal {
	if r.fits(m) && n <= sizeRefusalsAlone {
		return sizeRefusal{msg: m, alone: true}
	}
	r.Metrics.oversized(m.Topic)
	reason := fmt.Sprintf("event refused by Kafka as too large for %s (%d bytes with its headers): its max.message.bytes is below the limit Gatekeeper uses for it", m.Topic, RecordSize(m))
	if prev, ok := lastHeader(m.Headers, HeaderReason); ok && m.Topic == r.Topics.DLQ {
		reason = prev + "; " + reason
	}
	if m.Topic == r.Topics.DLQ {
		r.logger().Error("dead letter refused by Kafka as too large, written with its reason and origin only", "size", RecordSize(m))
		return sizeRefusal{msg: r.minimalDeadLetter(m, reason)}
	}
	dl := WithReason(m, reason)
	dl.Topic = r.Topics.DLQ
	if t, ok := r.trimmed(dl); ok {
		r.logger().Warn("event refused by Kafka as too large, dead-lettered", "to", m.Topic, "size", RecordSize(m))
		return sizeRefusal{msg: t}
	}
	dl.Value = nil
	r.logger().Warn("event refused by Kafka as too large, dead-lettered without its value", "to", m.Topic, "size", RecordSize(m))
	return sizeRefusal{msg: dl}
}

func isTooLarge(err error) bool {
	var mtl kafka.MessageTooLargeError
	return errors.Is(err, kafka.MessageSizeTooLarge) || errors.Is(err, kafka.RecordListTooLarge) || errors.As(err, &mtl)
}
