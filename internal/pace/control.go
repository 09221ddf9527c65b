package pace

import (
	"fmt"
	"math"
	"time"
)

// Params are the controller's settings. It is a value type.
type Params struct {
	// TargetWait is the wait downstream (lag / drain rate) to hold.
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
// offsets, and the group's members. It is a value type.
type Sample struct {
	At        time.Time
	Committed int64
	End       int64
	Members   int
}

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
	Drain float64 // the downstream group's drain rate, events a second
	Input float64 // what reaches the downstream topic, events a second
	Lag   int64
	Wait  time.Duration // lag / drain
	State string
	// Reason says why the signal is lost (State held or floor).
	Reason string
	// LostSince is when the signal was lost (zero: it is not).
	LostSince time.Time
}

// Controller turns samples of the downstream into a rate. Its law: with D
// the drain rate over the last few seconds, L the lag and L* = D x
// TargetWait the lag that gives the target wait,
//
//	rate = D + (L* - L) / TargetWait
//
// so that the lag moves to L* within about a target wait: at the target the
// rate is the drain; above it the rate is under the drain until the excess
// has drained; under it (the downstream keeps up) the rate is up to twice
// the drain, which is how the rate finds a faster downstream (it doubles per
// interval while events do not wait). When what reaches the downstream is
// well under the rate (demand, not the capacity, sets the pace), the rate is
// not lowered: an idle downstream says nothing of what it can take.
// Not safe for concurrent use.
type Controller struct {
	p       Params
	samples []Sample  // over the last span, one per SampleEvery
	decided time.Time // when the rate was last computed
	last    Estimate
	rate    float64 // the last rate set (0: none yet)
}

// SampleEvery is how often the downstream is read: a few times per
// interval, so that the lag of the law is a mean, not one point of a
// window's saw-tooth.
func SampleEvery(interval time.Duration) time.Duration { return max(interval/4, 25*time.Millisecond) }

// span is the time over which the drain rate is estimated.
func (c *Controller) span() time.Duration { return max(2*c.p.Interval, 2*time.Second) }

// NewController returns a controller that starts from rate (e.g. the fleet
// value before it; 0: the ceiling).
func NewController(p Params, rate float64) *Controller {
	if rate <= 0 {
		rate = p.Ceiling
	}
	return &Controller{p: p, rate: clamp(rate, p.Floor, p.Ceiling)}
}

// lead is how many intervals ahead the lag is predicted.
const lead = 1.0

func clamp(x, lo, hi float64) float64 { return math.Max(lo, math.Min(hi, x)) }

// Observe takes a sample (one per SampleEvery) and returns the estimate;
// the rate changes at most once per interval.
func (c *Controller) Observe(s Sample) Estimate {
	if s.Members == 0 {
		return c.Lost(s.At, "the downstream group has no members")
	}
	// Forget samples older than the span, keeping one at least that old.
	keep := 0
	for keep+1 < len(c.samples) && s.At.Sub(c.samples[keep+1].At) >= c.span() {
		keep++
	}
	c.samples = append(c.samples[keep:], s)
	old := c.samples[0]
	dt := s.At.Sub(old.At).Seconds()
	e := Estimate{Lag: max(0, s.End-s.Committed), State: StateOK}
	if len(c.samples) < 2 || dt < c.p.Interval.Seconds()/2 || s.Committed < old.Committed || s.End < old.End {
		if len(c.samples) >= 2 && (s.Committed < old.Committed || s.End < old.End) {
			e.Reason = fmt.Sprintf("offsets went back (committed %d to %d, end %d to %d): samples restarted", old.Committed, s.Committed, old.End, s.End)
			c.samples = c.samples[len(c.samples)-1:]
		}
		e.State, e.Rate = StateWarming, c.rate
		c.last = e
		return e
	}
	e.Drain = float64(s.Committed-old.Committed) / dt
	e.Input = float64(s.End-old.End) / dt
	target := c.p.TargetWait.Seconds()
	if e.Drain > 0 {
		e.Wait = time.Duration(float64(e.Lag) / e.Drain * float64(time.Second))
	} else if e.Lag > 0 {
		e.Wait = time.Duration(math.MaxInt64)
	}
	if !c.decided.IsZero() && s.At.Sub(c.decided) < c.p.Interval*9/10 {
		e.Rate = c.rate // between two decisions: a sample of the lag
		c.last = e
		return e
	}
	c.decided = s.At
	// The lag of the law is its mean over the last interval: within a
	// window it falls from what the window's first calls wrote, and one
	// sample would see a different point of that each time.
	var sum, k float64
	for _, x := range c.samples {
		if s.At.Sub(x.At) < c.p.Interval {
			sum += float64(max(0, x.End-x.Committed))
			k++
		}
	}
	lag := sum / k
	// The rate set last takes effect from the next window on: the lag then
	// is predicted from it, so that one correction is not made twice.
	ahead := lag + (c.rate-e.Drain)*lead*c.p.Interval.Seconds()
	rate := e.Drain + (e.Drain*target-ahead)/target
	if e.Input < 0.8*c.rate && rate < c.rate && lag <= e.Drain*target {
		rate = c.rate // demand-bound, and events do not wait: keep the rate
	}
	c.rate = clamp(rate, c.p.Floor, c.p.Ceiling)
	e.Rate = c.rate
	c.last = e
	return e
}

// Lost records that the signal could not be read at time at (reason says
// why) and returns the estimate: the last rate for the hold time, then the
// floor.
func (c *Controller) Lost(at time.Time, reason string) Estimate {
	c.samples = c.samples[:0]
	e := c.last
	if e.LostSince.IsZero() {
		e.LostSince = at
	}
	e.Reason = reason
	e.State, e.Rate = StateHeld, c.rate
	if at.Sub(e.LostSince) >= c.p.Hold {
		e.State, e.Rate = StateFloor, c.p.Floor
		c.rate = c.p.Floor
	}
	c.last = e
	return e
}
