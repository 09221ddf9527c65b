package integration

import (
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// Tests of the retry path (issue 4): deferred events come back through the
// retry tiers never early (G3), promptly, in the slot reserved for them, and
// without loss when the instance holding the retry partitions dies.
//
// Test events are keyed by tenant; the value is "<id>|<unix ms produced>".
// The downstream topic stamps LogAppendTime (newFlow). kafka-go's reader
// ignores a batch's timestamp type and returns the producer's time (which
// the Router keeps from the source event), so these tests read outputs with
// readTopic (franz-go), whose m.Time is the broker's append time: when the
// event was forwarded.

// rtEvent returns a test event of tenant for a source partition.
func rtEvent(tenant, id string, partition int) kafka.Message {
	return kafka.Message{Partition: partition, Key: []byte(tenant),
		Value: fmt.Appendf(nil, "%s|%d", id, time.Now().UnixMilli())}
}

// rtID returns the id and production time of a test event (from any topic).
func rtID(m kafka.Message) (id string, produced time.Time) {
	id, ms, ok := strings.Cut(string(m.Value), "|")
	if !ok {
		return string(m.Value), time.Time{}
	}
	n, _ := strconv.ParseInt(ms, 10, 64)
	return id, time.UnixMilli(n)
}

// rtMillis reads a unix-ms gk- header; ok is false if it is absent.
func rtMillis(t testing.TB, m kafka.Message, k string) (time.Time, bool) {
	t.Helper()
	v := header(m, k)
	if v == "" {
		return time.Time{}, false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("header %s of %s/%d@%d: %q is not unix ms", k, m.Topic, m.Partition, m.Offset, v)
	}
	return time.UnixMilli(n), true
}

// rtWriter returns a producer for topic that writes each message to the
// partition it names; it is closed when the test ends.
func rtWriter(t testing.TB, topic string) *kafka.Writer {
	w := partitionWriter(topic)
	t.Cleanup(func() { w.Close() })
	return w
}

func rtWrite(t testing.TB, w *kafka.Writer, msgs ...kafka.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce %d events to %s: %v", len(msgs), w.Topic, err)
	}
}

// rtWaitAssigned waits until procs are the members of one generation of each
// group and together own its partitions (parts per group), so that a test
// starts with every partition consumed. It returns the partitions of each
// process, by group.
func rtWaitAssigned(t testing.TB, groups map[string]int, procs ...*gkProc) map[string]map[*gkProc][]string {
	t.Helper()
	ps := make([]*testenv.Process, len(procs))
	for i, p := range procs {
		ps[i] = p.Process
	}
	var owned map[string][][]string
	waitFor(t, 90*time.Second, "consumer groups assigned", func() (ok bool, status string) {
		ok, owned, status = testenv.Assigned(groups, ps...)
		return ok, status
	})
	byProc := map[string]map[*gkProc][]string{}
	for group, parts := range owned {
		byProc[group] = map[*gkProc][]string{}
		for i, p := range procs {
			byProc[group][p] = parts[i]
		}
	}
	return byProc
}

// rtGroups are the consumer groups of a flow's gatekeepers and how many
// partitions each consumes (newFlow: three per retry tier).
func rtGroups(f flow, sourceParts int) map[string]int {
	return map[string]int{"gk-" + f.Source: sourceParts, "gk-" + f.Source + ".retry": 9}
}

// rtSpan is one event that was counted against its tenant once, in some
// window whose index is known to lie in [lo, hi].
type rtSpan struct {
	lo, hi int64
	id     string
}

// rtSpanOf returns the windows (of length win, aligned on the epoch, as
// aligned second windows are) in which the downstream event m can have been
// counted:
//   - forwarded from the retry path inside its reserved slot (appended before
//     gk-reserved): the window that holds gk-due, exactly;
//   - with gk-due but appended after the slot ended: forwarded in the slot, or
//     checked again as new after it (a window up to the append time);
//   - admitted directly: a window between production and append time.
func rtSpanOf(t testing.TB, m kafka.Message, win time.Duration) rtSpan {
	id, produced := rtID(m)
	idx := func(at time.Time) int64 { return at.UnixMilli() / win.Milliseconds() }
	s := rtSpan{id: id, hi: idx(m.Time)}
	if due, ok := rtMillis(t, m, "gk-due"); ok {
		s.lo = idx(due)
		if reserved, ok := rtMillis(t, m, "gk-reserved"); ok && m.Time.Before(reserved) {
			s.hi = s.lo
		}
		return s
	}
	s.lo = idx(produced)
	return s
}

