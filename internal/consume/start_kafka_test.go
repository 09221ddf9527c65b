package consume

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
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
// With once, only the first OffsetFetch is held back, and heldEnd and
// heldErr say when and how it ended.
type slowOffsetFetch struct {
	kafka.RoundTripper
	delay time.Duration
	once  bool

	mu                       sync.Mutex
	firstFetch, metaAnswered time.Time
	held                     int
	heldEnd                  time.Time
	heldErr                  error
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
		s.mu.Lock()
		s.held++
		hold := !s.once || s.held == 1
		s.mu.Unlock()
		res, err := s.RoundTripper.RoundTrip(ctx, addr, req)
		if !hold {
			return res, err
		}
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			err = ctx.Err()
		}
		if s.once {
			s.mu.Lock()
			s.heldEnd, s.heldErr = time.Now(), err
			s.mu.Unlock()
		}
		if ctx.Err() != nil {
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

// A partition stopped while its generation's start is not in yet does not
// start, even when the start is in too by then (a select between two ready
// channels picks one at random).
func TestGenerationStartWaitPrefersStop(t *testing.T) {
	start := &generationStart{ready: make(chan struct{})}
	close(start.ready)
	stop, cancel := context.WithCancel(context.Background())
	if !start.wait(stop) {
		t.Fatal("wait = false with the start in and stop not done, want true")
	}
	cancel()
	for i := range 200 {
		if start.wait(stop) {
			t.Fatalf("wait = true on try %d with stop done, want false", i+1)
		}
	}
}

// The fence is kept while the commit metadata is read: a read that outlasts
// the fence's first end (three quarters of the session after the first
// heartbeat's answer; a coordinator still loading its groups answers
// late) leaves it open, and the generation goes on. Before, the keeper's
// heartbeats started only once the metadata was in, by then the fence had
// ended, and so did the generation.
func TestKafkaFenceKeptWhileCommitMetadataIsRead(t *testing.T) {
	broker := testenv.Kafka(t)
	topic, group := createTopic(t, broker), uniqueName(t, "group")
	produce(t, broker, topic, values(30, "slow"))
	end := endOffsets(t, broker, topic)

	s := newSeen(t)
	// Held longer than the fence's first end (4.5 s of the 6 s session).
	d, tr, gens := heldMetadataMember(t, broker, group, topic, 10*time.Second, 6*time.Second, s)
	stop := runInBackground(t, d.Run)
	eventually(t, 30*time.Second, "every message handled", func() bool { return s.covers(end) })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	_, answered := tr.times()
	t.Logf("commit metadata held back %v; generations: %d", tr.delay, gens.Load())
	if answered.IsZero() {
		t.Fatal("the commit metadata was never answered")
	}
	if n := gens.Load(); n != 1 {
		t.Errorf("%d generations, want 1: the fence ended while the commit metadata was read", n)
	}
	wantCommittedAtEnd(t, broker, group, topic)
}

// A generation that ends while its commit metadata is read stops the read:
// it belonged to the generation, and went on for up to a session (its
// retries) after it, beside the next generation's own.
func TestKafkaGenerationEndStopsCommitMetadataRead(t *testing.T) {
	broker := testenv.Kafka(t)
	topic, group := createTopic(t, broker), uniqueName(t, "group")
	produce(t, broker, topic, values(30, "end"))
	end := endOffsets(t, broker, topic)

	s := newSeen(t)
	a, tr, gens := heldMetadataMember(t, broker, group, topic, 30*time.Second, time.Minute, s)
	stopA := runInBackground(t, a.Run)
	eventually(t, 30*time.Second, "the first commit metadata read held", func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return tr.held == 1
	})

	// A second member ends the first generation.
	cfgB := DelayedConfig{Config: testConfig(t, broker, group, topic), ReleaseAt: releaseByHeader}
	b, err := NewDelayed(cfgB, seenHandler(s))
	if err != nil {
		t.Fatalf("NewDelayed: %v", err)
	}
	joined := time.Now()
	stopB := runInBackground(t, b.Run)
	eventually(t, 30*time.Second, "every message handled", func() bool { return s.covers(end) })
	eventually(t, 30*time.Second, "the held read ended", func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return !tr.heldEnd.IsZero()
	})
	for _, stop := range []func() error{stopB, stopA} {
		if err := stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	tr.mu.Lock()
	ended, herr := tr.heldEnd, tr.heldErr
	tr.mu.Unlock()
	t.Logf("the first generation's commit metadata read ended %v after the second member started (%v); generations of the first: %d",
		ended.Sub(joined).Round(time.Millisecond), herr, gens.Load())
	if gens.Load() < 2 {
		t.Errorf("the first member saw %d generations, want 2 or more", gens.Load())
	}
	if !errors.Is(herr, kafka.ErrGenerationEnded) {
		t.Errorf("the held read ended with %v, want %v", herr, kafka.ErrGenerationEnded)
	}
	wantCommittedAtEnd(t, broker, group, topic)
}

// heldMetadataMember returns a retry-tier member of group whose calls time
// out after timeout and whose first OffsetFetch is held back for hold,
// handing what it handles to s; gens counts its generations.
func heldMetadataMember(t *testing.T, broker, group, topic string, timeout, hold time.Duration, s *seen) (d *Delayed, tr *slowOffsetFetch, gens *atomic.Int32) {
	t.Helper()
	cfg := DelayedConfig{Config: testConfig(t, broker, group, topic), ReleaseAt: releaseByHeader}
	cfg.Timeout = timeout
	tr = &slowOffsetFetch{RoundTripper: &kafka.Transport{}, delay: hold, once: true}
	cfg.Transport = tr
	d, err := NewDelayed(cfg, seenHandler(s))
	if err != nil {
		t.Fatalf("NewDelayed: %v", err)
	}
	gens = new(atomic.Int32)
	d.m.onGeneration = func(*kafka.Generation) { gens.Add(1) }
	return d, tr, gens
}

// seenHandler is a Handler that adds what it handles to s.
func seenHandler(s *seen) Handler {
	return onMessages(func(_ context.Context, msgs []kafka.Message) error {
		s.add(msgs)
		return nil
	})
}
