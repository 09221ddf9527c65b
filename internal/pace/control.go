package pace

import (
	"fmt"
	"math"
	"time"
)

// Params are the controller's settings. It is a value type.
type Params struct {
	// TargetWait is the wait downstream (lag / drain rate) to keep the
	// downstream under, through a halving of its drain too: the law holds
	// a setpoint under it (Controller.setpoint).
	TargetWait time.Duration
	// Floor and Ceiling bound the rate (events a second).
	Floor, Ceiling float64
	// Interval is how often the rate is computed.
	Interval time.Duration
	// Hold is how long the last rate is kept when the signal is lost,
	// before the floor is used.
	Hold time.Duration
}

// Sample is one reading of the downstream: the sums over the downstream
// topic's partitions of the group's committed offsets and of the end
// offsets, the same per partition, and the group's members (-1: not read
// with this sample; the last count read holds). It is a value type.
type Sample struct {
	At        time.Time
	Committed int64
	End       int64
	Members   int
	// Parts are the offsets per partition, in the order of the topic's
	// partitions (nil: not read; the skew is then taken as 1).
	Parts []Offsets
}

// Offsets are one partition's committed and end offsets. A value type.
type Offsets struct{ Committed, End int64 }

// States of the controller, as in the fleet record, /readyz and the metrics.
const (
	StateOK      = "ok"      // paced by the downstream's drain
	StateWarming = "warming" // too few samples yet: the last rate holds
	StateHeld    = "held"    // signal lost: the last rate holds
	StateFloor   = "floor"   // signal lost for longer than the hold: the floor
)

// Estimate is what the controller computed: the rate to set (events a
// second) and what it was computed from. It is a value type.
type Estimate struct {
	Rate  float64 // the capacity to set, events a second
	Drain float64 // the downstream group's drain rate (filtered), events a second
	Input float64 // what reaches the downstream topic, events a second
	Lag   int64
	Wait  time.Duration // lag / drain
	State string
	// Reason says why the signal is lost (State held or floor).
	Reason string
	// LostSince is when the signal was lost (zero: it is not).
	LostSince time.Time
	// Decided: the rate was computed with this sample (once per interval,
	// or at once when the drain dropped); otherwise it is the last one.
	Decided bool
	// Drop: the drain fell well under its estimate with this sample.
	Drop bool
	// Skew is how much longer the longest partition's events wait than
	// Wait, filtered (Controller.setpoint); 0 before the first decision.
	Skew float64
}