// rtSpanHeap is a min-heap of spans by hi.
type rtSpanHeap []rtSpan

func (h rtSpanHeap) Len() int           { return len(h) }
func (h rtSpanHeap) Less(i, j int) bool { return h[i].hi < h[j].hi }
func (h rtSpanHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *rtSpanHeap) Push(x any)        { *h = append(*h, x.(rtSpan)) }
func (h *rtSpanHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// rtOverLimit reports a window that must have counted more than limit of
// spans, however each span's uncertain window is resolved: it gives each
// window, in order, up to limit of the open spans that end soonest (optimal
// for interval assignment), and fails at the first window where a span ends
// unplaced. It returns ok=true if every span has a place.
func rtOverLimit(spans []rtSpan, limit int) (window int64, placed int, unplaced []string, ok bool) {
	spans = slices.Clone(spans)
	slices.SortFunc(spans, func(a, b rtSpan) int { return cmp.Compare(a.lo, b.lo) })
	var open rtSpanHeap
	i := 0
	for i < len(spans) || open.Len() > 0 {
		if open.Len() == 0 {
			window = spans[i].lo
		}
		for i < len(spans) && spans[i].lo <= window {
			heap.Push(&open, spans[i])
			i++
		}
		placed = 0
		for placed < limit && open.Len() > 0 {
			heap.Pop(&open)
			placed++
		}
		for open.Len() > 0 && open[0].hi <= window {
			unplaced = append(unplaced, heap.Pop(&open).(rtSpan).id)
		}
		if len(unplaced) > 0 {
			return window, placed, unplaced, false
		}
		window++
	}
	return 0, 0, nil, true
}

// rtCheckWindows fails the test if the tenant's downstream events (one per
// id) cannot have been counted with at most limit per window of length win.
func rtCheckWindows(t *testing.T, tenant string, down []kafka.Message, limit int, win time.Duration) {
	t.Helper()
	seen := map[string]bool{}
	var spans []rtSpan
	for _, m := range down {
		if string(m.Key) != tenant {
			continue
		}
		s := rtSpanOf(t, m, win)
		if seen[s.id] {
			continue
		}
		seen[s.id] = true
		spans = append(spans, s)
	}
	if w, placed, unplaced, ok := rtOverLimit(spans, limit); !ok {
		t.Errorf("tenant %s: window starting %v: got more than %d downstream events counted in it (%d placed, %d more: %v), want at most %d",
			tenant, time.UnixMilli(w*win.Milliseconds()).UTC(), limit, placed, len(unplaced), unplaced, limit)
	}
}

// rtPercentile returns the p-th percentile (0 < p <= 1) of sorted ds.
func rtPercentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(float64(len(ds))*p+0.999999) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

func TestRtOverLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spans []rtSpan
		limit int
		ok    bool
	}{
		{"exact fits", []rtSpan{{1, 1, "a"}, {1, 1, "b"}, {2, 2, "c"}}, 2, true},
		{"exact over", []rtSpan{{1, 1, "a"}, {1, 1, "b"}, {1, 1, "c"}}, 2, false},
		{"uncertain moves later", []rtSpan{{1, 1, "a"}, {1, 2, "b"}, {1, 1, "c"}}, 2, true},
		{"uncertain cannot move", []rtSpan{{1, 2, "a"}, {2, 2, "b"}, {2, 2, "c"}, {1, 1, "d"}, {1, 1, "e"}}, 2, false},
		{"gap between windows", []rtSpan{{1, 1, "a"}, {9, 9, "b"}, {9, 9, "c"}}, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, _, ok := rtOverLimit(tc.spans, tc.limit); ok != tc.ok {
				t.Errorf("got ok=%v, want %v", ok, tc.ok)
			}
		})
	}
}

