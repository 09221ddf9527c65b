package pace

import (
	"math"
	"math/rand"
	"sort"
	"time"
)

// model is a model of the fleet and the downstream for the controller's
// tests: the gate admits in each one-second window at most the rate the
// replicas read 200 ms before the window starts (they poll the fleet's
// value), half of it at the window's start (reservations forwarded then)
// and the rest over the window, at most what is asked; the downstream
// consumes at drain(t), with a jitter, while events wait, and commits every
// commitEvery; the controller reads it every SampleEvery.
type model struct {
	p           Params
	commitEvery time.Duration
	drain       func(sec float64) float64
	demand      func(sec float64) float64 // events a second asked; nil: always more than the rate
	jitter      float64                   // the drain's relative jitter per 100 ms
	seed        int64
}

// run returns per second what was admitted and the rate in force, and per
// event (in arrival order, one per admitted event) how long it waited.
func (m model) run(seconds int) (admitted, rates []float64, waits [][2]float64) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := NewController(m.p, m.p.Floor)
	rng := rand.New(rand.NewSource(m.seed))
	const tick = 10 * time.Millisecond
	var end, done, committed float64
	published, read := c.rate, c.rate
	inForce, noise := read, 1.0
	var lastCommit, lastSample time.Duration
	var ends []float64 // cumulative end per tick
	var dones []float64
	var window float64
	for at := time.Duration(0); at < time.Duration(seconds)*time.Second; at += tick {
		sec := at.Seconds()
		if at%(200*time.Millisecond) == 0 {
			read = published
		}
		if at%time.Second == 0 {
			inForce = read
			admitted = append(admitted, 0)
			rates = append(rates, inForce)
			window = math.Floor(inForce)
			if m.demand != nil {
				window = math.Min(window, m.demand(sec))
			}
			end += window / 2
			admitted[len(admitted)-1] += window / 2
		}
		in := window / 2 * tick.Seconds()
		end += in
		admitted[len(admitted)-1] += in
		if at%(100*time.Millisecond) == 0 {
			noise = 1 + m.jitter*(2*rng.Float64()-1)
		}
		done = math.Min(end, done+m.drain(sec)*noise*tick.Seconds())
		ends, dones = append(ends, end), append(dones, done)
		if at-lastCommit >= m.commitEvery {
			committed, lastCommit = math.Floor(done), at
		}
		if at-lastSample >= SampleEvery(m.p.Interval) {
			e := c.Observe(Sample{At: t0.Add(at), Committed: int64(committed), End: int64(end), Members: 1})
			published, lastSample = e.Rate, at
		}
	}
	// The wait of event n: when done passed n less when end passed it.
	j := 0
	for i, e := range ends {
		for n := float64(len(waits)) + 1; n <= e; n = float64(len(waits)) + 1 {
			for j < len(dones) && dones[j] < n {
				j++
			}
			if j == len(dones) {
				return admitted, rates, waits
			}
			waits = append(waits, [2]float64{float64(j) * tick.Seconds(), float64(j-i) * tick.Seconds()})
		}
	}
	return admitted, rates, waits
}

// waitP returns the q-quantile of the waits of the events processed in
// [from, to) seconds.
func waitP(waits [][2]float64, from, to, q float64) float64 {
	var xs []float64
	for _, w := range waits {
		if w[0] >= from && w[0] < to {
			xs = append(xs, w[1])
		}
	}
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	return xs[min(len(xs)-1, int(q*float64(len(xs))))]
}