// Controller turns samples of the downstream into a rate. With D the
// downstream group's drain rate, L the lag (both summed over the
// partitions) and L* = D x S the lag that gives the setpoint S (half of
// TargetWait over the skew K, but at least 1.75 times the time between the
// group's commits, at most TargetWait: setpoint), its law is
//
//	rate = D + clamp(c(L* - L') / Tc, -D, D/2)
//
// where L' is the lag predicted for when the rate takes effect, Tc =
// max(TargetWait, 2 intervals), and c (correction) halves an excess within
// B/4 of the target (B: L* before the skew), so that the lag's noise moves
// the rate half as much.
//
// The skew K is how much longer the longest partition's events wait than
// L / D (partsWait): the group takes its partitions about evenly while a
// heavy tenant fills one, which then holds most of the lag at a fraction of
// the drain. It is filtered over skewTau (ten intervals, at least 10 s):
// the partitions' shares of the lag move with the rate, and a skew taken
// as it is read moves the rate with them (swings of 12-20% in the model and
// the harness). Without the partitions' offsets K is 1.
//
// The drain is a feed-forward: it is the best estimate of what the
// downstream takes, and the rate follows it at once;
// the lag term only corrects the backlog, its gain and its bounds chosen so
// that it cannot oscillate: it may take the rate to the floor (a backlog
// drains as fast as it can), and raise it by half the drain at most.
//
// The drain is the slope of a least-squares line through the committed
// offsets of the last three seconds (the group commits in steps; a slope
// over many samples is smooth where a difference of two is not). When the
// drain over the last second falls under 70% of that estimate in two
// samples running while events wait, the downstream slowed: the estimate
// restarts from that second's samples and the rate is computed at once,
// not at the end of the interval (and when it is back over the estimate
// by as much soon after, it was a stall: the estimate is over the long
// span again). The rate rises by half per interval at most (of the rate,
// or of the drain if more).
//
// After a drop confirmed at the next decision (a cut), the backlog the old
// rate left drains as fast as the floor allows and the new drain is fed
// forward as soon as it is gone (a deadbeat on the predicted excess, not
// the gain 1/Tc), and the rest of the excess is taken within 6% of the
// drain (settleLaw).
//
// Under the setpoint, the rate is not lowered under the drain of the last
// second (the three seconds' slope lags a ramp).
//
// While the downstream keeps up (the least lag of the last interval under
// a quarter of D x TargetWait, and each partition's least wait under what
// the commits leave, so its drain is what reaches it, not what it can
// take) the rate is raised to up to 1.5 times what reached the downstream
// over the last second when the gate uses it in full (it probes
// for a faster downstream; by less as the least lag nears that bound, so
// that the probe which reaches the downstream's limit lands near it), and
// kept when demand, not the capacity, sets the pace: an idle downstream
// says nothing of what it can take.
// Not safe for concurrent use.
type Controller struct {
	p       Params
	samples []Sample  // over the last span, one per SampleEvery
	decided time.Time // when the rate was last computed
	last    Estimate
	rate    float64   // the last rate set (0: none yet)
	prev    float64   // the rate set before it (in force over the last interval)
	since   time.Time // the drain is estimated from samples at or after since (a drop moves it)
	drain   float64   // the last drain estimate (0: none yet)
	low     int       // samples running whose last second's drain is under dropBelow of the estimate
	members int       // the last count of the group's members read
	settle  int       // the stage of the response to the last drop (settle*)
	before  float64   // the drain estimate before the last drop
	settled int       // decisions running in settleRest with the excess under restDone
	short   float64   // the drain over the last second (the short span)
	skew    float64   // the skew filtered (skewTau; 0: none yet)
	// partLeast is the longest of the partitions' least waits over the
	// last interval, seconds (-1: the partitions' offsets not read).
	partLeast float64
}

// SampleEvery is how often the downstream is read: a few times per
// interval, so that a drop in the drain is seen within a fraction of it.
func SampleEvery(interval time.Duration) time.Duration { return max(interval/4, 25*time.Millisecond) }

// The controller's constants.
const (
	// lead is how many intervals ahead the lag is predicted: the rate
	// set now takes effect at the next window after the replicas read it.
	lead = 1.5
	// upStep bounds a rise: at most half the drain (or, probing, half the
	// rate) per interval.
	upStep = 0.5
	// dropBelow and dropSamples say when the drain dropped.
	dropBelow   = 0.7
	dropSamples = 2
	// keepsUp: under this fraction of L*, the downstream drains what
	// reaches it.
	keepsUp = 0.25
	// used: the gate admits at least this fraction of the rate in force.
	used = 0.75
	// After a drop (settleLaw): it is a cut when the drain at the next
	// decision is still under confirmBelow of the estimate before it and
	// the lag's excess at least confirmExcess of L*; the rest of the
	// excess is taken at most restBand of the drain from it, until it has
	// been under restDone of L* in restDoneN decisions running.
	confirmBelow  = 0.85
	confirmExcess = 0.25
	restBand      = 0.06
	restDone      = 0.125
	restDoneN     = 2
	// gapTimes: the setpoint is at least this many times the time
	// between two commits of the downstream group (setpoint).
	gapTimes = 1.75
)

// The stages of the response to a drop (settleLaw).
const (
	settleNone    = iota // the law alone
	settlePending        // a drop was seen: confirmed or not at the next decision
	settleDrain          // the old rate's backlog drains, down to the floor
	settleRest           // the rest of the excess, near the drain
)

// longSpan is the time over which the drain is estimated; shortSpan the
// time over which a drop is seen.
func (c *Controller) longSpan() time.Duration  { return max(3*c.p.Interval, 3*time.Second) }
func (c *Controller) shortSpan() time.Duration { return max(c.p.Interval, time.Second) }

// NewController returns a controller that starts from rate (e.g. the fleet
// value before it; 0: the ceiling).
func NewController(p Params, rate float64) *Controller {
	if rate <= 0 {
		rate = p.Ceiling
	}
	r := clamp(rate, p.Floor, p.Ceiling)
	return &Controller{p: p, rate: r, prev: r, members: -1}
}

