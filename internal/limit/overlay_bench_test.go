package limit

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"
)

// BenchmarkAdmitOverrides decides the batches of BenchmarkAdmit (500
// events, 1,000 skewed tenants) with and without 100,000 live overrides
// (every tenant of the batches among them, each with the "*" rule, so the
// decisions are the same), alternating the two in rounds on the same
// Redis; "ratio" is the events/s with overrides over those without (the
// issue's bound: at least 0.95), and "cpu-ratio" the same for this
// process's CPU time per event (getrusage: steadier than wall time on a
// loaded machine; Redis does the same work in both).
func BenchmarkAdmitOverrides(b *testing.B) {
	rdb := testRedis(b)
	ctx := context.Background()
	batches := skewedBatches(64, benchBatch, benchTenants)
	plain := newTestLimiter(b, rdb, "*=100000000/1h", Options{})
	over := newTestLimiter(b, rdb, "*=100000000/1h", Options{})
	rule, err := ParseRuleList([]string{"100000000/1h"})
	if err != nil {
		b.Fatal(err)
	}
	overlays := make(map[string]Overlay, 100000)
	for i := range 100000 {
		// Each override has a rule list of its own, as the watcher builds them.
		overlays[fmt.Sprintf("tenant-%d", i)] = Overlay{Rules: append([]Rule(nil), rule...), Version: int64(i + 1)}
	}
	if err := over.SetRules(over.Rules().WithOverlays(overlays, 100000)); err != nil {
		b.Fatal(err)
	}
	var spent, cpu [2]time.Duration
	var events [2]int
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k, l := range []*Limiter{plain, over} {
			start, c0 := time.Now(), cpuTime()
			ds, err := l.Admit(ctx, batches[i%len(batches)])
			if err != nil {
				b.Fatal(err)
			}
			spent[k] += time.Since(start)
			cpu[k] += cpuTime() - c0
			events[k] += len(ds)
			if k == 1 && ds[0].Override == 0 {
				b.Fatal("decision without the override's version")
			}
		}
	}
	plainRate := float64(events[0]) / spent[0].Seconds()
	overRate := float64(events[1]) / spent[1].Seconds()
	b.ReportMetric(plainRate, "events/s-plain")
	b.ReportMetric(overRate, "events/s-overrides")
	b.ReportMetric(overRate/plainRate, "ratio")
	b.ReportMetric(float64(cpu[0])/float64(events[0]), "cpu-ns/event-plain")
	b.ReportMetric(float64(cpu[1])/float64(events[1]), "cpu-ns/event-overrides")
	b.ReportMetric((float64(cpu[0])/float64(events[0]))/(float64(cpu[1])/float64(events[1])), "cpu-ratio")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
