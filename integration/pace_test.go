package integration

import (
	"context"
	"errors"
	"fmt"
	"html"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
)

// pacePhase is one step of the paced-capacity harness: the downstream
// consumer drains at drain events a second while producers send produce.
type pacePhase struct {
	seconds        int
	drain, produce float64
}

// drainer is the downstream service: a consumer of the downstream topic in
// its own group that processes at most rate events a second and commits
// every 200ms. It records when it processed each event and how long the
// event had waited in the topic.
type drainer struct {
	mu    sync.Mutex
	rate  float64
	done  []time.Time
	pos   [][2]int64 // partition and offset of each event processed
	phase []int      // the phase an event was processed in
	cur   int
}

func (d *drainer) set(rate float64, phase int) {
	d.mu.Lock()
	d.rate, d.cur = rate, phase
	d.mu.Unlock()
}

// run consumes until ctx is done, spacing events 1/rate apart (no credit
// beyond 50ms is saved up, as a service at its limit saves none).
func (d *drainer) run(ctx context.Context, r *kafka.Reader) error {
	next := time.Now()
	for {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		d.mu.Lock()
		rate, phase := d.rate, d.cur
		d.mu.Unlock()
		now := time.Now()
		if next.Before(now.Add(-50 * time.Millisecond)) {
			next = now.Add(-50 * time.Millisecond)
		}
		next = next.Add(time.Duration(float64(time.Second) / rate))
		if wait := time.Until(next); wait > 0 {
			time.Sleep(wait)
		}
		at := time.Now()
		d.mu.Lock()
		d.done = append(d.done, at)
		d.pos = append(d.pos, [2]int64{int64(m.Partition), m.Offset})
		d.phase = append(d.phase, phase)
		d.mu.Unlock()
	}
}

// perSecond counts times into one-second buckets from start, n buckets.
func perSecond(times []time.Time, start time.Time, n int) []float64 {
	out := make([]float64, n)
	for _, at := range times {
		if i := int(at.Sub(start) / time.Second); i >= 0 && i < n {
			out[i]++
		}
	}
	return out
}

// paceOut is what one run of the paced-capacity harness measured, per
// second from the start of traffic.
type paceOut struct {
	n                           int // events produced
	secs                        int
	bounds                      []int // the phases' starts
	admitted, drained, capacity []float64
	booked                      []float64     // per capacity window: what the gate admitted or reserved there
	paced, skew                 []float64     // gk1's paced rate and skew, sampled once a second
	waits                       [][]float64   // per phase: seconds events waited downstream
	partWaits                   [][][]float64 // the same per phase and partition
	cpu                         float64       // the gatekeepers' CPU seconds during the traffic
}

