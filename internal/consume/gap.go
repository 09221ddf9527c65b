package consume

import (
	"context"
	"time"

	"github.com/segmentio/kafka-go"
)

// gapCheckEvery is how often at most a partition asks Kafka whether a gap in
// its offsets is deleted data: compacted topics and transaction markers
// leave gaps that are not, and one ListOffsets per gap would be too many.
const gapCheckEvery = 10 * time.Second

// gapCheck watches the offsets a partition fetches for a jump over events
// that Kafka deleted before they were consumed (retention shorter than the
// consumer's lag, or than a deferred event's wait): kafka-go then skips to
// the first offset left without telling the caller. A jump is logged as an
// error and reported through Config.OnOffsetsLost. It is used by the one
// goroutine that fetches the partition.
type gapCheck struct {
	p         *partition
	next      int64 // the offset expected next, -1 when unknown
	lastCheck time.Time
	// firstOffset returns the partition's log start offset.
	firstOffset func(ctx context.Context) (int64, error)
}

// newGapCheck expects the partition's first message at committed (the
// group's committed offset, or a negative kafka-go constant: unknown).
func newGapCheck(p *partition, committed int64, client *kafka.Client) *gapCheck {
	g := &gapCheck{p: p, next: max(committed, -1)}
	g.firstOffset = func(ctx context.Context) (int64, error) {
		res, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{
			Topics: map[string][]kafka.OffsetRequest{p.topic: {kafka.FirstOffsetOf(p.id)}},
		})
		if err != nil {
			return 0, err
		}
		for _, po := range res.Topics[p.topic] {
			if po.Partition == p.id {
				return po.FirstOffset, po.Error
			}
		}
		return 0, kafka.UnknownTopicOrPartition
	}
	return g
}

// fetched records that the message at offset was fetched.
func (g *gapCheck) fetched(ctx context.Context, offset int64) {
	if g == nil {
		return
	}
	expected := g.next
	g.next = offset + 1
	if expected < 0 || offset <= expected || time.Since(g.lastCheck) < gapCheckEvery {
		return
	}
	g.lastCheck = time.Now()
	cctx, cancel := context.WithTimeout(ctx, g.p.cfg.Timeout)
	first, err := g.firstOffset(cctx)
	cancel()
	if err != nil {
		g.p.log.Warn("offset gap: could not read the log start offset", "expected", expected, "offset", offset, "err", err)
		return
	}
	if first <= expected {
		return // a gap in the log itself (compaction, transaction markers)
	}
	lost := min(first, offset) - expected
	g.p.log.Error("events deleted by Kafka before they were consumed (retention): offsets skipped",
		"expected", expected, "offset", offset, "log_start", first, "lost", lost)
	if g.p.cfg.OnOffsetsLost != nil {
		g.p.cfg.OnOffsetsLost(g.p.topic, g.p.id, lost)
	}
}
