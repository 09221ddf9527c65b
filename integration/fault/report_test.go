//go:build fault

package fault

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The report of a scenario (its figures, then one summary line) and the
// assertions on them.

// outcome is everything a scenario's report and checks need.
type outcome struct {
	sc           scenario
	flow         flow
	kafkaVersion string
	fig          figures
	recs         []recovery
	marks        []faultMark
	bound        int // dupBound
	res          loadResult
	out          []outEvent // downstream and dead letter
	retry        []outEvent // the first retry tier
	took         time.Duration
}

// report prints the figures: in detail, then as one summary line.
func report(t *testing.T, o outcome) {
	t.Helper()
	f := o.fig
	p50, p99, worst := latencyQuantiles(f.Latency)
	t.Logf("figures: produced %d (extra source copies from retried producer writes: %d), downstream %d (%d through the retry path, %d of them after their slot), dead letter %d %v, foreign records %d",
		f.Produced, f.SourceDups, f.Downstream, f.Deferred, f.Late, f.DLQ, f.Reasons, f.Foreign)
	t.Logf("figures: lost %d, duplicated %d (bound %d), early %d, max_window %d/%d (%s)",
		f.Lost, f.Duplicated, o.bound, f.Early, f.MaxWindow, limitPerWindow, f.MaxAt)
	t.Logf("figures: Redis window counts sum to %d; the events read back account for %d counts (first copy of each: one per direct admission, one per deferral, one per admission after the slot; %d for extra source copies); difference %+d (G9: 0)",
		f.RedisCounted, f.Counts, f.SourceDupCounts, f.RedisCounted-f.Counts)
	t.Logf("figures: most counted in one window by Redis %d/%d (%s; G2 as the limiter kept it, copies aside)", f.RedisMost, limitPerWindow, f.RedisMostKey)
	off, worstTenants := tenantDiffs(f)
	t.Logf("figures: G9 per tenant: %d of %d tenants off, sum of differences %+d, sum of their absolute values %d; worst: %s; late reservations (checked again as new after their slot, which they gave back: one count each): %d of %d through the retry path; extra copies of a trip in the first retry tier (retried writes): %d",
		len(off), len(f.CountsByTenant), sumDiffs(off), sumAbs(off), worstTenants, f.Late, f.Deferred, f.RetryDups)
	lp99, lmax, lover := lateness(f.RetryLateness, window)
	t.Logf("figures: retry lateness (downstream append - gk-due, %d deferred events): p99 %v, max %v, %d more than a window (%v) late; %d downstream took a later reservation's slot (gk-took)",
		len(f.RetryLateness), lp99.Round(10*time.Millisecond), lmax.Round(10*time.Millisecond), lover, window, tookSlots(o.out, o.flow.Downstream))
	for i, m := range o.marks {
		to := o.res.End.Add(time.Hour)
		if i+1 < len(o.marks) {
			to = o.marks[i+1].at
		}
		ls := latenessDue(o.out, o.flow.Downstream, m.at, to)
		mp99, mmax, mover := lateness(ls, window)
		t.Logf("figures: retry lateness of the %d deferred events due from %s until the next fault: p99 %v, max %v, %d more than a window late",
			len(ls), m.name, mp99.Round(10*time.Millisecond), mmax.Round(10*time.Millisecond), mover)
	}
	for _, b := range f.Backs {
		ls := latenessAfter(o.out, o.flow.Downstream, b.at)
		bp99, bmax, _ := lateness(ls, 0)
		t.Logf("figures: after %s at %s: %d deferred events due before it came back %v after it at p99, %v at most (target: 2s; first %v, p50 %v)",
			b.name, b.at.UTC().Format("15:04:05.000"), len(ls), bp99.Round(10*time.Millisecond), bmax.Round(10*time.Millisecond),
			quantile(ls, 0).Round(10*time.Millisecond), quantile(ls, 0.5).Round(10*time.Millisecond))
	}
	t.Logf("figures: count diff: Redis window counts %d - events counted once %d = %+d (%+.2f%% of the events)",
		f.RedisCounted, f.Once, f.RedisCounted-f.Once, 100*float64(f.RedisCounted-f.Once)/float64(max(f.Once, 1)))
	t.Logf("figures: latency of directly admitted events: p50 %v, p99 %v, max %v (%d events); by produce time: %s",
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), worst.Round(time.Millisecond), len(f.Latency),
		latencyTimeline(f.Latency, o.res.Start, 4*time.Second))
	if len(f.NormalDeferred) > 0 {
		t.Logf("figures: events of normal tenants deferred, by produce time: %v", f.NormalDeferred)
	}
	recover := "none"
	worstRec, allOK := time.Duration(0), len(o.recs) > 0
	for _, r := range o.recs {
		if r.ok {
			t.Logf("recover: %s: healthy again after %v", r.fault, r.took.Round(100*time.Millisecond))
			worstRec = max(worstRec, r.took)
		} else {
			t.Logf("recover: %s: NOT healthy again before the next phase: %s", r.fault, r.note)
			allOK = false
		}
	}
	if allOK {
		recover = fmt.Sprintf("%.1fs", worstRec.Seconds())
	}
	if f.MaxWindow > limitPerWindow {
		t.Logf("max_window: %s: %s; Redis counted %s in that window", f.MaxAt,
			windowDetail(o.out, o.res, o.flow.Downstream, f.MaxTenant, f.MaxIdx, window),
			redisWindowCount(o.flow.Prefix, f.MaxTenant, f.MaxIdx))
	}
	for _, id := range f.DupIDs[:min(len(f.DupIDs), 5)] {
		t.Logf("duplicated id %d: %s", id, strings.Join(copiesOf(o.out, id), " | "))
	}
	dup := strconv.Itoa(f.Duplicated)
	if o.bound > 0 {
		dup += fmt.Sprintf(" (bound %d)", o.bound)
	}
	t.Logf("fault %s kafka=%s: produced=%d downstream=%d dlq=%d lost=%d duplicated=%s early=%d max_window=%d/%d redis_max_window=%d/%d count_diff=%+.2f%% retry_late_p99=%.1fs retry_late_max=%.1fs recover=%s took=%v",
		o.sc.name, o.kafkaVersion, f.Produced, f.Downstream, f.DLQ, f.Lost, dup, f.Early, f.MaxWindow, limitPerWindow,
		f.RedisMost, limitPerWindow, 100*float64(f.RedisCounted-f.Once)/float64(max(f.Once, 1)), lp99.Seconds(), lmax.Seconds(),
		recover, o.took.Round(time.Second))
}

