package route

import "sync"

// slicePool recycles the per-batch slices of the gating path (a batch's items
// and output messages are a large share of its allocations). A slice is
// cleared before it goes back, so the pool keeps no message alive.
type slicePool[T any] struct{ p sync.Pool }

// get returns a zeroed slice of length n.
func (sp *slicePool[T]) get(n int) []T {
	if v, ok := sp.p.Get().(*[]T); ok && cap(*v) >= n {
		return (*v)[:n]
	}
	return make([]T, n)
}

// put gives s back; the caller must not use it afterwards.
func (sp *slicePool[T]) put(s []T) {
	s = s[:cap(s)]
	clear(s)
	sp.p.Put(&s)
}
