package consume

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/segmentio/kafka-go"
)

func TestReleaseHeapNeverEarly(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := newFakeClock(t0)
	rng := rand.New(rand.NewPCG(1, 2))

	var h releaseHeap
	release := map[int64]time.Time{}
	for off := int64(0); off < 1000; off++ {
		at := t0.Add(time.Duration(rng.IntN(10000)) * time.Millisecond)
		if off%97 == 0 {
			at = time.Time{} // unreadable: release at once
		}
		release[off] = at
		h.push(kafka.Message{Offset: off}, at, nil, time.Time{})
	}

	var got []int64
	for step := 0; h.Len() > 0; step++ {
		now := clock.Now()
		due := h.popDue(now, 50)
		if len(due) > 50 {
			t.Fatalf("popDue returned %d messages, limit 50", len(due))
		}
		if !slices.IsSortedFunc(due, func(a, b waiting) int { return int(a.msg.Offset - b.msg.Offset) }) {
			t.Fatalf("batch not in offset order: %v", due)
		}
		for _, w := range due {
			if w.at.After(now) {
				t.Fatalf("offset %d released at %v, before its time %v", w.msg.Offset, now, w.at)
			}
			got = append(got, w.msg.Offset)
		}
		if h.Len() > 0 && !h.next().After(now) && len(due) < 50 {
			t.Fatalf("a due message was left behind at %v", now)
		}
		if len(due) < 50 {
			clock.Set(now.Add(100 * time.Millisecond))
		}
	}
	if len(got) != 1000 {
		t.Fatalf("released %d messages, want 1000", len(got))
	}
}

func TestReleaseHeapOrder(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	var h releaseHeap
	h.push(kafka.Message{Offset: 4}, t0.Add(2*time.Second), nil, time.Time{})
	h.push(kafka.Message{Offset: 3}, t0.Add(time.Second), nil, time.Time{})
	h.push(kafka.Message{Offset: 1}, t0.Add(time.Second), nil, time.Time{})
	h.push(kafka.Message{Offset: 2}, time.Time{}, nil, time.Time{})
	h.push(kafka.Message{Offset: 0}, t0.Add(3*time.Second), nil, time.Time{})

	var got [][]int64
	for _, now := range []time.Time{t0.Add(-time.Hour), t0, t0.Add(1500 * time.Millisecond), t0.Add(5 * time.Second)} {
		var offs []int64
		for _, w := range h.popDue(now, 10) {
			offs = append(offs, w.msg.Offset)
		}
		got = append(got, offs)
	}
	want := [][]int64{{2}, nil, {1, 3}, {0, 4}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("released batches (-want +got):\n%s", diff)
	}
}
