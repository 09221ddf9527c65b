package pace

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// simulate runs the controller against a model of the fleet and the
// downstream: the gate admits in each one-second window the rate in force at
// the window's start (demand always exceeds it), spread over the window; the
// downstream consumes at drain(t) while events wait and commits every
// commitEvery. It returns the admitted events per second and the rate in
// force per second.
func simulate(p Params, seconds int, commitEvery time.Duration, drain func(sec float64) float64) (admitted, rates []float64) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := NewController(p, p.Ceiling/10)
	const tick = 10 * time.Millisecond
	var end, done, committed float64
	rate, inForce := c.rate, c.rate
	var lastCommit, lastSample time.Duration
	for at := time.Duration(0); at < time.Duration(seconds)*time.Second; at += tick {
		if at%time.Second == 0 {
			inForce = rate
			admitted = append(admitted, 0)
			rates = append(rates, inForce)
		}
		in := inForce * tick.Seconds()
		end += in
		admitted[len(admitted)-1] += in
		done = math.Min(end, done+drain(at.Seconds())*tick.Seconds())
		if at-lastCommit >= commitEvery {
			committed, lastCommit = math.Floor(done), at
		}
		if at-lastSample >= SampleEvery(p.Interval) {
			e := c.Observe(Sample{At: t0.Add(at), Committed: int64(committed), End: int64(end), Members: 1})
			rate, lastSample = e.Rate, at
		}
	}
	return admitted, rates
}

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

// TestControllerConverges holds the control law to the figures on
// the model: drain 2,000/s, cut to 1,000/s, then 10,000/s.
func TestControllerConverges(t *testing.T) {
	p := Params{TargetWait: 2 * time.Second, Floor: 100, Ceiling: 20000, Interval: time.Second, Hold: 10 * time.Second}
	for _, commit := range []time.Duration{100 * time.Millisecond, time.Second} {
		t.Run(fmt.Sprintf("commit every %v", commit), func(t *testing.T) {
			drain := func(s float64) float64 {
				switch {
				case s < 40:
					return 2000
				case s < 80:
					return 1000
				}
				return 10000
			}
			adm, _ := simulate(p, 140, commit, drain)
			cut := settle(adm, 40, 80, 900, 1100) - 40
			up := settle(adm, 80, 140, 9000, math.Inf(1)) - 80
			cv1, dev1 := cv(adm[25:40])
			cv2, dev2 := cv(adm[65:80])
			cv3, dev3 := cv(adm[120:140])
			t.Logf("cut: within 10%% of 1,000/s after %d s; 10x: 90%% of 10,000/s after %d s", cut, up)
			t.Logf("steady: cv %.3f %.3f %.3f, largest swing %.3f %.3f %.3f", cv1, cv2, cv3, dev1, dev2, dev3)
			if cut < 0 || cut > 10 {
				t.Errorf("after the cut: settled after %d s, want at most 10", cut)
			}
			if up < 0 || up > 60 {
				t.Errorf("after the recovery: 90%% after %d s, want at most 60", up)
			}
			for _, x := range []float64{cv1, cv2, cv3} {
				if x > 0.10 {
					t.Errorf("steady coefficient of variation %.3f, want at most 0.10", x)
				}
			}
			for _, x := range []float64{dev1, dev2, dev3} {
				if x > 0.15 {
					t.Errorf("steady swing %.3f, want at most 0.15", x)
				}
			}
		})
	}
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
