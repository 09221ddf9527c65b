package pace

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Runner runs the pacing of one replica: while it holds the lease it
// computes the fleet's rate (with a Downstream), and on every replica it
// reads the fleet's rate and the operator's cap and applies what is in force.
// Run it once; Status is safe for concurrent use.
type Runner struct {
	Fleet *Fleet
	// Downstream is the signal; nil: the capacity is not paced (an
	// operator's cap still applies).
	Downstream *Downstream
	Params     Params
	// Shadow: compute and export the paced rate, never enforce it.
	Shadow bool
	// Ceiling is the configured capacity as a rate (limit.Capacity.Rate).
	Ceiling float64
	// Apply sets the rate in force (limit.Limiter.SetCapacityRate; the
	// ceiling or more restores the configured capacity).
	Apply func(rate float64)
	// ID names this replica in the lease and the fleet record.
	ID    string
	Log   *slog.Logger
	Clock func() time.Time

	mu     sync.Mutex
	inited bool
	status Status
	m      *metrics
}

// Status is what a replica knows of the pacing. It is a value type; its
// JSON is the API's (GET /v1/capacity).
type Status struct {
	Paced   bool    `json:"paced"`
	Shadow  bool    `json:"shadow"`
	Ceiling float64 `json:"ceiling"`
	Floor   float64 `json:"floor"`
	// Fleet is the fleet's paced rate as last read (nil: none yet).
	Fleet *Paced `json:"fleet,omitempty"`
	// Cap is the operator's cap in force (nil: none).
	Cap *Cap `json:"cap,omitempty"`
	// InForce is the rate this replica passes to its limiter.
	InForce float64 `json:"in_force"`
	// Leader: this replica computes the fleet's rate.
	Leader bool      `json:"leader"`
	ReadAt time.Time `json:"read_at"`
	Error  string    `json:"error,omitempty"`
}

// Status returns the replica's view of the pacing.
func (r *Runner) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

// Note returns a line for /readyz: the state of the pacing, with what is
// lost and since when; empty when the capacity is not paced or capped.
func (r *Runner) Note() string {
	s := r.Status()
	var line string
	switch {
	case s.Paced && s.Fleet == nil:
		line = fmt.Sprintf("capacity paced: no rate yet (%.0f/s in force)", s.InForce)
	case s.Paced:
		f := s.Fleet
		line = fmt.Sprintf("capacity paced %s: %.0f/s (drain %.0f/s, wait %.1fs)", f.State, f.Rate, f.Drain, f.Wait.Seconds())
		if f.State == StateHeld || f.State == StateFloor {
			line = fmt.Sprintf("capacity paced %s: %.0f/s: signal lost since %s: %s", f.State, f.Rate, f.LostSince.Format(time.RFC3339), f.Reason)
		}
		if s.Shadow {
			line += " (shadow: not enforced)"
		}
	}
	if s.Cap != nil {
		if line != "" {
			line += "; "
		}
		line += fmt.Sprintf("capped at %.0f/s until %s by %s", s.Cap.Rate, s.Cap.Until.Format(time.RFC3339), s.Cap.By)
	}
	if line != "" {
		line += fmt.Sprintf("; in force %.0f/s", s.InForce)
	}
	return line
}

func (r *Runner) now() time.Time {
	if r.Clock != nil {
		return r.Clock()
	}
	return time.Now()
}

// Register registers the pacing's metrics with reg.
func (r *Runner) Register(reg prometheus.Registerer) error {
	r.m = newMetrics()
	return r.m.register(reg)
}

// Init applies what is in force now, before any event is decided: the
// fleet's rate and the cap when they can be read, else the floor when paced
// and enforced, the ceiling otherwise. Run calls it; call it before the
// pipeline starts.
func (r *Runner) Init(ctx context.Context) {
	if r.Log == nil {
		r.Log = slog.New(slog.DiscardHandler)
	}
	if r.m == nil {
		r.m = newMetrics()
	}
	r.mu.Lock()
	if !r.inited {
		r.inited = true
		r.status = Status{Paced: r.Downstream != nil, Shadow: r.Shadow, Ceiling: r.Ceiling, Floor: r.Params.Floor, InForce: r.Ceiling}
		if r.Downstream != nil && !r.Shadow {
			r.status.InForce = r.Params.Floor // until the fleet's rate is read
		}
		r.Apply(r.status.InForce)
	}
	r.mu.Unlock()
	r.apply(ctx)
}

