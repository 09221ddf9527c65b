package route

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// Header names of the gk- header contract. Times are unix milliseconds in
// decimal. The "gk-" prefix is reserved for Gatekeeper.
const (
	// HeaderPrefix starts every Gatekeeper header.
	HeaderPrefix = "gk-"
	// HeaderAttempt is the number of times the event has been deferred (1 on the first deferral).
	HeaderAttempt = "gk-attempt"
	// HeaderDue is the start of the reserved slot: the event is never forwarded before it.
	HeaderDue = "gk-due"
	// HeaderTenant is the tenant the event was counted against.
	HeaderTenant = "gk-tenant"
	// HeaderReserved is the end of the reserved slot: until then the event is forwarded uncounted.
	HeaderReserved = "gk-reserved"
	// HeaderOriginTopic is the source topic the event was first consumed from.
	HeaderOriginTopic = "gk-origin-topic"
	// HeaderOriginPartition is the source partition the event was first consumed from.
	HeaderOriginPartition = "gk-origin-partition"
	// HeaderOriginOffset is the source offset the event was first consumed from.
	HeaderOriginOffset = "gk-origin-offset"
	// HeaderFirstSeen is when Gatekeeper first deferred the event.
	HeaderFirstSeen = "gk-first-seen"
	// HeaderReason says why an event went to the dead-letter topic (dead-letter topic only).
	HeaderReason = "gk-reason"
	// HeaderSig authenticates a deferred event when a retry secret is set:
	// the base64url HMAC-SHA256 of its key, value and other headers (see
	// Signer). It is the last header of events written to a retry tier, and
	// stays on them downstream and in the dead-letter topic.
	HeaderSig = "gk-sig"
	// HeaderTook marks a deferred event that took the slot of a later
	// reservation of its tenant (limit.Decision.Took): back inside that
	// slot it keeps it, and is never taken for the reservation's own event.
	HeaderTook = "gk-took"
	// HeaderWindows names the windows a deferred event's reservation was
	// counted in (limit.Decision.Windows; under a capacity only): the
	// Retrier's backlog offer (Advance) moves a reservation only out of the
	// windows that counted it.
	HeaderWindows = "gk-windows"
)

// maxWindowsHeader is the longest gk-windows read: a longer one names no
// windows (limit.Limiter's names are at most 13 bytes).
const maxWindowsHeader = 32

// Deferral is what the gk- headers of a deferred event say. It is a value type.
type Deferral struct {
	// Attempt counts deferrals of the event, starting at 1.
	Attempt int
	// Due is the start of the reserved slot; Reserved is its end.
	Due, Reserved time.Time
	// FirstSeen is when the event was first deferred.
	FirstSeen time.Time
	// Tenant is the tenant the event is counted against.
	Tenant string
	// OriginTopic, OriginPartition and OriginOffset locate the event in its source topic.
	OriginTopic     string
	OriginPartition int
	OriginOffset    int64
	// Took: the slot was taken from a later reservation (gk-took).
	Took bool
	// Windows names the windows the reservation was counted in (gk-windows;
	// "": not named).
	Windows string
}

// WithDeferral returns a copy of m that carries d in its gk- headers. Every
// gk- header m had is removed (so a re-deferred event never carries two
// values), the other headers keep their order, and the deferral headers are
// appended. m itself is not modified.
//
// Times are written in whole milliseconds: Due is rounded up, so that an event
// is never released early, and Reserved is rounded down, so that an event is
// never taken to be inside its slot after the slot ended.
func WithDeferral(m kafka.Message, d Deferral) kafka.Message {
	// One buffer holds every value: deferred events can be a large part of
	// the traffic, and eight small allocations each would show.
	b := make([]byte, 0, 6*20+len(d.Tenant)+len(d.OriginTopic))
	var end [8]int
	b = strconv.AppendInt(b, int64(d.Attempt), 10)
	end[0] = len(b)
	b = strconv.AppendInt(b, ceilMillis(d.Due), 10)
	end[1] = len(b)
	b = strconv.AppendInt(b, d.Reserved.UnixMilli(), 10)
	end[2] = len(b)
	b = append(b, d.Tenant...)
	end[3] = len(b)
	b = append(b, d.OriginTopic...)
	end[4] = len(b)
	b = strconv.AppendInt(b, int64(d.OriginPartition), 10)
	end[5] = len(b)
	b = strconv.AppendInt(b, d.OriginOffset, 10)
	end[6] = len(b)
	b = strconv.AppendInt(b, d.FirstSeen.UnixMilli(), 10)
	end[7] = len(b)
	val := func(i int) []byte {
		start := 0
		if i > 0 {
			start = end[i-1]
		}
		return b[start:end[i]:end[i]]
	}
	hs := []kafka.Header{
		{Key: HeaderAttempt, Value: val(0)},
		{Key: HeaderDue, Value: val(1)},
		{Key: HeaderReserved, Value: val(2)},
		{Key: HeaderTenant, Value: val(3)},
		{Key: HeaderOriginTopic, Value: val(4)},
		{Key: HeaderOriginPartition, Value: val(5)},
		{Key: HeaderOriginOffset, Value: val(6)},
		{Key: HeaderFirstSeen, Value: val(7)},
	}
	if d.Took {
		hs = append(hs, kafka.Header{Key: HeaderTook, Value: []byte("1")})
	}
	if d.Windows != "" {
		hs = append(hs, kafka.Header{Key: HeaderWindows, Value: []byte(d.Windows)})
	}
	return withHeaders(m, isGK, hs...)
}

