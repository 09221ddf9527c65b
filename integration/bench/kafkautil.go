package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

// kafkaAdmin does the driver's own Kafka chores: topics, offsets, reads.
type kafkaAdmin struct {
	brokers []string
	client  *kafka.Client
}

func newKafkaAdmin(brokers []string) *kafkaAdmin {
	return &kafkaAdmin{brokers: brokers, client: &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second}}
}

// createTopics creates topics with the given partitions; logAppend sets
// message.timestamp.type=LogAppendTime (the broker stamps each append). It
// waits until every partition has a leader.
func (a *kafkaAdmin) createTopics(ctx context.Context, partitions int, logAppend bool, topics ...string) error {
	var cfgs []kafka.TopicConfig
	for _, t := range topics {
		c := kafka.TopicConfig{Topic: t, NumPartitions: partitions, ReplicationFactor: 1}
		if logAppend {
			c.ConfigEntries = []kafka.ConfigEntry{{ConfigName: "message.timestamp.type", ConfigValue: "LogAppendTime"}}
		}
		cfgs = append(cfgs, c)
	}
	res, err := a.client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: cfgs})
	if err != nil {
		return fmt.Errorf("create topics: %w", err)
	}
	for _, t := range topics {
		if err := res.Errors[t]; err != nil {
			return fmt.Errorf("create topic %s: %w", t, err)
		}
	}
	for _, t := range topics {
		if err := a.waitReady(ctx, t, partitions); err != nil {
			return err
		}
	}
	return nil
}

func (a *kafkaAdmin) waitReady(ctx context.Context, topic string, partitions int) error {
	var last error
	for {
		conn, err := kafka.DialContext(ctx, "tcp", a.brokers[0])
		if err == nil {
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			var parts []kafka.Partition
			parts, err = conn.ReadPartitions(topic)
			conn.Close()
			if err == nil && len(parts) == partitions {
				ok := true
				for _, p := range parts {
					ok = ok && p.Leader.Host != ""
				}
				if ok {
					return nil
				}
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s not ready (last error: %v): %w", topic, last, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// deleteTopics deletes topics, ignoring ones that do not exist, and waits
// until the broker no longer knows them (deletion is asynchronous: a topic
// of the same name created or used too early would vanish under its
// consumers).
func (a *kafkaAdmin) deleteTopics(ctx context.Context, topics ...string) error {
	if err := a.deleteTopicsAsync(ctx, topics...); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for _, t := range topics {
		for {
			conn, err := kafka.DialContext(ctx, "tcp", a.brokers[0])
			if err != nil {
				return err
			}
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			parts, err := conn.ReadPartitions(t)
			conn.Close()
			if errors.Is(err, kafka.UnknownTopicOrPartition) || err == nil && len(parts) == 0 {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("topic %s still there a minute after its deletion (last error: %v)", t, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}

func (a *kafkaAdmin) deleteTopicsAsync(ctx context.Context, topics ...string) error {
	if len(topics) == 0 {
		return nil
	}
	res, err := a.client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: topics})
	if err != nil {
		return fmt.Errorf("delete topics: %w", err)
	}
	var errs []error
	for _, t := range topics {
		if err := res.Errors[t]; err != nil && !errors.Is(err, kafka.UnknownTopicOrPartition) {
			errs = append(errs, fmt.Errorf("delete topic %s: %w", t, err))
		}
	}
	return errors.Join(errs...)
}

// ends returns the end offset (high watermark) of each partition of topic;
// a topic that does not exist has none. Errors a new topic's metadata gives
// for a while (no leader yet) are retried for up to 30 seconds.
func (a *kafkaAdmin) ends(ctx context.Context, topic string, partitions int) (map[int]int64, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := a.endsOnce(ctx, topic, partitions)
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) ||
			!(errors.Is(err, kafka.NotLeaderForPartition) || errors.Is(err, kafka.LeaderNotAvailable)) {
			return out, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (a *kafkaAdmin) endsOnce(ctx context.Context, topic string, partitions int) (map[int]int64, error) {
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for p := 0; p < partitions; p++ {
		req.Topics[topic] = append(req.Topics[topic], kafka.LastOffsetOf(p))
	}
	res, err := a.client.ListOffsets(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("list offsets of %s: %w", topic, err)
	}
	out := map[int]int64{}
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			if errors.Is(po.Error, kafka.UnknownTopicOrPartition) {
				return map[int]int64{}, nil
			}
			return nil, fmt.Errorf("list offsets of %s/%d: %w", topic, po.Partition, po.Error)
		}
		out[po.Partition] = po.LastOffset
	}
	return out, nil
}

// total sums the end offsets of topics.
func (a *kafkaAdmin) total(ctx context.Context, partitions int, topics ...string) (int64, error) {
	var n int64
	for _, t := range topics {
		e, err := a.ends(ctx, t, partitions)
		if err != nil {
			return 0, err
		}
		for _, o := range e {
			n += o
		}
	}
	return n, nil
}

// record is what the driver reads back from an output topic.
type record struct {
	Partition int
	Offset    int64
	// Time is the append time on a LogAppendTime topic. (kafka-go's reader
	// ignores the batch's timestamp type and returns the producer's time, so
	// the driver reads with franz-go, which honours it.)
	Time    time.Time
	Headers map[string]string
}

// read returns the records of topic in [from[p], to[p]) for each partition p.
func (a *kafkaAdmin) read(ctx context.Context, topic string, from, to map[int]int64) ([]record, error) {
	offsets := map[int32]kgo.Offset{}
	left := 0
	for p, f := range from {
		if f < to[p] {
			offsets[int32(p)] = kgo.NewOffset().At(f)
			left += int(to[p] - f)
		}
	}
	if left == 0 {
		return nil, nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(a.brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}),
		kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out := make([]record, 0, left)
	for left > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return out, fmt.Errorf("read %s: %d records missing: %w", topic, left, err)
		}
		for _, fe := range fs.Errors() {
			return out, fmt.Errorf("read %s/%d: %w", fe.Topic, fe.Partition, fe.Err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			p := int(r.Partition)
			if r.Offset < from[p] || r.Offset >= to[p] {
				return
			}
			h := map[string]string{}
			for _, x := range r.Headers {
				h[x.Key] = string(x.Value)
			}
			out = append(out, record{Partition: p, Offset: r.Offset, Time: r.Timestamp, Headers: h})
			left--
		})
	}
	return out, nil
}

// appendSpan returns the earliest and the latest append time among the
// records of topics below the end offsets given (per topic, per
// partition): it reads the first and the last record of each partition.
func (a *kafkaAdmin) appendSpan(ctx context.Context, ends map[string]map[int]int64) (first, last time.Time, err error) {
	for topic, parts := range ends {
		firsts, lasts, ones := map[int]int64{}, map[int]int64{}, map[int]int64{}
		for p, end := range parts {
			if end > 0 {
				firsts[p], ones[p], lasts[p] = 0, 1, end-1
			}
		}
		rs, err := a.read(ctx, topic, firsts, ones)
		if err != nil {
			return first, last, err
		}
		rs2, err := a.read(ctx, topic, lasts, parts)
		if err != nil {
			return first, last, err
		}
		for _, r := range append(rs, rs2...) {
			if first.IsZero() || r.Time.Before(first) {
				first = r.Time
			}
			if r.Time.After(last) {
				last = r.Time
			}
		}
	}
	if first.IsZero() {
		return first, last, errors.New("no records in the output topics")
	}
	return first, last, nil
}
