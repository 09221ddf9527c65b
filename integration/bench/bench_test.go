package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

func TestParseCommandStats(t *testing.T) {
	info := "# Commandstats\r\n" +
		"cmdstat_evalsha:calls=12,usec=3400,usec_per_call=283.33,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_hincrby:calls=300,usec=150,usec_per_call=0.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=2,usec=40,usec_per_call=20.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_config|resetstat:calls=1,usec=9,usec_per_call=9.00,rejected_calls=0,failed_calls=0\r\n"
	calls, usec, err := parseCommandStats(info)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := calls.total(), int64(312); got != want {
		t.Errorf("total calls: got %d, want %d (the driver's own info and config|resetstat left out)", got, want)
	}
	if got, want := calls["evalsha"], int64(12); got != want {
		t.Errorf("evalsha calls: got %d, want %d", got, want)
	}
	if got, want := usec.busy(), int64(3400); got != want {
		t.Errorf("busy usec: got %d, want %d (the script's time, which covers its commands)", got, want)
	}
	if got, want := strings.Join(calls.top(2), " "), "hincrby=300 evalsha=12"; got != want {
		t.Errorf("top: got %q, want %q", got, want)
	}
	plain, plainUsec, err := parseCommandStats("cmdstat_get:calls=5,usec=10\ncmdstat_set:calls=5,usec=20\n")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := plainUsec.busy(), int64(30); got != want || plain.total() != 10 {
		t.Errorf("without scripts: got busy %d calls %d, want %d and 10", got, plain.total(), want)
	}
}

func TestSolveLimit(t *testing.T) {
	for _, tc := range []struct {
		counts   []int
		fraction float64
		want     int
	}{
		{[]int{10, 10, 10}, 0, 10},
		{[]int{100, 10, 10}, 0.5, 40}, // 60 of 120 over 40
		{[]int{5, 5}, 0.99, 1},
	} {
		if got := solveLimit(tc.counts, tc.fraction); got != tc.want {
			t.Errorf("solveLimit(%v, %v): got %d, want %d", tc.counts, tc.fraction, got, tc.want)
		}
	}
}

func TestWorkloadIsDeterministicAndSkewed(t *testing.T) {
	w := workload{Events: 20000, Tenants: 1000, Skew: 1.1, EventSize: 200, Partitions: 6, Seed: 1}
	a, b := w.ranks(), w.ranks()
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("ranks differ at %d: got %d and %d, want the same data set twice", i, a[i], b[i])
		}
	}
	c := counts(a, w.Tenants)
	if c[0] < 10*c[100] {
		t.Errorf("rank 0 has %d events, rank 100 %d: want a heavy head (at least 10x)", c[0], c[100])
	}
	limit := solveLimit(c, 1.0/3)
	if got := float64(overLimit(c, limit)) / float64(w.Events); got < 0.30 || got > 0.34 {
		t.Errorf("share over limit %d: got %.3f, want about 1/3", limit, got)
	}
	if w.name() != w.name() || w.name() == (workload{Events: 20000, Tenants: 1000, Skew: 1.1, EventSize: 200, Partitions: 6, Seed: 2}).name() {
		t.Errorf("topic name %q: want it stable and different for another seed", w.name())
	}
}

func TestEventValueSize(t *testing.T) {
	for _, size := range []int{120, 200, 1000} {
		v := eventValue("t-12345", 987654, time.UnixMilli(1700000000000), size)
		if len(v) != size {
			t.Errorf("size %d: got %d bytes: %s", size, len(v), v)
		}
		if !strings.HasPrefix(string(v), `{"tenant":"t-12345"`) || !strings.HasSuffix(string(v), `"}`) {
			t.Errorf("size %d: got %s, want a JSON object with the tenant", size, v)
		}
	}
}

