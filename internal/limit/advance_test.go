package limit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// drainRun is what backlog saw of one run: per second, what was forwarded
// in it (admitted, forwarded at their due time inside their slot, or
// moved), in the capacity's measure (events, or their bytes or units) and,
// for b, in its own rule's, and when the last of them went.
type drainRun struct {
	fwd      map[int]int64            // all tenants
	by       map[string]map[int]int64 // per tenant
	own      map[int]int64            // b, in its own rule's measure
	deferBy  map[string]int           // events deferred, per tenant
	last     int                      // the second of the last forward
	calls    int                      // Advance calls
	moves    int                      // events moved
	deferred int                      // events deferred
	reads    int64                    // the most window reads (HMGET) of an Advance call
	slowest  time.Duration
	evalshas int64
}

// waitingEvent is a deferred event in the test's retry tier.
type waitingEvent struct {
	tenant     string
	off        int64
	due, until time.Time
	cost       Cost
	windows    string // the Decision's
}

// drainPlan is a run of backlogOf: the capacity, the tenants' rules, the
// events sent at each call (20 a second) until the second until, and what
// the i-th event sent costs (nil: events alone, and AdmitCosts is not
// used); check, when set, looks at the windows of the seconds from start
// once the backlog is gone.
type drainPlan struct {
	capacity, limits string
	until            int
	plan             func(sec, k int) []string
	cost             func(i int) Cost
	check            func(t *testing.T, l *Limiter, start time.Time)
}

// backlog floods b, under CAPACITY=100/1s and b's own 150/1s, with 300
// events a second for three seconds (15 a call, 20 calls a second) and
// then plays a retry tier: each call, the deferred events that are due
// are forwarded (inside their slot: never early), and, with advance, the
// head of the waiting events (up to 100, in due order) is offered to
// Advance, whose moved events are forwarded now. Every Advance call is
// made twice, the second a replay (the same source and offsets), which
// must decide the same and count nothing. At the end, every second's
// capacity window and b's own window count exactly the events forwarded in
// it (each event counted once, in the window it was forwarded in), within
// the capacity and b's rule.
func backlog(t *testing.T, advance bool) drainRun {
	t.Helper()
	return backlogOf(t, advance, drainPlan{capacity: "100/1s", limits: "b=150/1s", until: 3, plan: flood("b", 15, 3)})
}

// flood returns the plan of tenant sending n events a call until the
// second until.
func flood(tenant string, n, until int) func(sec, k int) []string {
	return func(sec, k int) []string {
		if sec < until {
			return repeat(tenant, n)
		}
		return nil
	}
}

