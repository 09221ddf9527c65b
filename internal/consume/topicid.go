package consume

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
)

// Topic IDs. A topic deleted and created again under the same name starts
// again at offset 0: only Kafka's topic ID (a UUID the controller gives each
// topic at creation, Metadata v10 and later) tells the two apart. Each Batch
// carries its partition's topic ID (Batch.TopicID), so that what a Handler
// remembers of offsets (the limiter's replay record) is never taken for
// another topic's.
//
// kafka-go's Metadata request stops at v8, before topic IDs, so
// topicIDRequest sends a Metadata v12 request of its own through the
// Transport's connections (TLS and SASL as configured): it implements
// protocol.RawExchanger, which hands it the connection.
//
// The ID is read when a partition is assigned, and read again after every
// fetch that returns records, before they are handed out (while they are
// decoded): a fetch names its topic by name (kafka-go's Fetch stops at
// v11, before fetches by topic ID), and a topic deleted and created again
// between two fetches, even within a broker's long poll, shows no error,
// only the new topic's records at the old offsets. A fetch that fails on
// the partition (the topic deleted, or created again and shorter than the
// old offset) reads it again too, and so does the next fetch without
// records, and one every topicRecheck on an idle partition. A topic's IDs never
// come back, so the assigned ID read again after a fetch means the fetch
// read that topic. On a different ID the partition stops without
// committing, and the member rejoins the group (see runPartition).

// topicRecheck is how often at most an idle partition (fetches without
// records) reads its topic's ID again: a topic created again no longer
// than the old offset shows neither an error nor records, and its events
// would otherwise wait for more to come.
const topicRecheck = 10 * time.Second

// errTopicReplaced is the error of a fetch from a topic whose ID changed
// since the partition was assigned.
var errTopicReplaced = errors.New("the topic was deleted and created again (its topic ID changed)")

// topicIDRequest is a Metadata v12 request for the ID of one topic. Broker
// sends it to the partition's leader, whose metadata is at least as new as
// what it served the partition's fetches from.
type topicIDRequest struct {
	topic     string
	partition int
}

// topicIDResponse is what topicIDRequest read: the topic's ID in Kafka's
// own text form (unpadded base64url, as kafka-topics prints it; "" for the
// zero ID of a cluster without topic IDs), or its error.
type topicIDResponse struct {
	id  string
	err error
}

func (*topicIDRequest) ApiKey() protocol.ApiKey  { return protocol.Metadata }
func (*topicIDResponse) ApiKey() protocol.ApiKey { return protocol.Metadata }

// Required always asks for the raw exchange: the request is not one that
// kafka-go knows how to encode.
func (*topicIDRequest) Required(map[protocol.ApiKey]int16) bool { return true }

// Broker is the partition's leader as the Transport knows it, any broker
// when it knows none.
func (r *topicIDRequest) Broker(c protocol.Cluster) (protocol.Broker, error) {
	if t, ok := c.Topics[r.topic]; ok {
		if p, ok := t.Partitions[int32(r.partition)]; ok {
			if b, ok := c.Brokers[p.Leader]; ok {
				return b, nil
			}
		}
	}
	return protocol.Broker{ID: -1}, nil
}

// topicIDCorrelation is the correlation ID of every topicIDRequest: one
// request at a time goes over a connection.
const topicIDCorrelation = 0x6b6b6964