// redisWindowCount reads what Redis counted for tenant in window idx (key
// <prefix>:{<tenant>}:5s:<start ms>, internal/limit/keys.go), for a report.
func redisWindowCount(prefix, tenant string, idx int64) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer rdb.Close()
	key := fmt.Sprintf("%s:{%s}:5s:%d", prefix, tenant, idx*window.Milliseconds())
	n, err := rdb.HGet(ctx, key, "count").Result()
	if err != nil {
		return fmt.Sprintf("? (%s: %v)", key, err)
	}
	return n
}

// redisCounted sums the counts of every window key under prefix
// (<prefix>:{<tenant>}:5s:<start ms>; frontier, anchor and replay record
// keys left out), in all and by tenant. Keys that expired since the poller
// last saw them (a 5s window's key lives two minutes after its window ends,
// shorter than a long scenario) count what the poller saw last.
//
// It also returns the largest count of one window and its key: G2 as Redis
// kept it, every event the window counted (admitted there or reserved for
// it), whenever it was appended downstream.
func redisCounted(ctx context.Context, prefix string, seen map[string]int) (sum int, byTenant map[string]int, most int, mostKey string, err error) {
	counts, err := windowCounts(ctx, prefix)
	for k, n := range seen {
		if _, ok := counts[k]; !ok {
			counts[k] = n
		}
	}
	byTenant = map[string]int{}
	for k, n := range counts {
		sum += n
		_, rest, _ := strings.Cut(k, ":{")
		tenant, _, _ := strings.Cut(rest, "}")
		byTenant[tenant] += n
		if n > most || (n == most && k < mostKey) {
			most, mostKey = n, k
		}
	}
	return sum, byTenant, most, mostKey, err
}