// TestRetryNeverEarly runs a gatekeeper (ROLES=gate,retry) over tenants with
// 1s, 10s and 1h windows sharing the source partitions, produces bursts over
// the limits for a while and waits until the deferred events of the short
// windows have come back. Every downstream event that went through the retry
// path must have been appended at or after its gk-due (G3), and its lateness
// (append time - gk-due) must be small: p99 under a second.
func TestRetryNeverEarly(t *testing.T) {
	t.Parallel()
	f := newFlow(t, 3)
	limits := "fast-a=5/1s;fast-b=5/1s;slow-a=20/10s;slow-b=20/10s;long-a=1/1h;long-b=1/1h"
	gk := startGatekeeper(t, "gk", f.env(t, "GATEKEEPER_LIMITS", limits, "GATEKEEPER_WINDOW", "aligned"))
	gk.waitReady(90 * time.Second)
	rtWaitAssigned(t, rtGroups(f, 3), gk)

	// Per second and tenant: fast 8 (limit 5/s), slow 4 (limit 2/s on
	// average, in 10s windows), long 1 (limit 1/h: deferred by hours, into
	// the .1h and .long tiers or rejected). Every tenant is spread over all
	// source partitions.
	const rounds = 12
	perRound := map[string]int{"fast-a": 8, "fast-b": 8, "slow-a": 4, "slow-b": 4, "long-a": 1, "long-b": 1}
	tenants := []string{"fast-a", "fast-b", "slow-a", "slow-b", "long-a", "long-b"}
	want := map[string]int{} // tenant -> events produced
	w := rtWriter(t, f.Source)
	start := time.Now()
	for r := range rounds {
		var batch []kafka.Message
		for _, tenant := range tenants {
			for i := range perRound[tenant] {
				id := fmt.Sprintf("%s-%d-%d", tenant, r, i)
				batch = append(batch, rtEvent(tenant, id, (r+i+len(batch))%3))
				want[tenant]++
			}
		}
		rtWrite(t, w, batch...)
		time.Sleep(time.Until(start.Add(time.Duration(r+1) * time.Second)))
	}

	// fast and slow events all come back (the last slow ones within about
	// 30s of the start); long ones: one per tenant admitted, the rest wait.
	short := []string{"fast-a", "fast-b", "slow-a", "slow-b"}
	var down []kafka.Message
	waitFor(t, 90*time.Second, "the fast and slow tenants' events downstream", func() (bool, string) {
		down = readTopic(t, f.Downstream)
		got := map[string]map[string]bool{}
		for _, m := range down {
			id, _ := rtID(m)
			if got[string(m.Key)] == nil {
				got[string(m.Key)] = map[string]bool{}
			}
			got[string(m.Key)][id] = true
		}
		var status []string
		ok := true
		for _, tenant := range short {
			status = append(status, fmt.Sprintf("%s %d/%d", tenant, len(got[tenant]), want[tenant]))
			ok = ok && len(got[tenant]) == want[tenant]
		}
		return ok, strings.Join(status, ", ")
	})
	elapsed := time.Since(start)

	var (
		retried int
		late    []time.Duration // append time - gk-due, for deferrals of at most a minute
		early   []string
	)
	for _, m := range down {
		due, ok := rtMillis(t, m, "gk-due")
		if !ok {
			continue
		}
		retried++
		if m.Time.Before(due) {
			id, _ := rtID(m)
			early = append(early, fmt.Sprintf("%s (attempt %s) appended %v, due %v: %v early",
				id, header(m, "gk-attempt"), m.Time.UTC().Format(time.StampMilli), due.UTC().Format(time.StampMilli), due.Sub(m.Time)))
		}
		if first, ok := rtMillis(t, m, "gk-first-seen"); ok && due.Sub(first) <= time.Minute {
			late = append(late, m.Time.Sub(due))
		}
	}
	t.Run("never early", func(t *testing.T) {
		if len(early) > 0 {
			t.Errorf("got %d of %d deferred events forwarded before gk-due, want none (G3):\n%s",
				len(early), retried, strings.Join(rtHead(early), "\n"))
		}
		// Enough deferrals came back for the check to mean something: the fast
		// and slow tenants alone defer well over 100 events.
		if retried < 100 {
			t.Errorf("deferred events back downstream: got %d, want at least 100", retried)
		}
	})
	t.Run("lateness", func(t *testing.T) {
		slices.Sort(late)
		p50, p99 := rtPercentile(late, 0.5), rtPercentile(late, 0.99)
		t.Logf("retry lateness (downstream append time - gk-due) over %d events due within a minute: p50 %v, p99 %v, max %v",
			len(late), p50, p99, rtPercentile(late, 1))
		if len(late) < 100 {
			t.Errorf("events for the lateness figure: got %d, want at least 100", len(late))
		}
		if p99 >= time.Second {
			t.Errorf("retry lateness p99: got %v, want under 1s (issue 4). On a loaded shared machine this can "+
				"come from CPU starvation of the broker or gatekeeper; see the log above for the distribution", p99)
		}
	})

	// And the limits held, reserved slots included (G2 as seen downstream).
	for _, tenant := range short {
		limit, win := 5, time.Second
		if strings.HasPrefix(tenant, "slow-") {
			limit, win = 20, 10*time.Second
		}
		rtCheckWindows(t, tenant, down, limit, win)
	}

	// The lateness histogram of the first tier saw every event that came back.
	if n := rtMetricSum(t, gk, `gatekeeper_retry_lateness_seconds_count{topic="`+f.Retry+`"}`); n < float64(retried) {
		t.Errorf("gatekeeper_retry_lateness_seconds_count for %s: got %v, want at least %d", f.Retry, n, retried)
	}

	// The long tenants' deferrals went to the hour tiers (the next hour's
	// slot to .1h, or to the first tier in the last minute of an hour; the
	// later ones to .long), sharing source partitions with the short ones
	// without holding them up.
	tiers := map[string]int{}
	for _, tier := range []string{f.Retry, f.Retry + ".1h", f.Retry + ".long"} {
		for _, m := range readTopic(t, tier) {
			if strings.HasPrefix(string(m.Key), "long-") {
				tiers[tier]++
			}
		}
	}
	if tiers[f.Retry+".long"] == 0 || tiers[f.Retry+".1h"]+tiers[f.Retry] == 0 {
		t.Errorf("long tenants' deferrals per tier: got %v, want some in %s.long and in %s.1h (or %s)",
			tiers, f.Retry, f.Retry, f.Retry)
	}
	t.Logf("%d deferred events back downstream in %v; long tenants' deferrals per tier %v",
		retried, elapsed.Round(time.Second), tiers)
}

