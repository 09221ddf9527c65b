package pace

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// Downstream reads the downstream group's position on the downstream topic.
// Safe for concurrent use.
type Downstream struct {
	Client  *kafka.Client
	Group   string
	Topic   string
	Timeout time.Duration // bound of each read; default 5s
	Clock   func() time.Time
}

// Read returns a sample: the group's committed offsets and the topic's end
// offsets, summed over the topic's partitions, and the group's members. A
// partition the group never committed counts from its first offset.
func (d *Downstream) Read(ctx context.Context) (Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, cmpDur(d.Timeout, 5*time.Second))
	defer cancel()
	md, err := d.Client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{d.Topic}})
	if err != nil {
		return Sample{}, fmt.Errorf("downstream topic %s: metadata: %w", d.Topic, err)
	}
	if len(md.Topics) != 1 || md.Topics[0].Error != nil || len(md.Topics[0].Partitions) == 0 {
		if len(md.Topics) == 1 && md.Topics[0].Error != nil {
			return Sample{}, fmt.Errorf("downstream topic %s: %w", d.Topic, md.Topics[0].Error)
		}
		return Sample{}, fmt.Errorf("downstream topic %s: no partitions", d.Topic)
	}
	var parts []int
	var reqs []kafka.OffsetRequest
	for _, p := range md.Topics[0].Partitions {
		parts = append(parts, p.ID)
		reqs = append(reqs, kafka.FirstOffsetOf(p.ID), kafka.LastOffsetOf(p.ID))
	}
	desc, err := d.Client.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{d.Group}})
	if err != nil {
		return Sample{}, fmt.Errorf("downstream group %s: describe: %w", d.Group, err)
	}
	if len(desc.Groups) != 1 || desc.Groups[0].Error != nil {
		return Sample{}, fmt.Errorf("downstream group %s: describe: %w", d.Group, groupErr(desc.Groups))
	}
	of, err := d.Client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: d.Group, Topics: map[string][]int{d.Topic: parts}})
	if err == nil && of.Error != nil {
		err = of.Error
	}
	if err != nil {
		return Sample{}, fmt.Errorf("downstream group %s: committed offsets: %w", d.Group, err)
	}
	lo, err := d.Client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{d.Topic: reqs}, IsolationLevel: kafka.ReadCommitted})
	if err != nil {
		return Sample{}, fmt.Errorf("downstream topic %s: end offsets: %w", d.Topic, err)
	}
	committed := map[int]int64{}
	for _, p := range of.Topics[d.Topic] {
		if p.Error != nil {
			return Sample{}, fmt.Errorf("downstream group %s: partition %d: %w", d.Group, p.Partition, p.Error)
		}
		committed[p.Partition] = p.CommittedOffset
	}
	s := Sample{At: d.now(), Members: len(desc.Groups[0].Members)}
	seen := 0
	for _, p := range lo.Topics[d.Topic] {
		if p.Error != nil {
			return Sample{}, fmt.Errorf("downstream topic %s: partition %d: %w", d.Topic, p.Partition, p.Error)
		}
		c, ok := committed[p.Partition]
		if !ok || c < p.FirstOffset {
			c = p.FirstOffset
		}
		s.Committed += min(c, p.LastOffset)
		s.End += p.LastOffset
		seen++
	}
	if seen != len(parts) {
		return Sample{}, fmt.Errorf("downstream topic %s: end offsets of %d of %d partitions", d.Topic, seen, len(parts))
	}
	return s, nil
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