// windowCounts reads the count of every window key under prefix.
func windowCounts(ctx context.Context, prefix string) (map[string]int, error) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ReadTimeout: 10 * time.Second})
	defer rdb.Close()
	counts := map[string]int{}
	iter := rdb.Scan(ctx, 0, prefix+":{*}:5s:*", 1000).Iterator()
	for iter.Next(ctx) {
		n, err := rdb.HGet(ctx, iter.Val(), "count").Int()
		if err == redis.Nil {
			continue // expired since the scan
		}
		if err != nil {
			return counts, fmt.Errorf("hget %s count: %w", iter.Val(), err)
		}
		counts[iter.Val()] = n
	}
	return counts, iter.Err()
}

// countPoller reads the window counts under a prefix every few seconds
// until stopped, keeping the last count seen of each key.
type countPoller struct {
	stopc, done chan struct{}
	mu          sync.Mutex
	last        map[string]int
}

func startCountPoller(prefix string, every time.Duration) *countPoller {
	p := &countPoller{stopc: make(chan struct{}), done: make(chan struct{}), last: map[string]int{}}
	go func() {
		defer close(p.done)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), every)
			counts, _ := windowCounts(ctx, prefix)
			cancel()
			p.mu.Lock()
			maps.Copy(p.last, counts)
			p.mu.Unlock()
			select {
			case <-p.stopc:
				return
			case <-time.After(every):
			}
		}
	}()
	return p
}

