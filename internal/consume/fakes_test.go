package consume

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// fakeClock is a Clock that moves only when told. It remembers the deadline
// of the last After call, so a test can wait until the loop under test has
// gone to sleep before moving time.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []fakeWaiter
	last    time.Time
}

type fakeWaiter struct {
	at time.Time
	c  chan time.Time
}

func newFakeClock(t time.Time) *fakeClock { return &fakeClock{now: t} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := fakeWaiter{at: c.now.Add(d), c: make(chan time.Time, 1)}
	c.last = w.at
	if !w.at.After(c.now) {
		w.c <- c.now
		return w.c
	}
	c.waiters = append(c.waiters, w)
	return w.c
}

// Set moves the clock to t and fires every timer due by then.
func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if w.at.After(t) {
			kept = append(kept, w)
			continue
		}
		w.c <- t
	}
	c.waiters = kept
}

// lastAfter returns the deadline of the most recent After call.
func (c *fakeClock) lastAfter() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// chanFetcher serves the messages sent on ch.
type chanFetcher struct {
	ch    chan kafka.Message
	calls atomic.Int64
}

func (f *chanFetcher) FetchMessage(ctx context.Context) (kafka.Message, error) {
	f.calls.Add(1)
	select {
	case m := <-f.ch:
		return m, nil
	case <-ctx.Done():
		return kafka.Message{}, ctx.Err()
	}
}

// genFetcher serves an endless run of messages with ascending offsets.
type genFetcher struct {
	topic  string
	served atomic.Int64
}

func (f *genFetcher) FetchMessage(ctx context.Context) (kafka.Message, error) {
	if err := ctx.Err(); err != nil {
		return kafka.Message{}, err
	}
	off := f.served.Add(1) - 1
	return kafka.Message{Topic: f.topic, Offset: off, HighWaterMark: off + 1}, nil
}

// commits records the offsets a partition commits.
type commits struct {
	mu   sync.Mutex
	list []offsetCommit
}

func (c *commits) commit(oc offsetCommit) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.list = append(c.list, oc)
	return nil
}

// get returns the committed offsets.
func (c *commits) get() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int64
	for _, oc := range c.list {
		out = append(out, oc.next)
	}
	return out
}

// doneSets returns, per commit, the committed offset and the offsets its
// metadata says are done beyond it.
func (c *commits) doneSets(t *testing.T) []doneSet {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []doneSet
	for _, oc := range c.list {
		rs, err := decodeDone(oc.meta, oc.next)
		if err != nil {
			t.Fatalf("commit %d: metadata %q: %v", oc.next, oc.meta, err)
		}
		ds := doneSet{Next: oc.next}
		for _, r := range rs {
			for o := r.lo; o < r.hi; o++ {
				ds.Done = append(ds.Done, o)
			}
		}
		out = append(out, ds)
	}
	return out
}

// doneSet is one commit as doneSets reads it.
type doneSet struct {
	Next int64
	Done []int64
}

// testPartition returns a partition over f with fast batching and backoff.
func testPartition(f fetcher, h Handler, c *commits, mutate func(*Config)) *partition {
	cfg := Config{
		Brokers: []string{"unused:9092"}, GroupID: "g", Topics: []string{"t"},
		BatchWait: 5 * time.Millisecond, BackoffMin: time.Millisecond, BackoffMax: 4 * time.Millisecond,
		Logger: testenv.DiscardLogger(),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	cfg = cfg.withDefaults()
	return &partition{
		topic: "t", id: 0, fetcher: f, commit: c.commit, handler: h,
		cfg: &cfg, log: cfg.Logger, committed: -1, hwm: -1,
	}
}

// eventually polls cond every few milliseconds until it holds or timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func offsetsOf(msgs []kafka.Message) []int64 {
	out := make([]int64, len(msgs))
	for i, m := range msgs {
		out[i] = m.Offset
	}
	return out
}

func msgs(from, to int64) []kafka.Message {
	var out []kafka.Message
	for o := from; o < to; o++ {
		out = append(out, kafka.Message{Topic: "t", Offset: o, HighWaterMark: to})
	}
	return out
}

// onMessages adapts a function of a batch's messages to the Handler
// interface, for tests that need nothing else of the Batch.
func onMessages(f func(ctx context.Context, msgs []kafka.Message) error) HandlerFunc {
	return func(ctx context.Context, b Batch) error { return f(ctx, b.Messages) }
}
