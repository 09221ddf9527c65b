package consume

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// A partition whose look-ahead is full of messages due later reads on to a
// message due sooner behind them: it is released at its time, before any of
// them, and not when enough of them have been released. The messages passed
// over are read again and released too, each once, never early, and the
// partition is committed to its end, through a handover: the first member
// leaves once the near message is handled, with messages passed over, and a
// second one takes the partition.
func TestKafkaDelayedNearBehindFullLookAhead(t *testing.T) {
	broker := testenv.Kafka(t)
	topic, group := createTopic(t, broker), uniqueName(t, "group")
	const (
		far       = 300
		lookAhead = 64 << 10 // about 50 of the far messages
	)
	t0 := time.Now()
	// Release times go in headers in milliseconds.
	farAt, nearAt := time.UnixMilli(t0.Add(8*time.Second).UnixMilli()), time.UnixMilli(t0.Add(3*time.Second).UnixMilli())
	var msgs []kafka.Message
	for i := range far {
		m := kafka.Message{Key: []byte(fmt.Sprint(i)), Value: append([]byte(fmt.Sprintf("far-%d-", i)), bytes.Repeat([]byte("x"), 1000)...)}
		msgs = append(msgs, withRelease(m, farAt))
	}
	msgs = append(msgs, withRelease(kafka.Message{Key: []byte("near"), Value: []byte("near")}, nearAt))
	produceWith(t, broker, topic, kafka.BalancerFunc(func(kafka.Message, ...int) int { return 0 }), msgs)
	end := endOffsets(t, broker, topic)

	var waiting, passed atomic.Int64
	var mu sync.Mutex
	handled := map[string]time.Time{}
	var firstFar time.Time
	s := newSeen(t)
	cfg := DelayedConfig{
		Config:         testConfig(t, broker, group, topic),
		ReleaseAt:      releaseByHeader,
		LookAheadBytes: lookAhead,
		OnWaiting:      func(_ string, d int) { waiting.Add(int64(d)) },
		OnPassedOver:   func(_ string, n int) { passed.Add(int64(n)) },
	}
	cfg.MaxBytes = lookAhead
	h := onMessages(func(_ context.Context, msgs []kafka.Message) error {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			if at := releaseAtHeader(m); now.Before(at) {
				t.Errorf("offset %d handled %v before its release time", m.Offset, at.Sub(now))
			}
			if string(m.Value) != "near" && firstFar.IsZero() {
				firstFar = now
			}
			handled[string(m.Value)] = now
		}
		s.add(msgs)
		return nil
	})
	for i, until := range []func() bool{
		func() bool { mu.Lock(); defer mu.Unlock(); _, ok := handled["near"]; return ok },
		func() bool { return s.covers(end) },
	} {
		d, err := NewDelayed(cfg, h)
		if err != nil {
			t.Fatalf("NewDelayed: %v", err)
		}
		stop := runInBackground(t, d.Run)
		eventually(t, 60*time.Second, fmt.Sprintf("member %d done", i+1), until)
		if err := stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if i == 0 && passed.Load() == 0 {
			t.Error("nothing passed over before the near message was handled")
		}
	}

	mu.Lock()
	defer mu.Unlock()
	near, ok := handled["near"]
	if !ok {
		t.Fatal("the near message was not handled")
	}
	t.Logf("near message handled %v after its release time; the first far one %v after theirs; %d passed over",
		near.Sub(nearAt).Round(time.Millisecond), firstFar.Sub(farAt).Round(time.Millisecond), passed.Load())
	if !near.Before(firstFar) {
		t.Errorf("the near message (release +3s) was handled at %v, after the first far one (release +8s) at %v: it waited behind them",
			near.Sub(t0).Round(time.Millisecond), firstFar.Sub(t0).Round(time.Millisecond))
	}
	if passed.Load() == 0 {
		t.Error("nothing passed over")
	}
	if dups := s.dups(); len(dups) > 0 {
		t.Errorf("handled more than once: %v", dups)
	}
	if got := waiting.Load(); got != 0 {
		t.Errorf("waiting gauge = %d after Run returned, want 0", got)
	}
	if got := committedOffsets(t, broker, group, topic)[0]; got != end[0] {
		t.Errorf("committed offset %d, want the end %d", got, end[0])
	}
}
