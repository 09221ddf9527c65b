package consume

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/segmentio/kafka-go"
)

// releaseHeader is the header the tests put release times (unix ms) in.
const releaseHeader = "release-at"

// releaseByHeader is releaseAtHeader as a release clock (no note).
func releaseByHeader(m kafka.Message) Release { return Release{At: releaseAtHeader(m)} }

func releaseAtHeader(m kafka.Message) time.Time {
	for _, h := range m.Headers {
		if h.Key == releaseHeader {
			ms, err := strconv.ParseInt(string(h.Value), 10, 64)
			if err != nil {
				return time.Time{}
			}
			return time.UnixMilli(ms)
		}
	}
	return time.Time{}
}

func withRelease(m kafka.Message, at time.Time) kafka.Message {
	m.Headers = append(m.Headers, kafka.Header{Key: releaseHeader, Value: []byte(strconv.FormatInt(at.UnixMilli(), 10))})
	return m
}

// delayedHarness runs one Delayed partition loop over a fake fetcher and a
// fake clock.
type delayedHarness struct {
	clock   *fakeClock
	commits *commits
	waiting atomic.Int64
	cancel  context.CancelFunc
	done    chan struct{}

	mu       sync.Mutex
	released [][]int64
	late     []time.Duration
	failures int
	attempts int
}

func startDelayed(t *testing.T, f fetcher, t0 time.Time, lookAhead int, failures int) *delayedHarness {
	t.Helper()
	return startDelayedWith(t, f, t0, func(dc *DelayedConfig) { dc.LookAhead = lookAhead }, failures)
}

// startDelayedWith is startDelayed with the DelayedConfig set by mutate.
func startDelayedWith(t *testing.T, f fetcher, t0 time.Time, mutate func(*DelayedConfig), failures int) *delayedHarness {
	t.Helper()
	h := &delayedHarness{clock: newFakeClock(t0), commits: &commits{}, done: make(chan struct{}), failures: failures}
	handler := onMessages(func(_ context.Context, ms []kafka.Message) error {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.attempts++
		now := h.clock.Now()
		for _, m := range ms {
			if at := releaseAtHeader(m); at.After(now) {
				t.Errorf("offset %d handed over at %v, before its release time %v", m.Offset, now, at)
			}
		}
		if h.failures > 0 {
			h.failures--
			return context.DeadlineExceeded
		}
		h.released = append(h.released, offsetsOf(ms))
		return nil
	})
	p := testPartition(f, handler, h.commits, func(c *Config) { c.Clock = h.clock })
	dc := DelayedConfig{
		Config:     *p.cfg,
		ReleaseAt:  releaseByHeader,
		OnWaiting:  func(_ string, d int) { h.waiting.Add(int64(d)) },
		OnLateness: func(_ string, d time.Duration) { h.late = append(h.late, d) },
	}
	mutate(&dc)
	dc = dc.withDefaults()
	stop, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() {
		defer close(h.done)
		p.runDelayed(&dc, stop, context.Background())
	}()
	t.Cleanup(h.stop)
	return h
}

func (h *delayedHarness) stop() {
	h.cancel()
	<-h.done
}

func (h *delayedHarness) releasedSet() map[int64]bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	set := map[int64]bool{}
	for _, b := range h.released {
		for _, o := range b {
			set[o] = true
		}
	}
	return set
}

// waitAsleepUntil waits until the loop has asked the clock to wake it at at:
// it has handled all that was due and is idle.
func (h *delayedHarness) waitAsleepUntil(t *testing.T, at time.Time) {
	t.Helper()
	eventually(t, 5*time.Second, "loop asleep until "+at.String(), func() bool { return h.clock.lastAfter().Equal(at) })
}