// backlogOf runs the retry tier of backlog under p's capacity and limits,
// with the events of p.plan(second, call) sent at each call (20 a second)
// until the second p.until, and after it until nothing waits.
func backlogOf(t *testing.T, advance bool, p drainPlan) drainRun {
	t.Helper()
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, err := ParseCapacity(p.capacity)
	if err != nil {
		t.Fatal(err)
	}
	limits, until, plan := p.limits, p.until, p.plan
	rdb := privateRedis(t)
	m := newWorkMeter(t, rdb)
	l := newTestLimiter(t, rdb, limits, Options{Clock: clk.Now, Capacity: c, Horizon: 2 * time.Minute})
	l.advanceEvery = 0 // a call at each offer, 20 a second, and its replay
	own := l.Rules().For("b")[0]
	ctx := context.Background()
	start := clk.Now()
	retry := Source{Topic: "retry", Partition: 0}
	run := drainRun{fwd: map[int]int64{}, by: map[string]map[int]int64{}, own: map[int]int64{}, deferBy: map[string]int{}}
	forward := func(tenant string, sec int, cost Cost) {
		run.fwd[sec] += cost.of(c[0].Measure)
		if run.by[tenant] == nil {
			run.by[tenant] = map[int]int64{}
		}
		run.by[tenant][sec] += cost.of(c[0].Measure)
		if tenant == "b" {
			run.own[sec] += cost.of(own.Measure)
		}
		run.last = sec
	}
	var waiting []waitingEvent
	var next int64 // the retry tier's next offset
	sent := 0
	var sentBy int64 // in the capacity's measure
	m.reset()
	for k := 0; k < 40*20; k++ {
		now := start.Add(time.Duration(k) * 50 * time.Millisecond)
		clk.Set(now)
		sec := k / 20
		if sec >= until && len(waiting) == 0 {
			break
		}
		if batch := plan(sec, k%20); sec < until && len(batch) > 0 {
			costs := make([]Cost, len(batch))
			for i := range costs {
				if p.cost != nil {
					costs[i] = p.cost(sent + i)
				}
			}
			admit := func() ([]Decision, error) { return l.AdmitCosts(ctx, batch, costs) }
			if p.cost == nil {
				admit = func() ([]Decision, error) { return l.Admit(ctx, batch) }
			}
			ds, err := admit()
			if err != nil {
				t.Fatal(err)
			}
			sent += len(ds)
			for i, d := range ds {
				sentBy += costs[i].of(c[0].Measure)
				switch d.Kind {
				case Admit:
					forward(batch[i], sec, costs[i])
				case Defer:
					waiting = append(waiting, waitingEvent{tenant: batch[i], off: next, due: d.Due, until: d.Until, cost: costs[i], windows: d.Windows})
					run.deferred++
					run.deferBy[batch[i]]++
					next++
				default:
					t.Fatalf("second %d: %+v", sec, d)
				}
			}
		}
		// The due events go at their time, inside their slot.
		waiting = slices.DeleteFunc(waiting, func(w waitingEvent) bool {
			if w.due.After(now) {
				return false
			}
			if !now.Before(w.until) {
				t.Errorf("event %d due %v forwarded at %v, after its slot", w.off, w.due, now)
			}
			forward(w.tenant, sec, w.cost)
			return true
		})
		if !advance || len(waiting) == 0 {
			continue
		}
		slices.SortFunc(waiting, func(a, b waitingEvent) int {
			if c := a.due.Compare(b.due); c != 0 {
				return c
			}
			return cmp.Compare(a.off, b.off)
		})
		head := waiting[:min(100, len(waiting))]
		ws := make([]Waiting, len(head))
		for i, w := range head {
			ws[i] = Waiting{Tenant: w.tenant, Offset: w.off, Due: w.due, Cost: w.cost, Windows: w.windows}
		}
		calls0, reads0 := m.calls("evalsha")+m.calls("eval"), m.calls("hmget")
		moved, at, err := l.Advance(ctx, retry, ws)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(moved, true) && !at.Equal(now) {
			t.Errorf("second %d: moves counted at %v, want the call's clock %v", sec, at, now)
		}
		calls, reads := m.calls("evalsha")+m.calls("eval")-calls0, m.calls("hmget")-reads0
		if want := int64(btoi(k%20 >= 10)); calls != want { // none in the first half of a second
			t.Errorf("second %d, call %d: an Advance call of %d events made %d script calls, want %d", sec, k%20, len(ws), calls, want)
		}
		run.reads = max(run.reads, reads)
		before, _, _ := capWindow(t, l, c[0], now.Truncate(time.Second))
		again, _, err := l.Advance(ctx, retry, ws)
		if err != nil {
			t.Fatal(err)
		}
		after, _, _ := capWindow(t, l, c[0], now.Truncate(time.Second))
		if !slices.Equal(moved, again) || before != after {
			t.Fatalf("second %d: a replay of the call moved %v (window count %d), the call %v (%d)", sec, again, after, moved, before)
		}
		run.calls += int(calls)
		gone, kept := map[int64]bool{}, map[string]bool{}
		for i, mv := range moved {
			if mv {
				gone[head[i].off] = true
				forward(head[i].tenant, sec, head[i].cost)
				run.moves++
				if kept[head[i].tenant] {
					t.Errorf("second %d: an event of %s moved after an earlier one of its was kept", sec, head[i].tenant)
				}
			} else {
				kept[head[i].tenant] = true
			}
		}
		waiting = slices.DeleteFunc(waiting, func(w waitingEvent) bool { return gone[w.off] })
	}
	if len(waiting) > 0 {
		t.Fatalf("%d events still waiting after 40 seconds", len(waiting))
	}
	run.slowest = m.slowest()
	run.evalshas = m.calls("evalsha") + m.calls("eval")
	var total, counted int64
	for sec := 0; sec < 130; sec++ {
		ws := start.Add(time.Duration(sec) * time.Second)
		count, _, booked := capWindow(t, l, c[0], ws)
		o, err := rdb.HGet(ctx, l.keys.window("b", own, ws), "count").Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("second %d: b's window: %v", sec, err)
		}
		total += run.fwd[sec]
		counted += count
		if count > c[0].Limit || o > own.Limit {
			t.Errorf("second %d: capacity window %d of %d, b's window %d of %d", sec, count, c[0].Limit, o, own.Limit)
		}
		if count != run.fwd[sec] || o != run.own[sec] {
			t.Errorf("second %d: %d forwarded, counted %d in the capacity window; b %d, %d in b's own",
				sec, run.fwd[sec], count, run.own[sec], o)
		}
		var under int64 // what the tenants booked under their floors
		for ten, n := range booked {
			if n != run.by[ten][sec] {
				t.Errorf("second %d: %s forwarded %d, booked %d", sec, ten, run.by[ten][sec], n)
			}
			under += min(n, l.Rules().Share(ten).FloorIn(c[0]))
		}
		fb, err := rdb.HGet(ctx, l.keys.capacity(c[0])+WindowSep+strconv.FormatInt(ws.UnixMilli(), 10), "fb").Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("second %d: fb: %v", sec, err)
		}
		if fb != under {
			t.Errorf("second %d: fb %d, want %d, what the tenants booked under their floors", sec, fb, under)
		}
		checkFloorUse(t, l, c[0], ws)
	}
	if total != sentBy || counted != sentBy {
		t.Errorf("%d sent (%d events), %d forwarded, %d counted", sentBy, sent, total, counted)
	}
	if run.reads > DefaultMaxScan+8 {
		t.Errorf("an Advance call read %d windows, want at most its budget %d and the current windows", run.reads, DefaultMaxScan)
	}
	if run.slowest > slowCeiling {
		t.Errorf("slowest script call %v, want at most %v", run.slowest, slowCeiling)
	}
	if p.check != nil {
		p.check(t, l, start)
	}
	return run
}

