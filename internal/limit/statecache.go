package limit

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// stateCache holds the tenant states a Limiter remembers, up to a budget of
// estimated heap bytes (stateBytes), and evicts the least recently used one
// when a new state would pass the budget.
//
// It keeps two LRU lists: plain states (key names and perhaps a ttl chain)
// and states known full up to the horizon, whose events are rejected without
// a Redis call. Eviction takes, in this order: the least recently used full
// state whose fullness has run out (it is plain now), the least recently
// used plain state, and only when no plain state remains, the least recently
// used full one. So a flood of new tenants pushes out other plain states and
// never a tenant known full; full tenants go only when they alone fill the
// budget. A state moves to the full list when a reply says it is full, and
// back to the plain list when it is used after its fullness ran out.
//
// Two lists rather than a segmented LRU: a segmented LRU protects the states
// used twice, but what makes a state worth keeping here is what it saves,
// and only a known-full state saves a Redis call (a plain one saves building
// a few strings, or a read of the ttl anchor). A hot plain tenant that is
// evicted costs one allocation on its next event; a full tenant evicted
// costs a round trip per batch until its next reply.
//
// Every operation is O(1): the lists are intrusive (the links live in
// tenantState), so using a state allocates nothing. stateCache is not safe
// for concurrent use: Limiter.mu guards it and the states' cache fields.
type stateCache struct {
	budget int64 // most estimated bytes
	bytes  int64 // estimated bytes held
	m      map[stateKey]*tenantState
	// deleted counts the deletions from m since it was made: a Go map
	// never shrinks, and its deleted slots may make it grow under churn,
	// so m is copied into a fresh map after as many deletions as entries.
	deleted int
	plain   stateList
	full    stateList
	// evicted counts evictions of plain and of known-full states.
	evictedPlain, evictedFull prometheus.Counter
	size                      prometheus.Gauge
}

// stateList is a doubly linked list of states around a sentinel: root.next
// is the most recently used state, root.prev the least.
type stateList struct {
	root tenantState
}

func (s *stateList) init() { s.root.next, s.root.prev = &s.root, &s.root }

// back returns the least recently used state, or nil.
func (s *stateList) back() *tenantState {
	if s.root.prev == &s.root {
		return nil
	}
	return s.root.prev
}

// pushFront puts st, linked in no list, first.
func (s *stateList) pushFront(st *tenantState) {
	st.prev, st.next, st.list = &s.root, s.root.next, s
	s.root.next.prev = st
	s.root.next = st
}

// unlink takes st out of its list.
func unlink(st *tenantState) {
	st.prev.next = st.next
	st.next.prev = st.prev
	st.prev, st.next, st.list = nil, nil, nil
}

// newStateCache returns an empty cache of budget bytes that counts its
// evictions and bytes in m.
func newStateCache(budget int64, m *metrics) *stateCache {
	c := &stateCache{
		budget:       budget,
		m:            map[stateKey]*tenantState{},
		evictedPlain: m.cacheEvictions.WithLabelValues("plain"),
		evictedFull:  m.cacheEvictions.WithLabelValues("full"),
		size:         m.cacheBytes,
	}
	c.plain.init()
	c.full.init()
	return c
}

// Estimated heap bytes of one state besides its strings: the tenantState
// (176-byte size class, with the cost it is known full for) and its map
// slot (key and pointer, 40 bytes, and a control byte); each rule adds 16
// bytes to its ttl chains' array, and each key, the frontier's too, 16 to the
// keys slice's array and 16 to its box (an interface value). A Go
// map's table is between 7/16 and 7/8 full when it grows; deleted slots
// may make it double once more before stateCache copies it (after as many
// deletions as entries), so a slot costs at most about 41*32/7 bytes.
const (
	stateFixedBytes = 176 + 41*32/7
	stateRuleBytes  = 16
	stateKeyBytes   = 16 + 16
)

// stringBytes estimates the heap bytes of an n-byte string: n rounded up to
// its allocation size class (at most about 1/7 more for strings under 2 KiB,
// at least the smallest class) plus slack.
func stringBytes(n int) int64 {
	if n == 0 {
		return 0
	}
	return int64(n + n/7 + 16)
}

// stateBytes estimates the heap bytes st holds: the fixed part, the tenant
// and rule-set strings of its map key, the frontier and the rule keys. The
// rule-set string is shared by the tenants of one batch; counting it per
// state errs on the safe side.
func stateBytes(st *tenantState) int64 {
	n := int64(stateFixedBytes+stateRuleBytes*(len(st.keys)-1)+stateKeyBytes*len(st.keys)) +
		stringBytes(len(st.key.tenant)) + stringBytes(len(st.key.set))
	for _, k := range st.keys {
		n += stringBytes(len(k.(string)))
	}
	return n
}

// get returns the state under k, or nil, and marks it most recently used. A
// full state whose fullness ran out by now goes back to the plain list.
func (c *stateCache) get(k stateKey, now time.Time) *tenantState {
	st := c.m[k]
	if st == nil {
		return nil
	}
	l := st.list
	if l == &c.full && !now.Before(st.full) {
		l = &c.plain
	}
	unlink(st)
	l.pushFront(st)
	return st
}

// add remembers st (not yet in the cache, st.key not in it) as the most
// recently used plain state, evicting others until it fits. A state larger
// than the whole budget is not remembered.
func (c *stateCache) add(st *tenantState, now time.Time) {
	st.bytes = stateBytes(st)
	if st.bytes > c.budget {
		return
	}
	for c.bytes+st.bytes > c.budget {
		c.evict(now)
	}
	c.m[st.key] = st
	c.plain.pushFront(st)
	c.bytes += st.bytes
	c.size.Set(float64(c.bytes))
}

// evict forgets one state: the least recently used full state if its
// fullness ran out, else the least recently used plain state, else the
// least recently used full one. The cache must not be empty.
func (c *stateCache) evict(now time.Time) {
	st := c.full.back()
	if st == nil || now.Before(st.full) {
		if p := c.plain.back(); p != nil {
			st = p
		}
	}
	if now.Before(st.full) {
		c.evictedFull.Inc()
	} else {
		c.evictedPlain.Inc()
	}
	unlink(st)
	delete(c.m, st.key)
	c.bytes -= st.bytes
	c.size.Set(float64(c.bytes))
	c.deleted++
	if c.deleted > len(c.m) && c.deleted >= minRebuild {
		c.rebuild()
	}
}

// minRebuild is the fewest deletions after which the map is copied, so that
// a small cache is not copied at every eviction.
const minRebuild = 1024

// rebuild copies the map into a fresh one sized for its entries. Called
// after more deletions than entries, it costs O(1) per deletion.
func (c *stateCache) rebuild() {
	m := make(map[stateKey]*tenantState, len(c.m)+len(c.m)/4)
	for k, st := range c.m {
		m[k] = st
	}
	c.m, c.deleted = m, 0
}

// markFull records that st's tenant is full until then, and moves st to the
// front of the full list. A state no longer in the cache (evicted since it
// was looked up, or too large for it) only records the time.
func (c *stateCache) markFull(st *tenantState, until time.Time) {
	st.full = until
	if st.list == nil {
		return
	}
	unlink(st)
	c.full.pushFront(st)
}

// len returns the number of states remembered.
func (c *stateCache) len() int { return len(c.m) }
