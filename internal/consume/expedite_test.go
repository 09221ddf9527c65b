package consume

import (
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

func TestReleaseHeapExpedite(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	var h releaseHeap
	for i, key := range []string{"a", "b", "a", "a"} {
		h.push(kafka.Message{Offset: int64(i), Key: []byte(key)}, t0.Add(time.Duration(10+i)*time.Minute), nil, t0.Add(time.Duration(i)*time.Second))
	}
	// Tenant a was raised at t0+2s: its messages waiting since before then
	// (offsets 0 and 2) go now; offset 3 started waiting after the raise.
	raised := t0.Add(2500 * time.Millisecond)
	n := h.expedite(t0.Add(5*time.Second), func(m kafka.Message, since time.Time) bool {
		return string(m.Key) == "a" && raised.After(since)
	})
	if n != 2 {
		t.Fatalf("expedited %d, want 2", n)
	}
	due := h.popDue(t0.Add(5*time.Second), 10)
	if len(due) != 2 || due[0].msg.Offset != 0 || due[1].msg.Offset != 2 {
		t.Fatalf("due now: %+v, want offsets 0 and 2", due)
	}
	if h.Len() != 2 || !h.next().Equal(t0.Add(11*time.Minute)) {
		t.Errorf("left: %d, next %v", h.Len(), h.next())
	}
}
