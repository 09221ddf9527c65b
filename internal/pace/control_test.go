package pace

import (
	"math"
	"math/rand"
	"sort"
	"testing"
	"time"
)

// settle returns the first second from which, until to, every second's
// admitted count is within [lo, hi]; -1 if none.
func settle(xs []float64, from, to int, lo, hi float64) int {
	first := -1
	for i := from; i < to; i++ {
		if xs[i] < lo || xs[i] > hi {
			first = -1
		} else if first < 0 {
			first = i
		}
	}
	return first
}

// cv returns the coefficient of variation and the largest deviation from
// the mean (as a fraction of the mean) of xs.
func cv(xs []float64) (float64, float64) {
	var sum, sq, dev float64
	for _, x := range xs {
		sum += x
	}
	mean := sum / float64(len(xs))
	for _, x := range xs {
		sq += (x - mean) * (x - mean)
		dev = math.Max(dev, math.Abs(x-mean)/mean)
	}
	return math.Sqrt(sq/float64(len(xs))) / mean, dev
}

// step is one phase of a model run: the downstream drains drain events a
// second and demand are asked, for secs seconds.
type step struct {
	secs          int
	drain, demand float64
}

// stepCase is a model run of three steps (a start, a cut, a recovery) from
// the floor, at a ceiling, with the downstream committing every commit.
// startBy: the start from the floor must settle within this many seconds
// (0: not held; with commits a second apart the start is slower).
type stepCase struct {
	name    string
	ceiling float64
	steps   []step
	commit  time.Duration
	startBy int
	// parts and buffer: the downstream's partitions and the consumer's
	// buffer (model.parts, model.buffer; nil: one partition).
	parts  []float64
	buffer float64
}

// The harness's steps (drain 300/s, cut to 150/s, then 1,500/s, asked 450,
// 450, 1,800 a second) and the issue's (2,000, 1,000, 10,000 a second,
// always asked more).
var (
	harnessSteps = []step{{25, 300, 450}, {20, 150, 450}, {40, 1500, 1800}}
	issueSteps   = []step{{40, 2000, 1e9}, {40, 1000, 1e9}, {60, 10000, 1e9}}
	// harnessParts are the shares of the harness's downstream partitions
	// (run Z and after: the weight-3 tenant's partition receives about
	// 41% of what is admitted, the two others 25% and 34%).
	harnessParts = []float64{0.41, 0.25, 0.34}
)

// stepCases are the model runs of TestControllerConverges and
// TestControllerCutSettles: the harness's steps and the issue's, with the
// downstream committing every 200 ms, 100 ms or every second, and the
// harness's steps on partitions filled unevenly, taken as kafka-go's
// reader takes them, without a buffer and with one of 100 events.
var stepCases = []stepCase{
	{name: "harness", ceiling: 3000, steps: harnessSteps, commit: 200 * time.Millisecond, startBy: 15},
	{name: "issue, commit every 100ms", ceiling: 20000, steps: issueSteps, commit: 100 * time.Millisecond, startBy: 15},
	{name: "issue, commit every 1s", ceiling: 20000, steps: issueSteps, commit: time.Second},
	{name: "harness, partitions filled unevenly", ceiling: 3000, steps: harnessSteps, commit: 200 * time.Millisecond, startBy: 15, parts: harnessParts},
	{name: "harness, partitions filled unevenly, a buffer", ceiling: 3000, steps: harnessSteps, commit: 200 * time.Millisecond, startBy: 15, parts: harnessParts, buffer: 100},
}

// modelTarget is the target wait of the model runs.
const modelTarget = 2 * time.Second

// stepRun is what one model run of a stepCase measured.
type stepRun struct {
	admitted, rates []float64
	start           int        // seconds from the floor to within 10% of the first drain, staying there
	peak            float64    // the largest admitted in the first step, over its drain
	cut, up         int        // seconds to within 10% of the cut's drain, to 90% of the recovery's
	cvs, devs       [3]float64 // steady: the last 10 s of the first two steps, the last 15 of the third
	p99             float64    // the wait's p99 over the cut
}