// WithReason returns a copy of m with gk-reason set to reason, replacing any
// earlier gk-reason; all other headers are kept in order. m itself is not
// modified.
func WithReason(m kafka.Message, reason string) kafka.Message {
	return withHeaders(m, func(k string) bool { return k == HeaderReason },
		kafka.Header{Key: HeaderReason, Value: []byte(reason)})
}

// withOrigin returns a copy of m, consumed from a source topic, whose gk-
// headers name its origin and, if known, its tenant. Any gk- headers m came
// with are stale or forged, and removed. The origin (gk-origin-topic,
// gk-origin-partition, gk-origin-offset) is the event's stable identity: every
// copy of it that reaches downstream carries the same three values.
func withOrigin(m kafka.Message, tenant string) kafka.Message {
	var o origins
	return o.with(m, tenant)
}

// origins adds the origin headers (see withOrigin) to the events of one
// source batch. It runs for every admitted event, so it allocates per
// batch, not per event: the header values of all events share one byte
// buffer and their header lists one header slice, sized by newOrigins; the
// topic and partition values are written once per partition (a source
// batch is one partition). Every message gets full-capacity sub-slices, so
// appending to its headers or values never writes into another's. The zero
// value works (allocating as it goes). Not safe for concurrent use.
type origins struct {
	buf  []byte
	hdrs []kafka.Header
	// topic and partition are the values of the last partition seen.
	topic, partition []byte
	topicName        string
	partitionNum     int
}

// originPool recycles the buffers of origins (see release).
var originPool sync.Pool

// newOrigins returns the origins of msgs, sized for them: each event's own
// headers and four more, its key's bytes (the tenant, when it is taken from
// the key) and 20 digits of offset. Its buffers come from earlier batches
// released with release.
func newOrigins(msgs []kafka.Message) *origins {
	nh, nb := 0, 0
	for i := range msgs {
		nh += len(msgs[i].Headers) + 4
		nb += len(msgs[i].Key) + 20
	}
	if len(msgs) > 0 {
		nb += len(msgs[0].Topic) + 20
	}
	o, _ := originPool.Get().(*origins)
	if o == nil {
		o = &origins{}
	}
	if cap(o.hdrs) < nh {
		o.hdrs = make([]kafka.Header, 0, nh)
	}
	if cap(o.buf) < nb {
		o.buf = make([]byte, 0, nb)
	}
	return o
}

// release gives o's buffers to the next batch. Call it only when no message
// built by o is used any more, nor will be: after Kafka acknowledged their
// write (a write given up on, its context done, may still be under way in
// the writer).
func (o *origins) release() {
	clear(o.hdrs[:cap(o.hdrs)]) // keep no source header alive
	*o = origins{buf: o.buf[:0], hdrs: o.hdrs[:0]}
	originPool.Put(o)
}

// value appends v (from f) to the buffer and returns it, capped.
func (o *origins) value(f func([]byte) []byte) []byte {
	start := len(o.buf)
	o.buf = f(o.buf)
	return o.buf[start:len(o.buf):len(o.buf)]
}

// with returns a copy of m with its origin headers and the tenant's, as
// withOrigin does.
func (o *origins) with(m kafka.Message, tenant string) kafka.Message {
	o.set(&m, tenant)
	return m
}

// set gives m its origin headers and the tenant's in place, as with does.
func (o *origins) set(m *kafka.Message, tenant string) {
	if o.topic == nil || m.Topic != o.topicName || m.Partition != o.partitionNum {
		o.topicName, o.partitionNum = m.Topic, m.Partition
		o.topic = o.value(func(b []byte) []byte { return append(b, m.Topic...) })
		o.partition = o.value(func(b []byte) []byte { return strconv.AppendInt(b, int64(m.Partition), 10) })
	}
	start := len(o.hdrs)
	for _, h := range m.Headers {
		if !isGK(h.Key) {
			o.hdrs = append(o.hdrs, h)
		}
	}
	if tenant != "" {
		o.hdrs = append(o.hdrs, kafka.Header{Key: HeaderTenant, Value: o.value(func(b []byte) []byte { return append(b, tenant...) })})
	}
	o.hdrs = append(o.hdrs,
		kafka.Header{Key: HeaderOriginTopic, Value: o.topic},
		kafka.Header{Key: HeaderOriginPartition, Value: o.partition},
		kafka.Header{Key: HeaderOriginOffset, Value: o.value(func(b []byte) []byte { return strconv.AppendInt(b, m.Offset, 10) })},
	)
	m.Headers = o.hdrs[start:len(o.hdrs):len(o.hdrs)]
}

