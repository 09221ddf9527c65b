package route

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
	produceAPI "github.com/segmentio/kafka-go/protocol/produce"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
)

// cutTransport is a network that can be cut: metadata requests are answered
// (one partition per topic); while cut, a produce request hangs until its
// context ends and then fails the way a lost connection does (a transient
// error kafka-go's Writer retries on its own); otherwise it lands and is
// counted. Safe for concurrent use.
type cutTransport struct {
	mu     sync.Mutex
	cut    bool
	landed int
}

func (c *cutTransport) setCut(cut bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cut = cut
}

func (c *cutTransport) landedCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.landed
}

func (c *cutTransport) RoundTrip(ctx context.Context, _ net.Addr, req kafka.Request) (kafka.Response, error) {
	if m, ok := req.(*metadataAPI.Request); ok {
		r := &metadataAPI.Response{}
		for _, t := range m.TopicNames {
			r.Topics = append(r.Topics, metadataAPI.ResponseTopic{Name: t, Partitions: make([]metadataAPI.ResponsePartition, 1)})
		}
		return r, nil
	}
	p := req.(*produceAPI.Request)
	c.mu.Lock()
	cut := c.cut
	if !cut {
		c.landed++
	}
	c.mu.Unlock()
	if cut {
		<-ctx.Done()
		return nil, io.ErrUnexpectedEOF
	}
	r := &produceAPI.Response{}
	for _, t := range p.Topics {
		r.Topics = append(r.Topics, produceAPI.ResponseTopic{Topic: t.Topic, Partitions: []produceAPI.ResponsePartition{{}}})
	}
	return r, nil
}

// A zombie's write: a write made while the network is cut fails for its
// caller, but kafka-go's Writer keeps the batch and retries it on its own.
// Through a plain writer it lands once the network returns, after the
// partition's next owner may have written the same event; through a
// FencedWriter whose fence ended meanwhile it never does, and later writes
// of that generation fail at once with consume.ErrFenced.
func TestFencedWriterDropsTheZombiesWrites(t *testing.T) {
	opts := func(ct *cutTransport) WriterOptions {
		return WriterOptions{Transport: ct, WriteTimeout: 100 * time.Millisecond, ReadTimeout: time.Second}
	}
	brokers := []string{"127.0.0.1:1"}
	for _, tc := range []struct {
		name       string
		fenced     bool
		wantLanded int
	}{
		{"plain writer: the queued write lands after the cut", false, 1},
		{"fenced writer: nothing lands after the fence ended", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ct := &cutTransport{cut: true}
			fence := consume.NewOpenWriteFence()
			ctx := consume.WithFence(context.Background(), fence)
			var w Writer
			if tc.fenced {
				fw := NewFencedWriter(brokers, opts(ct))
				defer fw.Close()
				w = fw
			} else {
				kw := NewKafkaWriter(brokers, opts(ct))
				defer kw.Close()
				w = kw
			}
			wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			err := w.WriteMessages(wctx, kafka.Message{Topic: "out", Value: []byte("v")})
			cancel()
			if err == nil {
				t.Fatal("a write while the network is cut: got nil, want an error")
			}
			fence.Close("test: the generation is over")
			ct.setCut(false)
			// kafka-go's Writer backs off at most 1s between attempts.
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) && ct.landedCount() < tc.wantLanded+1 {
				time.Sleep(50 * time.Millisecond)
			}
			if got := ct.landedCount(); got != tc.wantLanded {
				t.Errorf("produce requests that landed after the network returned: got %d, want %d", got, tc.wantLanded)
			}
			if !tc.fenced {
				return
			}
			err = w.WriteMessages(ctx, kafka.Message{Topic: "out", Value: []byte("v2")})
			if !errors.Is(err, consume.ErrFenced) {
				t.Errorf("a write after the fence ended: got %v, want consume.ErrFenced", err)
			}
			if got := ct.landedCount(); got != 0 {
				t.Errorf("after a fenced write: got %d produce requests landed, want 0", got)
			}
		})
	}
}