func TestDelayedReleasesNeverEarlyAndCommitsPrefix(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	f := &chanFetcher{ch: make(chan kafka.Message, 10)}
	in := msgs(10, 16) // offsets 10..15
	in[0] = withRelease(in[0], t0.Add(time.Second))
	in[1].Headers = []kafka.Header{{Key: releaseHeader, Value: []byte("garbage")}} // release at once
	in[2] = withRelease(in[2], t0.Add(3*time.Second))
	in[3] = withRelease(in[3], t0.Add(time.Second))
	in[4] = withRelease(in[4], t0.Add(2*time.Second))
	in[5] = withRelease(in[5], t0.Add(-time.Second)) // already due
	for _, m := range in {
		f.ch <- m
	}
	h := startDelayed(t, f, t0, 100, 0)

	// Each commit says which offsets beyond it are done, so that a new
	// owner of the partition hands none of them again; the last commit of
	// each step is checked (how releases split into batches may vary).
	steps := []struct {
		now          time.Time
		wantReleased []int64
		wantLast     doneSet
		nextWake     time.Time
	}{
		{now: t0, wantReleased: []int64{11, 15}, wantLast: doneSet{10, []int64{11, 15}}, nextWake: t0.Add(time.Second)},
		{now: t0.Add(999 * time.Millisecond), wantReleased: []int64{11, 15}, wantLast: doneSet{10, []int64{11, 15}}, nextWake: t0.Add(time.Second)},
		{now: t0.Add(time.Second), wantReleased: []int64{10, 11, 13, 15}, wantLast: doneSet{12, []int64{13, 15}}, nextWake: t0.Add(2 * time.Second)},
		{now: t0.Add(2 * time.Second), wantReleased: []int64{10, 11, 13, 14, 15}, wantLast: doneSet{12, []int64{13, 14, 15}}, nextWake: t0.Add(3 * time.Second)},
		{now: t0.Add(3 * time.Second), wantReleased: []int64{10, 11, 12, 13, 14, 15}, wantLast: doneSet{Next: 16}},
	}
	last := func() doneSet {
		ds := h.commits.doneSets(t)
		if len(ds) == 0 {
			return doneSet{}
		}
		return ds[len(ds)-1]
	}
	for _, s := range steps {
		h.clock.Set(s.now)
		want := map[int64]bool{}
		for _, o := range s.wantReleased {
			want[o] = true
		}
		eventually(t, 5*time.Second, "released "+s.now.String(), func() bool { return len(h.releasedSet()) == len(want) })
		eventually(t, 5*time.Second, "commit "+s.now.String(), func() bool { return cmp.Equal(s.wantLast, last()) })
		if !s.nextWake.IsZero() {
			h.waitAsleepUntil(t, s.nextWake)
		}
		if diff := cmp.Diff(want, h.releasedSet()); diff != "" {
			t.Fatalf("at %v released (-want +got):\n%s", s.now, diff)
		}
		if diff := cmp.Diff(s.wantLast, last()); diff != "" {
			t.Fatalf("at %v last commit (-want +got):\n%s", s.now, diff)
		}
	}
	// No commit ever points past an offset still waiting.
	for _, c := range h.commits.doneSets(t) {
		if c.Next > 12 && c.Next != 16 {
			t.Errorf("commit %d past offset 12 before it was released", c.Next)
		}
	}
	if got := h.waiting.Load(); got != 0 {
		t.Errorf("waiting gauge = %d, want 0", got)
	}
	h.stop()
	// Lateness is reported for messages with a readable release time only.
	if len(h.late) != 5 {
		t.Errorf("lateness reported %d times, want 5", len(h.late))
	}
	for _, l := range h.late {
		if l < 0 {
			t.Errorf("negative lateness %v", l)
		}
	}
}