// logDrain logs the runs of a flood's backlog without and with Advance:
// what was forwarded per second (in unit), when the last went, and the
// script calls.
func logDrain(t *testing.T, before, after drainRun, unit string) {
	t.Helper()
	for _, r := range []struct {
		name string
		run  drainRun
	}{{"reserved slots alone", before}, {"with Advance", after}} {
		var used []int64
		for sec := 0; sec <= r.run.last; sec++ {
			used = append(used, r.run.fwd[sec])
		}
		t.Logf("%s: %d events deferred; the last forwarded in second %d, %s per second %v; %d script calls of Advance (at most %d window reads each) moved %d events; %d script calls in all, the slowest %v",
			r.name, r.run.deferred, r.run.last, unit, used, r.run.calls, r.run.reads, r.run.moves, r.run.evalshas, r.run.slowest)
	}
}

// TestCapacityBacklogDrains: b floods 300 events a second for three seconds
// under CAPACITY=100/1s (its own rule 150/1s): 100 a second are admitted
// and 600 deferred, each reserving at most half b's share of a later
// second. Without Advance the backlog drains at those reservations, 50 a
// second for twelve seconds, the capacity half idle; with it, the retry
// tier's waiting events move into the idle room of each second and the
// backlog drains at the capacity, 100 a second, in six. Each second is
// within the capacity and b's rule and counts exactly what was forwarded
// in it, and a replay of every Advance call decides the same and counts
// nothing (backlog).
func TestCapacityBacklogDrains(t *testing.T) {
	before := backlog(t, false)
	after := backlog(t, true)
	logDrain(t, before, after, "events")
	if after.last > 9 {
		t.Errorf("with Advance the backlog drained in second %d, want by second 9 (six seconds at the capacity after the flood); reserved slots alone: second %d",
			after.last, before.last)
	}
	for sec := 3; sec < after.last; sec++ {
		if after.fwd[sec] < 98 {
			t.Errorf("with Advance, second %d forwarded %d events, want the capacity (at least 98) while a backlog waits", sec, after.fwd[sec])
		}
	}
}

