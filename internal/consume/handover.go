package consume

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// A retry-tier partition finishes its messages out of offset order: a message
// due in a second is released before one due in a minute that came before it.
// Its committed offset is the first message not yet done, so without more the
// next owner of the partition (after a rebalance, a rolling update or a crash)
// would read again, and hand again, every message released beyond it.
//
// So each commit carries, in the offset metadata Kafka keeps with it, the set
// of offsets beyond the committed one that are already done; the next owner
// reads it (OffsetFetch) when the partition is assigned and skips those
// offsets. The set is written compactly as ranges or as a bitset (whichever is
// shorter, an idea taken from Confluent's parallel-consumer) and must fit in
// the broker's offset.metadata.max.bytes (4096 by default): when it does not,
// the ranges at the high end are left out, and the offsets they cover are
// handed again by the next owner (at least once; counted by OnUnrecorded).
//
// Metadata format, all ASCII: "gk1" + kind + ":" + base + ":" + payload, where
// base is the committed offset in decimal (the metadata is ignored unless it
// matches the committed offset it came with), kind is 'r' or 'b', and payload
// is unpadded base64url of
//
//   - 'r': for each done range in ascending order, two unsigned varints: its
//     distance from the end of the previous range (from base for the first)
//     and its length;
//   - 'b': a bitset over [base, base+8*len): bit i (byte i/8, bit i%8 from the
//     least significant) is set when offset base+i is done.

// DefaultMetadataMax is the default of Config.MetadataMax: Kafka's default
// offset.metadata.max.bytes.
const DefaultMetadataMax = 4096

const metaVersion = "gk1"

// offsetRange is the half-open range of offsets [lo, hi).
type offsetRange struct{ lo, hi int64 }

func (r offsetRange) len() int64 { return r.hi - r.lo }

// encodeDone encodes done (ascending, disjoint, all at or above base) as
// offset metadata of at most max bytes. It keeps the longest prefix of done
// that fits and returns the number of offsets it had to leave out.
func encodeDone(base int64, done []offsetRange, max int) (meta string, left int64) {
	if len(done) == 0 {
		return "", 0
	}
	fits := func(k int) (string, bool) {
		m := encodeRanges(base, done[:k])
		return m, len(m) <= max
	}
	if m, ok := fits(len(done)); ok {
		return m, 0
	}
	// Binary search for the most ranges that fit: sizes grow with k.
	lo, hi := 0, len(done) // fits(lo) holds (k=0 is the empty string), fits(hi) does not
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if _, ok := fits(mid); ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	for _, r := range done[lo:] {
		left += r.len()
	}
	if lo == 0 {
		return "", left
	}
	m, _ := fits(lo)
	return m, left
}

// encodeRanges returns the shorter of the two encodings of done.
func encodeRanges(base int64, done []offsetRange) string {
	if len(done) == 0 {
		return ""
	}
	head := metaVersion + "%c:" + strconv.FormatInt(base, 10) + ":"
	var runs []byte
	prev := base
	for _, r := range done {
		runs = binary.AppendUvarint(runs, uint64(r.lo-prev))
		runs = binary.AppendUvarint(runs, uint64(r.len()))
		prev = r.hi
	}
	// The bitset's size is known before it is built: build it only if it
	// is shorter.
	span := done[len(done)-1].hi - base
	if bits := (span + 7) / 8; bits < int64(len(runs)) {
		set := make([]byte, bits)
		for _, r := range done {
			for o := r.lo; o < r.hi; o++ {
				i := o - base
				set[i/8] |= 1 << (i % 8)
			}
		}
		return fmt.Sprintf(head, 'b') + base64.RawURLEncoding.EncodeToString(set)
	}
	return fmt.Sprintf(head, 'r') + base64.RawURLEncoding.EncodeToString(runs)
}

// decodeDone parses offset metadata written by encodeDone for the committed
// offset base. Empty metadata (or metadata another client wrote, or written
// for another offset) is no done set, and no error: the partition is then
// consumed from base as usual. An error means metadata that claims to be
// ours but is malformed.
func decodeDone(meta string, base int64) ([]offsetRange, error) {
	if !strings.HasPrefix(meta, metaVersion) || len(meta) < len(metaVersion)+2 {
		return nil, nil
	}
	kind := meta[len(metaVersion)]
	rest, ok := strings.CutPrefix(meta[len(metaVersion)+1:], ":")
	if !ok {
		return nil, errors.New("offset metadata: no base")
	}
	b, payload, ok := strings.Cut(rest, ":")
	if !ok {
		return nil, errors.New("offset metadata: no payload")
	}
	at, err := strconv.ParseInt(b, 10, 64)
	if err != nil || at < 0 {
		return nil, fmt.Errorf("offset metadata: base %q", b)
	}
	if at != base {
		return nil, nil // written for another committed offset
	}
	raw, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return nil, fmt.Errorf("offset metadata: %w", err)
	}
	switch kind {
	case 'r':
		return decodeRuns(base, raw)
	case 'b':
		return decodeBits(base, raw), nil
	}
	return nil, fmt.Errorf("offset metadata: unknown kind %q", kind)
}

func decodeRuns(base int64, raw []byte) ([]offsetRange, error) {
	var done []offsetRange
	prev := base
	for len(raw) > 0 {
		gap, n := binary.Uvarint(raw)
		if n <= 0 {
			return nil, errors.New("offset metadata: bad run")
		}
		raw = raw[n:]
		length, n := binary.Uvarint(raw)
		if n <= 0 || length == 0 {
			return nil, errors.New("offset metadata: bad run")
		}
		raw = raw[n:]
		const maxOff = 1<<63 - 1
		if gap > uint64(maxOff-prev) || length > uint64(maxOff-prev)-gap {
			return nil, errors.New("offset metadata: run beyond the largest offset")
		}
		lo := prev + int64(gap)
		hi := lo + int64(length)
		if len(done) > 0 && lo == done[len(done)-1].hi {
			done[len(done)-1].hi = hi
		} else {
			done = append(done, offsetRange{lo, hi})
		}
		prev = hi
	}
	return done, nil
}

func decodeBits(base int64, raw []byte) []offsetRange {
	var done []offsetRange
	for i := int64(0); i < int64(len(raw))*8; i++ {
		if raw[i/8]&(1<<(i%8)) == 0 {
			continue
		}
		o := base + i
		if len(done) > 0 && done[len(done)-1].hi == o {
			done[len(done)-1].hi++
		} else {
			done = append(done, offsetRange{o, o + 1})
		}
	}
	return done
}