// ParseDeferral reads the deferral headers of m. If a header appears more than
// once, the last one counts. The error names the missing or malformed header.
func ParseDeferral(m kafka.Message) (Deferral, error) {
	return parseDeferral(m, nil)
}

// parseDeferral is ParseDeferral with m's gk-due already read (parseDue, no
// error) when due is not nil: it is not read again.
func parseDeferral(m kafka.Message, due *time.Time) (Deferral, error) {
	var d Deferral
	var err error
	get := func(name string) string {
		if err != nil {
			return ""
		}
		v, ok := lastHeader(m.Headers, name)
		if !ok {
			err = fmt.Errorf("no header %s", name)
		} else if v == "" {
			err = fmt.Errorf("header %s is empty", name)
		}
		return v
	}
	integer := func(name string, bits int) int64 {
		v := get(name)
		if err != nil {
			return 0
		}
		n, perr := strconv.ParseInt(v, 10, bits)
		if perr != nil {
			err = fmt.Errorf("header %s: %q is not an integer", name, v)
		}
		return n
	}
	millis := func(name string) time.Time {
		n := integer(name, 64)
		if err != nil {
			return time.Time{}
		}
		return time.UnixMilli(n).UTC()
	}

	d.Attempt = int(integer(HeaderAttempt, 32))
	if due == nil {
		d.Due = millis(HeaderDue)
	} else if err == nil {
		d.Due = *due
	}
	d.Reserved = millis(HeaderReserved)
	d.FirstSeen = millis(HeaderFirstSeen)
	d.Tenant = get(HeaderTenant)
	d.OriginTopic = get(HeaderOriginTopic)
	d.OriginPartition = int(integer(HeaderOriginPartition, 32))
	d.OriginOffset = integer(HeaderOriginOffset, 64)
	_, d.Took = lastHeader(m.Headers, HeaderTook)
	if w, ok := lastHeader(m.Headers, HeaderWindows); ok && len(w) <= maxWindowsHeader {
		d.Windows = w // optional: absent (an older release, no capacity), no windows named
	}
	if err != nil {
		return Deferral{}, err
	}
	if d.Attempt < 1 {
		return Deferral{}, fmt.Errorf("header %s: %d is below 1", HeaderAttempt, d.Attempt)
	}
	if err := checkTenant(d.Tenant); err != nil {
		return Deferral{}, fmt.Errorf("header %s: %w", HeaderTenant, err)
	}
	return d, nil
}

// parseDue reads gk-due alone, for the tiers that only need the due time.
func parseDue(m kafka.Message) (time.Time, error) {
	v, ok := lastHeader(m.Headers, HeaderDue)
	if !ok {
		return time.Time{}, errors.New("no header " + HeaderDue)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("header %s: %q is not an integer", HeaderDue, v)
	}
	return time.UnixMilli(n).UTC(), nil
}

// LastHeader returns the value of the last header of m named name: as for
// every gk- header, a later one overrides an earlier one.
func LastHeader(m kafka.Message, name string) (string, bool) {
	return lastHeader(m.Headers, name)
}

func lastHeader(hs []kafka.Header, name string) (string, bool) {
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].Key == name {
			return string(hs[i].Value), true
		}
	}
	return "", false
}

func isGK(name string) bool { return strings.HasPrefix(name, HeaderPrefix) }

// withHeaders returns a copy of m without the headers for which drop is true
// and with add appended. The header slice is new, so m's is never aliased.
func withHeaders(m kafka.Message, drop func(string) bool, add ...kafka.Header) kafka.Message {
	hs := make([]kafka.Header, 0, len(m.Headers)+len(add))
	for _, h := range m.Headers {
		if !drop(h.Key) {
			hs = append(hs, h)
		}
	}
	m.Headers = append(hs, add...)
	return m
}

func formatMillis(ms int64) []byte { return []byte(strconv.FormatInt(ms, 10)) }

// ceilMillis returns t in unix milliseconds, rounded up.
func ceilMillis(t time.Time) int64 {
	ms := t.UnixMilli()
	if time.UnixMilli(ms).Before(t) {
		ms++
	}
	return ms
}