func clamp(x, lo, hi float64) float64 { return math.Max(lo, math.Min(hi, x)) }

// Observe takes a sample (one per SampleEvery) and returns the estimate;
// the rate changes once per interval, or at once when the drain dropped.
func (c *Controller) Observe(s Sample) Estimate {
	if s.Members >= 0 {
		c.members = s.Members
	}
	if c.members == 0 {
		return c.Lost(s.At, "the downstream group has no members")
	}
	// Forget samples older than the span, keeping one at least that old.
	keep := 0
	for keep+1 < len(c.samples) && s.At.Sub(c.samples[keep+1].At) >= c.longSpan() {
		keep++
	}
	c.samples = append(c.samples[keep:], s)
	old := c.samples[0]
	e := Estimate{Lag: max(0, s.End-s.Committed), State: StateOK}
	if len(c.samples) >= 2 && (s.Committed < old.Committed || s.End < old.End) {
		e.Reason = fmt.Sprintf("offsets went back (committed %d to %d, end %d to %d): samples restarted", old.Committed, s.Committed, old.End, s.End)
		c.samples = c.samples[len(c.samples)-1:]
		c.since, c.drain, c.low, c.settle = time.Time{}, 0, 0, settleNone
	}
	short, ok := c.rateOver(s.At, c.shortSpan(), func(x Sample) int64 { return x.Committed })
	if !ok {
		e.State, e.Rate = StateWarming, c.rate
		c.last = e
		return e
	}
	c.short = short
	e.Input, _ = c.rateOver(s.At, c.shortSpan(), func(x Sample) int64 { return x.End })
	// The drain: feed-forward, filtered; a drop restarts it at once.
	// A drop counts only while events wait: when the downstream keeps up,
	// its drain is what reaches it, and that comes in bursts.
	waiting := float64(e.Lag) >= keepsUp*c.drain*c.p.TargetWait.Seconds()
	switch {
	case c.drain > 0 && short < dropBelow*c.drain && waiting:
		c.low++
	case c.drain > 0 && short*dropBelow > c.drain && s.At.Sub(c.since) < c.longSpan():
		c.low-- // back up soon after a drop: it was a stall
	default:
		c.low = 0
	}
	switch {
	case c.low >= dropSamples:
		c.since, c.low, e.Drop = s.At.Add(-c.shortSpan()), 0, true
	case c.low <= -dropSamples:
		c.since, c.low, c.settle = time.Time{}, 0, settleNone // a stall: the long span again
	}
	if e.Drop {
		c.settle, c.before = settlePending, c.drain
	}
	e.Drain = c.slope(s.At)
	c.drain = e.Drain
	if e.Drain > 0 {
		e.Wait = time.Duration(float64(e.Lag) / e.Drain * float64(time.Second))
	} else if e.Lag > 0 {
		e.Wait = time.Duration(math.MaxInt64)
	}
	if !e.Drop && !c.decided.IsZero() && s.At.Sub(c.decided) < c.p.Interval*9/10 {
		e.Rate = c.rate // between two decisions: a sample of the lag
		c.last = e
		return e
	}
	c.decided, e.Decided = s.At, true
	// A rise is never urgent: by half per interval at most, of the rate
	// or of the drain if more.
	mean, least := c.lagOver(s.At)
	c.filterSkew()
	e.Skew = math.Max(1, c.skew)
	rate := math.Min(c.law(e, mean, least), math.Max(c.rate, e.Drain)*(1+upStep))
	if e.Drop {
		rate = math.Min(rate, c.rate) // a drop never raises the rate
	}
	c.prev, c.rate = c.rate, clamp(rate, c.p.Floor, c.p.Ceiling)
	e.Rate = c.rate
	c.last = e
	return e
}

