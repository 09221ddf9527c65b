package limit

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the limiter's collectors. metrics is safe for concurrent use.
type metrics struct {
	redisSeconds *prometheus.HistogramVec
	redisErrors  prometheus.Counter
	cacheHits    prometheus.Counter
	// cacheEvictions counts tenant states forgotten for room, by state
	// (plain, or full: known full up to the horizon).
	cacheEvictions *prometheus.CounterVec
	cacheBytes     prometheus.Gauge
	replayed       prometheus.Counter
}

// newMetrics builds the limiter's collectors and registers them with reg; a
// nil reg leaves them unregistered.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		redisSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gatekeeper_redis_call_seconds",
			Help:    "Latency of Redis script calls made by the limiter.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"op"}),
		redisErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gatekeeper_redis_errors_total",
			Help: "Limiter calls to Redis that failed.",
		}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gatekeeper_limiter_cache_hits_total",
			Help: "Events decided from the local cache of tenants full up to the horizon, without Redis.",
		}),
		cacheEvictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gatekeeper_limiter_cache_evictions_total",
			Help: "Tenant states the limiter forgot to stay within its cache budget, by state: plain, or full (known full up to the horizon; these then cost Redis calls again).",
		}, []string{"state"}),
		cacheBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gatekeeper_limiter_cache_bytes",
			Help: "Estimated heap bytes of the tenant states the limiter remembers (at most its cache budget).",
		}),
		replayed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gatekeeper_replayed_decisions_total",
			Help: "Events decided again (a retried script call, a redelivered batch) that got their recorded decision back and were not counted again.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.redisSeconds, m.redisErrors, m.cacheHits, m.cacheEvictions, m.cacheBytes, m.replayed} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("limiter metrics: %w", err)
		}
	}
	return m, nil
}