func (tc stepCase) run(seed int64) stepRun {
	at := func(s float64) step {
		for _, st := range tc.steps {
			if s < float64(st.secs) {
				return st
			}
			s -= float64(st.secs)
		}
		return tc.steps[len(tc.steps)-1]
	}
	b1, b2 := tc.steps[0].secs, tc.steps[0].secs+tc.steps[1].secs
	secs := b2 + tc.steps[2].secs
	d1, d2, d3 := tc.steps[0].drain, tc.steps[1].drain, tc.steps[2].drain
	m := model{p: Params{TargetWait: modelTarget, Floor: tc.ceiling / 60, Ceiling: tc.ceiling, Interval: time.Second, Hold: 10 * time.Second},
		commitEvery: tc.commit, jitter: 0.15, seed: seed, parts: tc.parts, buffer: tc.buffer,
		drain: func(s float64) float64 { return at(s).drain }, demand: func(s float64) float64 { return at(s).demand }}
	r := stepRun{}
	var waits [][2]float64
	r.admitted, r.rates, waits = m.run(secs)
	r.start = settle(r.admitted, 0, b1, 0.9*d1, 1.1*d1)
	for _, x := range r.admitted[:b1] {
		r.peak = math.Max(r.peak, x/d1)
	}
	r.cut = settle(r.admitted, b1, b2, 0.9*d2, 1.1*d2) - b1
	r.up = settle(r.admitted, b2, secs, 0.9*d3, math.Inf(1)) - b2
	for i, w := range [][2]int{{b1 - 10, b1}, {b2 - 10, b2}, {secs - 15, secs}} {
		r.cvs[i], r.devs[i] = cv(r.admitted[w[0]:w[1]])
	}
	r.p99 = waitP(waits, float64(b1), float64(b2), 0.99)
	return r
}

// TestControllerConverges holds the control law to the issue's figures on
// the model (model_test.go): the harness's steps and the issue's, with the
// downstream committing every 200 ms, 100 ms or every second, its drain
// jittered.
func TestControllerConverges(t *testing.T) {
	for _, tc := range stepCases {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.run(1)
			t.Logf("admitted per second: %v", roundTo(r.admitted))
			t.Logf("rate in force: %v", roundTo(r.rates))
			t.Logf("start: within 10%% of %.0f/s after %d s, at most %.2f times it; cut: within 10%% of %.0f/s after %d s; 10x: 90%% of %.0f/s after %d s; wait p99 in the cut %.2f s",
				tc.steps[0].drain, r.start, r.peak, tc.steps[1].drain, r.cut, tc.steps[2].drain, r.up, r.p99)
			t.Logf("steady: cv %.3f %.3f %.3f, largest swing %.3f %.3f %.3f", r.cvs[0], r.cvs[1], r.cvs[2], r.devs[0], r.devs[1], r.devs[2])
			if r.cut < 0 || r.cut > 10 {
				t.Errorf("after the cut: settled after %d s, want at most 10", r.cut)
			}
			if r.p99 > 2*modelTarget.Seconds() {
				t.Errorf("the wait's p99 in the cut %.2f s, want at most twice the target, %v", r.p99, 2*modelTarget)
			}
			if tc.startBy > 0 && (r.start < 0 || r.start > tc.startBy) {
				t.Errorf("the start from the floor settled after %d s, want at most %d", r.start, tc.startBy)
			}
			if r.up < 0 || r.up > 60 {
				t.Errorf("after the recovery: 90%% after %d s, want at most 60", r.up)
			}
			for _, x := range r.cvs {
				if x > 0.10 {
					t.Errorf("steady coefficient of variation %.3f, want at most 0.10", x)
				}
			}
			for _, x := range r.devs {
				if x > 0.15 {
					t.Errorf("steady swing %.3f, want at most 0.15", x)
				}
			}
		})
	}
}

