package limit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/gatekeeper-dev/gatekeeper/internal/lua"
)

// Options configure a Limiter. The zero value of each field means its default.
type Options struct {
	// Prefix starts every counter key. Default "gk". On Redis Cluster, a
	// prefix holding a hash tag ("{gk}", see OneSlot) puts every key in one
	// slot: the limiter then makes one call per batch, as on one Redis, and
	// may keep a capacity.
	Prefix string
	// WindowKind is Aligned (default) or TTL.
	WindowKind WindowKind
	// Location places day, week and month boundaries. Default UTC.
	Location *time.Location
	// Horizon is the furthest a deferral may reach. Default 24h.
	Horizon time.Duration
	// Retention keeps the keys of windows of a day or longer this long after
	// their window ends, and bounds how long shorter windows keep theirs
	// (24 windows' length, at least a minute; see retention). Default 7 days.
	Retention time.Duration
	// Timeout bounds every Redis call. Default 2s.
	Timeout time.Duration
	// MaxScan bounds the windows the deferral searches of one batch may
	// read, all tenants together (see bounded.go). Default DefaultMaxScan.
	MaxScan int
	// CacheBytes bounds the estimated heap bytes of the tenant states the
	// Limiter remembers (key names, tenants known full, ttl chains); past
	// it the least recently used go first, tenants known full last (see
	// stateCache). Default 16 MiB.
	CacheBytes int64
	// Clock is the one time source of all decisions: the scripts take their
	// "now" from it, never from Redis. Replicas should run NTP-synced clocks;
	// skew moves events between neighbouring windows but never lets a
	// window's count pass its limit. Default time.Now.
	Clock func() time.Time
	// ReplayScope, if set, names the deployment in the keys of the replay
	// records (Source): two deployments that share a Redis and a Prefix
	// but not a ReplayScope never take each other's decisions for the same
	// topic, partition and offset. Gatekeeper sets it to GROUP_ID.
	ReplayScope string
	// Registerer receives the limiter's metrics. Nil: not registered.
	Registerer prometheus.Registerer
	// Capacity is the budget shared by every tenant (G12; capacity.go).
	// None: tenants have only their own rules. Not with Redis Cluster.
	Capacity Capacity
}

func (o *Options) defaults() error {
	if o.Prefix == "" {
		o.Prefix = "gk"
	}
	if o.WindowKind == "" {
		o.WindowKind = Aligned
	}
	if o.WindowKind != Aligned && o.WindowKind != TTL {
		return fmt.Errorf("window %q: want aligned or ttl", o.WindowKind)
	}
	if o.Location == nil {
		o.Location = time.UTC
	}
	if o.Horizon == 0 {
		o.Horizon = 24 * time.Hour
	}
	if o.Horizon < 0 {
		return fmt.Errorf("horizon %v: must not be negative", o.Horizon)
	}
	if o.Retention == 0 {
		o.Retention = 7 * 24 * time.Hour
	}
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Second
	}
	if o.MaxScan == 0 {
		o.MaxScan = DefaultMaxScan
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = DefaultCacheBytes
	}
	if o.CacheBytes < 0 {
		return fmt.Errorf("cache bytes %d: must not be negative", o.CacheBytes)
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	return nil
}

// Limiter decides admission for batches of events against per-tenant rules
// kept in Redis. It is safe for concurrent use; any number of Limiters (in
// any number of processes) may share one Redis and its counters.
type Limiter struct {
	rdb     redis.UniversalClient
	cluster bool
	opts    Options
	keys    keys
	rules   atomic.Pointer[Rules]
	capNow  atomic.Pointer[Capacity] // the capacity in force when paced (capacity_pace.go)
	capResv atomic.Uint64            // the paced reservations' floor, float64 bits (capacity_pace.go)
	admit   *redis.Script
	get     *redis.Script
	release *redis.Script
	metrics *metrics
	// fullReason is the reason of events rejected for want of room.
	fullReason string

	mu     sync.Mutex
	states *stateCache
	sent   sentOffsets

	// advNext is when this Limiter may make its next Advance call (unix
	// ns; advance.go: one call per advanceEvery, AdvanceEvery but in
	// tests, for all partitions).
	advNext      atomic.Int64
	advanceEvery time.Duration

	// replayBound bounds each replay record (ReplayRecordBytes; tests
	// lower it); drop and sweep delete Cluster records once commits pass
	// them (replaySweep).
	replayBound int
	drop        *redis.Script
	takesUntil  *redis.Script // lua.TakesUntil (late.go)
	sweep       replaySweep

	// capGeneral (tests only) decides every tenant through the capacity's
	// general path, without cap_one (90_run.lua): the two must agree.
	capGeneral bool
	// fullReply (tests only) asks admit.lua for its full reply, every
	// tenant's numbers, rather than the compact one: the two must agree.
	fullReply bool
}

