package override

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
	"github.com/gatekeeper-dev/gatekeeper/internal/top"
)

// BenchmarkAdmitterOverrides decides batches of 500 events of 10,000
// Zipf-skewed tenants through the live Admitter as a replica does (the
// Limiter with a source partition, the report, the top view's tally), with
// no override ("plain") and with 100,000 overrides ("overrides": every
// tenant of the batches among them, each with the "*" rule, so the
// decisions and the Redis work are the same). Meant for counting
// instructions, repeatable on a loaded machine:
//
//	go test -c -o /tmp/ov.test ./internal/override/
//	valgrind --tool=callgrind /tmp/ov.test -test.run '^$' -test.bench 'AdmitterOverrides/plain' -test.benchtime 400x
//
// and the same with 100x: the difference over 300 batches is the cost of a
// batch, setup left out (see the README's "What 100,000 overrides cost").
func BenchmarkAdmitterOverrides(b *testing.B) {
	for _, n := range []int{0, 100000} {
		name := "plain"
		if n > 0 {
			name = "overrides"
		}
		b.Run(name, func(b *testing.B) { benchAdmitter(b, n) })
	}
}

func benchAdmitter(b *testing.B, overrides int) {
	rdb, _ := testenv.Redis(b)
	ctx := context.Background()
	rules, err := limit.ParseRules("*=100000000/1h")
	if err != nil {
		b.Fatal(err)
	}
	prefix := fmt.Sprintf("gkbench:%d:%s", time.Now().UnixNano(), b.Name())
	lim, err := limit.New(ctx, rdb, rules, limit.Options{Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	if overrides > 0 {
		rule, err := limit.ParseRuleList([]string{"100000000/1h"})
		if err != nil {
			b.Fatal(err)
		}
		over := make(map[string]limit.Overlay, overrides)
		for i := range overrides {
			over[fmt.Sprintf("t-%d", i)] = limit.Overlay{Rules: rule, Version: int64(i + 1)}
		}
		if err := lim.SetRules(rules.WithOverlays(over, int64(overrides))); err != nil {
			b.Fatal(err)
		}
	}
	a, err := NewAdmitter(lim, nil, top.NewTracker(time.Minute, 0, nil), slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		b.Fatal(err)
	}
	// 64 batches of 500 events, tenants Zipf-skewed over 10,000.
	z := rand.NewZipf(rand.New(rand.NewPCG(3, 4)), 1.1, 1, 9999)
	batches := make([][]limit.Event, 64)
	for i := range batches {
		batches[i] = make([]limit.Event, 500)
		for j := range batches[i] {
			batches[i][j] = limit.Event{Tenant: fmt.Sprintf("t-%d", z.Uint64())}
		}
	}
	src := limit.Source{Topic: prefix + ".src"}
	var offset int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		batch := batches[i%len(batches)]
		for j := range batch {
			batch[j].Offset = offset
			offset++
		}
		src.Low = offset - int64(len(batch))
		ds, err := a.AdmitFrom(ctx, src, batch)
		if err != nil {
			b.Fatal(err)
		}
		if (ds[0].Override != 0) != (overrides > 0) {
			b.Fatalf("decision under override version %d, with %d overrides", ds[0].Override, overrides)
		}
	}
	b.ReportMetric(float64(b.N*500)/b.Elapsed().Seconds(), "events/s")
}
