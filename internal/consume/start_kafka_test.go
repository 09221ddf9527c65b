package consume

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	fetchAPI "github.com/segmentio/kafka-go/protocol/fetch"
	offsetfetchAPI "github.com/segmentio/kafka-go/protocol/offsetfetch"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// slowOffsetFetch is a kafka.Transport whose OffsetFetch answers come back
// after delay (the coordinator loading its groups after a broker restart);
// it records when the first Fetch went out and when the first OffsetFetch
// was answered.
type slowOffsetFetch struct {
	kafka.RoundTripper
	delay time.Duration

	mu                       sync.Mutex
	firstFetch, metaAnswered time.Time
}

func (s *slowOffsetFetch) RoundTrip(ctx context.Context, addr net.Addr, req kafka.Request) (kafka.Response, error) {
	switch req.(type) {
	case *fetchAPI.Request:
		s.mu.Lock()
		if s.firstFetch.IsZero() {
			s.firstFetch = time.Now()
		}
		s.mu.Unlock()
	case *offsetfetchAPI.Request:
		res, err := s.RoundTripper.RoundTrip(ctx, addr, req)
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		s.mu.Lock()
		if s.metaAnswered.IsZero() {
			s.metaAnswered = time.Now()
		}
		s.mu.Unlock()
		return res, err
	}
	return s.RoundTripper.RoundTrip(ctx, addr, req)
}

func (s *slowOffsetFetch) times() (firstFetch, metaAnswered time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.firstFetch, s.metaAnswered
}

// A retry tier's partitions send their first fetch while the metadata of the
// last commits is read, and handle nothing before it is in (its done set
// says what not to hand over again). After a broker restart that read took
// up to 0.7 s, and the first fetch waited for it.
func TestKafkaFirstFetchWhileCommitMetadataIsRead(t *testing.T) {
	broker := testenv.Kafka(t)
	topic, group := createTopic(t, broker), uniqueName(t, "group")
	produce(t, broker, topic, values(30, "start"))
	end := endOffsets(t, broker, topic)

	tr := &slowOffsetFetch{RoundTripper: &kafka.Transport{}, delay: time.Second}
	cfg := DelayedConfig{Config: testConfig(t, broker, group, topic), ReleaseAt: releaseByHeader}
	cfg.Transport = tr
	s := newSeen(t)
	var mu sync.Mutex
	var firstHandled time.Time
	d, err := NewDelayed(cfg, onMessages(func(_ context.Context, msgs []kafka.Message) error {
		mu.Lock()
		if firstHandled.IsZero() {
			firstHandled = time.Now()
		}
		mu.Unlock()
		s.add(msgs)
		return nil
	}))
	if err != nil {
		t.Fatalf("NewDelayed: %v", err)
	}
	stop := runInBackground(t, d.Run)
	eventually(t, 30*time.Second, "every message handled", func() bool { return s.covers(end) })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	fetched, answered := tr.times()
	mu.Lock()
	handled := firstHandled
	mu.Unlock()
	t.Logf("first fetch %v before the commit metadata was in, first batch handled %v after it",
		answered.Sub(fetched).Round(time.Millisecond), handled.Sub(answered).Round(time.Millisecond))
	if fetched.IsZero() || answered.IsZero() {
		t.Fatalf("first fetch at %v, commit metadata answered at %v: want both", fetched, answered)
	}
	if !fetched.Before(answered) {
		t.Errorf("the first fetch went out %v after the commit metadata was in, want before", fetched.Sub(answered))
	}
	if handled.Before(answered) {
		t.Errorf("the first batch was handled %v before the commit metadata was in", answered.Sub(handled))
	}
	wantCommittedAtEnd(t, broker, group, topic)
}