// stateKey names a tenant under one rule set (the rules' windows name its keys).
type stateKey struct{ tenant, set string }

// tenantState is what a Limiter remembers of a tenant under one rule set:
// its key names, built once, and what the last replies said. The strings
// never change once built; full, chain and the cache fields are guarded by
// Limiter.mu.
type tenantState struct {
	key stateKey
	// keys: the frontier key, then the rules' key prefixes in rule order,
	// each boxed once, as go-redis takes a command's arguments: a call
	// passes them on without boxing each again (see admitCmd).
	keys []any
	// full: no room within the horizon before this time (zero: not known)
	// for an event that costs fullCost or more (see fullFor).
	full     time.Time
	fullCost Cost
	// chains: the ttl chain of each rule as the last reply gave it (nil:
	// none known); while now is before its end the script need not read
	// the anchor. A new slice replaces it, never changed in place.
	chains []chain
	// The links of stateCache's lists: list is nil while the state is not
	// in the cache; bytes is its estimated size (stateBytes).
	prev, next *tenantState
	list       *stateList
	bytes      int64
}

// chain is a ttl chain: windows start + i*step up to end (unix ms).
type chain struct{ start, end int64 }

// DefaultCacheBytes is the default of Options.CacheBytes: 16 MiB, about
// 12,000 states of 256-byte tenants under one rule, 30,000 of short names.
const DefaultCacheBytes = 16 << 20

// New returns a Limiter over rdb (a *redis.Client or *redis.ClusterClient)
// with the given rules. It loads the scripts, so a broken script or an
// unreachable Redis fails here.
func New(ctx context.Context, rdb redis.UniversalClient, rules *Rules, opts Options) (*Limiter, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if err := CheckRules(rules, opts.WindowKind); err != nil {
		return nil, err
	}
	_, cluster := rdb.(*redis.ClusterClient)
	if cluster && OneSlot(opts.Prefix) {
		cluster = false // every key in one slot: one call per batch, as on one Redis
	}
	if err := checkCapacityUse(rules, opts, cluster); err != nil {
		return nil, err
	}
	l := &Limiter{
		advanceEvery: AdvanceEvery,
		rdb:          rdb,
		cluster:      cluster,
		sent:         sentOffsets{perTenant: cluster},
		opts:         opts,
		keys:         keys{prefix: opts.Prefix, kind: opts.WindowKind, scope: opts.ReplayScope},
		admit:        redis.NewScript(lua.Admit),
		get:          redis.NewScript(lua.AlignedGet),
		release:      redis.NewScript(lua.Release),
		drop:         redis.NewScript(lua.ReplayDrop),
		takesUntil:   redis.NewScript(lua.TakesUntil),

		replayBound: ReplayRecordBytes,
	}
	l.fullReason = fmt.Sprintf("no room within the deferral horizon (%v)", opts.Horizon)
	l.rules.Store(rules)
	for _, s := range []*redis.Script{l.admit, l.get, l.release, l.drop, l.takesUntil} {
		cctx, cancel := context.WithTimeout(ctx, opts.Timeout)
		err := s.Load(cctx, rdb).Err()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("load script: %w", err)
		}
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	l.metrics = m
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(newCapacityCollector(l)); err != nil {
			return nil, fmt.Errorf("limiter metrics: %w", err)
		}
	}
	l.states = newStateCache(opts.CacheBytes, m)
	return l, nil
}

func ruleLists(rs *Rules) [][]Rule {
	if rs == nil {
		return nil
	}
	out := [][]Rule{rs.fallback}
	for _, t := range rs.Tenants() {
		out = append(out, rs.For(t))
	}
	return append(out, rs.overlayLists()...)
}

// CheckRules reports whether rules can be used with the window kind.
func CheckRules(rules *Rules, kind WindowKind) error {
	if kind == TTL {
		return nil
	}
	for _, rs := range ruleLists(rules) {
		for _, r := range rs {
			if err := r.checkAligned(); err != nil {
				return err
			}
		}
	}
	return nil
}

// SetRules replaces the rules, for events decided from now on. Counters are
// kept per rule, so a changed rule starts from its own (possibly empty)
// windows; the local cache is keyed by rule set and never applies to new rules.
func (l *Limiter) SetRules(r *Rules) error {
	if err := CheckRules(r, l.opts.WindowKind); err != nil {
		return err
	}
	if err := CheckCapacity(r, l.opts.Capacity); err != nil {
		return err
	}
	l.rules.Store(r)
	return nil
}

// Rules returns the rules in force.
func (l *Limiter) Rules() *Rules { return l.rules.Load() }

// Capacity returns the limiter's capacity (none: nil).
func (l *Limiter) Capacity() Capacity { return l.opts.Capacity }

