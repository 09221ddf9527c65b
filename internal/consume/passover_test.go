package consume

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// logFetcher serves the messages of a log (offsets ascending, gaps
// allowed) from a position that seek moves, and waits at its end.
type logFetcher struct {
	mu    sync.Mutex
	log   []kafka.Message
	pos   int64
	top   atomic.Int64 // the highest offset served
	seeks atomic.Int64
}

func (f *logFetcher) FetchMessage(ctx context.Context) (kafka.Message, error) {
	for {
		f.mu.Lock()
		for _, m := range f.log {
			if m.Offset >= f.pos {
				f.pos = m.Offset + 1
				f.mu.Unlock()
				if m.Offset > f.top.Load() {
					f.top.Store(m.Offset)
				}
				return m, nil
			}
		}
		f.mu.Unlock()
		select {
		case <-ctx.Done():
			return kafka.Message{}, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

func (f *logFetcher) seek(offset int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pos = offset
	f.seeks.Add(1)
}

// drop removes the messages at offsets [lo, hi) from the log (retention).
func (f *logFetcher) drop(lo, hi int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	kept := f.log[:0]
	for _, m := range f.log {
		if m.Offset < lo || m.Offset >= hi {
			kept = append(kept, m)
		}
	}
	f.log = kept
}

// farThenNear is a log of far messages of about 1.2 KB released at farAt,
// then one small message released at nearAt.
func farThenNear(far int, farAt, nearAt time.Time) *logFetcher {
	f := &logFetcher{}
	for i := range far {
		m := kafka.Message{Topic: "t", Offset: int64(i), HighWaterMark: int64(far + 1), Value: make([]byte, 1000)}
		f.log = append(f.log, withRelease(m, farAt))
	}
	f.log = append(f.log, withRelease(kafka.Message{Topic: "t", Offset: int64(far), HighWaterMark: int64(far + 1)}, nearAt))
	f.top.Store(-1)
	return f
}

// With the look-ahead full of messages due in an hour, a message due in 10s
// behind them is read and released at its time; the messages passed over are
// read again a second before they are due and released, each once. Offsets
// Kafka deleted meanwhile count as done, so the commits reach the end.
func TestDelayedPassOverReadsOnAndRescans(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	farAt, nearAt := t0.Add(time.Hour), t0.Add(10*time.Second)
	const far = 40
	f := farThenNear(far, farAt, nearAt)
	var passed atomic.Int64
	h := startDelayedWith(t, f, t0, func(dc *DelayedConfig) {
		dc.LookAhead, dc.LookAheadBytes = 1000, 6000 // 4 of the far messages
		dc.OnPassedOver = func(_ string, n int) { passed.Add(int64(n)) }
	}, 0)

	h.waitAsleepUntil(t, nearAt)
	if got := f.top.Load(); got != far {
		t.Fatalf("fetched up to offset %d, want %d (the near message)", got, far)
	}
	h.clock.Set(nearAt)
	eventually(t, 5*time.Second, "near message released", func() bool { return h.releasedSet()[far] })
	if got := len(h.releasedSet()); got != 1 {
		t.Errorf("released %d messages at the near one's time, want 1", got)
	}
	// Kafka deletes offsets 20 to 29 (retention). Most were passed over;
	// one may still be held (which are depends on timing: a message fetched
	// and not yet taken in counts in the budget too).
	f.drop(20, 30)

	// A second before the far ones are due, they are read again.
	h.waitAsleepUntil(t, farAt.Add(-rescanLead))
	seeks := f.seeks.Load()
	h.clock.Set(farAt.Add(-rescanLead))
	eventually(t, 5*time.Second, "rescan", func() bool { return f.seeks.Load() > seeks })
	h.waitAsleepUntil(t, farAt)
	h.clock.Set(farAt)
	eventually(t, 5*time.Second, "every message not deleted released", func() bool {
		got := h.releasedSet()
		for o := int64(0); o <= far; o++ {
			if !got[o] && (o < 20 || o >= 30) {
				return false
			}
		}
		return true
	})
	seen := map[int64]int{}
	h.mu.Lock()
	for _, b := range h.released {
		for _, o := range b {
			seen[o]++
		}
	}
	h.mu.Unlock()
	for o, n := range seen {
		if n > 1 {
			t.Errorf("offset %d released %d times", o, n)
		}
	}
	if passed.Load() == 0 {
		t.Error("nothing passed over")
	}
	eventually(t, 5*time.Second, "committed to the end", func() bool {
		c := h.commits.get()
		return len(c) > 0 && c[len(c)-1] == far+1
	})
	if got := h.waiting.Load(); got != 0 {
		t.Errorf("waiting gauge = %d, want 0", got)
	}
}

// A partition keeps at most half of its byte budget in passed-over offsets:
// beyond that it waits for releases, as without passing over.
func TestDelayedPassOverCap(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	f := farThenNear(2000, t0.Add(time.Hour), t0.Add(10*time.Second))
	var passed atomic.Int64
	h := startDelayedWith(t, f, t0, func(dc *DelayedConfig) {
		dc.LookAhead, dc.LookAheadBytes = 1000, 6000 // at most 187 offsets passed over
		dc.OnPassedOver = func(_ string, n int) { passed.Add(int64(n)) }
	}, 0)
	eventually(t, 5*time.Second, "passed over up to the cap", func() bool { return passed.Load() == 6000/2/passedOffsetBytes })
	top := f.top.Load()
	time.Sleep(50 * time.Millisecond) // give a wrong implementation the chance to read on
	// A fetch already under way when the cap was reached may still land
	// one message (it counts in the budget once taken in: 3 of 200 runs
	// under -race saw 189 against 188); reading on would fetch far more.
	if got := f.top.Load(); got > top+1 || got >= 2000 {
		t.Errorf("fetched up to offset %d (%d at the cap), want it to stay below the near message at 2000", got, top)
	}
	if got := passed.Load(); got != 187 {
		t.Errorf("passed over %d, want 187", got)
	}
	h.stop()
}

// Messages released within 2×rescanLead are never passed over: the
// partition waits for them as without passing over.
func TestDelayedPassOverSparesSoonDue(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	f := farThenNear(40, t0.Add(2*rescanLead), t0.Add(time.Second))
	var passed atomic.Int64
	h := startDelayedWith(t, f, t0, func(dc *DelayedConfig) {
		dc.LookAhead, dc.LookAheadBytes = 1000, 6000
		dc.OnPassedOver = func(_ string, n int) { passed.Add(int64(n)) }
	}, 0)
	h.waitAsleepUntil(t, t0.Add(2*rescanLead))
	time.Sleep(20 * time.Millisecond)
	if got := passed.Load(); got != 0 {
		t.Errorf("passed over %d messages released within 2×rescanLead", got)
	}
	if got := f.top.Load(); got >= 40 {
		t.Errorf("fetched up to offset %d past a full look-ahead", got)
	}
	h.clock.Set(t0.Add(2 * rescanLead))
	eventually(t, 5*time.Second, "every message released", func() bool { return len(h.releasedSet()) == 41 })
}

// A rescan that finds every message it went back for ends there, though no
// message at or beyond its end comes (the tier receives nothing more):
// messages passed over again during it are read again in turn. (Before,
// the rescan waited for a message past its end, which never came once the
// load had stopped, and the messages passed over during it waited forever:
// TestFaultMix on 2026-12-02 left 2,063 events in two retry partitions.)
func TestDelayedPassOverRescanEndsWithoutNewMessages(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	const n = 40
	f := &logFetcher{}
	for i := range n {
		// Released 20 s apart from 10 s on, latest first, so that the
		// messages fetched last are the ones released soonest.
		at := t0.Add(10*time.Second + time.Duration(n-1-i)*20*time.Second)
		m := kafka.Message{Topic: "t", Offset: int64(i), HighWaterMark: n, Value: make([]byte, 1000)}
		f.log = append(f.log, withRelease(m, at))
	}
	f.top.Store(-1)
	h := startDelayedWith(t, f, t0, func(dc *DelayedConfig) {
		dc.LookAhead, dc.LookAheadBytes = 1000, 6000 // 4 of the messages
	}, 0)
	last := t0.Add(10*time.Second + (n-1)*20*time.Second)
	for now := t0; !now.After(last.Add(2 * time.Second)); now = now.Add(500 * time.Millisecond) {
		time.Sleep(2 * time.Millisecond)
		h.clock.Set(now)
	}
	eventually(t, 10*time.Second, "every message released", func() bool {
		clk := last.Add(2 * time.Second)
		h.clock.Set(clk)
		return len(h.releasedSet()) == n
	})
	eventually(t, 5*time.Second, "committed to the end", func() bool {
		c := h.commits.get()
		return len(c) > 0 && c[len(c)-1] == n
	})
}
