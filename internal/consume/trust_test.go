package consume

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

func TestMetadataSignature(t *testing.T) {
	key, old, other := metaKey([]byte("current")), metaKey([]byte("previous")), metaKey([]byte("someone else"))
	meta := encodeRanges(10, []offsetRange{{12, 15}})
	signed := signMeta([][]byte{key}, "g.retry", "t.retry", 2, meta)
	if len(signed) != len(meta)+sigLen {
		t.Fatalf("signed metadata is %d bytes, want %d + %d", len(signed), len(meta), sigLen)
	}
	for name, tc := range map[string]struct {
		keys                   [][]byte
		group, topic, meta     string
		partition              int
		wantBody, wantDistrust string
	}{
		"signed":                {[][]byte{key}, "g.retry", "t.retry", signed, 2, meta, ""},
		"rotated: previous key": {[][]byte{old, key}, "g.retry", "t.retry", signed, 2, meta, ""},
		"no keys: not checked":  {nil, "g.retry", "t.retry", signed, 2, meta, ""},
		"unsigned":              {[][]byte{key}, "g.retry", "t.retry", meta, 2, meta, DistrustUnsigned},
		"another key":           {[][]byte{other}, "g.retry", "t.retry", signed, 2, meta, DistrustBadSig},
		"another partition":     {[][]byte{key}, "g.retry", "t.retry", signed, 1, meta, DistrustBadSig},
		"another group":         {[][]byte{key}, "g2.retry", "t.retry", signed, 2, meta, DistrustBadSig},
		"another topic":         {[][]byte{key}, "g.retry", "t.retry.1h", signed, 2, meta, DistrustBadSig},
		"done set changed":      {[][]byte{key}, "g.retry", "t.retry", encodeRanges(10, []offsetRange{{12, 99}}) + signed[len(meta):], 2, encodeRanges(10, []offsetRange{{12, 99}}), DistrustBadSig},
	} {
		t.Run(name, func(t *testing.T) {
			body, why := verifyMeta(tc.keys, tc.group, tc.topic, tc.partition, tc.meta)
			if body != tc.wantBody || why != tc.wantDistrust {
				t.Errorf("got %q, %q; want %q, %q", body, why, tc.wantBody, tc.wantDistrust)
			}
		})
	}
}

// A done set that someone else committed for the retry group is not taken
// on trust: one that reaches beyond the partition's end (it would move the
// commit past events not yet written), or, with keys, one that is unsigned
// or signed with another key, makes the new owner handle every message
// again (duplicates, not losses) and say why. A done set signed with the
// group's key and within the end is skipped as usual.
func TestKafkaDelayedDistrustsForgedDoneSet(t *testing.T) {
	broker := testenv.Kafka(t)
	key := []byte("the retry secret of this deployment, 32+ bytes")
	for name, tc := range map[string]struct {
		keys   [][]byte
		forge  func(group, topic string, p int, end int64) string
		want   int // messages handled of each partition's n
		reason string
	}{
		"beyond the end": {nil, func(_, _ string, _ int, end int64) string {
			return encodeRanges(0, []offsetRange{{2, end + 1000}})
		}, n3, DistrustBeyondEnd},
		"unsigned": {[][]byte{key}, func(_, _ string, _ int, end int64) string {
			return encodeRanges(0, []offsetRange{{2, end}})
		}, n3, DistrustUnsigned},
		"another key": {[][]byte{key}, func(g, tp string, p int, end int64) string {
			return signMeta([][]byte{metaKey([]byte("not ours"))}, g, tp, p, encodeRanges(0, []offsetRange{{2, end}}))
		}, n3, DistrustBadSig},
		"signed, within the end": {[][]byte{key}, func(g, tp string, p int, end int64) string {
			return signMeta([][]byte{metaKey(key)}, g, tp, p, encodeRanges(0, []offsetRange{{2, end}}))
		}, 2, ""},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			topic, group := createTopic(t, broker), uniqueName(t, "group")
			msgs := values(n3*testPartitions, "forged")
			for i := range msgs {
				msgs[i] = withRelease(msgs[i], time.Now().Add(-time.Second))
			}
			produce(t, broker, topic, msgs) // round robin: n3 each
			end := endOffsets(t, broker, topic)
			for p, e := range end {
				if e != n3 {
					t.Fatalf("partition %d ends at %d, want %d", p, e, n3)
				}
			}
			commitForged(t, broker, group, topic, end, tc.forge)

			s := newSeen(t)
			var mu sync.Mutex
			reasons := map[string]int{}
			cfg := DelayedConfig{Config: testConfig(t, broker, group, topic), ReleaseAt: releaseByHeader,
				MetadataKeys: tc.keys,
				OnDistrusted: func(_ string, why string) { mu.Lock(); reasons[why]++; mu.Unlock() }}
			d, err := NewDelayed(cfg, onMessages(func(_ context.Context, msgs []kafka.Message) error {
				s.add(msgs)
				return nil
			}))
			if err != nil {
				t.Fatal(err)
			}
			stop := runInBackground(t, d.Run)
			eventually(t, 30*time.Second, "the committed offsets reach the end", func() bool {
				return cmp.Equal(end, committedOffsets(t, broker, group, topic))
			})
			time.Sleep(300 * time.Millisecond)
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if got, want := s.distinct(), tc.want*testPartitions; got != want {
				t.Errorf("handled %d messages, want %d", got, want)
			}
			mu.Lock()
			defer mu.Unlock()
			want := map[string]int{}
			if tc.reason != "" {
				want[tc.reason] = testPartitions
			}
			if diff := cmp.Diff(want, reasons); diff != "" {
				t.Errorf("distrusted done sets by reason (-want +got):\n%s", diff)
			}
		})
	}
}

// n3 is the number of messages per partition of the forged-metadata test.
const n3 = 20

// commitForged commits offset 0 of every partition for group, as a client
// outside the group may, with the metadata forge returns.
func commitForged(t *testing.T, broker, group, topic string, end map[int]int64, forge func(group, topic string, p int, end int64) string) {
	t.Helper()
	var ocs []kafka.OffsetCommit
	for p := range testPartitions {
		ocs = append(ocs, kafka.OffsetCommit{Partition: p, Offset: 0, Metadata: forge(group, topic, p, end[p])})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := &kafka.Client{Addr: kafka.TCP(broker), Timeout: 10 * time.Second}
	res, err := c.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1, Topics: map[string][]kafka.OffsetCommit{topic: ocs}})
	if err != nil {
		t.Fatal(err)
	}
	for _, ps := range res.Topics {
		for _, p := range ps {
			if p.Error != nil {
				t.Fatalf("commit partition %d: %v", p.Partition, p.Error)
			}
		}
	}
}