// law returns the rate for the estimate e and the lag's mean and least
// over the last interval (within a window the lag falls from what the
// window's first calls wrote: one sample would see a different point of
// that each time).
func (c *Controller) law(e Estimate, lag, least float64) float64 {
	d := e.Drain
	target := c.p.TargetWait.Seconds()
	// L*: the lag of the setpoint, under the target; the bands around it
	// (the lag's noise, the stages of a cut) are of the setpoint before
	// the skew: what the reads and commits leave in the summed lag does
	// not shrink with it.
	hold, band := c.setpoint()
	want, ref := d*hold, d*band
	// The rate set last takes effect from the next window on: the lag then
	// is predicted from it, so that one correction is not made twice.
	ahead := lag + (c.rate-d)*lead*c.p.Interval.Seconds()
	tc := math.Max(target, 2*c.p.Interval.Seconds())
	if c.settle != settleNone && d > 0 && !e.Drop {
		if rate, ok := c.settleLaw(d, ahead-want, ref, tc); ok {
			return rate
		}
	}
	rate := d + clamp(correction(want-ahead, ref/4)/tc, -d, upStep*d)
	if lag < want && !e.Drop {
		// Under the setpoint the rate is not lowered under what the
		// downstream drained over the last second: the drain's slope over
		// three seconds lags a ramp, and the first decisions after the
		// downstream starts to lag would set a rate under what it takes.
		rate = math.Max(rate, math.Min(c.short, c.rate))
	}
	// The downstream keeps up while its lag fell under a quarter of the
	// target's in the last interval: the least lag of the interval, not the
	// predicted one (a probe's rise, not yet drained, is no backlog while
	// the downstream keeps up), and of the target, not the setpoint (what
	// the reads and commits leave in the lag does not shrink with it).
	// With the partitions' offsets, each partition must keep up too: the
	// longest of their least waits under what the commits leave (gapTimes
	// the commit gap, at most keepsUp of the target). The summed lag is
	// held under the skew, so its least falls under keep while the
	// longest partition still holds its backlog.
	keep := keepsUp * d * target
	part := keepsUp * target
	if g := gapTimes * c.commitGap().Seconds(); g > 0 {
		part = math.Min(part, g)
	}
	if (least >= keep || c.partLeast >= part) && d > 0 {
		return rate
	}
	// The downstream keeps up: its drain is what reaches it.
	inForce := math.Min(c.rate, c.prev)
	if e.Input >= used*inForce {
		// Used in full: probe, by half of what reached the downstream
		// when its lag fell to nothing, less as the lag nears the bound
		// above: the probe that reaches the downstream's limit lands near
		// it instead of half over it.
		return math.Max(rate, math.Min(c.rate, e.Input)*(1+upStep*(1-least/keep)))
	}
	return math.Max(rate, c.rate) // demand sets the pace: keep the rate
}

// correction returns the part of the lag's excess x to correct: half of it
// within e0 of the target (the lag's noise moves the rate half as much
// there), all of it beyond, continuous at e0.
func correction(x, e0 float64) float64 {
	if math.Abs(x) <= e0 {
		return x / 2
	}
	return math.Copysign(math.Abs(x)-e0/2, x)
}

// rateOver returns how fast f grew over the last span (from the newest
// sample at least span old, else the oldest if it is at least half the
// span old); false when there is no such sample.
func (c *Controller) rateOver(at time.Time, span time.Duration, f func(Sample) int64) (float64, bool) {
	n := len(c.samples)
	if n < 2 {
		return 0, false
	}
	i := 0
	for i+1 < n-1 && at.Sub(c.samples[i+1].At) >= span {
		i++
	}
	dt := at.Sub(c.samples[i].At)
	if dt < span/2 {
		return 0, false
	}
	return float64(f(c.samples[n-1])-f(c.samples[i])) / dt.Seconds(), true
}

// slope returns the drain: the least-squares slope of the committed
// offsets over the samples at or after since (at most the long span).
func (c *Controller) slope(at time.Time) float64 {
	var n, st, sc, stt, stc, span float64
	t0 := c.samples[len(c.samples)-1].At
	for _, x := range c.samples {
		if x.At.Before(c.since) || at.Sub(x.At) > c.longSpan() {
			continue
		}
		t, v := x.At.Sub(t0).Seconds(), float64(x.Committed-c.samples[0].Committed)
		n, st, sc, stt, stc, span = n+1, st+t, sc+v, stt+t*t, stc+t*v, math.Max(span, -t)
	}
	den := n*stt - st*st
	// Samples over less than the short span (just after a drop, or read
	// late on a loaded machine): two close ones with a commit between
	// them would read a burst; the rate over the short span instead.
	if n < 2 || den <= 0 || span < c.shortSpan().Seconds() {
		short, _ := c.rateOver(at, c.shortSpan(), func(x Sample) int64 { return x.Committed })
		return math.Max(0, short)
	}
	return math.Max(0, (n*stc-st*sc)/den)
}