// TestRetryNoStarvation checks that deferred events get the slots reserved
// for them: a burst over the limit reserves the next windows of a 1s and a
// 10s tenant; live events of the same tenants that follow must not take
// those places. Every burst event reaches downstream inside its reserved
// slot, no live event is counted before the burst's last window, and no
// window holds more than the limit.
func TestRetryNoStarvation(t *testing.T) {
	t.Parallel()
	f := newFlow(t, 3)
	limits := map[string]int{"fast": 5, "slow": 20}
	windows := map[string]time.Duration{"fast": time.Second, "slow": 10 * time.Second}
	prefix := keyPrefix(t)
	gk := startGatekeeper(t, "gk", f.env(t, "GATEKEEPER_LIMITS", "fast=5/1s;slow=20/10s",
		"GATEKEEPER_REDIS_KEY_PREFIX", prefix))
	gk.waitReady(90 * time.Second)
	rtWaitAssigned(t, rtGroups(f, 3), gk)
	w := rtWriter(t, f.Source)

	// The burst: fast 30 (5 admitted, 5 windows of 1s reserved), slow 50
	// (20 admitted, 2 windows of 10s reserved).
	burst := map[string]bool{}
	var msgs []kafka.Message
	for i := range 50 {
		for _, tenant := range []string{"fast", "slow"} {
			if tenant == "fast" && i >= 30 {
				continue
			}
			id := fmt.Sprintf("burst-%s-%d", tenant, i)
			burst[id] = true
			msgs = append(msgs, rtEvent(tenant, id, i%3))
		}
	}
	rtWrite(t, w, msgs...)
	// The burst's reservations, from the retry tier, once all is routed.
	type slot struct{ due, reserved time.Time }
	reserved := map[string]slot{}
	lastBurst := map[string]time.Time{} // tenant -> latest gk-due of the burst
	waitFor(t, 60*time.Second, "burst routed", func() (bool, string) {
		retry := f.readRetry(t)
		down := readTopic(t, f.Downstream)
		routed := map[string]bool{}
		for _, m := range append(down, retry...) {
			if id, _ := rtID(m); burst[id] {
				routed[id] = true
			}
		}
		for _, m := range retry {
			id, _ := rtID(m)
			due, _ := rtMillis(t, m, "gk-due")
			end, _ := rtMillis(t, m, "gk-reserved")
			if burst[id] && header(m, "gk-attempt") == "1" {
				reserved[id] = slot{due, end}
				if due.After(lastBurst[string(m.Key)]) {
					lastBurst[string(m.Key)] = due
				}
			}
		}
		return len(routed) == len(burst), fmt.Sprintf("%d of %d burst events routed", len(routed), len(burst))
	})
	if len(reserved) != 25+30 {
		t.Fatalf("burst events deferred: got %d, want %d (25 fast, 30 slow)", len(reserved), 25+30)
	}

	// Live events of the same tenants, while the reserved windows pass: fast
	// at its limit (5/s) for 6s, slow 10 in all.
	live := map[string]bool{}
	liveStart := time.Now()
	for i := range 30 {
		batch := []kafka.Message{rtEvent("fast", fmt.Sprintf("live-fast-%d", i), i%3)}
		if i%3 == 0 {
			batch = append(batch, rtEvent("slow", fmt.Sprintf("live-slow-%d", i/3), (i+1)%3))
		}
		for _, m := range batch {
			id, _ := rtID(m)
			live[id] = true
		}
		rtWrite(t, w, batch...)
		time.Sleep(time.Until(liveStart.Add(time.Duration(i+1) * 200 * time.Millisecond)))
	}

	var down []kafka.Message
	waitFor(t, 90*time.Second, "burst and live events downstream", func() (bool, string) {
		down = readTopic(t, f.Downstream)
		got := map[string]bool{}
		for _, m := range down {
			id, _ := rtID(m)
			got[id] = true
		}
		n := 0
		for id := range burst {
			if got[id] {
				n++
			}
		}
		l := 0
		for id := range live {
			if got[id] {
				l++
			}
		}
		return n == len(burst) && l == len(live), fmt.Sprintf("burst %d/%d, live %d/%d", n, len(burst), l, len(live))
	})

	for _, m := range down {
		id, _ := rtID(m)
		tenant := string(m.Key)
		if s, ok := reserved[id]; ok {
			// A reserved burst event went downstream in its slot, uncounted.
			if m.Time.Before(s.due) || !m.Time.Before(s.reserved) {
				t.Errorf("burst event %s appended %v, want inside its reserved slot [%v, %v) (late by %v)",
					id, m.Time.UTC().Format(time.StampMilli), s.due.UTC().Format(time.StampMilli),
					s.reserved.UTC().Format(time.StampMilli), m.Time.Sub(s.due))
			}
			continue
		}
		if !live[id] {
			continue
		}
		// Every window before the burst's last one is full of the burst's
		// events: a live event counted there took a reserved place.
		last := lastBurst[tenant].Truncate(windows[tenant])
		if due, ok := rtMillis(t, m, "gk-due"); ok {
			if due.Before(last) {
				t.Errorf("live event %s: deferred to %v, want not before the burst's last window %v",
					id, due.UTC().Format(time.StampMilli), last.UTC().Format(time.StampMilli))
			}
		} else if m.Time.Before(last) {
			t.Errorf("live event %s: admitted directly, appended %v, want not before the burst's last window %v",
				id, m.Time.UTC().Format(time.StampMilli), last.UTC().Format(time.StampMilli))
		}
	}
	for tenant, limit := range limits {
		rtCheckWindows(t, tenant, down, limit, windows[tenant])
	}
	// The counters agree: no window of either tenant counted over its limit.
	for _, cw := range rtWindowCounts(t, prefix) {
		if cw.count > int64(limits[cw.tenant]) {
			t.Errorf("redis window %s: got count %d, want at most %d", cw.key, cw.count, limits[cw.tenant])
		}
	}
	t.Logf("burst %d (last due fast %v, slow %v), live %d, downstream %d",
		len(burst), lastBurst["fast"].UTC().Format(time.StampMilli), lastBurst["slow"].UTC().Format(time.StampMilli),
		len(live), len(down))
}