// Run computes (with the lease) and applies the rate until ctx is done.
func (r *Runner) Run(ctx context.Context) error {
	r.Init(ctx)
	var wg sync.WaitGroup
	if r.Downstream != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.control(ctx)
		}()
	}
	poll := time.NewTicker(pollEvery(r.Params.Interval))
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return nil
		case <-poll.C:
			r.apply(ctx)
		}
	}
}

// pollEvery is how often a replica reads the fleet's rate.
func pollEvery(interval time.Duration) time.Duration {
	return min(max(interval/5, 50*time.Millisecond), 200*time.Millisecond)
}

// apply reads the fleet's rate and the cap, and applies the rate in force:
// the least of the ceiling, the paced rate (unless shadow) and the cap.
func (r *Runner) apply(ctx context.Context) {
	paced, c, err := r.Fleet.Read(ctx)
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	st := &r.status
	if err != nil {
		st.Error = err.Error()
		r.m.readErrors.Inc()
		return // keep what is in force
	}
	st.Paced, st.Shadow, st.Ceiling, st.Floor = r.Downstream != nil, r.Shadow, r.Ceiling, r.Params.Floor
	st.Error, st.ReadAt = "", now
	if c != nil && !c.Until.After(now) {
		c = nil
	}
	st.Fleet, st.Cap = paced, c
	rate := r.Ceiling
	if r.Downstream != nil && !r.Shadow {
		rate = r.Params.Floor
		if paced != nil {
			rate = paced.Rate
		}
	}
	if c != nil {
		rate = math.Min(rate, c.Rate)
	}
	rate = math.Min(rate, r.Ceiling)
	st.InForce = rate
	r.Apply(rate)
	r.m.observe(*st)
}

// control computes the fleet's rate while this replica holds the lease: it
// reads the downstream every SampleEvery, renews the lease once per
// interval, and publishes the rate when it is computed (once per interval,
// at once after a drop) or the state changes.
func (r *Runner) control(ctx context.Context) {
	t := time.NewTicker(SampleEvery(r.Params.Interval))
	defer t.Stop()
	var c *Controller
	var held bool
	var leaseAt time.Time
	var state string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !held || r.now().Sub(leaseAt) >= r.Params.Interval {
			var err error
			held, err = r.Fleet.Lease(ctx, r.ID, 3*r.Params.Interval+time.Second)
			if err != nil {
				r.Log.Warn("capacity pacing: lease", slog.String("err", err.Error()))
			}
			leaseAt = r.now()
			r.mu.Lock()
			r.status.Leader = held
			r.mu.Unlock()
		}
		if !held {
			c = nil
			continue
		}
		if c == nil {
			start := r.Params.Floor
			if s := r.Status(); s.Fleet != nil {
				start = s.Fleet.Rate
			}
			c = NewController(r.Params, start)
			state = ""
			r.Log.Info("capacity pacing: this replica computes the fleet's rate", slog.Float64("rate", start))
		}
		s, err := r.Downstream.Read(ctx)
		var e Estimate
		if err != nil {
			e = c.Lost(r.now(), err.Error())
		} else {
			e = c.Observe(s)
		}
		if e.State == StateWarming && e.Reason != "" {
			r.Log.Warn("capacity pacing: "+e.Reason, slog.Float64("rate", e.Rate))
		}
		if e.State == StateHeld || e.State == StateFloor {
			r.Log.Warn("capacity pacing: signal lost", slog.String("state", e.State), slog.String("reason", e.Reason), slog.Time("since", e.LostSince))
		}
		if e.Drop {
			r.Log.Info("capacity pacing: the downstream's drain dropped", slog.Float64("drain", e.Drain), slog.Float64("rate", e.Rate))
		}
		if !e.Decided && e.State == state {
			continue
		}
		state = e.State
		ok, err := r.Fleet.Publish(ctx, Paced{Estimate: e, At: r.now(), By: r.ID})
		if err != nil {
			r.Log.Warn("capacity pacing: publish", slog.String("err", err.Error()))
		} else if !ok {
			held = false // another replica took the lease
		}
	}
}
