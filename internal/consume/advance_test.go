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
// for their release time.
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
	moved := 0
	dc := DelayedConfig{Config: *p.cfg, ReleaseAt: releaseByHeader, AdvanceEvery: time.Second,
		OnAdvanced: func(_ string, n int) { mu.Lock(); moved += n; mu.Unlock() },
		Advance: advanceFunc(func(_ context.Context, b Batch) []bool {
			mu.Lock()
			defer mu.Unlock()
			offered = append(offered, offsetsOf(b.Messages))
			if len(b.Notes) != len(b.Messages) {
				t.Errorf("%d notes for %d messages", len(b.Notes), len(b.Messages))
			}
			if len(offered) == 1 { // the first offer lets the two earliest go
				return []bool{true, true, false, false}
			}
			return nil
		})}
	dc = dc.withDefaults()
	runDelayedUntilCleanup(t, p, &dc)
	state := func() (o [][]int64, r []int64, m int) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(offered), slices.Clone(released), moved
	}
	eventually(t, 5*time.Second, "the first offer's two released", func() bool { _, r, _ := state(); return len(r) == 2 })
	o, r, m := state()
	slices.Sort(r)
	if !slices.Equal(r, []int64{1, 3}) || m != 2 {
		t.Fatalf("released %v (%d moved), want offsets 1 and 3, the two earliest", r, m)
	}
	if len(o) != 1 || !slices.Equal(o[0], []int64{1, 3, 0, 2}) {
		t.Fatalf("offered %v, want one offer of all four, earliest release first", o)
	}
	// The next offer comes AdvanceEvery later, of those still waiting.
	eventually(t, 5*time.Second, "asleep until the next offer", func() bool { return clock.lastAfter().Equal(t0.Add(time.Second)) })
	clock.Set(t0.Add(time.Second))
	eventually(t, 5*time.Second, "a second offer", func() bool { o, _, _ := state(); return len(o) == 2 })
	if o, _, _ := state(); !slices.Equal(o[1], []int64{0, 2}) {
		t.Fatalf("second offer %v, want 0 and 2", o[1])
	}
	eventually(t, 5*time.Second, "asleep until the next offer", func() bool { return clock.lastAfter().Equal(t0.Add(2 * time.Second)) })
	clock.Set(t0.Add(30 * time.Second))
	eventually(t, 5*time.Second, "offset 0 at its time", func() bool { _, r, _ := state(); return len(r) == 3 })
	if _, r, _ := state(); r[2] != 0 {
		t.Fatalf("released %v, want offset 0 third, at its release time", r)
	}
}
