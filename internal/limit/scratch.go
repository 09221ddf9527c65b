package limit

import "sync"

// scratch holds the slices and the map one admission call works in (the
// events split into tenants, costs and offsets, and the groups by tenant):
// a call takes one from scratchPool and gives it back when it returns, so
// that a batch allocates them only when it is larger than the ones before.
// None of it outlives the call: decisions are written to a slice of their
// own, and the tenant states the groups point at live in the state cache.
type scratch struct {
	tenants  []string
	costs    []Cost
	offsets  []int64
	byTenant map[string]int32
	gid      []int32
	sizes    []int32
	slab     []group
	order    []*group
	idx      []int
	// The call's reply, split per group (parseReplies).
	flat    []int64
	replies []reply
	// The script call's arguments.
	call callBufs
}

var scratchPool = sync.Pool{New: func() any { return &scratch{byTenant: map[string]int32{}} }}

func getScratch() *scratch { return scratchPool.Get().(*scratch) }

// release clears what s points at (tenants, rules, states) and gives it
// back to the pool. s must not be used afterwards.
func (s *scratch) release() {
	clear(s.tenants[:cap(s.tenants)])
	clear(s.slab[:cap(s.slab)])
	clear(s.order[:cap(s.order)])
	clear(s.replies[:cap(s.replies)])
	s.call.clear()
	clear(s.byTenant)
	scratchPool.Put(s)
}

// grow returns buf with length n, reusing its array when it is large enough.
// The elements are not cleared.
func grow[T any](buf []T, n int) []T {
	if cap(buf) < n {
		return make([]T, n)
	}
	return buf[:n]
}

// split returns the tenants and costs of events, index-aligned with them,
// and src with their offsets, in s's slices.
func (s *scratch) split(src Source, events []Event) (tenants []string, costs []Cost, at positions) {
	s.tenants = grow(s.tenants, len(events))
	s.costs = grow(s.costs, len(events))
	at = positions{Source: src}
	if src.Topic != "" {
		s.offsets = grow(s.offsets, len(events))
		at.offsets = s.offsets
	}
	for i, e := range events {
		s.tenants[i], s.costs[i] = e.Tenant, e.Cost
		if at.offsets != nil {
			at.offsets[i] = e.Offset
		}
	}
	return s.tenants, s.costs, at
}