// newcomerPlan is the traffic of the newcomer tests: b floods 15 events a
// call (300 a second) for three seconds, a sends one event every other call
// (10 a second) throughout, c floods 10 a call (200 a second) from second 5.
func newcomerPlan(sec, k int) []string {
	var batch []string
	if sec < 3 {
		batch = append(batch, repeat("b", 15)...)
	}
	if k%2 == 0 {
		batch = append(batch, "a")
	}
	if sec >= 5 {
		batch = append(batch, repeat("c", 10)...)
	}
	return batch
}

// logNewcomer logs what a, b and c were forwarded per second (in unit) in
// the newcomer tests' runs without and with Advance.
func logNewcomer(t *testing.T, before, after drainRun, unit string) {
	t.Helper()
	for _, r := range []struct {
		name string
		run  drainRun
	}{{"reserved slots alone", before}, {"with Advance", after}} {
		var a, b, c []int64
		for sec := 0; sec <= 12; sec++ {
			a, b, c = append(a, r.run.by["a"][sec]), append(b, r.run.by["b"][sec]), append(c, r.run.by["c"][sec])
		}
		t.Logf("%s: a deferred %d, %s per second %v; b %v; c %v; last forward in second %d; %d moved",
			r.name, r.run.deferBy["a"], unit, a, b, c, r.run.last, r.run.moves)
	}
}

// TestCapacityBacklogLeavesNewcomer: while b's backlog (as in
// TestCapacityBacklogDrains) moves into idle room, a light tenant a sends
// 10 events a second throughout and c starts flooding 200 a second in
// second 5. Moves take only what nobody is expected to take: a is
// admitted as without Advance, and c books its share from the next second
// on, at least what it books without Advance in every second (b's backlog
// moved out of the later seconds leaves it more, not less). With a floor
// of 20/1s for b the same holds: b's backlog moved out of seconds 6-9
// leaves b asking nothing there, and its floor goes to the others (an
// unused floor is kept apart only for what its tenant is predicted to ask,
// see 35_capacity.lua's Floors): those seconds carry the whole capacity.
func TestCapacityBacklogLeavesNewcomer(t *testing.T) {
	for _, limits := range []string{"b=150/1s;*=1000/1s", "b=150/1s,floor:20/1s;*=1000/1s"} {
		t.Run(limits, func(t *testing.T) {
			p := drainPlan{capacity: "100/1s", limits: limits, until: 10, plan: newcomerPlan}
			before := backlogOf(t, false, p)
			after := backlogOf(t, true, p)
			logNewcomer(t, before, after, "events")
			if after.deferBy["a"] > before.deferBy["a"] {
				t.Errorf("a deferred %d with Advance, %d without", after.deferBy["a"], before.deferBy["a"])
			}
			for sec := 6; sec < 10; sec++ {
				if got, was := after.by["c"][sec], before.by["c"][sec]; got < was || got < 40 {
					t.Errorf("second %d: c forwarded %d with Advance, %d without; want at least that and 40", sec, got, was)
				}
				if got := after.fwd[sec]; got < 98 {
					t.Errorf("second %d: %d forwarded with Advance, want the capacity (at least 98) while c floods", sec, got)
				}
			}
		})
	}
}