// lagOver returns the lag's mean and least over the samples of the last
// interval.
func (c *Controller) lagOver(at time.Time) (mean, least float64) {
	var sum, k float64
	least = math.Inf(1)
	for _, x := range c.samples {
		if at.Sub(x.At) < c.p.Interval {
			l := float64(max(0, x.End-x.Committed))
			sum, k, least = sum+l, k+1, math.Min(least, l)
		}
	}
	return sum / math.Max(1, k), least
}

// setpoint returns the wait the law holds, in seconds. TargetWait is the
// wait the downstream is kept under, through a halving of its drain too:
// held at the target, a halving would take what is queued to twice the
// target, and what is admitted while the drop is seen and acted on (about
// two intervals at the old rate) further. So the law holds half the
// target: a halving takes the queue to the target, the reaction adds its
// seconds, and the wait stays within twice the target. But at least
// gapTimes the time between two commits of the downstream group: the lag
// is seen to within a commit's worth of events, and a setpoint near that
// reads as held while the downstream keeps up (in the model, with commits
// a second apart, setpoints of 1.5 s and less stall the start and the
// recovery); and at most the target. Half the target is for the partition
// that waits longest: the summed lag is held at half the target over the
// skew (hold). The bands of the law (band: the lag's noise, the stages of
// a cut) are of the setpoint before the skew: what the commits and reads
// leave in the summed lag does not shrink with it (with the bands taken
// from the skewed setpoint, the model's cut on partitions filled unevenly
// settled in a median of 8 s over 40 seeds, 6 s with them as they are).
func (c *Controller) setpoint() (hold, band float64) {
	t, gap := c.p.TargetWait.Seconds(), gapTimes*c.commitGap().Seconds()
	return math.Min(t, math.Max(t/2/math.Max(1, c.skew), gap)), clamp(gap, t/2, t)
}

// filterSkew reads the partitions' waits (partsWait) with this decision:
// their least keeps the last interval's, their skew goes into the filtered
// one, an exponential mean over skewTau (kept when it cannot be read: no
// partitions' offsets, or samples over less than the short span).
func (c *Controller) filterSkew() {
	k, least, ok := partsWait(c.samples, c.p.Interval, c.shortSpan())
	c.partLeast = least
	if !ok {
		return
	}
	if c.skew == 0 {
		c.skew = 1
	}
	c.skew += (k - c.skew) * math.Min(1, c.p.Interval.Seconds()/skewTau(c.p.Interval).Seconds())
}

// skewTau is the time constant of the skew's filter: slow, so that the
// partitions' shares of the lag, which move with the rate, do not move it.
func skewTau(interval time.Duration) time.Duration { return max(10*interval, 10*time.Second) }

// maxSkew bounds the skew: a partition whose drain nearly stopped cannot be
// helped by the rate, and must not take it to the floor.
const maxSkew = 3

// partsWait returns how much longer the longest partition's events wait
// than the summed lag over the summed drain says (the skew: at least 1, at
// most maxSkew), and the longest of the partitions' least waits over the
// last interval, in seconds; false without the partitions' offsets or
// samples over less than the short span (the least is then -1). A
// downstream group takes its partitions about evenly while they fill
// unevenly (one heavy tenant's partition), so the summed lag over the
// summed drain is not the wait of the partition that waits longest. Each
// partition's wait is its lag (its mean, or its least, over the last
// interval) over its drain (its committed offsets over the samples kept,
// at least the short span); a partition that drained nothing does not
// count (the rate cannot help it).
func partsWait(samples []Sample, interval, shortSpan time.Duration) (skew, least float64, ok bool) {
	if len(samples) < 2 {
		return 1, -1, false
	}
	first, last := samples[0], samples[len(samples)-1]
	dt := last.At.Sub(first.At).Seconds()
	n := len(last.Parts)
	if n == 0 || len(first.Parts) != n || dt < shortSpan.Seconds() {
		return 1, -1, false
	}
	lags, leasts := make([]float64, n), make([]float64, n)
	for i := range leasts {
		leasts[i] = math.Inf(1)
	}
	var k float64
	for _, x := range samples {
		if last.At.Sub(x.At) < interval && len(x.Parts) == n {
			for i, o := range x.Parts {
				l := float64(max(0, o.End-o.Committed))
				lags[i], leasts[i] = lags[i]+l, math.Min(leasts[i], l)
			}
			k++
		}
	}
	var lag, drain, longest float64
	least = 0
	for i := range n {
		dp := float64(last.Parts[i].Committed-first.Parts[i].Committed) / dt
		lp := lags[i] / math.Max(1, k)
		lag, drain = lag+lp, drain+math.Max(0, dp)
		if dp > 0 {
			longest = math.Max(longest, lp/dp)
			least = math.Max(least, leasts[i]/dp)
		}
	}
	if lag <= 0 || drain <= 0 {
		return 1, least, true
	}
	return clamp(longest/(lag/drain), 1, maxSkew), least, true
}