// rtWindowCount is one aligned window counter in Redis.
type rtWindowCount struct {
	key, tenant string
	count       int64
}

// rtWindowCounts returns the window counters under prefix
// (<prefix>:{<tenant>}:<window>:<start ms>, e.g. gk:{acme}:1s:1700000000000;
// the tenant's frontier and ttl anchor keys are left out).
func rtWindowCounts(t testing.TB, prefix string) []rtWindowCount {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer rdb.Close()
	var out []rtWindowCount
	iter := rdb.Scan(ctx, 0, prefix+":{*}:*:*", 1000).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		if strings.Contains(key, ":frontier:") || strings.HasSuffix(key, ":anchor") {
			continue
		}
		lb, rb := strings.Index(key, "{"), strings.Index(key, "}")
		c, err := rdb.HGet(ctx, key, "count").Int64()
		if err != nil {
			t.Fatalf("hget %s count: %v", key, err)
		}
		out = append(out, rtWindowCount{key: key, tenant: key[lb+1 : rb], count: c})
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("scan %s: %v", prefix, err)
	}
	if len(out) == 0 {
		t.Fatalf("no window counters under %s", prefix)
	}
	return out
}

// TestRetryNoLossAcrossKill runs two gatekeepers, defers a burst, kills the
// one with most deferred events waiting in its retry partitions (SIGKILL), restarts it, and checks that every produced
// event reaches downstream or the dead-letter topic at least once (G1), none
// early (G3).
func TestRetryNoLossAcrossKill(t *testing.T) {
	t.Parallel()
	f := newFlow(t, 3)
	env := f.env(t, "GATEKEEPER_LIMITS", "fast=5/1s;slow=20/10s", "GATEKEEPER_KAFKA_SESSION_TIMEOUT", "8s")
	a := startGatekeeper(t, "a", env)
	b := startGatekeeper(t, "b", env)
	a.waitReady(90 * time.Second)
	b.waitReady(90 * time.Second)
	owned := rtWaitAssigned(t, rtGroups(f, 3), a, b)["gk-"+f.Source+".retry"]
	w := rtWriter(t, f.Source)

	produced := map[string]bool{}
	burst := func(name string, fast, slow int) {
		var msgs []kafka.Message
		for i := range max(fast, slow) {
			for _, tenant := range []string{"fast", "slow"} {
				if (tenant == "fast" && i >= fast) || (tenant == "slow" && i >= slow) {
					continue
				}
				id := fmt.Sprintf("%s-%s-%d", name, tenant, i)
				produced[id] = true
				msgs = append(msgs, rtEvent(tenant, id, i%3))
			}
		}
		rtWrite(t, w, msgs...)
	}
	// fast: 5 admitted, 35 deferred over 7s; slow: 20 admitted, 40 deferred
	// into the next two 10s windows.
	burst("one", 40, 60)
	waitFor(t, 60*time.Second, "first burst routed", func() (bool, string) {
		n := 0
		for _, m := range append(readTopic(t, f.Downstream), f.readRetry(t)...) {
			if id, _ := rtID(m); produced[id] {
				n++
			}
		}
		return n >= len(produced), fmt.Sprintf("%d of %d", n, len(produced))
	})

	// Kill the instance with more deferred events waiting (fetched from its
	// retry partitions, not yet released, so not committed either).
	var waitA, waitB float64
	waitFor(t, 30*time.Second, "deferred events waiting", func() (bool, string) {
		waitA, waitB = rtMetricSum(t, a, "gatekeeper_deferred_waiting"), rtMetricSum(t, b, "gatekeeper_deferred_waiting")
		return waitA+waitB > 0, fmt.Sprintf("a %v, b %v", waitA, waitB)
	})
	victim, survivor, waiting := a, b, waitA
	if waitB > waitA {
		victim, survivor, waiting = b, a, waitB
	}
	victim.Kill()
	killedAt := time.Now()
	t.Logf("killed %s (%v deferred events waiting; partitions %v); %s keeps %v",
		victim.Name, waiting, owned[victim], survivor.Name, owned[survivor])

	// More events while it is down, then restart it.
	burst("two", 20, 20)
	again := startGatekeeper(t, victim.Name+"-restarted", env)
	again.waitReady(90 * time.Second)
	// The group drops the killed member only when its session times out.
	rtWaitAssigned(t, rtGroups(f, 3), survivor, again)
	t.Logf("partitions shared by %s and %s again %v after the kill", survivor.Name, again.Name,
		time.Since(killedAt).Round(time.Second))

	var down, dlq []kafka.Message
	waitFor(t, 150*time.Second, "every event downstream or dead-lettered", func() (bool, string) {
		down, dlq = readTopic(t, f.Downstream), readTopic(t, f.DLQ)
		got := map[string]bool{}
		for _, m := range append(down, dlq...) {
			got[rtIDOf(m)] = true
		}
		var missing []string
		for id := range produced {
			if !got[id] {
				missing = append(missing, id)
			}
		}
		slices.Sort(missing)
		return len(missing) == 0, fmt.Sprintf("%d of %d missing: %v", len(missing), len(produced), rtHead(missing))
	})
	copies := map[string]int{}
	attempts := map[string]int{}
	for _, m := range down {
		copies[rtIDOf(m)]++
		attempts[header(m, "gk-attempt")]++
		if due, ok := rtMillis(t, m, "gk-due"); ok && m.Time.Before(due) {
			t.Errorf("event %s appended %v, %v before its gk-due (G3)", rtIDOf(m), m.Time.UTC(), due.Sub(m.Time))
		}
	}
	dups := 0
	for _, n := range copies {
		dups += n - 1
	}
	t.Logf("all %d events out %v after the kill: %d downstream (%d duplicates; by gk-attempt %v), %d dead-lettered",
		len(produced), time.Since(killedAt).Round(time.Second), len(down), dups, attempts, len(dlq))
}

