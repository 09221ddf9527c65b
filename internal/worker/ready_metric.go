package worker

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// readyCollector exports the readiness checks of /readyz as the gauge
// gatekeeper_ready{check}: 1 when the check passes, 0 when it fails. Every
// scrape runs the checks, at once and each bounded by timeout, as a GET
// /readyz does, so the series is as fresh as the scrape, also where no
// probe calls /readyz, and a replica paused by Redis trouble (check
// "consumption") can be told from one that is not. It is safe for
// concurrent use if the checks are, as readyCheck requires.
type readyCollector struct {
	checks  []readyCheck
	timeout time.Duration
	desc    *prometheus.Desc
}

// newReadyCollector returns the collector of checks; a timeout of zero or
// less means 2s, as for /readyz.
func newReadyCollector(checks []readyCheck, timeout time.Duration) *readyCollector {
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	return &readyCollector{
		checks:  checks,
		timeout: timeout,
		desc: prometheus.NewDesc("gatekeeper_ready",
			"Readiness checks of /readyz, run at each scrape: 1 passes, 0 fails (check: redis, kafka, limiter, groups, "+
				"consumption (0: paused by Redis trouble), writes, shutdown). The replica is ready when all are 1.",
			[]string{"check"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *readyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector: it runs the checks.
func (c *readyCollector) Collect(ch chan<- prometheus.Metric) {
	errs := runChecks(context.Background(), c.checks, c.timeout)
	for i, check := range c.checks {
		v := 1.0
		if errs[i] != nil {
			v = 0
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, check.Name)
	}
}