// TestCapacityBacklogLeavesNewcomerBytes is TestCapacityBacklogLeavesNewcomer
// under CAPACITY=100KiB/1s, the events of 500, 1000 and 1500 bytes in turn
// (b floods 300 a second, a sends 10, c 200 from second 5): moves by bytes
// take only what nobody is expected to take, a is deferred no more than
// without them, and c books from the next second on at least what it books
// without them and 40% of the capacity. The same with a floor of 20KiB/1s
// for b, whose backlog moved out of seconds 6-9 leaves it asking nothing
// there: its floor goes to the others (before, kept apart until 98% of
// each window, it left a and c no room: a deferred 34 events, 8 without
// the moves), and every window's fb is what its tenants booked under their
// floors (backlogOf).
func TestCapacityBacklogLeavesNewcomerBytes(t *testing.T) {
	sizes := []int64{500, 1000, 1500}
	for _, limits := range []string{"b=150KiB/1s;*=1000KiB/1s", "b=150KiB/1s,floor:20KiB/1s;*=1000KiB/1s"} {
		t.Run(limits, func(t *testing.T) {
			p := drainPlan{capacity: "100KiB/1s", limits: limits, until: 10, plan: newcomerPlan,
				cost: func(i int) Cost { return Cost{Bytes: sizes[i%len(sizes)]} }}
			before := backlogOf(t, false, p)
			after := backlogOf(t, true, p)
			logNewcomer(t, before, after, "bytes")
			if after.moves == 0 {
				t.Errorf("with Advance nothing moved")
			}
			if after.deferBy["a"] > before.deferBy["a"] {
				t.Errorf("a deferred %d with Advance, %d without", after.deferBy["a"], before.deferBy["a"])
			}
			for sec := 6; sec < 10; sec++ {
				if got, was := after.by["c"][sec], before.by["c"][sec]; got < was || got < 40*1024 {
					t.Errorf("second %d: c forwarded %d bytes with Advance, %d without; want at least that and 40KiB", sec, got, was)
				}
			}
		})
	}
}

// TestAdvanceNeedsCapacity: without a capacity Advance moves nothing and
// makes no Redis call.
func TestAdvanceNeedsCapacity(t *testing.T) {
	rdb := privateRedis(t)
	m := newWorkMeter(t, rdb)
	ctx := context.Background()
	ws := []Waiting{{Tenant: "b", Offset: 1, Due: time.Now().Add(3 * time.Second)}}
	l := newTestLimiter(t, rdb, "b=150/1s", Options{})
	m.reset()
	moved, _, err := l.Advance(ctx, Source{Topic: "retry"}, ws)
	if err != nil || moved[0] {
		t.Fatalf("without a capacity: moved %v, %v", moved, err)
	}
	if n := m.calls("evalsha") + m.calls("eval"); n != 0 {
		t.Errorf("without a capacity: %d script calls, want none", n)
	}
}

// TestAdvanceInOrder: an Advance call offers Redis a tenant's events only
// up to its first whose cost no rule may count (takeCosts takes it out):
// the later ones must not move before it.
func TestAdvanceInOrder(t *testing.T) {
	rules := []Rule{{Limit: 1000, Measure: Bytes}}
	tenants := []string{"a", "b", "a", "a", "b", "a"}
	costs := []Cost{{Bytes: 10}, {Bytes: 10}, {Bytes: 10}, {Bytes: 5000}, {Bytes: 10}, {Bytes: 10}}
	var groups []*group
	for _, ten := range []string{"a", "b"} {
		g := &group{tenant: ten, rules: rules, byCost: true}
		for i, x := range tenants {
			if x == ten {
				g.idx = append(g.idx, i)
			}
		}
		groups = append(groups, g)
	}
	ds := make([]Decision, len(tenants))
	takeCosts(groups, costs, ds, nil)
	inOrder(groups, tenants, ds)
	for _, tc := range []struct {
		g    *group
		want []int
	}{{groups[0], []int{0, 2}}, {groups[1], []int{1, 4}}} {
		if !slices.Equal(tc.g.idx, tc.want) || len(tc.g.costs) != len(tc.want) {
			t.Errorf("tenant %s: offered %v (%d costs), want %v", tc.g.tenant, tc.g.idx, len(tc.g.costs), tc.want)
		}
	}
}