// RawExchange writes the request (header v2, body v12) and reads the
// response (header v1, body v12).
func (r *topicIDRequest) RawExchange(rw io.ReadWriter) (protocol.Message, error) {
	var b []byte
	b = binary.BigEndian.AppendUint32(b, 0) // size, set below
	b = binary.BigEndian.AppendUint16(b, uint16(protocol.Metadata))
	b = binary.BigEndian.AppendUint16(b, 12)
	b = binary.BigEndian.AppendUint32(b, topicIDCorrelation)
	b = binary.BigEndian.AppendUint16(b, uint16(len("gatekeeper")))
	b = append(b, "gatekeeper"...)
	b = append(b, 0)                 // header tagged fields
	b = binary.AppendUvarint(b, 1+1) // topics: one
	b = append(b, make([]byte, 16)...)
	b = binary.AppendUvarint(b, uint64(len(r.topic)+1))
	b = append(b, r.topic...)
	b = append(b, 0)       // topic tagged fields
	b = append(b, 0, 0, 0) // allow auto creation, topic operations, tagged fields
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	if _, err := rw.Write(b); err != nil {
		return nil, err
	}
	var size [4]byte
	if _, err := io.ReadFull(rw, size[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(size[:])
	if n > 16<<20 {
		return nil, fmt.Errorf("metadata v12 response of %d bytes", n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(rw, body); err != nil {
		return nil, err
	}
	return parseTopicIDResponse(body, r.topic)
}

// parseTopicIDResponse reads a Metadata v12 response (header included) for
// topic.
func parseTopicIDResponse(body []byte, topic string) (*topicIDResponse, error) {
	d := &kdecoder{b: body}
	if d.u32() != topicIDCorrelation {
		return nil, errors.New("metadata v12: correlation ID mismatch")
	}
	d.tags()
	d.u32()               // throttle
	for range d.array() { // brokers
		d.u32()
		d.str()
		d.u32()
		d.str()
		d.tags()
	}
	d.str() // cluster ID
	d.u32() // controller
	var res *topicIDResponse
	for range d.array() {
		code := int16(d.u16())
		name := d.str()
		id := d.bytes(16)
		d.bytes(1) // internal
		for range d.array() {
			d.u16()
			d.u32()
			d.u32()
			d.u32()
			for range 3 {
				for range d.array() {
					d.u32()
				}
			}
			d.tags()
		}
		d.u32() // authorized operations
		d.tags()
		if d.err == nil && name == topic {
			res = &topicIDResponse{}
			if code != 0 {
				res.err = kafka.Error(code)
			} else if !bytes.Equal(id, make([]byte, 16)) {
				res.id = base64.RawURLEncoding.EncodeToString(id)
			}
		}
	}
	if d.err != nil {
		return nil, fmt.Errorf("metadata v12: %w", d.err)
	}
	if res == nil {
		return nil, fmt.Errorf("metadata v12: no topic %q in the response", topic)
	}
	return res, nil
}

// kdecoder reads the primitive types of Kafka's flexible versions; the
// first error sticks and later reads return zeros.
type kdecoder struct {
	b   []byte
	err error
}

func (d *kdecoder) bytes(n int) []byte {
	if d.err != nil || n < 0 || n > len(d.b) {
		if d.err == nil {
			d.err = io.ErrUnexpectedEOF
		}
		return make([]byte, max(n, 0))
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *kdecoder) u16() uint16 { return binary.BigEndian.Uint16(d.bytes(2)) }
func (d *kdecoder) u32() uint32 { return binary.BigEndian.Uint32(d.bytes(4)) }

func (d *kdecoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = io.ErrUnexpectedEOF
		return 0
	}
	d.b = d.b[n:]
	return v
}

// str reads a compact (nullable) string.
func (d *kdecoder) str() string {
	n := d.uvarint()
	if n == 0 {
		return ""
	}
	return string(d.bytes(int(n - 1)))
}

// array reads a compact array's length (a null array is empty).
func (d *kdecoder) array() []struct{} {
	n := d.uvarint()
	if n == 0 || d.err != nil {
		return nil
	}
	if n-1 > uint64(len(d.b)) { // each element takes a byte at least
		d.err = io.ErrUnexpectedEOF
		return nil
	}
	return make([]struct{}, n-1)
}

// tags skips tagged fields.
func (d *kdecoder) tags() {
	for range d.uvarint() {
		if d.err != nil {
			return
		}
		d.uvarint()
		d.bytes(int(d.uvarint()))
	}
}

// topicID reads the ID of topic (see topicIDRequest), bounded by timeout.
func topicID(ctx context.Context, t kafka.RoundTripper, addr net.Addr, timeout time.Duration, topic string, partition int) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res, err := t.RoundTrip(ctx, addr, &topicIDRequest{topic: topic, partition: partition})
	if err != nil {
		return "", fmt.Errorf("topic ID of %s: %w", topic, err)
	}
	r, ok := res.(*topicIDResponse)
	if !ok {
		return "", fmt.Errorf("topic ID of %s: unexpected response %T", topic, res)
	}
	if r.err != nil {
		return "", fmt.Errorf("topic ID of %s: %w", topic, r.err)
	}
	return r.id, nil
}
