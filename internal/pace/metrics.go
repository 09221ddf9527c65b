package pace

import "github.com/prometheus/client_golang/prometheus"

// metrics are the pacing's metrics, as one replica sees the fleet's.
type metrics struct {
	paced, inForce, drain, lag, wait, skew, capRate, leader, lost prometheus.Gauge
	state                                                         *prometheus.GaugeVec
	readErrors                                                    prometheus.Counter
}

func newMetrics() *metrics {
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: "gatekeeper_capacity_" + name, Help: help})
	}
	return &metrics{
		paced:   g("paced_rate", "The rate (events a second) the downstream's drain sets for the capacity, enforced or not (shadow)."),
		inForce: g("in_force_rate", "The capacity's rate (events a second; bytes or units for a capacity of them) this replica passes to the limiter: the least of the configured capacity, the paced rate (unless shadow) and an operator's cap."),
		drain:   g("downstream_drain_rate", "The downstream group's drain rate, events a second."),
		lag:     g("downstream_lag", "The downstream group's lag on the downstream topic, events."),
		wait:    g("downstream_wait_seconds", "The downstream wait: lag / drain rate."),
		skew:    g("downstream_skew", "How much longer the downstream partition that waits longest waits than lag / drain rate (filtered, 1 to 3): the paced rate holds the lag at the target's half over it."),
		capRate: g("cap_rate", "An operator's cap on the capacity, events a second (bytes or units for a capacity of them; 0: none)."),
		leader:  g("pace_leader", "1 when this replica computes the fleet's paced rate."),
		lost:    g("pace_signal_lost", "1 when the downstream group's offsets cannot be read or it has no members (the rate is held, then the floor)."),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gatekeeper_capacity_pace_state",
			Help: "1 for the state of the paced capacity: ok, warming, held (signal lost, last rate) or floor (signal lost longer than the hold)."}, []string{"state"}),
		readErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "gatekeeper_capacity_pace_read_errors_total",
			Help: "Reads of the fleet's paced rate and cap from Redis that failed (what was in force stays)."}),
	}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.paced, m.inForce, m.drain, m.lag, m.wait, m.skew, m.capRate, m.leader, m.lost, m.state, m.readErrors} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *metrics) observe(s Status) {
	m.inForce.Set(s.InForce)
	m.leader.Set(b2f(s.Leader))
	m.capRate.Set(0)
	if s.Cap != nil {
		m.capRate.Set(s.Cap.Rate)
	}
	if f := s.Fleet; f != nil {
		m.paced.Set(f.Rate)
		m.drain.Set(f.Drain)
		m.lag.Set(float64(f.Lag))
		m.wait.Set(f.Wait.Seconds())
		m.skew.Set(f.Skew)
		m.lost.Set(b2f(f.State == StateHeld || f.State == StateFloor))
		for _, st := range []string{StateOK, StateWarming, StateHeld, StateFloor} {
			m.state.WithLabelValues(st).Set(b2f(f.State == st))
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