// TestAdvanceBounded: the work of an Advance call is bounded by its batch
// and its budget of window reads, whatever the backlog. 500 tenants, each
// with a rule of its own per second, flood 20 events at once under
// CAPACITY=1000/1s: each is admitted 2 and reserves 1 a second (half its
// share) for 18 seconds. In second 3, past the ramp's start, one call offers
// 500 waiting events (the head of each tenant's backlog, 10 each of 50
// tenants, or one each of 500), every one in a window of its own rules
// that the call has not read: the call reads at most its budget (here 256)
// and the current windows, and its time (SLOWLOG) is printed and held to a
// generous ceiling. The same with a capacity and rules of bytes
// (1000KiB/1s, each tenant 100KiB/1s), every event 1KiB: the moves by cost
// read no more.
func TestAdvanceBounded(t *testing.T) {
	for _, tc := range []struct {
		capacity, limits string
		cost             Cost
	}{{"1000/1s", "*=100/1s", Cost{}}, {"1000KiB/1s", "*=100KiB/1s", Cost{Bytes: 1024}}} {
		t.Run(tc.capacity, func(t *testing.T) { advanceBounded(t, tc.capacity, tc.limits, tc.cost) })
	}
}

// advanceBounded is TestAdvanceBounded under capacity and limits, every
// event of the given cost.
func advanceBounded(t *testing.T, capacity, limits string, cost Cost) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, _ := ParseCapacity(capacity)
	rdb := privateRedis(t)
	m := newWorkMeter(t, rdb)
	const budget = 256
	l := newTestLimiter(t, rdb, limits, Options{Clock: clk.Now, Capacity: c, Horizon: time.Minute, MaxScan: budget})
	l.advanceEvery = 0
	ctx := context.Background()
	start := clk.Now()
	waiting := map[string][]Waiting{}
	var off int64
	for b := 0; b < 20; b++ {
		var batch []string
		for i := 0; i < 25; i++ {
			batch = append(batch, repeat(fmt.Sprintf("t%03d", 25*b+i), 20)...)
		}
		costs := make([]Cost, len(batch))
		for i := range costs {
			costs[i] = cost
		}
		ds, err := l.AdmitCosts(ctx, batch, costs)
		if err != nil {
			t.Fatal(err)
		}
		for i, d := range ds {
			if d.Kind == Defer && d.Due.After(start.Add(3*time.Second)) {
				waiting[batch[i]] = append(waiting[batch[i]], Waiting{Tenant: batch[i], Offset: off, Due: d.Due, Cost: cost, Windows: d.Windows})
				off++
			}
		}
	}
	clk.Set(start.Add(3600 * time.Millisecond))
	for _, tc := range []struct{ tenants, each int }{{50, 10}, {500, 1}} {
		var ws []Waiting
		for i := 0; i < 500 && len(ws) < tc.tenants*tc.each; i++ {
			w := waiting[fmt.Sprintf("t%03d", i)]
			if len(w) < tc.each {
				continue
			}
			ws = append(ws, w[:tc.each]...)
			waiting[fmt.Sprintf("t%03d", i)] = w[tc.each:]
		}
		m.reset()
		moved, _, err := l.Advance(ctx, Source{Topic: "retry"}, ws)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, mv := range moved {
			n += btoi(mv)
		}
		t.Logf("%d tenants, %d waiting events each: %d moved", tc.tenants, tc.each, n)
		m.check(fmt.Sprintf("an Advance call of %d events", len(ws)), 1, budget+int64(tc.tenants)+4)
	}
	for sec := 0; sec < 60; sec++ {
		if count, _, _ := capWindow(t, l, c[0], start.Add(time.Duration(sec)*time.Second)); count > c[0].Limit {
			t.Errorf("second %d: %d booked, over the capacity", sec, count)
		}
	}
}