// With LookAhead messages waiting, fetching pauses until one is released.
func TestDelayedLookAheadBound(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	f := &releasingFetcher{at: t0.Add(time.Hour)}
	h := startDelayed(t, f, t0, 10, 0)

	eventually(t, 5*time.Second, "look-ahead filled", func() bool { return f.served.Load() == 10 })
	h.waitAsleepUntil(t, t0.Add(time.Hour))
	time.Sleep(20 * time.Millisecond) // give a wrong implementation the chance to overfetch
	if got := f.served.Load(); got != 10 {
		t.Fatalf("fetched %d messages with look-ahead 10", got)
	}
	if got := h.waiting.Load(); got != 10 {
		t.Errorf("waiting gauge = %d, want 10", got)
	}
	if got := h.commits.get(); len(got) != 0 {
		t.Errorf("commits %v before anything was released", got)
	}

	// Release everything: fetching resumes.
	f.setRelease(t0)
	h.clock.Set(t0.Add(time.Hour))
	eventually(t, 5*time.Second, "fetching resumed", func() bool { return f.served.Load() > 20 })
}

// With LookAheadBytes held by waiting messages, fetching pauses until one
// is released: the bytes held exceed the budget by one message at most.
func TestDelayedLookAheadBytesBound(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	f := &releasingFetcher{at: t0.Add(time.Hour), valueSize: 1000}
	h := startDelayedWith(t, f, t0, func(dc *DelayedConfig) { dc.LookAhead, dc.LookAheadBytes = 1000, 6000 }, 0)

	eventually(t, 5*time.Second, "look-ahead filled", func() bool { return f.served.Load() == 5 })
	h.waitAsleepUntil(t, t0.Add(time.Hour))
	time.Sleep(20 * time.Millisecond) // give a wrong implementation the chance to overfetch
	if got := f.served.Load(); got != 5 {
		t.Fatalf("fetched %d messages of about 1.26 KB (1,000-byte values and the heap overhead) with a 6,000-byte look-ahead, want 5", got)
	}
	f.setRelease(t0)
	h.clock.Set(t0.Add(time.Hour))
	eventually(t, 5*time.Second, "fetching resumed", func() bool { return f.served.Load() > 20 })
}

// releasingFetcher serves an endless run of messages released at at.
type releasingFetcher struct {
	genFetcher
	mu        sync.Mutex
	at        time.Time
	valueSize int // bytes of each message's value
}

func (f *releasingFetcher) setRelease(at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.at = at
}