// While its fence is open, a FencedWriter writes as a plain writer does, and
// a write without a fence (a context from no consumer) goes out too.
func TestFencedWriterWritesWhileOpen(t *testing.T) {
	ct := &cutTransport{}
	fw := NewFencedWriter([]string{"127.0.0.1:1"}, WriterOptions{Transport: ct})
	defer fw.Close()
	fence := consume.NewOpenWriteFence()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := fw.WriteMessages(consume.WithFence(ctx, fence), kafka.Message{Topic: "out", Value: []byte("a")}); err != nil {
		t.Fatalf("write with an open fence: %v", err)
	}
	if err := fw.WriteMessages(ctx, kafka.Message{Topic: "out", Value: []byte("b")}); err != nil {
		t.Fatalf("write without a fence: %v", err)
	}
	if got := ct.landedCount(); got != 2 {
		t.Errorf("got %d produce requests landed, want 2", got)
	}
	fence.Close("test")
	if err := fw.WriteMessages(consume.WithFence(ctx, fence), kafka.Message{Topic: "out", Value: []byte("c")}); !errors.Is(err, consume.ErrFenced) {
		t.Errorf("write after the fence ended: got %v, want consume.ErrFenced", err)
	}
}

// lateAnswer is a network on which a produce request's fence ends while the
// request is in flight, as for a process paused (SIGSTOP) after sending it
// and resumed past its fence's end: the request lands, the fence is closed,
// and the answer comes delay later, unless the request is cancelled first
// (delay < 0: it never comes). Metadata is answered as by cutTransport.
type lateAnswer struct {
	fence  *consume.WriteFence
	delay  time.Duration
	mu     sync.Mutex
	landed int
}

func (l *lateAnswer) RoundTrip(ctx context.Context, addr net.Addr, req kafka.Request) (kafka.Response, error) {
	if _, ok := req.(*produceAPI.Request); !ok {
		return (&cutTransport{}).RoundTrip(ctx, addr, req)
	}
	l.mu.Lock()
	l.landed++
	l.mu.Unlock()
	l.fence.Close("test: paused past the fence's end")
	if l.delay >= 0 {
		select {
		case <-time.After(l.delay):
			return (&cutTransport{}).RoundTrip(ctx, addr, req)
		case <-ctx.Done():
		}
	} else {
		<-ctx.Done()
	}
	return nil, io.ErrUnexpectedEOF
}

// A produce request in flight when its fence ends gets its answer if it
// comes within inFlightGrace: the write landed, and reporting it failed
// would have the batch handled again by the next owner (duplicates; before,
// the request was cancelled at once and the write failed). An answer that
// does not come is still cut off soon after, not at the write's timeout.
func TestFencedWriterReadsAnAnswerOnItsWay(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration
	}{
		{"the answer comes 10ms after the fence ended", 10 * time.Millisecond},
		{"no answer comes", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fence := consume.NewOpenWriteFence()
			lt := &lateAnswer{fence: fence, delay: tc.delay}
			fw := NewFencedWriter([]string{"127.0.0.1:1"}, WriterOptions{Transport: lt, WriteTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second})
			defer fw.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			err := fw.WriteMessages(consume.WithFence(ctx, fence), kafka.Message{Topic: "out", Value: []byte("a")})
			took := time.Since(start)
			lt.mu.Lock()
			landed := lt.landed
			lt.mu.Unlock()
			if landed != 1 {
				t.Fatalf("produce requests sent: %d, want 1", landed)
			}
			if tc.delay >= 0 && err != nil {
				t.Errorf("write answered %v after its fence ended: got %v, want nil (it landed)", tc.delay, err)
			}
			if tc.delay < 0 && (!errors.Is(err, consume.ErrFenced) || took > 2*time.Second) {
				t.Errorf("write never answered: got %v after %v, want consume.ErrFenced within about %v", err, took.Round(time.Millisecond), inFlightGrace)
			}
		})
	}
}