// runPaceHarness runs procs gatekeepers (the built binary) with a capacity
// (capEnv: CAPACITY and the pacing variables) against real Kafka and a Redis
// of its own, while a real downstream consumer (its own group, named in
// capEnv as group:DOWNGROUP) drains the downstream topic at each phase's
// rate and producers send at the phase's rate, over 20 tenants with weights
// and a floor. It asserts exactness: no capacity window over the capacity in
// force there (field cl, fixed at the window's first call while current;
// each window is read two seconds after it ends, and the future ones at the
// end), lost 0, early 0, SLOWLOG under a generous ceiling.
func runPaceHarness(t *testing.T, phases []pacePhase, procsN int, ceiling int64, capEnv ...string) paceOut {
	const parts = 4
	rs := startRedisServer(t, "")
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rdb.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, kv := range [][2]string{{"slowlog-log-slower-than", "2000"}, {"slowlog-max-len", "10000"}} {
		if err := rdb.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	f := newFlow(t, parts)
	downGroup := "down-" + f.Source
	for i := range capEnv {
		capEnv[i] = strings.ReplaceAll(capEnv[i], "DOWNGROUP", downGroup)
	}
	env := f.env(t, append([]string{
		"GATEKEEPER_REDIS_ADDRS", rs.Addr,
		"GATEKEEPER_LIMITS", "*=1000000/1m;heavy=weight:3;gold=floor:20/1s",
		"GATEKEEPER_DEFER_HORIZON", "1h",
		"GATEKEEPER_TENANT_FROM", "key"}, capEnv...)...)
	prefix, group := env["GATEKEEPER_REDIS_KEY_PREFIX"], env["GATEKEEPER_GROUP_ID"]

	// The downstream service first, so that its group has a member.
	dr := &drainer{rate: phases[0].drain}
	reader := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{kafkaAddr()}, GroupID: downGroup, Topic: f.Downstream,
		CommitInterval: 200 * time.Millisecond, MaxWait: 100 * time.Millisecond, StartOffset: kafka.FirstOffset,
		HeartbeatInterval: 500 * time.Millisecond, SessionTimeout: 6 * time.Second})
	defer reader.Close()
	var dwg sync.WaitGroup
	dwg.Add(1)
	go func() {
		defer dwg.Done()
		if err := dr.run(ctx, reader); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("downstream consumer: %v", err)
		}
	}()
	defer dwg.Wait()
	defer cancel()

	var procs []*gkProc
	for i := 0; i < procsN; i++ {
		procs = append(procs, startGatekeeper(t, fmt.Sprintf("gk%d", i+1), env))
	}
	for _, p := range procs {
		p.waitReady(90 * time.Second)
	}
	waitSharedGeneration(t, group, f.Source, parts, procs...)
	rdb.SlowLogReset(ctx)
	cpuNow := func() float64 {
		c := 0.0
		for _, p := range procs {
			c += p.metric(t, "process_cpu_seconds_total")
		}
		return c
	}
	cpu0 := cpuNow()

	// 20 tenants: heavy (weight 3) sends 40%, gold (floor 20/s) 5%, the
	// other 18 the rest evenly.
	shares := map[string]float64{"heavy": 0.40, "gold": 0.05}
	for i := 0; i < 18; i++ {
		shares[fmt.Sprintf("t%02d", i)] = 0.55 / 18
	}
	names := slices.Sorted(maps.Keys(shares))
	partOf := func(tenant string) int { return partitionOf(tenant, parts) }
	type win struct{ count, cl int64 }
	wins := map[int64]win{}
	readWin := func(s int64) (win, bool) {
		v, err := rdb.HMGet(ctx, fmt.Sprintf("%s:cap:1s:%d", prefix, s), "count", "cl").Result()
		if err != nil || v[0] == nil {
			return win{}, false
		}
		count, _ := strconv.ParseInt(fmt.Sprint(v[0]), 10, 64)
		cl, err := strconv.ParseInt(fmt.Sprint(v[1]), 10, 64)
		if err != nil {
			cl = -1 // never current yet
		}
		return win{count, cl}, true
	}

	// Produce in real time, phase by phase; once a second sample gk1's
	// paced rate and read the windows that ended two seconds ago or before.
	w := partitionWriter(f.Source)
	defer w.Close()
	out := paceOut{}
	credit := map[string]float64{}
	start := time.Now()
	last, nextSample, nextWin := start, start, start.Truncate(time.Second)
	heldShown := false
	for pi, ph := range phases {
		if pi == 1 {
			// What the future windows hold at the cut: reserved there
			// before it, in force whatever the rate set after it.
			t.Logf("at the cut, the windows ahead hold: %s", heldAhead(ctx, rdb, prefix, time.Now(), 8))
		}
		dr.set(ph.drain, pi)
		out.bounds = append(out.bounds, int(time.Since(start)/time.Second))
		pend := time.Now().Add(time.Duration(ph.seconds) * time.Second)
		for time.Now().Before(pend) {
			time.Sleep(20 * time.Millisecond)
			now := time.Now()
			dt := now.Sub(last).Seconds()
			last = now
			var msgs []kafka.Message
			for _, name := range names {
				credit[name] += ph.produce * shares[name] * dt
				for credit[name] >= 1 {
					credit[name]--
					msgs = append(msgs, kafka.Message{Key: []byte(name), Partition: partOf(name),
						Value: fmt.Appendf(nil, "pace %d %d", out.n, now.UnixMilli())})
					out.n++
				}
			}
			if err := w.WriteMessages(ctx, msgs...); err != nil {
				t.Fatalf("produce: %v", err)
			}
			if !now.Before(nextSample) {
				nextSample = nextSample.Add(time.Second)
				if pi == 1 && !heldShown && now.After(pend.Add(time.Duration(3-ph.seconds)*time.Second)) {
					heldShown = true
					t.Logf("3 s after the cut, the windows ahead hold: %s", heldAhead(ctx, rdb, prefix, now, 6))
				}
				p, _ := procs[0].metricValue("gatekeeper_capacity_paced_rate")
				k, _ := procs[0].metricValue("gatekeeper_capacity_downstream_skew")
				out.paced, out.skew = append(out.paced, p), append(out.skew, k)
				// Every window up to two seconds ago, those a slow
				// second skipped included.
				for s := now.Truncate(time.Second).Add(-2 * time.Second); !nextWin.After(s); nextWin = nextWin.Add(time.Second) {
					if x, ok := readWin(nextWin.UnixMilli()); ok {
						wins[nextWin.UnixMilli()] = x
					}
				}
			}
		}
	}
	end := time.Now()
	out.cpu = cpuNow() - cpu0
	out.secs = int(end.Sub(start) / time.Second)
	t.Logf("produced %d events from %d tenants in %v", out.n, len(shares), end.Sub(start).Round(time.Millisecond))
	time.Sleep(3 * time.Second)
	for s := end.Truncate(time.Second).Add(-2 * time.Second); s.Before(end.Add(2 * time.Second)); s = s.Add(time.Second) {
		if x, ok := readWin(s.UnixMilli()); ok {
			wins[s.UnixMilli()] = x
		}
	}

	// Every event downstream, deferred (in a retry tier) or dead-lettered.
	idOf := idOfKind("pace")
	o := awaitRouted(t, f, out.n, idOf)
	down := map[int]int{}
	early, copies, lost := 0, 0, 0
	var admittedAt []time.Time
	appended := map[[2]int64]time.Time{}
	copyIn := map[int64]int64{} // second -> copies written then
	for _, m := range o.down {
		i := idOf(m)
		down[i]++
		if down[i] > 1 {
			copyIn[m.Time.Truncate(time.Second).UnixMilli()]++
		}
		admittedAt = append(admittedAt, m.Time)
		appended[[2]int64{int64(m.Partition), m.Offset}] = m.Time
		if due := header(m, "gk-due"); due != "" {
			d, _ := strconv.ParseInt(due, 10, 64)
			if m.Time.UnixMilli() < d {
				early++
			}
		}
	}
	lost, copies = lostAndCopies(o, down, out.n, idOf)
	t.Logf("routed: %s; lost %d, early %d, copies downstream %d", o, lost, early, copies)
	if lost != 0 || early != 0 {
		t.Errorf("lost %d, early %d; want 0 and 0", lost, early)
	}

	// Exactness, copies counted: a copy downstream is one booking written
	// twice, so it is added to the window of the second it was written in.
	iter := rdb.Scan(ctx, 0, prefix+":cap:1s:*", 1000).Iterator()
	future := 0
	for iter.Next(ctx) {
		key := iter.Val()
		s, _ := strconv.ParseInt(key[strings.LastIndex(key, ":")+1:], 10, 64)
		if _, ok := wins[s]; !ok {
			if x, ok := readWin(s); ok {
				wins[s] = x
				future++
			}
		}
	}
	over, current := 0, 0
	for s, x := range wins {
		limit := x.cl
		if limit < 0 {
			limit = ceiling // a future window: bounded by the calls' capacity
		} else {
			current++
		}
		if x.count+copyIn[s] > limit || limit > ceiling {
			over++
			t.Errorf("window %d: %d booked and %d copies, over the capacity in force %d (ceiling %d)", s, x.count, copyIn[s], limit, ceiling)
		}
	}
	t.Logf("capacity windows checked: %d (%d with a capacity fixed while current, %d read at the end), over the capacity in force: %d", len(wins), current, future, over)

	// Series per second.
	out.admitted = perSecond(admittedAt, start, out.secs)
	dr.mu.Lock()
	out.drained = perSecond(dr.done, start, out.secs)
	out.waits, out.partWaits = make([][]float64, len(phases)), make([][][]float64, len(phases))
	for i, ph := range dr.phase {
		if at, ok := appended[dr.pos[i]]; ok {
			w := dr.done[i].Sub(at).Seconds()
			out.waits[ph] = append(out.waits[ph], w)
			if out.partWaits[ph] == nil {
				out.partWaits[ph] = make([][]float64, parts)
			}
			out.partWaits[ph][dr.pos[i][0]] = append(out.partWaits[ph][dr.pos[i][0]], w)
		}
	}
	dr.mu.Unlock()
	out.capacity = make([]float64, out.secs)
	out.booked = make([]float64, out.secs)
	for i := range out.capacity {
		s := start.Add(time.Duration(i) * time.Second).Truncate(time.Second).UnixMilli()
		out.capacity[i] = float64(max(0, wins[s].cl))
		out.booked[i] = float64(wins[s].count)
	}

	for _, p := range procs {
		var lines []string
		for _, l := range strings.Split(p.Tail(5000), "\n") {
			if strings.Contains(l, "capacity pacing") {
				lines = append(lines, l)
			}
		}
		if len(lines) > 12 {
			lines = append(lines[:6], lines[len(lines)-6:]...)
		}
		t.Logf("%s's pacing log: %d lines%s", p.Name, len(lines), "\n"+strings.Join(lines, "\n"))
	}
	logs, err := rdb.SlowLogGet(ctx, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var slowest time.Duration
	for _, l := range logs {
		slowest = max(slowest, l.Duration)
	}
	t.Logf("SLOWLOG: %d calls over 2ms, the slowest %v", len(logs), slowest)
	if slowest > 500*time.Millisecond {
		t.Errorf("slowest script call %v, want under 500ms", slowest)
	}
	return out
}

