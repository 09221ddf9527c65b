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
	// parts are the downstream topic's partitions, as the shares of what
	// is admitted that each receives (nil: one partition). The consumer
	// takes them as kafka-go's reader does: its fetchers fill a buffer of
	// buffer events (0: none) taking the partitions that have events
	// waiting evenly (one queue per partition, served in turn), and it
	// processes the buffer in order; so a partition that receives more
	// than an even share of the drain holds the lag, and its events wait
	// longer than the summed lag over the summed drain.
	parts  []float64
	buffer float64
}

// run returns per second what was admitted and the rate in force, and per
// event (in arrival order within its partition, one per admitted event)
// when it was processed and how long it waited.
func (m model) run(seconds int) (admitted, rates []float64, waits [][2]float64) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := NewController(m.p, m.p.Floor)
	rng := rand.New(rand.NewSource(m.seed))
	const tick = 10 * time.Millisecond
	shares := m.parts
	if len(shares) == 0 {
		shares = []float64{1}
	}
	n := len(shares)
	end, done, committed := make([]float64, n), make([]float64, n), make([]float64, n)
	buf := make([]float64, n) // taken from each partition into the consumer's buffer, not yet processed
	published, read := c.rate, c.rate
	inForce, noise := read, 1.0
	var lastCommit, lastSample time.Duration
	ends, dones := make([][]float64, n), make([][]float64, n) // cumulative per partition and tick
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
			for i, sh := range shares {
				end[i] += window / 2 * sh
			}
			admitted[len(admitted)-1] += window / 2
		}
		in := window / 2 * tick.Seconds()
		for i, sh := range shares {
			end[i] += in * sh
		}
		admitted[len(admitted)-1] += in
		if at%(100*time.Millisecond) == 0 {
			noise = 1 + m.jitter*(2*rng.Float64()-1)
		}
		capa := m.drain(sec) * noise * tick.Seconds()
		if n == 1 && m.buffer == 0 {
			done[0] = math.Min(end[0], done[0]+capa)
		} else {
			m.consume(end, done, buf, capa)
		}
		for i := range n {
			ends[i], dones[i] = append(ends[i], end[i]), append(dones[i], done[i])
		}
		if at-lastCommit >= m.commitEvery {
			for i := range n {
				committed[i] = math.Floor(done[i])
			}
			lastCommit = at
		}
		if at-lastSample >= SampleEvery(m.p.Interval) {
			s := Sample{At: t0.Add(at), Members: 1}
			if n > 1 {
				s.Parts = make([]Offsets, n)
			}
			for i := range n {
				s.Committed, s.End = s.Committed+int64(committed[i]), s.End+int64(end[i])
				if n > 1 {
					s.Parts[i] = Offsets{Committed: int64(committed[i]), End: int64(end[i])}
				}
			}
			e := c.Observe(s)
			published, lastSample = e.Rate, at
		}
	}
	// The wait of a partition's event k: when done passed k less when end
	// passed it.
	for p := range n {
		j, k := 0, 0
		for i, e := range ends[p] {
			for x := float64(k) + 1; x <= e; x = float64(k) + 1 {
				for j < len(dones[p]) && dones[p][j] < x {
					j++
				}
				if j == len(dones[p]) {
					break
				}
				waits = append(waits, [2]float64{float64(j) * tick.Seconds(), float64(j-i) * tick.Seconds()})
				k++
			}
		}
	}
	return admitted, rates, waits
}

// consume processes capa events of the consumer's buffer (in order: from
// each partition in proportion to what the buffer holds of it) and fills
// the buffer back to m.buffer from the partitions' queues, evenly over the
// partitions that have events waiting (what one cannot use goes to the
// others). Without a buffer it processes from the queues directly, taken
// the same way.
func (m model) consume(end, done, buf []float64, capa float64) {
	if m.buffer == 0 {
		take(end, done, buf, capa)
		for i := range buf {
			done[i] += buf[i]
			buf[i] = 0
		}
		return
	}
	var held float64
	for _, b := range buf {
		held += b
	}
	if held > 0 {
		f := math.Min(1, capa/held)
		for i, b := range buf {
			done[i] += b * f
			buf[i] -= b * f
		}
		held -= held * f
	}
	take(end, done, buf, m.buffer-held)
}

// take moves up to room events from the partitions' queues (end less done
// less what buf holds) into buf, evenly over the partitions with events
// waiting, what one cannot use going to the others.
func take(end, done, buf []float64, room float64) {
	for room > 1e-9 {
		k := 0
		for i := range end {
			if end[i]-done[i]-buf[i] > 1e-9 {
				k++
			}
		}
		if k == 0 {
			return
		}
		share, used := room/float64(k), 0.0
		for i := range end {
			if q := end[i] - done[i] - buf[i]; q > 1e-9 {
				x := math.Min(q, share)
				buf[i] += x
				used += x
			}
		}
		room -= used
	}
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
