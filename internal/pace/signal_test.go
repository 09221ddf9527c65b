package pace

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/metadata"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// TestDownstreamRead reads a real group's position: 30 events on a topic of
// two partitions, a group that committed 20 of them and left (no members),
// then one that never committed; and a topic that does not exist.
func TestDownstreamRead(t *testing.T) {
	addr := testenv.Kafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 10 * time.Second}
	topic := fmt.Sprintf("pace-%d", time.Now().UnixNano())
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 2, ReplicationFactor: 1}}})
	if err != nil || res.Errors[topic] != nil {
		t.Fatalf("create topic: %v %v", err, res)
	}
	defer client.DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	w := &kafka.Writer{Addr: kafka.TCP(addr), Topic: topic, Balancer: &kafka.RoundRobin{}, RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond}
	var msgs []kafka.Message
	for i := 0; i < 30; i++ {
		msgs = append(msgs, kafka.Message{Value: []byte("x")})
	}
	for {
		if err = w.WriteMessages(ctx, msgs...); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond) // the topic's leader is not known yet
	}
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	group := topic + "-down"
	if err := testenv.WarmUpGroupCoordinator(ctx, addr, group); err != nil {
		t.Fatal(err)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{addr}, GroupID: group, Topic: topic, StartOffset: kafka.FirstOffset})
	for i := 0; i < 20; i++ {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.CommitMessages(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	r.Close()

	// The broker's metadata lists the partitions in reverse (the order is
	// the broker's): the sample's are still in the order of their numbers.
	calls := &countingTransport{RoundTripper: kafka.DefaultTransport, reverse: true}
	counted := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 10 * time.Second, Transport: calls}
	d := &Downstream{Client: counted, Group: group, Topic: topic, Timeout: 5 * time.Second, MembersEvery: time.Hour}
	s, err := d.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.End != 30 || s.Committed != 20 || s.Members != 0 {
		t.Errorf("after the group left: %+v, want end 30, committed 20, no members", s)
	}
	// Per partition: the same offsets, one entry a partition, each end 15
	// (the writer took the partitions in turn), summing to the totals.
	var sum Offsets
	for _, o := range s.Parts {
		sum.Committed, sum.End = sum.Committed+o.Committed, sum.End+o.End
		if o.End != 15 || o.Committed > o.End {
			t.Errorf("a partition's offsets %+v, want end 15 and committed at most it", o)
		}
	}
	if len(s.Parts) != 2 || sum.Committed != s.Committed || sum.End != s.End {
		t.Errorf("per partition %+v, want two summing to committed %d, end %d", s.Parts, s.Committed, s.End)
	}
	if !slices.Equal(d.parts, []int{0, 1}) {
		t.Errorf("partitions %v from a metadata listing them in reverse, want [0 1]", d.parts)
	}
	// The next reads: the committed and the end offsets only (the
	// partitions, first offsets and members are not read again yet).
	first, s0 := calls.n.Load(), s
	for i := 0; i < 3; i++ {
		if s, err = d.Read(ctx); err != nil || s.End != 30 || s.Committed != 20 || s.Members != -1 {
			t.Fatalf("read again: %+v, %v; want end 30, committed 20, members not read (-1)", s, err)
		}
	}
	if n := calls.n.Load() - first; n != 6 {
		t.Errorf("three reads after the first made %d requests, want 6 (offset fetch, list offsets)", n)
	}
	t.Logf("requests: the first read %d, each next one %d", first, (calls.n.Load()-first)/3)
	d.Client = client
	c := NewController(Params{TargetWait: time.Second, Floor: 10, Ceiling: 100, Interval: time.Second, Hold: time.Minute}, 50)
	if e := c.Observe(s0); e.State != StateHeld || !strings.Contains(e.Reason, "no members") {
		t.Errorf("no members: %+v, want held", e)
	}
	d.Group = group + "-new"
	if s, err = d.Read(ctx); err != nil || s.Committed != 0 || s.End != 30 {
		t.Errorf("a group that never committed: %+v, %v; want committed 0 (the first offsets), end 30", s, err)
	}
	d.Topic = topic + "-missing"
	if _, err := d.Read(ctx); err == nil {
		t.Error("a missing topic read without an error")
	}
}

// countingTransport counts the requests made through it; reverse: it
// reverses the partitions of each topic in a metadata response.
type countingTransport struct {
	kafka.RoundTripper
	n       atomic.Int64
	reverse bool
}

func (c *countingTransport) RoundTrip(ctx context.Context, addr net.Addr, req kafka.Request) (kafka.Response, error) {
	c.n.Add(1)
	res, err := c.RoundTripper.RoundTrip(ctx, addr, req)
	if md, ok := res.(*metadata.Response); ok && c.reverse {
		for i := range md.Topics {
			slices.Reverse(md.Topics[i].Partitions)
		}
	}
	return res, err
}
