package testenv

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

// WarmUpGroupCoordinator waits until consumer-group requests succeed on the
// broker at addr. On a fresh broker the first group request creates
// __consumer_offsets, and until its partitions are loaded group requests fail
// with NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS; kafka-go's Reader
// gives up after MaxAttempts joins, so tests would fail depending on their
// order. group is the (empty) group the requests name.
func WarmUpGroupCoordinator(ctx context.Context, addr, group string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 5 * time.Second, Transport: &kafka.Transport{}}
	defer c.Transport.(*kafka.Transport).CloseIdleConnections()
	for {
		res, err := c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{}})
		if err == nil {
			err = res.Error
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready after a minute: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ReadTopic returns every record of topic on the broker at addr, from the
// first offset of each partition up to its end offset when called. It reads
// with franz-go, whose r.Timestamp is the broker's append time on a
// LogAppendTime topic (kafka-go's reader returns the producer's time).
func ReadTopic(ctx context.Context, addr, topic string) ([]*kgo.Record, error) {
	from, end, left, err := topicRange(ctx, addr, topic)
	if err != nil || left == 0 {
		return nil, err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("franz-go client: %w", err)
	}
	defer cl.Close()
	var out []*kgo.Record
	for left > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("read %s: %d messages left: %w", topic, left, ctx.Err())
		}
		if err := fs.Err(); err != nil {
			return nil, fmt.Errorf("read %s: %w", topic, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset < end[r.Partition] {
				left--
				out = append(out, r)
			}
		})
	}
	return out, nil
}

// topicRange returns, for each non-empty partition of topic, the offset to
// read from and the end offset, and how many records lie between.
func topicRange(ctx context.Context, addr, topic string) (map[int32]kgo.Offset, map[int32]int64, int, error) {
	conn, err := kafka.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, 0, err
	}
	parts, err := conn.ReadPartitions(topic)
	conn.Close()
	if err != nil {
		return nil, nil, 0, fmt.Errorf("partitions of %s: %w", topic, err)
	}
	from := map[int32]kgo.Offset{}
	end := map[int32]int64{}
	left := 0
	for _, p := range parts {
		pc, err := kafka.DialLeader(ctx, "tcp", addr, topic, p.ID)
		if err != nil {
			return nil, nil, 0, err
		}
		first, last, err := pc.ReadOffsets()
		pc.Close()
		if err != nil {
			return nil, nil, 0, fmt.Errorf("offsets of %s/%d: %w", topic, p.ID, err)
		}
		if last > first {
			from[int32(p.ID)] = kgo.NewOffset().At(first)
			end[int32(p.ID)] = last
			left += int(last - first)
		}
	}
	return from, end, left, nil
}
