package limit

import (
	"context"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gatekeeper-dev/gatekeeper/internal/lua"
)

// skewedBatches returns batches of tenant names drawn from a Zipf law over
// `tenants` names: a few heavy tenants and a long tail.
func skewedBatches(n, size, tenants int) [][]string {
	r := rand.New(rand.NewSource(1))
	z := rand.NewZipf(r, 1.1, 1, uint64(tenants-1))
	out := make([][]string, n)
	for i := range out {
		out[i] = make([]string, size)
		for j := range out[i] {
			out[i][j] = fmt.Sprintf("tenant-%d", z.Uint64())
		}
	}
	return out
}

const benchBatch, benchTenants = 500, 1000

// BenchmarkAdmit compares, on the same Redis in the same run, deciding a
// 500-event batch (1,000 skewed tenants) with Limiter.Admit against one
// EVALSHA of the seed's ttl script per event. The "speedup" metric of the
// last sub-benchmark is the ratio of the two.
func BenchmarkAdmit(b *testing.B) {
	rdb := testRedis(b)
	ctx := context.Background()
	batches := skewedBatches(64, benchBatch, benchTenants)
	l := newTestLimiter(b, rdb, "*=1000/1m", Options{})

	var admitPerBatch, seedPerBatch float64
	b.Run("gatekeeper-batch", func(b *testing.B) {
		start := time.Now()
		for i := 0; i < b.N; i++ {
			if _, err := l.Admit(ctx, batches[i%len(batches)]); err != nil {
				b.Fatal(err)
			}
		}
		admitPerBatch = float64(time.Since(start)) / float64(b.N)
		b.ReportMetric(float64(benchBatch*b.N)/time.Since(start).Seconds(), "events/s")
	})
	b.Run("seed-per-event", func(b *testing.B) {
		seed := redis.NewScript(lua.TTLIncr)
		prefix := testPrefix(b)
		start := time.Now()
		for i := 0; i < b.N; i++ {
			for _, tn := range batches[i%len(batches)] {
				if err := seed.Run(ctx, rdb, []string{prefix + ":{" + tn + "}"}, 60).Err(); err != nil {
					b.Fatal(err)
				}
			}
		}
		seedPerBatch = float64(time.Since(start)) / float64(b.N)
		b.ReportMetric(float64(benchBatch*b.N)/time.Since(start).Seconds(), "events/s")
	})
	if admitPerBatch > 0 && seedPerBatch > 0 {
		b.Run("speedup", func(b *testing.B) {
			b.ReportMetric(seedPerBatch/admitPerBatch, "x")
		})
	}
}

// BenchmarkAdmitBytes compares, in the same run, the batches of
// BenchmarkAdmit under an event rule alone, two event rules, an event rule
// and a byte rule, and a byte rule alone (events of 100 to 2,000 bytes,
// about as many bytes a minute as events): each "ratio" metric is the
// events/s under a rule set over those under the event rule alone.
func BenchmarkAdmitBytes(b *testing.B) {
	rdb := testRedis(b)
	ctx := context.Background()
	batches := skewedBatches(64, benchBatch, benchTenants)
	r := rand.New(rand.NewSource(2))
	costs := make([][]Cost, len(batches))
	for i := range costs {
		costs[i] = make([]Cost, benchBatch)
		for j := range costs[i] {
			costs[i][j] = Cost{Bytes: 100 + r.Int63n(1900)}
		}
	}
	specs := []string{"*=1000/1m", "*=1000/1m,50000/1d", "*=1000/1m,1MiB/1m", "*=1MiB/1m"}
	perBatch := map[string]float64{}
	for _, spec := range specs {
		l := newTestLimiter(b, rdb, spec, Options{})
		b.Run(spec, func(b *testing.B) {
			start := time.Now()
			for i := 0; i < b.N; i++ {
				if _, err := l.AdmitCosts(ctx, batches[i%len(batches)], costs[i%len(costs)]); err != nil {
					b.Fatal(err)
				}
			}
			perBatch[spec] = float64(time.Since(start)) / float64(b.N)
			b.ReportMetric(float64(benchBatch*b.N)/time.Since(start).Seconds(), "events/s")
		})
	}
	for _, spec := range specs[1:] {
		if base, x := perBatch[specs[0]], perBatch[spec]; base > 0 && x > 0 {
			b.Run("ratio:"+spec, func(b *testing.B) { b.ReportMetric(base/x, "x") })
		}
	}
}