// commitGap returns the shortest time between two moves of the committed
// offsets over the samples kept (0: fewer than two moves seen).
func (c *Controller) commitGap() time.Duration {
	var gap, last time.Duration
	moved := false
	for i := 1; i < len(c.samples); i++ {
		if c.samples[i].Committed == c.samples[i-1].Committed {
			continue
		}
		at := c.samples[i].At.Sub(c.samples[0].At)
		if moved && (gap == 0 || at-last < gap) {
			gap = at - last
		}
		last, moved = at, true
	}
	return gap
}

// Lost records that the signal could not be read at time at (reason says
// why) and returns the estimate: the last rate for the hold time, then the
// floor.
func (c *Controller) Lost(at time.Time, reason string) Estimate {
	c.samples = c.samples[:0]
	c.since, c.drain, c.low, c.settle = time.Time{}, 0, 0, settleNone
	e := c.last
	if e.LostSince.IsZero() {
		e.LostSince = at
	}
	e.Reason, e.Decided, e.Drop = reason, true, false
	e.State, e.Rate = StateHeld, c.rate
	if at.Sub(e.LostSince) >= c.p.Hold {
		e.State, e.Rate = StateFloor, c.p.Floor
		c.rate, c.prev = c.p.Floor, c.p.Floor
	}
	c.last = e
	return e
}

// settleLaw is the law after a drop, while it is not done (false: the law
// alone). At the drop the law alone sets the rate (under the rate before);
// at the next decision it is a cut when the drain stayed low (under
// confirmBelow of the estimate before the drop: a stall's commits came
// back, and with commits a second apart a drop read while the downstream
// keeps up is not one) and the lag's excess over the new target is at
// least confirmExcess of it. Then the backlog that the old rate left
// drains as fast as the floor allows, and the drain is fed forward as soon
// as it is gone: the rate is the drain less the excess predicted for when
// it takes effect, over one interval (a deadbeat: the excess is gone one
// window later), down to the floor. The law alone would take the excess's
// last third at a gain of 1/Tc, and halved near the target: five to seven
// windows 10-40% under the drain. The first rate above the floor is the
// last of the drain; what the prediction missed (up to about a quarter of
// L* in the model) is taken from the next decision on at most restBand of
// the drain from it, so that the admitted rate stays within 10% of the
// drain, until the excess has been under restDone of L* in restDoneN
// decisions running, or is over L*/2 (a new backlog) or L*/4 under the
// target: then the law alone again.
func (c *Controller) settleLaw(d, excess, want, tc float64) (float64, bool) {
	switch c.settle {
	case settlePending:
		if d > confirmBelow*c.before || excess < confirmExcess*want {
			break
		}
		c.settle = settleDrain
		fallthrough
	case settleDrain:
		if excess <= 0 {
			break
		}
		rate := d - excess/c.p.Interval.Seconds()
		if rate > c.p.Floor {
			c.settle, c.settled = settleRest, 0
		}
		return rate, true
	case settleRest:
		if excess <= restDone*want {
			c.settled++
		} else {
			c.settled = 0
		}
		if c.settled >= restDoneN || excess >= want/2 || excess <= -want/4 {
			break
		}
		return d + clamp(correction(-excess, want/4)/tc, -restBand*d, restBand*d), true
	}
	c.settle = settleNone
	return 0, false
}