func (f *releasingFetcher) FetchMessage(ctx context.Context) (kafka.Message, error) {
	m, err := f.genFetcher.FetchMessage(ctx)
	if err != nil {
		return m, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.valueSize > 0 {
		m.Value = make([]byte, f.valueSize)
	}
	return withRelease(m, f.at), nil
}

// A failing batch of released messages is retried until it succeeds and
// only then committed.
func TestDelayedRetriesFailedBatch(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	f := &chanFetcher{ch: make(chan kafka.Message, 3)}
	for _, m := range msgs(0, 3) {
		f.ch <- withRelease(m, t0)
	}
	h := startDelayed(t, f, t0, 100, 2)
	eventually(t, 5*time.Second, "all released", func() bool { return len(h.releasedSet()) == 3 })
	eventually(t, 5*time.Second, "committed", func() bool {
		c := h.commits.get()
		return len(c) > 0 && c[len(c)-1] == 3
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.attempts < 3 {
		t.Errorf("handler called %d times, want at least 3 (two failures)", h.attempts)
	}
}

// Lateness runs from the release time to the Handler's success, so that the
// time the Handler takes to write (and any failed attempts) is included.
func TestDelayedLatenessIncludesHandling(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	f := &chanFetcher{ch: make(chan kafka.Message, 2)}
	f.ch <- withRelease(msgs(0, 1)[0], t0)
	clock := newFakeClock(t0)
	var (
		mu   sync.Mutex
		late []time.Duration
	)
	handler := onMessages(func(context.Context, []kafka.Message) error {
		clock.Set(clock.Now().Add(250 * time.Millisecond)) // the write takes 250ms
		return nil
	})
	c := &commits{}
	p := testPartition(f, handler, c, func(cfg *Config) { cfg.Clock = clock })
	dc := DelayedConfig{
		Config:    *p.cfg,
		ReleaseAt: releaseByHeader,
		LookAhead: 10,
		OnLateness: func(_ string, d time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			late = append(late, d)
		},
	}
	runDelayedUntilCleanup(t, p, &dc)

	eventually(t, 5*time.Second, "committed", func() bool { return len(c.get()) > 0 })
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff([]time.Duration{250 * time.Millisecond}, late); diff != "" {
		t.Errorf("lateness (-want +got):\n%s", diff)
	}
}

// A release clock's notes reach the Handler with their messages, in step,
// so that the Handler need not read again what the clock read.
func TestDelayedHandsReleaseNotes(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	f := &chanFetcher{ch: make(chan kafka.Message, 10)}
	in := msgs(20, 26)
	for i := range in {
		in[i] = withRelease(in[i], t0.Add(-time.Duration(len(in)-i)*time.Second)) // all due
		f.ch <- in[i]
	}
	var mu sync.Mutex
	got := map[int64]any{}
	handler := HandlerFunc(func(_ context.Context, b Batch) error {
		mu.Lock()
		defer mu.Unlock()
		if len(b.Notes) != len(b.Messages) {
			t.Errorf("%d notes for %d messages", len(b.Notes), len(b.Messages))
			return nil
		}
		for i, m := range b.Messages {
			got[m.Offset] = b.Notes[i]
		}
		return nil
	})
	clock := newFakeClock(t0)
	p := testPartition(f, handler, &commits{}, func(c *Config) { c.Clock = clock })
	dc := DelayedConfig{Config: *p.cfg, ReleaseAt: func(m kafka.Message) Release {
		return Release{At: releaseAtHeader(m), Note: fmt.Sprintf("note of %d", m.Offset)}
	}}
	dc = dc.withDefaults()
	runDelayedUntilCleanup(t, p, &dc)
	eventually(t, 5*time.Second, "every message handed over", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == len(in)
	})
	mu.Lock()
	defer mu.Unlock()
	for _, m := range in {
		if want := fmt.Sprintf("note of %d", m.Offset); got[m.Offset] != want {
			t.Errorf("offset %d handed with note %v, want %q", m.Offset, got[m.Offset], want)
		}
	}
}

// As for Group: while a batch fails because the commits are behind
// (limit.ErrReplayFull), the commit that failed is sent again, and once it
// is accepted the batch goes through. Before, Delayed committed only after
// a batch succeeded, which never came.
func TestDelayedRetriesCommitWhileBatchFails(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	f := &chanFetcher{ch: make(chan kafka.Message, 8)}
	for _, m := range msgs(0, 4) {
		f.ch <- withRelease(m, t0)
	}
	c := &commits{}
	var failCommits, committed, handled atomic.Int64
	failCommits.Store(1) // the first commit fails once
	handler := HandlerFunc(func(_ context.Context, b Batch) error {
		if first := b.Messages[0].Offset; first > 0 && committed.Load() < first {
			return errors.New("replay record full: commits are behind")
		}
		handled.Add(int64(len(b.Messages)))
		return nil
	})
	p := testPartition(f, handler, c, func(cfg *Config) { cfg.Clock = newFakeClock(t0) })
	p.commit = func(oc offsetCommit) error {
		if failCommits.Add(-1) >= 0 {
			return errors.New("coordinator unavailable")
		}
		committed.Store(oc.next)
		return c.commit(oc)
	}
	dc := DelayedConfig{Config: *p.cfg, ReleaseAt: releaseByHeader}.withDefaults()
	runDelayedUntilCleanup(t, p, &dc)
	eventually(t, 5*time.Second, "the first messages handled", func() bool { return handled.Load() == 4 })
	for _, m := range msgs(4, 8) {
		f.ch <- withRelease(m, t0)
	}
	eventually(t, 5*time.Second, "the messages after the failed commit handled", func() bool { return handled.Load() == 8 })
}

// runDelayedUntilCleanup runs p's delayed loop with dc until the test ends.
func runDelayedUntilCleanup(t *testing.T, p *partition, dc *DelayedConfig) {
	t.Helper()
	stop, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.runDelayed(dc, stop, context.Background())
	}()
	t.Cleanup(func() { cancel(); <-done })
}