// TestControllerCutSettles holds the response to a cut over many seeds of
// the model's jitter: the admitted rate within 10% of the new drain in at
// most 10 s in 85% of the runs at least, 7 s in half of them (the law
// alone, before settleLaw: 74% and 9-10 s for the harness's steps, 77% and
// 9 s for the issue's, over 600 seeds), and in steady state after the cut
// and the recovery the coefficient of variation at most 0.10 and the swing
// 15% in every run. In every run too, the wait's p99 in the cut at most
// twice the target (the law holding the target itself: 4.1-5.2 s), and,
// with commits 200 ms or 100 ms apart, the start from the floor within 10%
// of the first drain with 10 s of the step left (15 s: the last 10 s of the
// harness's first step hold no part of the start; the law before: 16-21 s
// in most runs, up to 1.41 times the drain).
func TestControllerCutSettles(t *testing.T) {
	const seeds = 40
	for _, tc := range stepCases {
		t.Run(tc.name, func(t *testing.T) {
			var cuts, starts []int
			var p99s []float64
			within := 0
			for seed := int64(1); seed <= seeds; seed++ {
				r := tc.run(seed)
				cuts, starts, p99s = append(cuts, r.cut), append(starts, r.start), append(p99s, r.p99)
				if r.p99 > 2*modelTarget.Seconds() {
					t.Errorf("seed %d: the wait's p99 in the cut %.2f s, want at most twice the target, %v", seed, r.p99, 2*modelTarget)
				}
				if tc.startBy > 0 && (r.start < 0 || r.start > tc.startBy) {
					t.Errorf("seed %d: the start from the floor settled after %d s, want at most %d", seed, r.start, tc.startBy)
				}
				if r.cut >= 0 && r.cut <= 10 {
					within++
				}
				for i := 1; i < 3; i++ {
					if r.cvs[i] > 0.10 || r.devs[i] > 0.15 {
						t.Errorf("seed %d, step %d: steady coefficient of variation %.3f, swing %.3f; want at most 0.10 and 0.15", seed, i+1, r.cvs[i], r.devs[i])
					}
				}
			}
			sort.Ints(cuts)
			sort.Ints(starts)
			sort.Float64s(p99s)
			t.Logf("seconds to within 10%% of the cut's drain over %d seeds: %v", seeds, cuts)
			t.Logf("the start from the floor, seconds to within 10%% of the drain: %v", starts)
			t.Logf("the wait's p99 in the cut: %.2f-%.2f s (median %.2f)", p99s[0], p99s[seeds-1], p99s[seeds/2])
			if within < seeds*85/100 {
				t.Errorf("within 10 s in %d runs of %d, want at least %d", within, seeds, seeds*85/100)
			}
			if med := cuts[seeds/2]; med < 0 || med > 7 {
				t.Errorf("median %d s, want at most 7", med)
			}
		})
	}
}

func roundTo(xs []float64) []int {
	out := make([]int, len(xs))
	for i, x := range xs {
		out[i] = int(math.Round(x))
	}
	return out
}

// TestControllerSignalLost: no members holds the last rate for the hold
// time, then the floor; the signal back resumes pacing.
func TestControllerSignalLost(t *testing.T) {
	p := Params{TargetWait: 2 * time.Second, Floor: 100, Ceiling: 5000, Interval: time.Second, Hold: 5 * time.Second}
	c := NewController(p, 1000)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var e Estimate
	for i := 0; i < 5; i++ {
		e = c.Observe(Sample{At: t0.Add(time.Duration(i) * time.Second), Committed: int64(i) * 800, End: int64(i)*800 + 1600, Members: 2})
	}
	if e.State != StateOK || math.Abs(e.Drain-800) > 1 {
		t.Fatalf("steady: %+v, want ok at drain 800", e)
	}
	held := e.Rate
	for i := 5; i < 10; i++ {
		e = c.Observe(Sample{At: t0.Add(time.Duration(i) * time.Second), Members: 0})
		if e.State != StateHeld || e.Rate != held {
			t.Fatalf("second %d without members: %s at %.0f, want held at %.0f", i, e.State, e.Rate, held)
		}
	}
	e = c.Lost(t0.Add(10*time.Second), "offsets: timeout")
	if e.State != StateFloor || e.Rate != 100 || e.Reason != "offsets: timeout" || !e.LostSince.Equal(t0.Add(5*time.Second)) {
		t.Fatalf("after the hold: %+v, want the floor since second 5", e)
	}
	e = c.Observe(Sample{At: t0.Add(11 * time.Second), Committed: 10000, End: 10000, Members: 1})
	if e.State != StateWarming || !e.LostSince.IsZero() {
		t.Fatalf("signal back: %+v, want warming", e)
	}
}