// group is the events of one tenant in a batch.
type group struct {
	tenant string
	idx    []int
	rules  []Rule
	set    string
	st     *tenantState
	// chains is st.chains as read for this call (nil: unknown).
	chains []chain
	// byCost: the rules count bytes or units (see CountsCosts); costs are
	// then the costs of the events idx (else nil).
	byCost bool
	costs  []Cost
	// override is the version of the live override whose rules these are
	// (0: none); every decision of the group carries it.
	override int64
	// windows names the windows the rules count in, under a capacity (see
	// windowsID; "" without one); every deferral of the group carries it.
	windows string
	// from is the Rules value the batch is decided on (one per batch: its
	// rules, shares and floors all come from it).
	from *Rules
}

// Admit decides a batch that names no source and whose events cost nothing
// but their count: it is AdmitFrom with a zero Source and no costs (a
// tenant with a byte or unit rule is then an error), and a replay of it is
// counted again.
func (l *Limiter) Admit(ctx context.Context, tenants []string) ([]Decision, error) {
	s := getScratch()
	defer s.release()
	return l.admitFrom(ctx, s, positions{}, tenants, nil, false, time.Time{})
}

// AdmitCosts decides a batch that names no source: it is AdmitFrom with a
// zero Source.
func (l *Limiter) AdmitCosts(ctx context.Context, tenants []string, costs []Cost) ([]Decision, error) {
	s := getScratch()
	defer s.release()
	return l.admitFrom(ctx, s, positions{}, tenants, costs, false, time.Time{})
}

// AdmitFrom decides a batch of events. The result is index-aligned with
// events; one tenant's events are decided in slice order: the first that fit
// are admitted, the next get the earliest reserved slots, the rest are
// rejected. An event fits when every rule of its tenant has room for its
// cost: 1 for a rule that counts events, its Cost for a rule that counts
// bytes or units. An event whose cost is over a rule's whole limit is
// rejected with its own reason (it would never fit) and the events after it
// are decided as if it were not there. The whole
// batch costs one Redis round trip (one per node on Redis Cluster), none for
// tenants without rules or known to be full up to the horizon. The events
// of a tenant whose counter keys are broken get Fail decisions, and the
// other tenants are decided as usual. A non-nil error means Redis trouble
// and nothing was decided (nor counted): the batch may be retried.
//
// With a Source, an event whose position (its Offset in the source's
// partition) was decided by Redis before (from the source's Low offset on,
// see Source) gets that decision back and counts nothing; the others are
// decided as above, in order.
func (l *Limiter) AdmitFrom(ctx context.Context, src Source, events []Event) ([]Decision, error) {
	s := getScratch()
	defer s.release()
	tenants, costs, at := s.split(src, events)
	return l.admitFrom(ctx, s, at, tenants, costs, false, time.Time{})
}

// admitFrom is AdmitFrom, or when short AdmitNow (before zero) or
// AdmitBefore, over the events' tenants and costs (nil: every event costs
// its count only, and a tenant with a byte or unit rule is an error) and
// positions, in s.
func (l *Limiter) admitFrom(ctx context.Context, s *scratch, src positions, tenants []string, costs []Cost, short bool, before time.Time) ([]Decision, error) {
	if err := checkSource(src); err != nil {
		return nil, err
	}
	if costs != nil && len(costs) != len(tenants) {
		return nil, fmt.Errorf("admit: %d costs for %d events", len(costs), len(tenants))
	}
	now := l.opts.Clock()
	out := make([]Decision, len(tenants))
	order, err := l.groups(s, tenants, costs == nil)
	if err != nil {
		return nil, err
	}
	if costs != nil {
		takeCosts(order, costs, out, l.CapacityInForce())
	}
	var calls []*group
	l.mu.Lock()
	for _, g := range order {
		switch {
		case len(g.idx) == 0:
		case len(g.rules) == 0:
			for _, i := range g.idx {
				out[i] = Decision{Kind: Admit}
			}
		case !src.hasClaims(g) && l.rejectNever(g, src, out):
		default:
			g.st = l.stateLocked(g, now)
			local := src.late == nil || !src.late.take && !src.hasClaims(g) // AdmitLate: a take or a claim needs Redis
			if local && now.Before(g.st.full) && g.st.fullFor(g.costs) && !l.sent.mayReplay(src, g) {
				// Full up to the horizon: nothing can change before the
				// horizon reaches a window that was not full.
				l.metrics.cacheHits.Add(float64(len(g.idx)))
				for _, i := range g.idx {
					out[i] = Decision{Kind: Reject, Reason: l.fullReason}
				}
				continue
			}
			g.chains = g.st.chains
			calls = append(calls, g)
		}
	}
	l.sent.mark(src, calls)
	l.mu.Unlock()
	if len(calls) == 0 {
		markGroups(order, out)
		return out, nil
	}
	// The horizon's end: reservations start before it.
	hend := now.Add(l.opts.Horizon)
	if short {
		switch {
		case before.Before(now):
			hend = now
		case before.Before(hend):
			hend = before
		}
	}
	replies, err := l.call(ctx, s, now, calls, src, hend)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.sent.heard(src.Source, calls, replies)
	l.mu.Unlock()
	for j, g := range calls {
		if err := l.apply(g, replies[j], now, out, short); err != nil {
			return nil, err
		}
	}
	if l.opts.WindowKind == TTL {
		l.cacheChains(calls, replies)
	}
	if l.cluster {
		l.sweepReplays(ctx, src.Source, calls, replies)
	}
	markGroups(order, out)
	return out, nil
}

