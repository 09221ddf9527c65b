package consume

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// advanceFunc adapts a function to Advancer.
type advanceFunc func(ctx context.Context, b Batch) []bool

func (f advanceFunc) Advance(ctx context.Context, b Batch) []bool { return f(ctx, b) }

// TestDelayedAdvance: a Delayed with an Advancer offers it the partition's
// earliest waiting messages, earliest release first, at most once per
// AdvanceEvery, and hands over at once those it lets go; the others wait
// for their release time. The fetch goroutine hands the partition its
// messages one at a time, so an offer may come before all four wait (in 47
// of 1,000 runs with -race on an idle machine; the test failed on it before,
// in 6 of 300 runs and in the CI of 84d5cd5): the Advancer lets none of such
// an offer go, and the test moves the clock on to the next offer until one
// holds all four.
func TestDelayedAdvance(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	clock := newFakeClock(t0)
	f := &chanFetcher{ch: make(chan kafka.Message, 10)}
	in := msgs(0, 4)
	for i, s := range []int{30, 10, 40, 20} { // release order: 1, 3, 0, 2
		in[i] = withRelease(in[i], t0.Add(time.Duration(s)*time.Second))
		f.ch <- in[i]
	}
	var mu sync.Mutex
	var offered [][]int64
	var released []int64
	handler := onMessages(func(_ context.Context, ms []kafka.Message) error {
		mu.Lock()
		defer mu.Unlock()
		released = append(released, offsetsOf(ms)...)
		return nil
	})
	p := testPartition(f, handler, &commits{}, func(c *Config) { c.Clock = clock })
	moved, full := 0, -1 // full: the index in offered of the first offer of all four
	dc := DelayedConfig{Config: *p.cfg, ReleaseAt: releaseByHeader, AdvanceEvery: time.Second,
		OnAdvanced: func(_ string, n int) { mu.Lock(); moved += n; mu.Unlock() },
		Advance: advanceFunc(func(_ context.Context, b Batch) []bool {
			mu.Lock()
			defer mu.Unlock()
			offered = append(offered, offsetsOf(b.Messages))
			if len(b.Notes) != len(b.Messages) {
				t.Errorf("%d notes for %d messages", len(b.Notes), len(b.Messages))
			}
			if full < 0 && len(b.Messages) == 4 { // the first offer of all four lets the two earliest go
				full = len(offered) - 1
				return []bool{true, true, false, false}
			}
			return nil
		})}
	dc = dc.withDefaults()
	runDelayedUntilCleanup(t, p, &dc)
	state := func() (o [][]int64, r []int64, m, f int) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(offered), slices.Clone(released), moved, full
	}
	at := t0 // the time of the last offer
	for {
		eventually(t, 5*time.Second, "the first offer's two released, or asleep until the next offer", func() bool {
			_, r, _, _ := state()
			return len(r) == 2 || clock.lastAfter().Equal(at.Add(time.Second))
		})
		if _, r, _, _ := state(); len(r) == 2 {
			break
		}
		if at = at.Add(time.Second); at.After(t0.Add(5 * time.Second)) {
			o, _, _, _ := state()
			t.Fatalf("offered %v by %v, none of all four", o, at)
		}
		clock.Set(at)
	}
	o, r, m, fi := state()
	slices.Sort(r)
	if !slices.Equal(r, []int64{1, 3}) || m != 2 {
		t.Fatalf("released %v (%d moved), want offsets 1 and 3, the two earliest", r, m)
	}
	if fi != len(o)-1 || !slices.Equal(o[fi], []int64{1, 3, 0, 2}) {
		t.Fatalf("offered %v, want one offer of all four last, earliest release first", o)
	}
	// The next offer comes AdvanceEvery later, of those still waiting.
	eventually(t, 5*time.Second, "asleep until the next offer", func() bool { return clock.lastAfter().Equal(at.Add(time.Second)) })
	clock.Set(at.Add(time.Second))
	eventually(t, 5*time.Second, "a second offer", func() bool { o, _, _, _ := state(); return len(o) == fi+2 })
	if o, _, _, _ := state(); !slices.Equal(o[fi+1], []int64{0, 2}) {
		t.Fatalf("second offer %v, want 0 and 2", o[fi+1])
	}
	eventually(t, 5*time.Second, "asleep until the next offer", func() bool { return clock.lastAfter().Equal(at.Add(2 * time.Second)) })
	clock.Set(t0.Add(30 * time.Second))
	eventually(t, 5*time.Second, "offset 0 at its time", func() bool { _, r, _, _ := state(); return len(r) == 3 })
	if _, r, _, _ := state(); r[2] != 0 {
		t.Fatalf("released %v, want offset 0 third, at its release time", r)
	}
}