// TestControllerDropAtOnce: a steady downstream (1,000/s, jittered,
// committing every 200 ms, the lag at its target) gives no drop in 20 s;
// when it halves, the drop is seen and the rate computed at once, within a
// second and a quarter, not at the end of an interval, and set under the
// new drain (the backlog of the old rate drains); then the rate settles at
// the new drain. A sample without the members (-1) keeps the last count.
func TestControllerDropAtOnce(t *testing.T) {
	p := Params{TargetWait: 2 * time.Second, Floor: 50, Ceiling: 5000, Interval: time.Second, Hold: 5 * time.Second}
	c := NewController(p, 1000)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewSource(7))
	const cut = 20 * time.Second
	done, committed, end := 0.0, int64(0), 2000.0
	drain, rate := 1000.0, 1000.0
	var dropAt time.Duration
	var e Estimate
	for at := time.Duration(0); at < 40*time.Second; at += 10 * time.Millisecond {
		if at == cut {
			drain = 500
		}
		done += drain * (1 + 0.15*(2*rng.Float64()-1)) * 0.01
		end += rate * 0.01
		if at%(200*time.Millisecond) == 0 {
			committed = int64(done)
		}
		if at%SampleEvery(p.Interval) != 0 {
			continue
		}
		members := -1
		if at%time.Second == 0 {
			members = 1
		}
		e = c.Observe(Sample{At: t0.Add(at), Committed: committed, End: int64(end), Members: members})
		if e.State == StateHeld || e.State == StateFloor {
			t.Fatalf("at %v: %s, want ok (a sample without members keeps the last count)", at, e.State)
		}
		rate = e.Rate
		if e.Drop && at < cut {
			t.Fatalf("a drop at %v in a steady drain (estimate %.0f/s)", at, e.Drain)
		}
		if e.Drop && dropAt == 0 {
			dropAt = at
			if !e.Decided || e.Rate > 500 {
				t.Errorf("at the drop: %+v, want the rate computed at once, at most the new drain 500/s", e)
			}
		}
	}
	if dropAt == 0 || dropAt-cut > 1250*time.Millisecond {
		t.Fatalf("drop seen at %v, %v after the cut; want within 1.25 s", dropAt, dropAt-cut)
	}
	if math.Abs(e.Drain-500) > 50 || math.Abs(e.Rate-500) > 50 {
		t.Errorf("20 s after the cut: drain %.0f/s, rate %.0f/s; want both within 10%% of 500/s", e.Drain, e.Rate)
	}
	t.Logf("drop seen %v after the cut; 20 s later drain %.0f/s, rate %.0f/s, lag %d", dropAt-cut, e.Drain, e.Rate, e.Lag)
}

// TestControllerCommitStall: the downstream keeps processing 300/s but its
// commits stall for 1.5 s, then catch up at once. The stall looks like a
// drop (the rate is lowered); the burst of commits after it must not open
// the gate: the rate rises by half per interval at most (of the rate or the
// drain), the drain estimate stays under 1.5 times the drain, and the rate
// is back within 10% of the drain 10 s later.
func TestControllerCommitStall(t *testing.T) {
	p := Params{TargetWait: 2 * time.Second, Floor: 10, Ceiling: 5000, Interval: time.Second, Hold: 5 * time.Second}
	c := NewController(p, 300)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	done, end := 0.0, 600.0
	var committed int64
	rate, last := 300.0, 300.0
	for at := time.Duration(0); at < 30*time.Second; at += 10 * time.Millisecond {
		end += rate * 0.01
		done = math.Min(end, done+300*0.01)
		stalled := at >= 15*time.Second && at < 16500*time.Millisecond
		if at%(200*time.Millisecond) == 0 && !stalled {
			committed = int64(done)
		}
		if at%SampleEvery(p.Interval) != 0 {
			continue
		}
		e := c.Observe(Sample{At: t0.Add(at), Committed: committed, End: int64(end), Members: 1})
		if e.Decided && e.Rate > math.Max(last, e.Drain)*(1+upStep)+1e-9 {
			t.Fatalf("at %v: the rate rose from %.0f to %.0f/s (drain %.0f/s), more than by half", at, last, e.Rate, e.Drain)
		}
		if e.Drain > 450 {
			t.Fatalf("at %v: drain estimate %.0f/s after the commits' burst; want at most 450 (the drain is 300)", at, e.Drain)
		}
		if e.Decided {
			last = e.Rate
		}
		rate = e.Rate
	}
	if math.Abs(rate-300) > 30 {
		t.Errorf("13.5 s after the stall: rate %.0f/s, want within 10%% of 300", rate)
	}
}