// groups returns the events of tenants grouped by tenant, in the order of
// their first events, with their rules; an error when noCosts and a tenant
// has a rule counting bytes or units. It works in s's slices, not per
// tenant: the groups share one slice, and their idx lists one array (each
// group's a full-capacity part of it).
func (l *Limiter) groups(s *scratch, tenants []string, noCosts bool) ([]*group, error) {
	rules := l.rules.Load()
	// First pass: number the tenants in order of first event, count their events.
	byTenant := s.byTenant
	gid := grow(s.gid, len(tenants))
	sizes := s.sizes[:0]
	for i, t := range tenants {
		n, ok := byTenant[t]
		if !ok {
			n = int32(len(sizes))
			byTenant[t] = n
			sizes = append(sizes, 0)
		}
		gid[i] = n
		sizes[n]++
	}
	s.gid, s.sizes = gid, sizes
	slab := grow(s.slab, len(sizes))
	clear(slab)
	order := grow(s.order, len(sizes))
	clear(order)
	idx := grow(s.idx, len(tenants))
	s.slab, s.order, s.idx = slab, order, idx
	// Most tenants share a few rule lists (the "*" rules, one slice; live
	// overrides with the same rules share one slice too): name each once
	// per batch rather than once per tenant.
	type names struct{ set, windows string }
	sets := map[*Rule]names{}
	at := 0
	for i, t := range tenants {
		n := gid[i]
		g := &slab[n]
		if order[n] == nil {
			r, over := rules.lookup(t)
			if len(r) == 0 && len(l.opts.Capacity) > 0 {
				r = l.opts.Capacity // with a capacity, a tenant without rules has it as its ceiling
			}
			*g = group{tenant: t, rules: r, override: over, from: rules, idx: idx[at : at : at+int(sizes[n])]}
			at += int(sizes[n])
			if len(r) > 0 {
				nm, ok := sets[&r[0]]
				if !ok {
					nm.set = l.setID(r)
					if len(l.opts.Capacity) > 0 {
						nm.windows = l.windowsID(r)
					}
					sets[&r[0]] = nm
				}
				g.set, g.windows = nm.set, nm.windows
			}
			// A capacity of bytes or units counts every tenant's costs.
			g.byCost = CountsCosts(g.rules) || l.opts.Capacity.Measure() != Events
			if g.byCost && noCosts {
				return nil, fmt.Errorf("admit: tenant %q has a rule or a capacity counting bytes or units, and the events have no costs", t)
			}
			order[n] = g
		}
		g.idx = append(g.idx, i)
	}
	return order, nil
}

// cacheChains keeps the ttl chains of the tenants in replies (the last two
// numbers per rule of each reply; those the call sent when the compact
// reply left the tenant out).
func (l *Limiter) cacheChains(calls []*group, replies []reply) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for j, g := range calls {
		switch {
		case replies[j].cached:
			g.st.chains = sentChains(g.st.chains, g, len(g.rules))
		case replies[j].failed == "":
			g.st.chains = replyChains(g.st.chains, replies[j].n, len(g.rules))
		}
	}
}

// stateLocked returns the state of g's tenant under g's rule set, made and
// remembered when missing (the cache evicts others to make room; see
// stateCache). l.mu must be held.
func (l *Limiter) stateLocked(g *group, now time.Time) *tenantState {
	k := stateKey{g.tenant, g.set}
	if st := l.states.get(k, now); st != nil {
		return st
	}
	st := &tenantState{key: k, keys: make([]any, 1+len(g.rules))}
	st.keys[0] = l.keys.frontier(g.tenant, g.set)
	for i, r := range g.rules {
		st.keys[1+i] = l.keys.rule(g.tenant, r)
	}
	l.states.add(st, now)
	return st
}

// markFull records that g's tenant is full up to the horizon until then for
// events that cost as much as the batch's event i (the first that found no
// room) or more, every event for event rules: they are rejected without
// Redis, and the cache keeps it last.
func (l *Limiter) markFull(g *group, until time.Time, i int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	g.st.fullCost = g.costOf(i)
	l.states.markFull(g.st, until)
}