// TestGatePacedByDownstream runs the harness with two gatekeepers and
// CAPACITY_FROM=group:<the downstream group> while the downstream consumer's
// rate is stepped 300/s, 150/s (a 50% cut), 1,500/s (a 10x recovery), and
// producers always send more than it drains. Besides the harness's
// exactness (0 over, lost 0, early 0) it prints the admitted rate, the drain
// rate and the capacity in force per second, the convergence figures and the
// downstream wait, and writes a plot (GATEKEEPER_PACE_PLOT, default a
// temporary file). The steps (2,000, 1,000, 10,000 a second) are
// scaled down five times for a shared two-core machine.
func TestGatePacedByDownstream(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 85 seconds of traffic")
	}
	const target = 2 * time.Second
	phases := []pacePhase{{25, 300, 450}, {20, 150, 450}, {40, 1500, 1800}}
	out := runPaceHarness(t, phases, 2, 3000,
		"GATEKEEPER_CAPACITY", "3000/1s",
		"GATEKEEPER_CAPACITY_FROM", "group:DOWNGROUP",
		"GATEKEEPER_CAPACITY_TARGET_WAIT", target.String(),
		"GATEKEEPER_CAPACITY_FLOOR", "50/1s")
	var rows strings.Builder
	for i := 0; i < out.secs; i++ {
		fmt.Fprintf(&rows, " %d:%.0f/%.0f/%.0f/%.0f", i, out.admitted[i], out.booked[i], out.drained[i], out.capacity[i])
	}
	t.Logf("per second, arrived downstream/booked in the window/drained/capacity in force:%s", rows.String())
	t.Logf("paced rate (gk1's view, per second): %v", roundAll(out.paced))
	skews := make([]string, len(out.skew))
	for i, k := range out.skew {
		skews[i] = strconv.FormatFloat(k, 'f', 2, 64)
	}
	t.Logf("skew (gk1's view, per second: the longest partition's wait over the summed lag's, filtered): %s", strings.Join(skews, " "))

	b1, b2, secs := out.bounds[1], out.bounds[2], out.secs
	d2, d3 := phases[1].drain, phases[2].drain
	fig := func(s, b int) string {
		if s < 0 {
			return "not reached"
		}
		return fmt.Sprintf("%d s", s-b)
	}
	// Two views of the admitted rate: what reached the downstream topic per
	// second (its append time: a window's writes that slip into the next
	// second on a loaded machine show as swings), and what the gate booked
	// per capacity window (admitted there, or reserved there and forwarded
	// at its start); and the capacity in force per window, what the
	// controller set (the gate books up to it).
	for _, v := range []struct {
		name string
		xs   []float64
	}{{"arrivals per second downstream", out.admitted}, {"booked per window", out.booked}, {"capacity in force per window", out.capacity}} {
		cut := settle(v.xs, b1+1, b2, 0.9*d2, 1.1*d2)
		up := settle(v.xs, b2+1, secs-1, 0.9*d3, math.Inf(1))
		upFirst := -1
		for i := b2 + 1; i < secs; i++ {
			if v.xs[i] >= 0.9*d3 {
				upFirst = i
				break
			}
		}
		moving := make([]float64, secs)
		for i := range moving {
			moving[i] = mean(v.xs[max(0, i-4) : i+1])
		}
		up5 := settle(moving, b2+5, secs-1, 0.9*d3, math.Inf(1))
		t.Logf("%s: after the 50%% cut (%.0f/s to %.0f/s) within 10%% of the new drain rate from %s on [at most 10 s]; after the 10x recovery (to %.0f/s) at least 90%% of it first after %s, every second from %s on, its 5-second moving mean from %s on [at most 60 s]",
			v.name, phases[0].drain, d2, fig(cut, b1), d3, fig(upFirst, b2), fig(up, b2), fig(up5, b2))
		for i, r := range [][2]int{{b1 - 10, b1}, {b2 - 10, b2}, {secs - 15, secs - 1}} {
			c, dev := cvOf(v.xs[r[0]:r[1]])
			t.Logf("%s, phase %d steady (seconds %d-%d): mean %.0f/s, coefficient of variation %.3f [0.10], largest swing %.3f [0.15]", v.name, i+1, r[0], r[1]-1, mean(v.xs[r[0]:r[1]]), c, dev)
		}
	}
	for i := range phases {
		t.Logf("downstream wait in phase %d: p50 %.2fs p99 %.2fs (target %v)", i+1, percentile(out.waits[i], 0.5), percentile(out.waits[i], 0.99), target)
		// Per partition: the downstream consumer takes its partitions
		// about evenly while the tenants fill them unevenly, so one
		// partition's events may wait longer than the lag over the drain.
		var per strings.Builder
		for p, ws := range out.partWaits[i] {
			if len(ws) > 0 {
				fmt.Fprintf(&per, " partition %d: %d events, p50 %.2fs p99 %.2fs;", p, len(ws), percentile(ws, 0.5), percentile(ws, 0.99))
			}
		}
		t.Logf("downstream wait in phase %d per partition:%s", i+1, strings.TrimSuffix(per.String(), ";"))
	}
	t.Logf("gate CPU: %.1f s for %d events produced (%.1f s per million)", out.cpu, out.n, out.cpu/float64(out.n)*1e6)

	path := os.Getenv("GATEKEEPER_PACE_PLOT")
	if path == "" {
		path = filepath.Join(t.TempDir(), "pace.svg")
	}
	svg := lineChart("Paced by the downstream: events a second (two gatekeepers, drain stepped 300, 150, 1,500)", []series{
		{"admitted (booked per window)", "#2f6fb3", out.booked}, {"drained", "#d9822b", out.drained}, {"capacity in force", "#3a9a5b", out.capacity}})
	if err := os.WriteFile(path, []byte(svg), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("plot: %s", path)
}