// TestControllerDropLateSamples: on a loaded machine the reads come late.
// A steady 300/s drain (the lag at its target) falls to 100/s at 10.75 s;
// the next samples come at 11.74 s and 11.76 s, with a commit between the
// two. The drop is seen at 11.76 s, when the samples since its start are
// these two, 20 ms apart: their slope reads a burst (2,000/s). The drain
// estimate must be the rate over the last second, and the rate must not
// rise at a drop.
func TestControllerDropLateSamples(t *testing.T) {
	p := Params{TargetWait: 2 * time.Second, Floor: 10, Ceiling: 5000, Interval: time.Second, Hold: 5 * time.Second}
	c := NewController(p, 300)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	observe := func(sec float64, committed int64) Estimate {
		return c.Observe(Sample{At: t0.Add(time.Duration(sec * float64(time.Second))), Committed: committed, End: 600 + int64(300*sec), Members: 1})
	}
	var e Estimate
	for sec := 0.0; sec <= 10.75; sec += 0.25 {
		e = observe(sec, int64(300*sec))
	}
	before := e.Rate
	for _, x := range []struct {
		sec       float64
		committed int64
	}{{11.74, 3324}, {11.76, 3364}} {
		e = observe(x.sec, x.committed)
		t.Logf("%.2f s: drain %.0f/s, rate %.0f/s, drop %v", x.sec, e.Drain, e.Rate, e.Drop)
	}
	if !e.Drop {
		t.Fatalf("no drop seen at 11.76 s: %+v", e)
	}
	if e.Drain > 300 || e.Rate > before {
		t.Errorf("at the drop: drain %.0f/s, rate %.0f/s (before %.0f/s); want the drain at most 300 and the rate not raised", e.Drain, e.Rate, before)
	}
}

// TestControllerSettleStages walks the response to a drop (settleLaw)
// through its stages: a drop is a cut only when the drain stayed under 85%
// of the estimate before it and the excess is at least L*/4 (else the law
// alone: a stall whose commits came back, or noise); a cut drains the
// excess in one interval down to the floor, lands on the first rate above
// it, and takes the rest within 6% of the drain until the excess has been
// under L*/8 twice running.
func TestControllerSettleStages(t *testing.T) {
	p := Params{TargetWait: 2 * time.Second, Floor: 50, Ceiling: 3000, Interval: time.Second, Hold: 10 * time.Second}
	const tc = 2.0 // max(TargetWait, 2 intervals), seconds
	type call struct {
		d, excess, want float64
		rate            float64 // want this rate (0: the law alone)
		stage           int     // and this stage after the call
	}
	for _, x := range []struct {
		name  string
		calls []call
	}{
		{"the drain came back: not a cut", []call{{290, 200, 580, 0, settleNone}}},
		{"a small excess: not a cut", []call{{150, 70, 300, 0, settleNone}}},
		{"a cut", []call{
			{150, 400, 300, -250, settleDrain}, // under the floor: Observe clamps it
			{150, 180, 300, -30, settleDrain},
			{150, 60, 300, 90, settleRest},  // lands: the first rate above the floor
			{150, 60, 300, 141, settleRest}, // the rest: 6% under the drain at most (the law: 15 under)
			{150, 20, 300, 145, settleRest}, // under L*/8 once: the law's half gain, within the band
			{150, -10, 300, 0, settleNone},  // twice: the law alone
		}},
		{"a new backlog in the rest: the law alone", []call{{150, 400, 300, -250, settleDrain}, {150, 90, 300, 60, settleRest}, {150, 160, 300, 0, settleNone}}},
		{"the drain overshot: the law alone", []call{{150, 400, 300, -250, settleDrain}, {150, -10, 300, 0, settleNone}}},
	} {
		t.Run(x.name, func(t *testing.T) {
			c := NewController(p, 300)
			c.settle, c.before = settlePending, 300
			for i, k := range x.calls {
				rate, ok := c.settleLaw(k.d, k.excess, k.want, tc)
				if k.rate == 0 && ok || k.rate != 0 && (!ok || math.Abs(rate-k.rate) > 1e-9) || c.settle != k.stage {
					t.Fatalf("call %d (drain %.0f, excess %.0f): rate %.1f (%v), stage %d; want %.1f, stage %d", i, k.d, k.excess, rate, ok, c.settle, k.rate, k.stage)
				}
			}
		})
	}
}

