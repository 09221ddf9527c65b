package route

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	produceAPI "github.com/segmentio/kafka-go/protocol/produce"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
)

// FencedWriter is the Writer of the gating path: it writes each batch through
// a kafka.Writer of its own for the generation that handed the batch over
// (consume.FenceOf of the write's context), whose produce requests go out
// only while that generation's fence is open (see consume's fence.go). When
// the fence ends, the requests in flight are cancelled, the writes still
// queued or retried inside kafka-go's Writer fail at once instead of landing
// when the network returns, and that writer is closed. So a member cut off
// from Kafka writes nothing after a new owner of its partitions may have
// handled the same messages.
//
// A write whose context carries no fence (tests, tools) goes through a
// shared writer without one. Safe for concurrent use.
type FencedWriter struct {
	brokers []string
	opts    WriterOptions
	open    *kafka.Writer // for writes without a fence

	mu     sync.Mutex
	byGen  map[*consume.WriteFence]*kafka.Writer
	closed bool
	wg     sync.WaitGroup // the closes of fenced writers
}

// NewFencedWriter returns a FencedWriter whose writers are NewKafkaWriter's
// with opts. Close it when done.
func NewFencedWriter(brokers []string, opts WriterOptions) *FencedWriter {
	return &FencedWriter{brokers: brokers, opts: opts, open: NewKafkaWriter(brokers, opts),
		byGen: map[*consume.WriteFence]*kafka.Writer{}}
}

// WriteMessages implements Writer. It returns an error wrapping
// consume.ErrFenced when the fence of ctx has ended.
func (w *FencedWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	f, ok := consume.FenceOf(ctx)
	if !ok {
		return w.open.WriteMessages(ctx, msgs...)
	}
	kw, err := w.writerOf(f)
	if err != nil {
		return err
	}
	if err := kw.WriteMessages(ctx, msgs...); err != nil {
		if ferr := f.Err(); ferr != nil {
			return ferr
		}
		return err
	}
	return nil
}

// writerOf returns the writer of fence f, made at its first write.
func (w *FencedWriter) writerOf(f *consume.WriteFence) (*kafka.Writer, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := f.Err(); err != nil {
		return nil, err
	}
	if w.closed {
		return nil, errors.New("fenced writer closed")
	}
	if kw, ok := w.byGen[f]; ok {
		return kw, nil
	}
	opts := w.opts
	next := opts.Transport
	if next == nil {
		next = kafka.DefaultTransport
	}
	opts.Transport = &fenceTransport{fence: f, next: next}
	kw := NewKafkaWriter(w.brokers, opts)
	w.byGen[f] = kw
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		<-f.Done()
		w.mu.Lock()
		delete(w.byGen, f)
		w.mu.Unlock()
		// Close flushes what is queued: with the fence ended, every
		// produce request fails at once.
		_ = kw.Close()
	}()
	return kw, nil
}

// Close closes the shared writer and waits for the fenced ones, which close
// when their fence ends (consume closes every fence once its generation's
// partitions have drained).
func (w *FencedWriter) Close() error {
	w.mu.Lock()
	w.closed = true
	open := make([]*kafka.Writer, 0, len(w.byGen))
	for _, kw := range w.byGen {
		open = append(open, kw)
	}
	w.mu.Unlock()
	err := w.open.Close()
	// A fence still open here belongs to a generation that did not drain
	// (its member stopped without a clean end): close its writer now.
	for _, kw := range open {
		if cerr := kw.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}
	return err
}

// inFlightGrace is how long a produce request in flight when its fence ends
// may still get its answer before it is cancelled. A process resumed from a
// pause (SIGSTOP, a starved CPU) finds its fence ended and the answer to a
// request it sent before the pause already on its way: read, the write is
// done and its batch commits at the generation's end (a commit of a
// generation that ended is accepted until the member rejoins); cancelled
// at once, the write had landed but its batch was handled again by the next
// owner (TestLateKeepsPlaceRulesNotNested had 7 duplicates so). It is short
// beside the margin a fence leaves for a write sent just before it ends to
// land (a quarter of the lease, 0.5 s by default; a quarter of the session).
const inFlightGrace = 100 * time.Millisecond

// fenceTransport sends produce requests only while its fence is open, and
// cancels those in flight inFlightGrace after it ends; other requests
// (metadata) pass.
type fenceTransport struct {
	fence *consume.WriteFence
	next  kafka.RoundTripper
}

// RoundTrip implements kafka.RoundTripper. The error of a fenced request is
// not temporary, so kafka-go's Writer does not retry it.
func (t *fenceTransport) RoundTrip(ctx context.Context, addr net.Addr, req kafka.Request) (kafka.Response, error) {
	if _, ok := req.(*produceAPI.Request); !ok {
		return t.next.RoundTrip(ctx, addr, req)
	}
	if err := t.fence.Err(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(t.fence.Context(), func() { time.AfterFunc(inFlightGrace, cancel) })
	defer stop()
	res, err := t.next.RoundTrip(ctx, addr, req)
	if ferr := t.fence.Err(); err != nil && ferr != nil {
		return nil, fmt.Errorf("%w (request in flight cancelled: %v)", ferr, err)
	}
	return res, err
}
