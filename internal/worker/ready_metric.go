package worker

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
)

// readyCollector exports the readiness checks of /readyz as the gauge
// gatekeeper_ready{check}: 1 when the check passes, 0 when it fails. A
// scrape reads the results /readyz reads, at most about a second old (see
// readiness), also where no probe calls /readyz, so that a replica paused
// by Redis trouble (check "consumption") can be told from one that is not.
// When the checks give no result in time, every check is 0. It is safe for
// concurrent use.
type readyCollector struct {
	ready *readiness
	desc  *prometheus.Desc
}

// newReadyCollector returns the collector of the checks of ready.
func newReadyCollector(ready *readiness) *readyCollector {
	return &readyCollector{
		ready: ready,
		desc: prometheus.NewDesc("gatekeeper_ready",
			"Readiness checks of /readyz, results at most about a second old: 1 passes, 0 fails (check: redis, kafka, limiter, groups, "+
				"consumption (0: paused by Redis trouble), writes, shutdown). The replica is ready when all are 1.",
			[]string{"check"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *readyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *readyCollector) Collect(ch chan<- prometheus.Metric) {
	errs, err := c.ready.results(context.Background())
	for i, check := range c.ready.checks {
		v := 1.0
		if err != nil || errs[i] != nil {
			v = 0
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, check.Name)
	}
}
