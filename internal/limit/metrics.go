package limit

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	redisSeconds *prometheus.HistogramVec
	redisErrors  prometheus.Counter
	cacheHits    prometheus.Counter
}

func newMetrics() *metrics {
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
	}
	return m
}

func (m *metrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.redisSeconds, m.redisErrors, m.cacheHits} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