func TestPercentile(t *testing.T) {
	v := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range []struct{ p, want float64 }{{0.5, 5}, {0.99, 10}, {0.1, 1}} {
		if got := percentile(v, tc.p); got != tc.want {
			t.Errorf("p%v: got %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := percentile(nil, 0.5); got != 0 {
		t.Errorf("empty: got %v, want 0", got)
	}
}

func TestRuleUnit(t *testing.T) {
	for d, want := range map[time.Duration]string{time.Hour: "1h", 48 * time.Hour: "2d", 90 * time.Second: "90s", 15 * time.Minute: "15m"} {
		if got := ruleUnit(d); got != want {
			t.Errorf("ruleUnit(%v): got %q, want %q", d, got, want)
		}
	}
}

func TestReportMarkdownAndChart(t *testing.T) {
	r := report{Machine: machine{CPUs: 2, CPUModel: "cpu", MemoryGiB: "24", Redis: "7.0"}, Started: time.Unix(0, 0).UTC()}
	r.Main = scenario{Workload: workload{Events: 1000, Tenants: 10, Skew: 1.1, EventSize: 200, Partitions: 6, Seed: 1},
		Limit: 100, Window: "ttl 1h", Batch: 500, LiveEvents: 10, LiveRate: 5}
	r.Main.Results = []result{
		{Mode: modePassthrough, Events: 1000, EventsPerSec: 100000},
		{Mode: modeGatekeeper, Events: 1000, EventsPerSec: 50000, RedisCalls: 500, EvalSHA: 2, LatencyN: 10, P50ms: 50, P99ms: 90},
	}
	r.fillRatios()
	if got := r.Main.Results[1].Ratio; got != 0.5 {
		t.Errorf("ratio: got %v, want 0.5", got)
	}
	md := r.markdown()
	for _, want := range []string{"| gatekeeper | 50.0k | 0.50 | 500 | 2.00 | 50 ms | 90 ms |", "chart.svg", "2 CPUs (cpu)"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	svg := r.mainChart()
	if !strings.HasPrefix(svg, "<svg") || !strings.Contains(svg, "gatekeeper") || strings.Count(svg, "<rect") != 3 {
		t.Errorf("chart: got %s, want an SVG with a background and two bars", svg)
	}
}

// procCPU reads this process's CPU time from /proc, and it grows while the
// process computes; a pid file that is missing, malformed or stale is refused.
func TestProcCPU(t *testing.T) {
	self := os.Getpid()
	before, err := procCPU(self)
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for i := 0; ; i++ {
		x += i * i
		if i%1000000 == 0 {
			now, err := procCPU(self)
			if err != nil {
				t.Fatal(err)
			}
			if now > before {
				break
			}
		}
	}
	_ = x
	dir := t.TempDir()
	for name, content := range map[string]string{"garbage": "x\n", "stale": "999999999\n"} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if pid, ok := pidFromFile(path); ok {
			t.Errorf("pid file %q: got pid %d, want refused", content, pid)
		}
	}
	if _, ok := pidFromFile(filepath.Join(dir, "missing")); ok {
		t.Error("missing pid file: got a pid, want refused")
	}
	path := filepath.Join(dir, "self")
	if err := os.WriteFile(path, []byte(strconv.Itoa(self)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if pid, ok := pidFromFile(path); !ok || pid != self {
		t.Errorf("own pid file: got %d %v, want %d", pid, ok, self)
	}
}

// A mode is reported by its median round, with every round kept, the
// latency of the round that measured it and the highest peak RSS; the
// rounds table gives each round's ratio to that round's passthrough.
func TestMedianRound(t *testing.T) {
	pass := []result{
		{Mode: modePassthrough, EventsPerSec: 300, PeakRSSMB: 20, LatencyN: 10, P50ms: 5},
		{Mode: modePassthrough, EventsPerSec: 100, PeakRSSMB: 30},
		{Mode: modePassthrough, EventsPerSec: 200, PeakRSSMB: 25},
	}
	gk := []result{
		{Mode: modeGatekeeper, EventsPerSec: 150},
		{Mode: modeGatekeeper, EventsPerSec: 60},
		{Mode: modeGatekeeper, EventsPerSec: 90},
	}
	m := median(pass)
	if m.EventsPerSec != 200 || m.PeakRSSMB != 30 || m.LatencyN != 10 || m.P50ms != 5 {
		t.Errorf("median: got %v events/s, %v MB, latency %d events p50 %v; want 200, 30, 10, 5", m.EventsPerSec, m.PeakRSSMB, m.LatencyN, m.P50ms)
	}
	if got := fmt.Sprint(m.RoundEventsPerSec); got != "[300 100 200]" {
		t.Errorf("rounds: got %s, want [300 100 200]", got)
	}
	if m := median(pass[:2]); m.EventsPerSec != 100 {
		t.Errorf("median of two: got %v, want the lower, 100", m.EventsPerSec)
	}
	r := report{Main: scenario{Results: []result{median(pass), median(gk)}}}
	table := r.roundsTable()
	if !strings.Contains(table, "| gatekeeper | 150 | 60 | 90 | 0.50, 0.60, 0.45 |") {
		t.Errorf("rounds table lacks the gatekeeper row with per-round ratios:\n%s", table)
	}
	one := report{Main: scenario{Results: []result{median(pass[:1])}}}
	if got := one.roundsTable(); got != "" {
		t.Errorf("one round: got a rounds table %q, want none", got)
	}
}

// The CPU account is per million events, each mode against passthrough, and
// a mode that deferred events is set against the floor of the retry path
// (passthrough's cost once more for each deferred event), the gate's own
// share taken from gatekeeper-within.
func TestCPUAccountAndFloor(t *testing.T) {
	r := report{Main: scenario{Results: []result{
		{Mode: modePassthrough, Events: 500000, DrainCPU: 1.5, KafkaCPU: 1.0, RedisCPU: 0, PeakRSSMB: 30, Forwarded: 500000},
		{Mode: modeGatekeeperIn, Events: 500000, DrainCPU: 2.0, KafkaCPU: 1.25, RedisCPU: 0.5, PeakRSSMB: 45, Forwarded: 500000},
		{Mode: modeGatekeeper, Events: 500000, DrainCPU: 3.0, KafkaCPU: 2.0, RedisCPU: 0.75, PeakRSSMB: 60, Forwarded: 250000, Diverted: 250000},
		{Mode: modeSeedNaive, Events: 500000, DrainCPU: 10, KafkaCPU: -1, RedisCPU: 5},
	}}}
	table := r.cpuTable()
	for _, want := range []string{
		"| passthrough | 0.0 s | 3.00 s | 2.00 s | 0.00 s | 5.00 s | 1.00 | 1.00 | 0.0 s | 1.00 |",
		"| gatekeeper-within | 0.0 s | 4.00 s | 2.50 s | 1.00 s | 7.50 s | 1.33 | 1.50 | 0.0 s | 1.50 |",
		"| gatekeeper | 0.0 s | 6.00 s | 4.00 s | 1.50 s | 11.50 s | 2.00 | 2.30 | 0.0 s | 2.00 |",
		"| seed-naive | 0.0 s | 20.00 s | – | 10.00 s | – | 6.67 | – |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("CPU table lacks %q:\n%s", want, table)
		}
	}
	// Floor: 5.00 × 1.5 = 7.50 (process 4.50, broker 3.00, Redis 0); above it
	// process +1.50, broker +1.00, Redis +1.50; the gate on admitted traffic
	// 2.50, the rest 4.00 - 2.50 = 1.50.
	notes := r.floorNotes()
	for _, want := range []string{
		"gatekeeper: 11.50 s per million events against a floor of 7.50 s (1.53x)",
		"passthrough's 5.00 s once for every event and once more for the 50.0% deferred",
		"process +1.50 s, broker +1.00 s, Redis +1.50 s",
		"gatekeeper-within above passthrough) is 2.50 s (process +1.00, broker +0.50, Redis +1.00); the rest, 1.50 s,",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("floor notes lack %q:\n%s", want, notes)
		}
	}
	if strings.Contains(notes, "gatekeeper-within:") || strings.Contains(notes, "seed-naive") {
		t.Errorf("floor notes name a mode that deferred nothing or is not the binary:\n%s", notes)
	}
}

// gate-local's admitter admits every event of a batch, one decision each.
func TestAdmitAll(t *testing.T) {
	events := []limit.Event{{Tenant: "a"}, {Tenant: "b"}, {Tenant: "a"}}
	ds, err := admitAll{}.AdmitFrom(context.Background(), limit.Source{}, events)
	if err != nil || len(ds) != len(events) {
		t.Fatalf("got %d decisions, %v; want %d, nil", len(ds), err, len(events))
	}
	for i, d := range ds {
		if d.Kind != limit.Admit {
			t.Errorf("event %d: got %v, want admit", i, d.Kind)
		}
	}
}

// The side-by-side modes' tables: pace-cpu compares the gates, capacity-cpu
// each gate with its own Redis too.
func TestSideBySideTables(t *testing.T) {
	r := report{SideBySide: []sideCPUResult{
		{Mode: modePaceCPU, Rate: 1000, Events: 60000, CPU: [2]float64{6, 6.3}, Load: "1.0"},
		{Mode: modeCapacityCPU, Rate: 1000, Events: 60000, CPU: [2]float64{6, 6.6}, Redis: [2]float64{1.2, 3}, Load: "2.0"},
	}}
	md := r.sideBySideTables()
	for _, want := range []string{
		"| 1000 | 60000 | 100.00 s | 105.00 s | 1.050 | 1.0 |",
		"| 1000 | 60000 | 100.00 / 20.00 / 120.00 s | 110.00 / 50.00 / 160.00 s | 1.100 | 1.333 | 2.0 |",
		"## Pacing by the downstream", "## A shared capacity",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("tables lack %q:\n%s", want, md)
		}
	}
}
