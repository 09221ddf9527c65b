package consume

import (
	"context"
	"sync"

	"github.com/segmentio/kafka-go"
)

// Per-message and per-header costs beyond the bytes of key, value and
// headers: the kafka.Message struct, each header's struct and the slice and
// allocation headers, as a Go heap holds them (measured roughly; budgets
// stay estimates).
const (
	messageOverhead = 192
	headerOverhead  = 48
)

// messageBytes is what a fetched message costs in memory, as budgets count
// it: its key, value and headers, plus their overhead on the heap.
func messageBytes(m kafka.Message) int {
	n := messageOverhead + len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += headerOverhead + len(h.Key) + len(h.Value)
	}
	return n
}

// budget bounds the messages a partition's fetch goroutine has fetched and
// its loop has not handled yet, by count and by bytes. The fetch goroutine
// waits for room before each fetch, so the bytes held can exceed maxBytes by
// at most one message. Safe for concurrent use.
type budget struct {
	maxN, maxBytes int

	mu       sync.Mutex
	n, bytes int
	freed    chan struct{} // signalled when room is given back
}

func newBudget(maxN, maxBytes int) *budget {
	return &budget{maxN: maxN, maxBytes: maxBytes, freed: make(chan struct{}, 1)}
}

// wait blocks until there is room for one more message, or ctx is done
// (false).
func (b *budget) wait(ctx context.Context) bool {
	for {
		b.mu.Lock()
		room := b.n < b.maxN && (b.maxBytes <= 0 || b.bytes < b.maxBytes)
		b.mu.Unlock()
		if room {
			return true
		}
		select {
		case <-b.freed:
		case <-ctx.Done():
			return false
		}
	}
}

// take records a fetched message of size bytes.
func (b *budget) take(size int) {
	b.mu.Lock()
	b.n++
	b.bytes += size
	b.mu.Unlock()
}

// full reports whether the budget has no room for another message.
func (b *budget) full() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n >= b.maxN || (b.maxBytes > 0 && b.bytes >= b.maxBytes)
}

// hold records size bytes held beside the messages (the offsets of
// messages passed over); give(0, size) returns them.
func (b *budget) hold(size int) {
	b.mu.Lock()
	b.bytes += size
	b.mu.Unlock()
}

// give records that n messages of size bytes in all were handled.
func (b *budget) give(n, size int) {
	b.mu.Lock()
	b.n -= n
	b.bytes -= size
	b.mu.Unlock()
	select {
	case b.freed <- struct{}{}:
	default:
	}
}