// TestAdvanceOneCallPerInterval: a Limiter makes at most one Advance call
// per AdvanceEvery for all the partitions that offer, and none before the
// capacity window's ramp: offers in between make no script call.
func TestAdvanceOneCallPerInterval(t *testing.T) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, _ := ParseCapacity("100/1s")
	rdb := privateRedis(t)
	m := newWorkMeter(t, rdb)
	l := newTestLimiter(t, rdb, "*=1000/1s", Options{Clock: clk.Now, Capacity: c, Horizon: time.Minute})
	ctx := context.Background()
	offer := func(part int) {
		t.Helper()
		ws := []Waiting{{Tenant: "b", Offset: int64(part), Due: clk.Now().Add(5 * time.Second), Windows: l.windowsID(l.Rules().For("b"))}}
		if _, _, err := l.Advance(ctx, Source{Topic: "retry", Partition: part}, ws); err != nil {
			t.Fatal(err)
		}
	}
	calls := func() int64 { return m.calls("evalsha") + m.calls("eval") }
	clk.Add(200 * time.Millisecond) // before the ramp (half the window)
	if l.AdvanceWanted(clk.Now()) {
		t.Errorf("before the ramp: AdvanceWanted true, want false")
	}
	m.reset()
	offer(0)
	if n := calls(); n != 0 {
		t.Errorf("before the ramp: %d script calls, want 0", n)
	}
	clk.Add(400 * time.Millisecond) // in the ramp
	if !l.AdvanceWanted(clk.Now()) {
		t.Fatalf("in the ramp: AdvanceWanted false, want true")
	}
	m.reset()
	for part := range 6 { // six partitions offer at once
		offer(part)
	}
	if n := calls(); n != 1 {
		t.Errorf("six offers at once: %d script calls, want 1", n)
	}
	if l.AdvanceWanted(clk.Now().Add(AdvanceEvery - time.Millisecond)) {
		t.Errorf("within AdvanceEvery of the last call: AdvanceWanted true, want false")
	}
	clk.Add(AdvanceEvery)
	m.reset()
	offer(1)
	offer(2)
	if n := calls(); n != 1 {
		t.Errorf("two offers AdvanceEvery later: %d script calls, want 1", n)
	}
}

// TestAdvancedEventClaimedAgain: an event whose booking Advance moved, and
// that its replica then never forwarded (it crashed between the call and the
// write), comes back to the next owner at its old due time as a claim of its
// old slot, which the move freed. Checked (AdmitLate, as the Retrier does
// with AdvanceBacklog), it gets the move's decision back from the replay
// record, an admission already counted: nothing is counted again, and it is
// not taken for a claim of a slot it no longer holds. The same under a
// capacity of bytes, the events 1,000 bytes each.
func TestAdvancedEventClaimedAgain(t *testing.T) {
	for _, tc := range []struct {
		capacity string
		cost     Cost
	}{{"100/1s", Cost{}}, {"100KiB/1s", Cost{Bytes: 1000}}} {
		t.Run(tc.capacity, func(t *testing.T) { advancedClaimedAgain(t, tc.capacity, tc.cost) })
	}
}

// advancedClaimedAgain is TestAdvancedEventClaimedAgain under capacity,
// every event of the given cost.
func advancedClaimedAgain(t *testing.T, capacity string, cost Cost) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, _ := ParseCapacity(capacity)
	rdb := privateRedis(t)
	l := newTestLimiter(t, rdb, "b=150/1s", Options{Clock: clk.Now, Capacity: c, Horizon: 2 * time.Minute})
	l.advanceEvery = 0
	ctx := context.Background()
	retry := Source{Topic: "retry", Partition: 0}
	start := clk.Now()
	// b floods 300 in second 0: 100 admitted, the rest deferred ahead.
	batch := make([]string, 300)
	for i := range batch {
		batch[i] = "b"
	}
	costs := make([]Cost, len(batch))
	for i := range costs {
		costs[i] = cost
	}
	ds, err := l.AdmitCosts(ctx, batch, costs)
	if err != nil {
		t.Fatal(err)
	}
	var waiting []Waiting
	for _, d := range ds {
		if d.Kind == Defer {
			waiting = append(waiting, Waiting{Tenant: "b", Offset: int64(len(waiting)), Due: d.Due, Cost: cost, Windows: d.Windows})
		}
	}
	if len(waiting) == 0 {
		t.Fatal("nothing deferred")
	}
	// From second 2 on nothing new comes: offer the head of the backlog in
	// the second half of each second until one moves.
	var moved Waiting
	for sec := 2; sec < 10 && moved.Tenant == ""; sec++ {
		clk.Set(start.Add(time.Duration(sec)*time.Second + 600*time.Millisecond))
		var head []Waiting // the events still ahead: the tier's waiting ones
		for _, w := range waiting {
			if w.Due.After(clk.Now()) && len(head) < 20 {
				head = append(head, w)
			}
		}
		mv, _, err := l.Advance(ctx, retry, head)
		if err != nil {
			t.Fatal(err)
		}
		for i := range head {
			if mv[i] {
				moved = head[i]
				break
			}
		}
	}
	if moved.Tenant == "" {
		t.Fatal("no waiting event moved")
	}
	// The mover crashed before the write. At its old due time the event is
	// inside its old slot, and the next owner checks it as a claim.
	clk.Set(moved.Due.Add(10 * time.Millisecond))
	slotCount, _, _ := capWindow(t, l, c[0], moved.Due.Truncate(time.Second))
	got, err := l.AdmitLate(ctx, retry, []Event{{Tenant: "b", Cost: cost, Offset: moved.Offset, InSlot: true, Due: moved.Due}}, false)
	if err != nil {
		t.Fatal(err)
	}
	after, _, _ := capWindow(t, l, c[0], moved.Due.Truncate(time.Second))
	if len(got) != 1 || got[0].Kind != Admit {
		t.Errorf("the moved event checked again at its old slot: got %+v, want its admission back (counted when it moved)", got)
	}
	if after != slotCount {
		t.Errorf("its old slot's capacity window: %d before the check, %d after, want no change", slotCount, after)
	}
}