// stop stops polling and returns the last count seen of each key.
func (p *countPoller) stop() map[string]int {
	select {
	case <-p.stopc:
	default:
		close(p.stopc)
	}
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// tenantDiff is one tenant's window counts in Redis minus the counts its
// events read back account for.
type tenantDiff struct {
	tenant string
	diff   int
}

// tenantDiffs returns the tenants whose counts differ (G9), the largest
// difference first, and the worst five described.
func tenantDiffs(f figures) ([]tenantDiff, string) {
	var off []tenantDiff
	tenants := maps.Clone(f.CountsByTenant)
	maps.Copy(tenants, f.RedisByTenant)
	for tenant := range tenants {
		if d := f.RedisByTenant[tenant] - f.CountsByTenant[tenant]; d != 0 {
			off = append(off, tenantDiff{tenant, d})
		}
	}
	slices.SortFunc(off, func(a, b tenantDiff) int {
		return cmp.Or(cmp.Compare(abs(b.diff), abs(a.diff)), strings.Compare(a.tenant, b.tenant))
	})
	var parts []string
	for _, d := range off[:min(len(off), 5)] {
		parts = append(parts, fmt.Sprintf("%s %+d (Redis %d, events %d)", d.tenant, d.diff, f.RedisByTenant[d.tenant], f.CountsByTenant[d.tenant]))
	}
	if len(parts) == 0 {
		return off, "none"
	}
	return off, strings.Join(parts, ", ")
}

func sumDiffs(ds []tenantDiff) (n int) {
	for _, d := range ds {
		n += d.diff
	}
	return n
}

func sumAbs(ds []tenantDiff) (n int) {
	for _, d := range ds {
		n += abs(d.diff)
	}
	return n
}

func abs(n int) int { return max(n, -n) }

// inFlightAtCut is how long after a fault's mark the writes in flight when
// it began may still be appended (a proxy cuts just after the mark): a
// zombie's late write lands only once the network returns, seconds later.
const inFlightAtCut = time.Second

// check asserts the guarantees of the scenario on the figures.
func check(t *testing.T, o outcome) {
	t.Helper()
	f := o.fig
	if f.Lost > 0 {
		var ex []string
		for _, id := range f.LostIDs[:min(len(f.LostIDs), 10)] {
			s := o.res.Events[id]
			ex = append(ex, fmt.Sprintf("%d (%s, produced %s)", id, o.res.Tenants[s.tenant].name, s.produced.UTC().Format("15:04:05.000")))
		}
		t.Errorf("lost: got %d, want 0 (G1): %s", f.Lost, strings.Join(ex, ", "))
	}
	if f.Early > 0 {
		t.Errorf("early: got %d downstream events appended before their gk-due, want 0 (G3)", f.Early)
	}
	// G9, per tenant. Late reservations give their missed slot back and
	// count once, in the window they were admitted in again. Extra
	// copies written by retried writes are: an extra source copy is a
	// position of its own (its counts are estimated from the first copy's,
	// which may have been decided otherwise), and so is an extra retry-tier
	// copy of a trip checked in another batch than the first (one count).
	off, worst := tenantDiffs(f)
	if allowed := f.SourceDupCounts + f.RetryDups; allowed == 0 && len(off) > 0 {
		t.Errorf("G9: Redis window counts minus the events' counts: got %+d over %d tenants (worst: %s), want 0 for every tenant", sumDiffs(off), len(off), worst)
	} else if sumAbs(off) > allowed {
		t.Errorf("G9: Redis window counts minus the events' counts: got |%d| over %d tenants (worst: %s), want at most %d: the counts of the %d extra source copies (%d) and the %d extra retry-tier copies",
			sumAbs(off), len(off), worst, allowed, f.SourceDups, f.SourceDupCounts, f.RetryDups)
	}
	// G2 in every scenario, from what Redis counted: the downstream tally
	// (MaxWindow) is asserted only where nothing is decided at a window's
	// end and appended in the next (exact scenarios, below).
	if f.RedisMost > limitPerWindow {
		t.Errorf("G2: Redis counted %d in %s, want at most %d", f.RedisMost, f.RedisMostKey, limitPerWindow)
	}
	if f.RedisMostKey == "" {
		t.Errorf("G2: no window count read from Redis (prefix %s): nothing to check the limit against", o.flow.Prefix)
	}
	if tol := o.sc.countTolerance; tol > 0 {
		if diff := f.RedisCounted - f.Once; float64(abs(diff)) > tol*float64(f.Once) {
			t.Errorf("count diff: Redis window counts %d, events counted once %d: got %+d (%+.2f%%), want within %.0f%% (a deferred event that misses its slot gives it back)",
				f.RedisCounted, f.Once, diff, 100*float64(diff)/float64(max(f.Once, 1)), 100*tol)
		}
	}
	if o.sc.exact {
		if f.Duplicated > 0 {
			t.Errorf("duplicated: got %d, want 0 (G8: a graceful handover duplicates nothing)", f.Duplicated)
		}
		if f.MaxWindow > limitPerWindow {
			t.Errorf("max_window: got %d events of %s, want at most %d (G2)", f.MaxWindow, f.MaxAt, limitPerWindow)
		}
	} else {
		if f.Duplicated > o.bound {
			t.Errorf("duplicated: got %d, want at most %d (dupBound)", f.Duplicated, o.bound)
		}
		if o.sc.noStrayCopies && len(o.marks) > 0 {
			stray, again, most, at := strayCopies(o.out, o.retry, o.flow.Downstream, window, o.marks[0].at.Add(inFlightAtCut))
			t.Logf("figures: stray copies %d (downstream copies no crash explains: a zombie's late writes, a handover that forgot what was finished); "+
				"copies of a redelivered deferral's extra record read after its slot and deferred again %d; max_window without a crash's redelivery %d/%d (%s)",
				len(stray), again, most, limitPerWindow, at)
			if len(stray) > 0 {
				var ex []string
				for _, e := range stray[:min(len(stray), 5)] {
					ex = append(ex, fmt.Sprintf("id %d: %s; its records in the first retry tier: %s", e.id,
						strings.Join(copiesOf(o.out, e.id), " | "), strings.Join(copiesOf(o.retry, e.id), " | ")))
				}
				t.Errorf("stray copies: got %d, want 0 (a zombie's writes are fenced, a handover forgets nothing finished): %s",
					len(stray), strings.Join(ex, "; "))
			}
		}
	}
}

// tookSlots counts the events in topic that took a later reservation's slot
// (gk-took: a late event kept its place, #22).
func tookSlots(events []outEvent, topic string) int {
	n := 0
	for _, e := range events {
		if e.topic == topic && e.took {
			n++
		}
	}
	return n
}