// BenchmarkAdmitHorizon measures one call for an aligned 10/1h rule as the
// deferral horizon grows: the call carries every hour boundary up to the
// horizon, so its cost grows with DEFER_HORIZON (the reason for its upper
// bound in the worker's configuration).
func BenchmarkAdmitHorizon(b *testing.B) {
	rdb := testRedis(b)
	ctx := context.Background()
	for _, h := range []time.Duration{24 * time.Hour, 7 * 24 * time.Hour, 31 * 24 * time.Hour, 92 * 24 * time.Hour, 366 * 24 * time.Hour, 100000 * time.Hour} {
		b.Run(h.String(), func(b *testing.B) {
			l := newTestLimiter(b, rdb, "*=10/1h", Options{Horizon: h})
			for i := 0; i < b.N; i++ {
				if _, err := l.Admit(ctx, repeat(fmt.Sprintf("t%d", i), 50)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAdmitFrom is the gatekeeper-batch case of BenchmarkAdmit with a
// Source, as the route layer calls it: the replay record is read and
// written once per batch. Low trails by one batch, as with pipelined commits.
func BenchmarkAdmitFrom(b *testing.B) {
	rdb := testRedis(b)
	ctx := context.Background()
	batches := skewedBatches(64, benchBatch, benchTenants)
	l := newTestLimiter(b, rdb, "*=1000/1m", Options{})
	start := time.Now()
	for i := 0; i < b.N; i++ {
		s := src(max(0, int64(i-1)*benchBatch), int64(i)*benchBatch)
		if _, err := l.AdmitFrom(ctx, s.Source, s.events(batches[i%len(batches)], nil)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(benchBatch*b.N)/time.Since(start).Seconds(), "events/s")
}

// BenchmarkAdmitWithin is the limiter's call as the bench's
// gatekeeper-within mode makes it (issue 23): ttl windows of an hour, a
// limit no tenant reaches, 500-event batches of 10,000 Zipf tenants with a
// Source. It measures the process's side of the call (grouping, keys,
// arguments, the client's encoding and decoding, the reply); run it with
// -benchmem, or under callgrind for instruction counts.
func BenchmarkAdmitWithin(b *testing.B) {
	rdb := testRedis(b)
	ctx := context.Background()
	batches := skewedBatches(64, benchBatch, 10000)
	l := newTestLimiter(b, rdb, "*=1000000/1h", Options{WindowKind: TTL})
	events := make([][]Event, len(batches))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s := src(max(0, int64(i-1)*benchBatch), int64(i)*benchBatch)
		k := i % len(batches)
		if events[k] == nil {
			events[k] = s.events(batches[k], nil)
		}
		evs := events[k]
		for j := range evs {
			evs[j].Offset = s.from + int64(j)
		}
		ds, err := l.AdmitFrom(ctx, s.Source, evs)
		if err != nil {
			b.Fatal(err)
		}
		if ds[0].Kind != Admit {
			b.Fatalf("decision %v, want Admit", ds[0])
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchBatch), "ns/event")
}

// BenchmarkAdmitLateClaims is the price of checking claims
// (LATE_TAKES_SLOTS=check or on, the default): the first retry tier's batch
// of 500 events back inside their slot (Event.InSlot, none of whose slots
// was taken) makes one AdmitLate call, where with off it makes none, and
// with on, when no take is due as late as their slots, one TakesUntil read
// instead (route.Retrier.Takes). Each is compared, in the same run, with an
// AdmitFrom call of a source batch of the same tenants: "ratio" is the
// claims call's events/s over the source batch's, "bound-ratio" the read's.
func BenchmarkAdmitLateClaims(b *testing.B) {
	rdb := testRedis(b)
	ctx := context.Background()
	batches := skewedBatches(64, benchBatch, benchTenants)
	l := newTestLimiter(b, rdb, "*=1000/1m", Options{})
	due := time.Now().Truncate(time.Minute)
	var rates [3]float64
	b.Run("source-batch", func(b *testing.B) {
		start := time.Now()
		for i := 0; i < b.N; i++ {
			s := src(max(0, int64(i-1)*benchBatch), int64(i)*benchBatch)
			if _, err := l.AdmitFrom(ctx, s.Source, s.events(batches[i%len(batches)], nil)); err != nil {
				b.Fatal(err)
			}
		}
		rates[0] = float64(benchBatch*b.N) / time.Since(start).Seconds()
		b.ReportMetric(rates[0], "events/s")
	})
	b.Run("claims", func(b *testing.B) {
		start := time.Now()
		for i := 0; i < b.N; i++ {
			s := src(max(0, int64(i-1)*benchBatch), int64(i)*benchBatch)
			s.Topic = "in.retry"
			evs := s.events(batches[i%len(batches)], nil)
			for j := range evs {
				evs[j].InSlot, evs[j].Due = true, due
			}
			ds, err := l.AdmitLate(ctx, s.Source, evs, true)
			if err != nil {
				b.Fatal(err)
			}
			if ds[0].Kind != Keep {
				b.Fatalf("claim decided %v, want Keep", ds[0].Kind)
			}
		}
		rates[1] = float64(benchBatch*b.N) / time.Since(start).Seconds()
		b.ReportMetric(rates[1], "events/s")
	})
	b.Run("bound", func(b *testing.B) {
		start := time.Now()
		for i := 0; i < b.N; i++ {
			if _, err := l.TakesUntil(ctx, time.Time{}); err != nil {
				b.Fatal(err)
			}
		}
		rates[2] = float64(benchBatch*b.N) / time.Since(start).Seconds()
		b.ReportMetric(rates[2], "events/s")
	})
	if rates[0] > 0 && rates[1] > 0 && rates[2] > 0 {
		b.Run("ratio", func(b *testing.B) { b.ReportMetric(rates[1]/rates[0], "x") })
		b.Run("bound-ratio", func(b *testing.B) { b.ReportMetric(rates[2]/rates[0], "x") })
	}
}
