package pace

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// Downstream reads the downstream group's position on the downstream topic.
// A read is two requests (the committed offsets, the end offsets); the
// topic's partitions and first offsets are read again every MetaEvery (or
// after an error), the group's members every MembersEvery. Safe for
// concurrent use.
type Downstream struct {
	Client  *kafka.Client
	Group   string
	Topic   string
	Timeout time.Duration // bound of each read; default 5s
	// MembersEvery is how often the group's members are read (0: every
	// read); MetaEvery how often the partitions and first offsets are
	// (default 30s).
	MembersEvery, MetaEvery time.Duration
	Clock                   func() time.Time

	mu      sync.Mutex
	parts   []int
	first   map[int]int64 // the partitions' first offsets, as of metaAt
	metaAt  time.Time
	membAt  time.Time // when the members were last read (zero: never)
	members int
}

// Read returns a sample: the group's committed offsets and the topic's end
// offsets, summed over the topic's partitions and per partition (in the
// order of their numbers), and the group's members
// (-1 when they were not read this time). A partition the group never
// committed, or committed below the topic's first offset, counts from its
// first offset.
func (d *Downstream) Read(ctx context.Context) (Sample, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, cmpDur(d.Timeout, 5*time.Second))
	defer cancel()
	s, err := d.read(ctx)
	if err != nil {
		d.metaAt, d.membAt = time.Time{}, time.Time{} // read everything again next time
	}
	return s, err
}

func (d *Downstream) read(ctx context.Context) (Sample, error) {
	now := d.now()
	if d.metaAt.IsZero() || now.Sub(d.metaAt) >= cmpDur(d.MetaEvery, 30*time.Second) {
		if err := d.readMeta(ctx); err != nil {
			return Sample{}, err
		}
		d.metaAt = now
	}
	s := Sample{Members: -1}
	if d.membAt.IsZero() || now.Sub(d.membAt) >= d.MembersEvery {
		desc, err := d.Client.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{d.Group}})
		if err != nil {
			return Sample{}, fmt.Errorf("downstream group %s: describe: %w", d.Group, err)
		}
		if len(desc.Groups) != 1 || desc.Groups[0].Error != nil {
			return Sample{}, fmt.Errorf("downstream group %s: describe: %w", d.Group, groupErr(desc.Groups))
		}
		d.membAt, s.Members = now, len(desc.Groups[0].Members)
	}
	of, err := d.Client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: d.Group, Topics: map[string][]int{d.Topic: d.parts}})
	if err == nil && of.Error != nil {
		err = of.Error
	}
	if err != nil {
		return Sample{}, fmt.Errorf("downstream group %s: committed offsets: %w", d.Group, err)
	}
	committed := map[int]int64{}
	for _, p := range of.Topics[d.Topic] {
		if p.Error != nil {
			return Sample{}, fmt.Errorf("downstream group %s: partition %d: %w", d.Group, p.Partition, p.Error)
		}
		committed[p.Partition] = p.CommittedOffset
	}
	reqs := make([]kafka.OffsetRequest, 0, len(d.parts))
	for _, p := range d.parts {
		reqs = append(reqs, kafka.LastOffsetOf(p))
		if c, ok := committed[p]; !ok || c < 0 {
			reqs = append(reqs, kafka.FirstOffsetOf(p)) // never committed: read its first offset now
		}
	}
	lo, err := d.Client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{d.Topic: reqs}, IsolationLevel: kafka.ReadCommitted})
	if err != nil {
		return Sample{}, fmt.Errorf("downstream topic %s: end offsets: %w", d.Topic, err)
	}
	seen := 0
	s.Parts = make([]Offsets, len(d.parts))
	index := make(map[int]int, len(d.parts))
	for i, p := range d.parts {
		index[p] = i
	}
	for _, p := range lo.Topics[d.Topic] {
		if p.Error != nil {
			return Sample{}, fmt.Errorf("downstream topic %s: partition %d: %w", d.Topic, p.Partition, p.Error)
		}
		first := d.first[p.Partition]
		if p.FirstOffset >= 0 {
			first = p.FirstOffset
		}
		c, ok := committed[p.Partition]
		if !ok || c < first {
			c = first
		}
		s.Committed += min(c, p.LastOffset)
		s.End += p.LastOffset
		i, ok := index[p.Partition]
		if !ok {
			return Sample{}, fmt.Errorf("downstream topic %s: end offsets of partition %d, not in its metadata", d.Topic, p.Partition)
		}
		s.Parts[i] = Offsets{Committed: min(c, p.LastOffset), End: p.LastOffset}
		seen++
	}
	if seen != len(d.parts) {
		return Sample{}, fmt.Errorf("downstream topic %s: end offsets of %d of %d partitions", d.Topic, seen, len(d.parts))
	}
	s.At = d.now()
	return s, nil
}

// readMeta reads the topic's partitions and their first offsets.
func (d *Downstream) readMeta(ctx context.Context) error {
	md, err := d.Client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{d.Topic}})
	if err != nil {
		return fmt.Errorf("downstream topic %s: metadata: %w", d.Topic, err)
	}
	if len(md.Topics) != 1 || md.Topics[0].Error != nil || len(md.Topics[0].Partitions) == 0 {
		if len(md.Topics) == 1 && md.Topics[0].Error != nil {
			return fmt.Errorf("downstream topic %s: %w", d.Topic, md.Topics[0].Error)
		}
		return fmt.Errorf("downstream topic %s: no partitions", d.Topic)
	}
	parts := make([]int, 0, len(md.Topics[0].Partitions))
	reqs := make([]kafka.OffsetRequest, 0, len(md.Topics[0].Partitions))
	for _, p := range md.Topics[0].Partitions {
		parts = append(parts, p.ID)
		reqs = append(reqs, kafka.FirstOffsetOf(p.ID))
	}
	lo, err := d.Client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{d.Topic: reqs}, IsolationLevel: kafka.ReadCommitted})
	if err != nil {
		return fmt.Errorf("downstream topic %s: first offsets: %w", d.Topic, err)
	}
	first := map[int]int64{}
	for _, p := range lo.Topics[d.Topic] {
		if p.Error != nil {
			return fmt.Errorf("downstream topic %s: partition %d: %w", d.Topic, p.Partition, p.Error)
		}
		first[p.Partition] = p.FirstOffset
	}
	slices.Sort(parts) // a sample's Parts are in this order: the same from read to read
	d.parts, d.first = parts, first
	return nil
}

func (d *Downstream) now() time.Time {
	if d.Clock != nil {
		return d.Clock()
	}
	return time.Now()
}

func groupErr(gs []kafka.DescribeGroupsResponseGroup) error {
	if len(gs) == 1 {
		return gs[0].Error
	}
	return errors.New("no description of the group")
}

func cmpDur(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