// settle returns the first second in [from, to) from which every second
// up to to is within [lo, hi]; -1 if none.
func settle(xs []float64, from, to int, lo, hi float64) int {
	first := -1
	for i := from; i < min(to, len(xs)); i++ {
		if xs[i] < lo || xs[i] > hi {
			first = -1
		} else if first < 0 {
			first = i
		}
	}
	return first
}

func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(max(1, len(xs)))
}

// cvOf returns the coefficient of variation of xs and the largest
// deviation from their mean, as a fraction of the mean.
func cvOf(xs []float64) (float64, float64) {
	m := mean(xs)
	if m == 0 {
		return 0, 0
	}
	var sq, dev float64
	for _, x := range xs {
		sq += (x - m) * (x - m)
		dev = math.Max(dev, math.Abs(x-m)/m)
	}
	return math.Sqrt(sq/float64(len(xs))) / m, dev
}

func roundAll(xs []float64) []int {
	out := make([]int, len(xs))
	for i, x := range xs {
		out[i] = int(math.Round(x))
	}
	return out
}

// series is one line of lineChart.
type series struct {
	name, color string
	ys          []float64
}

// lineChart draws series over seconds as a standalone SVG.
func lineChart(title string, ss []series) string {
	const w, h, left, right, top, bottom = 820, 360, 60, 20, 50, 40
	maxY, n := 1.0, 0
	for _, s := range ss {
		n = max(n, len(s.ys))
		for _, y := range s.ys {
			maxY = math.Max(maxY, y)
		}
	}
	x := func(i int) float64 { return left + float64(i)*float64(w-left-right)/float64(max(1, n-1)) }
	y := func(v float64) float64 { return float64(h-bottom) - v*float64(h-top-bottom)/maxY }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	b.WriteString(`<rect width="100%" height="100%" fill="#fff"/>` + "\n")
	fmt.Fprintf(&b, `<text x="12" y="24" font-size="15" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	for k := 0; k <= 4; k++ {
		v := maxY * float64(k) / 4
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%.0f</text>`+"\n", left, y(v), w-right, y(v), left-6, y(v)+4, v)
	}
	for i := 0; i < n; i += 10 {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%ds</text>`+"\n", x(i), h-bottom+16, i)
	}
	for k, s := range ss {
		var pts []string
		for i, v := range s.ys {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(i), y(v)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", s.color, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<rect x="%d" y="34" width="12" height="4" fill="%s"/><text x="%d" y="40">%s</text>`+"\n", left+k*170, s.color, left+k*170+16, html.EscapeString(s.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// heldAhead describes what the n capacity windows from now's on hold:
// their count, the capacity in force (none yet in a future window), and
// what the heavy tenant, gold and the 18 others (summed, and the most of
// one) booked there.
func heldAhead(ctx context.Context, rdb *redis.Client, prefix string, now time.Time, n int) string {
	var b strings.Builder
	for k := range n {
		s := now.Truncate(time.Second).Add(time.Duration(k) * time.Second)
		h, err := rdb.HGetAll(ctx, fmt.Sprintf("%s:cap:1s:%d", prefix, s.UnixMilli())).Result()
		if err != nil {
			return err.Error()
		}
		var others, most, nOthers int64
		for f, v := range h {
			x, _ := strconv.ParseInt(v, 10, 64)
			if strings.HasPrefix(f, "t:") && f != "t:heavy" && f != "t:gold" {
				others += x
				most = max(most, x)
				nOthers++
			}
		}
		fmt.Fprintf(&b, "+%d: %s (in force %s; heavy %s, gold %s, %d others %d, at most %d each); ", k, h["count"], h["cl"], h["t:heavy"], h["t:gold"], nOthers, others, most)
	}
	return b.String()
}
