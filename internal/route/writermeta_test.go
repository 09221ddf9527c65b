package route

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
	produceAPI "github.com/segmentio/kafka-go/protocol/produce"
)

// countingTransport answers metadata requests with partitions partitions
// (or err) and counts the requests by type. Safe for concurrent use.
type countingTransport struct {
	mu         sync.Mutex
	meta, rest int
	partitions int
	errCode    int16
	err        error
}

func (c *countingTransport) RoundTrip(_ context.Context, _ net.Addr, req kafka.Request) (kafka.Response, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, ok := req.(*metadataAPI.Request)
	if !ok {
		c.rest++
		return &produceAPI.Response{}, nil
	}
	c.meta++
	if c.err != nil {
		return nil, c.err
	}
	r := &metadataAPI.Response{}
	for _, t := range m.TopicNames {
		r.Topics = append(r.Topics, metadataAPI.ResponseTopic{Name: t, ErrorCode: c.errCode,
			Partitions: make([]metadataAPI.ResponsePartition, c.partitions)})
	}
	return r, nil
}

// The writer's per-message metadata requests are answered from one response
// per topic for metadataTTL; other requests, topic creation, failures and
// error answers always go through.
func TestMetadataCache(t *testing.T) {
	ctx := context.Background()
	next := &countingTransport{partitions: 6}
	c := newMetadataCache(next)
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	ask := func(topic string, create bool) *metadataAPI.Response {
		t.Helper()
		r, err := c.RoundTrip(ctx, nil, &metadataAPI.Request{TopicNames: []string{topic}, AllowAutoTopicCreation: create})
		if err != nil {
			t.Fatal(err)
		}
		return r.(*metadataAPI.Response)
	}
	for range 1000 {
		if got := len(ask("out", false).Topics[0].Partitions); got != 6 {
			t.Fatalf("got %d partitions, want 6", got)
		}
	}
	ask("dlq", false)
	if next.meta != 2 {
		t.Errorf("1000 requests for one topic and one for another: got %d metadata requests through, want 2", next.meta)
	}
	next.partitions = 12
	now = now.Add(metadataTTL - time.Millisecond)
	if got := len(ask("out", false).Topics[0].Partitions); got != 6 {
		t.Errorf("within the TTL: got %d partitions, want the cached 6", got)
	}
	now = now.Add(time.Millisecond)
	if got := len(ask("out", false).Topics[0].Partitions); got != 12 {
		t.Errorf("after the TTL: got %d partitions, want the new 12", got)
	}
	before := next.meta
	ask("new", true)
	ask("new", true)
	if next.meta != before+2 {
		t.Errorf("topic creation: got %d requests through, want 2", next.meta-before)
	}
	if _, err := c.RoundTrip(ctx, nil, &produceAPI.Request{}); err != nil || next.rest != 1 {
		t.Errorf("produce: got err %v, %d requests through, want nil, 1", err, next.rest)
	}
	next.errCode = int16(kafka.UnknownTopicOrPartition)
	before = next.meta
	ask("gone", false)
	ask("gone", false)
	if next.meta != before+2 {
		t.Errorf("an error answer was cached: got %d requests through, want 2", next.meta-before)
	}
	next.err = errors.New("broker down")
	now = now.Add(metadataTTL)
	if _, err := c.RoundTrip(ctx, nil, &metadataAPI.Request{TopicNames: []string{"out"}}); err == nil {
		t.Error("a failed request after the TTL: got no error, want the transport's")
	}
}
