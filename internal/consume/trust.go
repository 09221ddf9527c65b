package consume

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/segmentio/kafka-go"
)

// Trusting the done set a previous owner left in the offset metadata.
//
// Anyone who may commit offsets for the retry group can write offset
// metadata, and a done set is a list of offsets the next owner skips: a
// forged one would make deferred events vanish without a trace. So a new
// owner takes the done set only when
//
//   - it is signed, when DelayedConfig.MetadataKeys is set (HMAC-SHA256 of the
//     group, topic, partition and metadata under a key derived from the first
//     key; any of the keys verifies, so the secret can be rotated), and
//   - it lies wholly below the partition's end offset when the partition is
//     assigned (every offset a real owner finished had been written).
//
// Otherwise it handles every message from the committed offset again
// (duplicates rather than losses), logs why, and calls
// DelayedConfig.OnDistrusted. The signature goes after the done set as
// "." and 22 characters of unpadded base64url (the done set's own characters
// never include "."), and counts towards MetadataMax.

// sigLen is the length of the signature suffix: "." and 16 bytes in base64url.
const sigLen = 1 + 22

// Reasons given to OnDistrusted.
const (
	DistrustUnsigned   = "unsigned"
	DistrustBadSig     = "signature does not match"
	DistrustUnreadable = "unreadable"
	DistrustBeyondEnd  = "beyond the partition's end"
	DistrustNoEnd      = "partition end unknown"
)

// metaKey derives the key that signs offset metadata from a secret, so that
// the secret's other uses (gk-sig) never sign the same bytes.
func metaKey(secret []byte) []byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("gatekeeper offset metadata v1"))
	return mac.Sum(nil)
}

// metaSig returns the signature suffix of meta, the done set of a partition.
func metaSig(key []byte, group, topic string, partition int, meta string) string {
	mac := hmac.New(sha256.New, key)
	for _, s := range []string{group, topic, strconv.Itoa(partition), meta} {
		mac.Write([]byte(s))
		mac.Write([]byte{0})
	}
	return "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil)[:16])
}

// signMeta returns meta signed with the first of keys (none: meta as is).
func signMeta(keys [][]byte, group, topic string, partition int, meta string) string {
	if len(keys) == 0 || meta == "" {
		return meta
	}
	return meta + metaSig(keys[0], group, topic, partition, meta)
}

// verifyMeta splits meta into the done set and its signature and reports
// whether any of keys signed it (with no keys: the done set, unchecked).
func verifyMeta(keys [][]byte, group, topic string, partition int, meta string) (string, string) {
	body, sig := meta, ""
	if i := strings.LastIndexByte(meta, '.'); i >= 0 {
		body, sig = meta[:i], meta[i:]
	}
	if len(keys) == 0 {
		return body, ""
	}
	if sig == "" {
		return body, DistrustUnsigned
	}
	for _, k := range keys {
		if hmac.Equal([]byte(sig), []byte(metaSig(k, group, topic, partition, body))) {
			return body, ""
		}
	}
	return body, DistrustBadSig
}

// inheritDone returns the done set the previous owner of a partition left
// in meta, the metadata of the commit at base, when it can be trusted, and
// nil otherwise (see above).
func (m *member) inheritDone(ctx context.Context, group, topic string, partition int, base int64, meta string) []offsetRange {
	log := m.log.With("topic", topic, "partition", partition, "offset", base)
	body, why := verifyMeta(m.metaKeys, group, topic, partition, meta)
	if why != "" {
		m.distrust(log, topic, why, nil)
		return nil
	}
	done, err := decodeDone(body, base)
	if err != nil {
		m.distrust(log, topic, DistrustUnreadable, err)
		return nil
	}
	if len(done) == 0 {
		return nil
	}
	end, err := m.partitionEnd(ctx, topic, partition)
	if err != nil {
		m.distrust(log, topic, DistrustNoEnd, err)
		return nil
	}
	if last := done[len(done)-1].hi; last > end {
		m.distrust(log, topic, DistrustBeyondEnd, fmt.Errorf("the done set reaches %d, the partition ends at %d", last, end))
		return nil
	}
	return done
}

// distrust reports a done set not taken: its messages are handled again.
func (m *member) distrust(log *slog.Logger, topic, why string, err error) {
	args := []any{"reason", why}
	if err != nil {
		args = append(args, "err", err)
	}
	log.Warn("offset metadata of the previous owner not trusted; its done set is handled again (duplicates, not losses)", args...)
	if m.onDistrusted != nil {
		m.onDistrusted(topic, why)
	}
}

// partitionEnd returns the partition's end offset (the next offset to be written).
func (m *member) partitionEnd(ctx context.Context, topic string, partition int) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	res, err := m.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{
		Topics: map[string][]kafka.OffsetRequest{topic: {kafka.LastOffsetOf(partition)}},
	})
	if err != nil {
		return 0, err
	}
	for _, po := range res.Topics[topic] {
		if po.Partition == partition {
			return po.LastOffset, po.Error
		}
	}
	return 0, kafka.UnknownTopicOrPartition
}