// m2id is the id of a test event.
func rtIDOf(m kafka.Message) string {
	id, _ := rtID(m)
	return id
}

// rtHead returns at most the first 10 of s.
func rtHead(s []string) []string { return s[:min(len(s), 10)] }

// rtMetricSum returns the sum of the samples in p's /metrics whose line
// starts with name: a metric name, or a name with its full label set
// (`x_count{topic="t"}`).
func rtMetricSum(t testing.TB, p *gkProc, name string) float64 {
	t.Helper()
	code, body, err := p.Get("/metrics")
	if err != nil || code != 200 {
		t.Fatalf("%s /metrics: %d %v", p.Name, code, err)
	}
	sum := 0.0
	for _, l := range strings.Split(body, "\n") {
		if !strings.HasPrefix(l, name+" ") && !strings.HasPrefix(l, name+"{") {
			continue
		}
		v, err := strconv.ParseFloat(l[strings.LastIndex(l, " ")+1:], 64)
		if err != nil {
			t.Fatalf("%s /metrics: line %q: %v", p.Name, l, err)
		}
		sum += v
	}
	return sum
}

// TestRetrySigned runs a gatekeeper with GATEKEEPER_RETRY_SECRET, defers
// real events and writes forged ones straight into the retry tiers, as
// anyone allowed to write those topics could: an unsigned event whose
// gk-reserved is a year away (it would be forwarded uncounted), an unsigned
// one in the .long tier due in 20 hours (it would hold the partition's
// commits until then), and a real deferral whose gk-reserved was changed.
// The real events must reach downstream signed; the forged ones must be
// dead-lettered at once with the reason, and counted.
func TestRetrySigned(t *testing.T) {
	t.Parallel()
	f := newFlow(t, 1)
	gk := startGatekeeper(t, "gk", f.env(t,
		"GATEKEEPER_LIMITS", "*=1/1s",
		"GATEKEEPER_RETRY_SECRET", "integration-test-secret-of-32-bytes!"))
	gk.waitReady(90 * time.Second)

	var real []kafka.Message
	for i := range 3 {
		real = append(real, kafka.Message{Key: []byte("a"), Value: fmt.Appendf(nil, "real-%d", i)})
	}
	produce(t, f.Source, real)
	var deferred kafka.Message
	waitFor(t, 60*time.Second, "a deferral in the first retry tier", func() (bool, string) {
		rs := readTopic(t, f.Retry)
		if len(rs) == 0 {
			return false, "none yet"
		}
		deferred = rs[0]
		return true, ""
	})

	now := time.Now()
	year := strconv.FormatInt(now.Add(365*24*time.Hour).UnixMilli(), 10)
	forgedHeaders := func(due time.Time, reserved string) []kafka.Header {
		return []kafka.Header{
			{Key: "gk-attempt", Value: []byte("1")},
			{Key: "gk-due", Value: []byte(strconv.FormatInt(due.UnixMilli(), 10))},
			{Key: "gk-reserved", Value: []byte(reserved)},
			{Key: "gk-tenant", Value: []byte("victim")},
			{Key: "gk-origin-topic", Value: []byte(f.Source)},
			{Key: "gk-origin-partition", Value: []byte("0")},
			{Key: "gk-origin-offset", Value: []byte("0")},
			{Key: "gk-first-seen", Value: []byte(strconv.FormatInt(now.UnixMilli(), 10))},
		}
	}
	altered := kafka.Message{Key: deferred.Key, Value: deferred.Value}
	for _, h := range deferred.Headers {
		if h.Key == "gk-reserved" {
			h.Value = []byte(year)
		}
		altered.Headers = append(altered.Headers, h)
	}
	produce(t, f.Retry, []kafka.Message{
		{Key: []byte("victim"), Value: []byte("forged-unsigned"), Headers: forgedHeaders(now.Add(-time.Second), year)},
		altered,
	})
	produce(t, f.Retry+".long", []kafka.Message{
		{Key: []byte("victim"), Value: []byte("forged-far"), Headers: forgedHeaders(now.Add(20*time.Hour), year)},
	})

	wantDLQ := map[string]string{ // value -> gk-reason
		"forged-unsigned":     "gk-sig missing",
		"forged-far":          "gk-sig missing",
		string(altered.Value): "gk-sig does not match",
	}
	var down, dlq []kafka.Message
	waitFor(t, 60*time.Second, "real events downstream and forged ones dead-lettered", func() (bool, string) {
		down, dlq = readTopic(t, f.Downstream), readTopic(t, f.DLQ)
		return len(down) >= len(real) && len(dlq) >= len(wantDLQ),
			fmt.Sprintf("%d downstream, %d dead-lettered", len(down), len(dlq))
	})
	for _, m := range dlq {
		want, ok := wantDLQ[string(m.Value)]
		if got := header(m, "gk-reason"); !ok || got != want {
			t.Errorf("dead-lettered %q with gk-reason %q, want %q", m.Value, got, want)
		}
		delete(wantDLQ, string(m.Value))
	}
	signed := 0
	for _, m := range down {
		if !strings.HasPrefix(string(m.Value), "real-") || string(m.Key) != "a" {
			t.Errorf("downstream got %q (key %q), want only the real events", m.Value, m.Key)
		}
		if header(m, "gk-due") != "" {
			// gk-sig stays in the retry tiers: a downstream copy written
			// back into a tier would not verify.
			if sig := header(m, "gk-sig"); sig != "" {
				t.Errorf("deferred event %q downstream has gk-sig %q, want none", m.Value, sig)
			}
			signed++
		}
	}
	for _, m := range dlq {
		if sig := header(m, "gk-sig"); sig != "" {
			t.Errorf("dead letter %q has gk-sig %q, want none", m.Value, sig)
		}
	}
	if signed != 2 {
		t.Errorf("got %d events downstream through the retry path, want 2", signed)
	}
	// The counter follows the acknowledgement of the batch's writes.
	waitFor(t, 10*time.Second, "signature failures counted", func() (bool, string) {
		missing := gk.metric(t, "gatekeeper_retry_sig_failures_total", `reason="missing"`)
		mismatch := gk.metric(t, "gatekeeper_retry_sig_failures_total", `reason="mismatch"`)
		return missing == 2 && mismatch == 1, fmt.Sprintf("missing %v, mismatch %v; want 2 and 1", missing, mismatch)
	})
}

// readTopic returns every message of topic present now, partition by
// partition (testenv.ReadTopic). It reads with franz-go, because kafka-go
// reports the producer's timestamp even on a LogAppendTime topic: here m.Time
// is the broker's append time on such a topic (the timestamp of the batch),
// i.e. when Gatekeeper forwarded the event.
func readTopic(t testing.TB, topic string) []kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recs, err := testenv.ReadTopic(ctx, kafkaAddr(), topic)
	if err != nil {
		t.Fatal(err)
	}
	var out []kafka.Message
	for _, r := range recs {
		m := kafka.Message{Topic: r.Topic, Partition: int(r.Partition), Offset: r.Offset,
			Key: r.Key, Value: r.Value, Time: r.Timestamp}
		for _, h := range r.Headers {
			m.Headers = append(m.Headers, kafka.Header{Key: h.Key, Value: h.Value})
		}
		out = append(out, m)
	}
	return out
}