// TestControllerSkew: partsWait on a downstream of two partitions that
// drains each at 150/s. With the lag even (300 events in each) the longest
// partition's wait is the summed lag over the summed drain (skew 1); with
// all of it in one partition (600 events: 4 s, where the sums say 2 s) the
// skew is 2, and the longest of the partitions' least waits 4 s (the
// downstream does not keep up, whatever the summed lag). A partition that drains nothing (a stalled member) does not
// count (the rate cannot help it), and the skew is at most maxSkew. The
// controller filters it over skewTau and holds a setpoint under half the
// target by it (at least gapTimes the commit gap), so the rate it sets for
// the uneven lag is lower than for the even one.
func TestControllerSkew(t *testing.T) {
	p := Params{TargetWait: 2 * time.Second, Floor: 10, Ceiling: 5000, Interval: time.Second, Hold: 5 * time.Second}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	run := func(secs float64, parts func(sec float64) []Offsets) (*Controller, Estimate) {
		c := NewController(p, 300)
		var e Estimate
		for sec := 0.0; sec <= secs; sec += 0.25 {
			ps := parts(sec)
			s := Sample{At: t0.Add(time.Duration(sec * float64(time.Second))), Members: 1, Parts: ps}
			for _, o := range ps {
				s.Committed, s.End = s.Committed+o.Committed, s.End+o.End
			}
			e = c.Observe(s)
		}
		return c, e
	}
	even := func(sec float64) []Offsets {
		return []Offsets{{int64(150 * sec), int64(150*sec) + 300}, {int64(150 * sec), int64(150*sec) + 300}}
	}
	uneven := func(sec float64) []Offsets {
		return []Offsets{{int64(150 * sec), int64(150*sec) + 600}, {int64(150 * sec), int64(150 * sec)}}
	}
	stalled := func(sec float64) []Offsets {
		return []Offsets{{int64(300 * sec), int64(300*sec) + 300}, {1000, 1600}}
	}
	now := func(c *Controller) float64 { k, _, _ := partsWait(c.samples, p.Interval, c.shortSpan()); return k }
	cEven, eEven := run(60, even)
	cUneven, eUneven := run(60, uneven)
	cStalled, _ := run(60, stalled)
	cEarly, _ := run(5, uneven)
	t.Logf("even: skew %.2f (filtered %.2f), rate %.0f/s; uneven: skew %.2f (filtered %.2f, after 5 s %.2f), rate %.0f/s; a stalled partition: skew %.2f",
		now(cEven), cEven.skew, eEven.Rate, now(cUneven), cUneven.skew, cEarly.skew, eUneven.Rate, now(cStalled))
	if math.Abs(now(cEven)-1) > 0.01 || math.Abs(now(cUneven)-2) > 0.05 {
		t.Errorf("skew even %.2f, uneven %.2f; want 1 and 2", now(cEven), now(cUneven))
	}
	if math.Abs(cEven.skew-1) > 0.01 || math.Abs(cUneven.skew-2) > 0.05 || cEarly.skew > 1.5 {
		t.Errorf("filtered skew even %.2f, uneven %.2f after 60 s and %.2f after 5 s; want 1, 2, and under 1.5 (filtered over %v)", cEven.skew, cUneven.skew, cEarly.skew, skewTau(p.Interval))
	}
	if hold, band := cUneven.setpoint(); math.Abs(hold-0.5) > 0.02 || band != 1 {
		t.Errorf("setpoint with the skew at 2: %.2f s (band %.2f s), want 0.5 s (band 1 s)", hold, band)
	}
	if eUneven.Rate >= eEven.Rate {
		t.Errorf("rate with the lag in one partition %.0f/s, want under the rate with it even, %.0f/s", eUneven.Rate, eEven.Rate)
	}
	if _, least, _ := partsWait(cUneven.samples, p.Interval, cUneven.shortSpan()); math.Abs(least-4) > 0.1 || cUneven.partLeast != least {
		t.Errorf("the longest least wait %.2f s (kept %.2f s), want 4 s", least, cUneven.partLeast)
	}
	if now(cStalled) > 1.01 {
		t.Errorf("skew with a stalled partition %.2f, want 1 (it does not count)", now(cStalled))
	}
	if k, _, _ := partsWait([]Sample{{At: t0, Parts: []Offsets{{0, 0}, {0, 0}}}, {At: t0.Add(3 * time.Second), Parts: []Offsets{{3, 10003}, {3000, 3000}}}}, p.Interval, time.Second); k != maxSkew {
		t.Errorf("skew of a partition that nearly stopped %.2f, want the bound %d", k, maxSkew)
	}
	if k, least, ok := partsWait([]Sample{{At: t0}, {At: t0.Add(3 * time.Second), Committed: 10, End: 100}}, p.Interval, time.Second); k != 1 || least != -1 || ok {
		t.Errorf("without the partitions' offsets: skew %.2f, least wait %.2f, read %v; want 1, -1, false", k, least, ok)
	}
}
