package top

import (
	"cmp"
	"container/heap"
	"slices"
	"sync"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// Counts are one tenant's decisions in one window. A value type.
type Counts struct {
	Admitted       int64 `json:"admitted"`
	Deferred       int64 `json:"deferred"`
	Rejected       int64 `json:"rejected"`
	ShadowDeferred int64 `json:"shadow_deferred,omitempty"`
	ShadowRejected int64 `json:"shadow_rejected,omitempty"`
}

func (c *Counts) add(o Counts) {
	c.Admitted += o.Admitted
	c.Deferred += o.Deferred
	c.Rejected += o.Rejected
	c.ShadowDeferred += o.ShadowDeferred
	c.ShadowRejected += o.ShadowRejected
}

// DefaultMaxTenants is the default of Tracker.MaxTenants.
const DefaultMaxTenants = 10000

// Tracker counts decisions per tenant in the current and the last window,
// and the deferred events waiting per tenant. Safe for concurrent use.
type Tracker struct {
	window     time.Duration
	maxTenants int
	clock      func() time.Time

	mu      sync.Mutex
	cur     *windowCounts
	last    *windowCounts
	waiting map[string]int64
}

type windowCounts struct {
	start    time.Time
	byTenant map[string]*Counts
	other    Counts // tenants past maxTenants
	others   int64  // decisions of those tenants
}

// NewTracker returns a Tracker of windows of length window (aligned on
// the Unix epoch), naming at most maxTenants tenants per window (0:
// DefaultMaxTenants). clock nil: time.Now.
func NewTracker(window time.Duration, maxTenants int, clock func() time.Time) *Tracker {
	if maxTenants == 0 {
		maxTenants = DefaultMaxTenants
	}
	if clock == nil {
		clock = time.Now
	}
	return &Tracker{window: window, maxTenants: maxTenants, clock: clock, waiting: map[string]int64{}}
}

// Window returns the window length.
func (t *Tracker) Window() time.Duration { return t.window }

// rollLocked moves to the window of now.
func (t *Tracker) rollLocked(now time.Time) {
	start := now.Truncate(t.window)
	if t.cur != nil && t.cur.start.Equal(start) {
		return
	}
	if t.cur != nil && t.cur.start.Add(t.window).Equal(start) {
		t.last = t.cur
	} else {
		t.last = nil
	}
	t.cur = &windowCounts{start: start, byTenant: map[string]*Counts{}}
}

func (t *Tracker) countsLocked(tenant string) *Counts {
	c := t.cur.byTenant[tenant]
	if c == nil {
		if len(t.cur.byTenant) >= t.maxTenants {
			return &t.cur.other
		}
		c = &Counts{}
		t.cur.byTenant[tenant] = c
	}
	return c
}

// Record counts a batch's decisions (index-aligned with tenants).
func (t *Tracker) Record(tenants []string, ds []limit.Decision) {
	t.record(tenants, ds, false)
}

// RecordShadow counts what shadow overrides would have decided.
func (t *Tracker) RecordShadow(tenants []string, ds []limit.Decision) {
	t.record(tenants, ds, true)
}

func (t *Tracker) record(tenants []string, ds []limit.Decision, shadow bool) {
	now := t.clock()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rollLocked(now)
	var c *Counts
	last := ""
	for i, d := range ds {
		if c == nil || tenants[i] != last {
			last, c = tenants[i], t.countsLocked(tenants[i])
		}
		switch {
		case shadow && d.Kind == limit.Defer:
			c.ShadowDeferred++
		case shadow && d.Kind == limit.Reject:
			c.ShadowRejected++
		case shadow:
		case d.Kind == limit.Admit:
			c.Admitted++
		case d.Kind == limit.Defer:
			c.Deferred++
		case d.Kind == limit.Reject, d.Kind == limit.Fail:
			c.Rejected++
		}
	}
}

// Waiting adds delta to the tenant's waiting deferred events.
func (t *Tracker) Waiting(tenant string, delta int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.waiting[tenant] + int64(delta)
	if n <= 0 {
		delete(t.waiting, tenant)
		return
	}
	t.waiting[tenant] = n
}

// Row is one tenant in a Table.
type Row struct {
	Tenant string `json:"tenant"`
	Counts
	Waiting int64 `json:"waiting"`
}

// Table is one window's top tenants, from one replica or merged.
type Table struct {
	Start time.Time `json:"start"`
	Rows  []Row     `json:"rows"`
	// Other sums the tenants not named (past MaxTenants, or below the top
	// K of every ranking).
	Other Counts `json:"other"`
}

// Tables are a replica's (or the merged) current and last windows.
type Tables struct {
	Window  string `json:"window"`
	Current Table  `json:"current"`
	Last    Table  `json:"last"`
}

// Top returns the current and last windows' tables, each naming the top k
// tenants by deferred, by rejected, by admitted and by waiting events
// (their union).
func (t *Tracker) Top(k int) Tables {
	now := t.clock()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rollLocked(now)
	out := Tables{Window: t.window.String(), Current: t.tableLocked(t.cur, k, true)}
	if t.last != nil {
		out.Last = t.tableLocked(t.last, k, false)
	} else {
		out.Last = Table{Start: t.cur.start.Add(-t.window), Rows: []Row{}}
	}
	return out
}

func (t *Tracker) tableLocked(w *windowCounts, k int, withWaiting bool) Table {
	rows := make([]Row, 0, len(w.byTenant))
	for tenant, c := range w.byTenant {
		rows = append(rows, Row{Tenant: tenant, Counts: *c})
	}
	if withWaiting {
		for tenant := range t.waiting {
			if _, ok := w.byTenant[tenant]; !ok {
				rows = append(rows, Row{Tenant: tenant})
			}
		}
		for i := range rows {
			rows[i].Waiting = t.waiting[rows[i].Tenant]
		}
	}
	kept := TopRows(rows, k)
	tab := Table{Start: w.start, Rows: kept, Other: w.other}
	in := make(map[string]bool, len(kept))
	for _, r := range kept {
		in[r.Tenant] = true
	}
	for _, r := range rows {
		if !in[r.Tenant] {
			tab.Other.add(r.Counts)
		}
	}
	return tab
}

// rankings order rows, most first.
var rankings = []func(Row) int64{
	func(r Row) int64 { return r.Deferred },
	func(r Row) int64 { return r.Rejected },
	func(r Row) int64 { return r.Admitted },
	func(r Row) int64 { return r.Waiting },
	func(r Row) int64 { return r.ShadowDeferred + r.ShadowRejected },
}

// TopRows returns the union of the top k rows of each ranking (ties by
// tenant name; a row whose count in a ranking is 0 is not in its top),
// sorted by deferred, rejected, admitted, then tenant. rows is left as it
// is. It runs once a second over every tenant of a window (up to
// MaxTenants), so each ranking's top k is selected with a heap of k rows
// rather than by sorting all of them.
func TopRows(rows []Row, k int) []Row {
	keep := map[string]bool{}
	h := &rankHeap{rows: rows, idx: make([]int, 0, max(k, 0))}
	for _, rank := range rankings {
		h.rank, h.idx = rank, h.idx[:0]
		for i := range rows {
			switch {
			case k <= 0 || rank(rows[i]) <= 0:
			case len(h.idx) < k:
				heap.Push(h, i)
			case h.ranksBefore(i, h.idx[0]):
				h.idx[0] = i
				heap.Fix(h, 0)
			}
		}
		for _, i := range h.idx {
			keep[rows[i].Tenant] = true
		}
	}
	out := make([]Row, 0, len(keep))
	for _, r := range rows {
		if keep[r.Tenant] {
			out = append(out, r)
		}
	}
	SortRows(out, "deferred")
	return out
}

// rankHeap holds indexes of rows, the one that ranks last by rank at the
// root: the top k seen so far, whose root the next better row replaces.
type rankHeap struct {
	rows []Row
	rank func(Row) int64
	idx  []int
}

// ranksBefore reports whether rows[a] comes before rows[b] in the ranking:
// a higher count, or the same count and a lower tenant name.
func (h *rankHeap) ranksBefore(a, b int) bool {
	ra, rb := h.rank(h.rows[a]), h.rank(h.rows[b])
	if ra != rb {
		return ra > rb
	}
	return h.rows[a].Tenant < h.rows[b].Tenant
}

func (h *rankHeap) Len() int           { return len(h.idx) }
func (h *rankHeap) Less(i, j int) bool { return h.ranksBefore(h.idx[j], h.idx[i]) }
func (h *rankHeap) Swap(i, j int)      { h.idx[i], h.idx[j] = h.idx[j], h.idx[i] }
func (h *rankHeap) Push(x any)         { h.idx = append(h.idx, x.(int)) }
func (h *rankHeap) Pop() any {
	i := h.idx[len(h.idx)-1]
	h.idx = h.idx[:len(h.idx)-1]
	return i
}

// SortRows sorts rows by the ranking named by (deferred, rejected,
// admitted, waiting; else deferred), most first, then by the others and
// the tenant.
func SortRows(rows []Row, by string) {
	first := map[string]int{"deferred": 0, "rejected": 1, "admitted": 2, "waiting": 3}[by]
	order := append([]func(Row) int64{rankings[first]}, rankings[:4]...)
	slices.SortFunc(rows, func(a, b Row) int {
		for _, rank := range order {
			if c := cmp.Compare(rank(b), rank(a)); c != 0 {
				return c
			}
		}
		return cmp.Compare(a.Tenant, b.Tenant)
	})
}