// TestCapacityBacklogDrainsCosts is TestCapacityBacklogDrains for a
// capacity of bytes (CAPACITY=100KiB/1s) or units (100000u/1s): b floods
// 15 events a call (300 a second) for three seconds, of 500, 1000 and 1500
// bytes and as many units in turn (300,000 a second, three times the
// capacity), with its own rule counting events (150/1s), bytes
// (150KiB/1s) or units (150000u/1s). Moves go by each event's cost: every
// second's capacity window and b's own window count exactly what was
// forwarded in it, within their limits, and a replay of every Advance call
// counts nothing (backlogOf). With Advance the backlog drains sooner than
// on its reserved slots alone, each second at 95% of the capacity at least
// while it waits (of b's own rule, 80KiB/1s, where that is the tighter).
func TestCapacityBacklogDrainsCosts(t *testing.T) {
	sizes := []int64{500, 1000, 1500}
	cost := func(i int) Cost { return Cost{Bytes: sizes[i%len(sizes)], Units: sizes[i%len(sizes)]} }
	for _, tc := range []struct {
		capacity, own string
		fill          int64 // the least forwarded a second while the backlog waits
	}{
		{"100KiB/1s", "b=150/1s", 100 * 1024 * 95 / 100},
		{"100KiB/1s", "b=150KiB/1s", 100 * 1024 * 95 / 100},
		{"100KiB/1s", "b=150000u/1s", 100 * 1024 * 95 / 100},
		{"100KiB/1s", "b=80KiB/1s", 80 * 1024 * 95 / 100}, // b's own rule is the tighter
		{"100000u/1s", "b=150/1s", 100000 * 95 / 100},
		{"100000u/1s", "b=150KiB/1s", 100000 * 95 / 100},
	} {
		t.Run(tc.capacity+" "+tc.own, func(t *testing.T) {
			c, err := ParseCapacity(tc.capacity)
			if err != nil {
				t.Fatal(err)
			}
			p := drainPlan{capacity: tc.capacity, limits: tc.own, until: 3, plan: flood("b", 15, 3), cost: cost}
			before := backlogOf(t, false, p)
			after := backlogOf(t, true, p)
			logDrain(t, before, after, c[0].Measure.String())
			if after.moves == 0 || after.last >= before.last {
				t.Errorf("with Advance %d events moved and the backlog drained in second %d, reserved slots alone in second %d: want moves, and sooner",
					after.moves, after.last, before.last)
			}
			for sec := 3; sec < after.last; sec++ {
				if after.fwd[sec] < tc.fill {
					t.Errorf("with Advance, second %d forwarded %d (capacity %d), want at least %d while a backlog waits", sec, after.fwd[sec], c[0].Limit, tc.fill)
				}
			}
		})
	}
}
