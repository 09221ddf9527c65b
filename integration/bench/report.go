package main

import (
	"bufio"
	"context"
	"fmt"
	"html"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// result is one mode over one data set.
type result struct {
	Mode    string `json:"mode"`
	Events  int    `json:"events"`
	Tenants int    `json:"tenants"`
	Batch   int    `json:"batch"`
	Limit   int    `json:"limit_per_tenant"`
	// Seconds is the time from the first to the last append to the output
	// topics while draining the data set; EventsPerSec is Events over it.
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_sec"`
	Ratio        float64 `json:"ratio_to_passthrough"`
	// WallSeconds is from starting the process to the data set drained
	// (process start and consumer group join included).
	WallSeconds  float64 `json:"wall_seconds"`
	Forwarded    int64   `json:"forwarded"`
	Diverted     int64   `json:"diverted"`
	DeadLettered int64   `json:"dead_lettered"`
	// RedisCalls counts every command Redis ran while the data set was
	// drained, those run inside scripts included (INFO commandstats).
	RedisCalls int64 `json:"redis_calls"`
	// RedisBusySeconds is the time Redis spent running the mode's commands
	// (scripts included once), from INFO commandstats.
	RedisBusySeconds float64  `json:"redis_busy_seconds"`
	EvalSHA          int64    `json:"evalsha_calls"`
	TopCommands      []string `json:"top_commands"`
	LatencyN         int      `json:"latency_events"`
	P50ms            float64  `json:"latency_p50_ms"`
	P99ms            float64  `json:"latency_p99_ms"`
	PeakRSSMB        float64  `json:"peak_rss_mb"`
	CPUSeconds       float64  `json:"cpu_seconds"`
	// DrainCPU, KafkaCPU and RedisCPU are the CPU seconds, from the mode's
	// start to the end of its drain, of its own process, of Kafka's broker
	// (-1: not measured, no local broker) and of the Redis server.
	DrainCPU float64 `json:"drain_cpu_seconds"`
	// RoundEventsPerSec is the events/s of every round of the main
	// scenario (the result is the median round).
	RoundEventsPerSec []float64 `json:"round_events_per_sec,omitempty"`
	KafkaCPU          float64   `json:"kafka_cpu_seconds"`
	RedisCPU          float64   `json:"redis_cpu_seconds"`
	Notes             []string  `json:"notes,omitempty"`
}

func (r result) per1k(n int64) float64 { return 1000 * float64(n) / float64(max(r.Events, 1)) }

type scenario struct {
	Workload   workload `json:"workload"`
	Limit      int      `json:"limit_per_tenant"`
	Window     string   `json:"window"`
	Batch      int      `json:"batch"`
	LiveEvents int      `json:"latency_events"`
	LiveRate   int      `json:"latency_rate"`
	Results    []result `json:"results"`
}

type machine struct {
	CPUs      int    `json:"cpus"`
	CPUModel  string `json:"cpu_model"`
	MemoryGiB string `json:"memory_gib"`
	Kernel    string `json:"kernel"`
	Go        string `json:"go"`
	Redis     string `json:"redis"`
}

func (m machine) String() string {
	return fmt.Sprintf("%d CPUs (%s), %s GiB memory, Linux %s, %s, Redis %s, Kafka and Redis on the same machine",
		m.CPUs, m.CPUModel, m.MemoryGiB, m.Kernel, m.Go, m.Redis)
}

func describeMachine(ctx context.Context, rdb *redis.Client) (machine, error) {
	m := machine{CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb float64
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "MemTotal:") {
				fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(l, "MemTotal:")), "%f", &kb)
			}
		}
		m.MemoryGiB = fmt.Sprintf("%.0f", kb/1024/1024)
	}
	if out, err := exec.CommandContext(ctx, "uname", "-r").Output(); err == nil {
		m.Kernel = strings.TrimSpace(string(out))
	}
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return m, fmt.Errorf("redis info: %w", err)
	}
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "redis_version:"); ok {
			m.Redis = v
		}
	}
	return m, nil
}

type report struct {
	Machine  machine   `json:"machine"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished,omitzero"`
	Main     scenario  `json:"main"`
	Sweep    []result  `json:"sweep,omitempty"`
	// Adversarial holds the adversarial mode's cases (see adversarial.go).
	Adversarial []advResult `json:"adversarial,omitempty"`
	// SideBySide holds the side-by-side modes' rates (pace-cpu and
	// capacity-cpu, see pacecpu.go).
	SideBySide []sideCPUResult `json:"side_by_side,omitempty"`
}

// fillRatios sets each result's ratio to the passthrough of its scenario
// (for the sweep: of the same batch size).
func (r *report) fillRatios() {
	var pass float64
	for _, x := range r.Main.Results {
		if x.Mode == modePassthrough {
			pass = x.EventsPerSec
		}
	}
	for i := range r.Main.Results {
		if pass > 0 {
			r.Main.Results[i].Ratio = r.Main.Results[i].EventsPerSec / pass
		}
	}
	passBy := map[int]float64{}
	for _, x := range r.Sweep {
		if x.Mode == modePassthrough {
			passBy[x.Batch] = x.EventsPerSec
		}
	}
	for i, x := range r.Sweep {
		if p := passBy[x.Batch]; p > 0 {
			r.Sweep[i].Ratio = x.EventsPerSec / p
		}
	}
}

func (r *report) write(dir string) error {
	if err := writeJSON(filepath.Join(dir, "results.json"), r); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "chart.svg"), []byte(r.mainChart()), 0o644); err != nil {
		return err
	}
	if len(r.Sweep) > 0 {
		if err := os.WriteFile(filepath.Join(dir, "sweep.svg"), []byte(r.sweepChart()), 0o644); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, "results.md"), []byte(r.markdown()), 0o644)
}

func fmtRate(v float64) string {
	switch {
	case v >= 100000:
		return fmt.Sprintf("%.0fk", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.1fk", v/1000)
	}
	return fmt.Sprintf("%.0f", v)
}

func fmtPer1k(v float64) string {
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func pct(n int64, of int) string { return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(max(of, 1))) }

// mainTable is the markdown table of scenario 1.
func (r *report) mainTable() string {
	var b strings.Builder
	b.WriteString("| mode | events/s | × passthrough | Redis calls / 1k events | EVALSHA / 1k events | p50 latency | p99 latency | peak RSS | deferred or rejected |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range r.Main.Results {
		lat50, lat99 := "–", "–"
		if x.LatencyN > 0 {
			lat50, lat99 = fmt.Sprintf("%.0f ms", x.P50ms), fmt.Sprintf("%.0f ms", x.P99ms)
		}
		fmt.Fprintf(&b, "| %s | %s | %.2f | %s | %s | %s | %s | %.0f MB | %s |\n",
			x.Mode, fmtRate(x.EventsPerSec), x.Ratio, fmtPer1k(x.per1k(x.RedisCalls)), fmtPer1k(x.per1k(x.EvalSHA)),
			lat50, lat99, x.PeakRSSMB, pct(x.Diverted+x.DeadLettered, x.Events))
	}
	return b.String()
}

func (r *report) sweepTable() string {
	var b strings.Builder
	b.WriteString("| mode | tenants | batch | events/s | × passthrough (same batch) | Redis calls / 1k events | EVALSHA / 1k events | deferred or rejected | peak RSS |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range r.Sweep {
		tenants := fmt.Sprint(x.Tenants)
		if x.Mode == modePassthrough {
			tenants = "–"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %.2f | %s | %s | %s | %.0f MB |\n",
			x.Mode, tenants, x.Batch, fmtRate(x.EventsPerSec), x.Ratio, fmtPer1k(x.per1k(x.RedisCalls)),
			fmtPer1k(x.per1k(x.EvalSHA)), pct(x.Diverted+x.DeadLettered, x.Events), x.PeakRSSMB)
	}
	return b.String()
}

func (r *report) markdown() string {
	var b strings.Builder
	s := r.Main
	b.WriteString("# Gatekeeper end-to-end benchmark\n\n")
	fmt.Fprintf(&b, "Run %s on %s.\n\n", r.Started.Format("2006-01-02 15:04 UTC"), r.Machine.String())
	fmt.Fprintf(&b, "Data set: %d events of ~%d bytes (JSON, keyed by tenant) in one source topic of %d partitions; "+
		"%d tenants, Zipf s=%g (a few heavy, a long tail); limit `*=%d/%s` (%s window), which leaves about %.0f%% of the events over it. "+
		"Consumer batch size %d. Every mode drains the same topic with its own consumer group.\n\n",
		s.Workload.Events, s.Workload.EventSize, s.Workload.Partitions, s.Workload.Tenants, s.Workload.Skew,
		s.Limit, strings.Fields(s.Window)[1], strings.Fields(s.Window)[0], 100*overShare(s), s.Batch)
	b.WriteString("![events per second](chart.svg)\n\n")
	b.WriteString(r.mainTable())
	b.WriteString("\n")
	if t := r.roundsTable(); t != "" {
		fmt.Fprintf(&b, "Each mode ran %d times, the modes interleaved; the table shows its median round (latency from the round that measured it, the highest peak RSS). Every round:\n\n", len(r.Main.Results[0].RoundEventsPerSec))
		b.WriteString(t)
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "- events/s: events ÷ time from the first to the last append to the mode's output topics while draining the backlog.\n")
	fmt.Fprintf(&b, "- Redis calls: Redis's own `INFO commandstats` (reset before each mode), every command including those run inside scripts, over the drain.\n")
	fmt.Fprintf(&b, "- latency: after the drain, %d events produced at %d events/s into a second source topic; producer timestamp to the output topic's append time (LogAppendTime), all outputs (downstream, retry, dead letter).\n", s.LiveEvents, s.LiveRate)
	fmt.Fprintf(&b, "- peak RSS: the mode's own process (VmHWM from /proc, read just before it is stopped); Gatekeeper is the real binary, the others a child process of the driver.\n\n")
	b.WriteString("Where the time goes, from the mode's start to the end of its drain, in CPU seconds per million events: the mode's own process (/proc), Kafka's broker (/proc, when it runs from deploy/local) and the Redis server (INFO cpu), and their sum; × passthrough is per event against passthrough's median round; Redis busy is the time Redis spent in the mode's commands (INFO commandstats; a script's time covers the commands it runs). All share the machine's cores.\n\n")
	b.WriteString(r.cpuTable())
	if f := r.floorNotes(); f != "" {
		b.WriteString("\n")
		b.WriteString(f)
	}
	if r := overridesRatio(s.Results); r > 0 {
		fmt.Fprintf(&b, "\ngatekeeper-overrides drains at %.3f times the events/s of gatekeeper (the cost of carrying the live overrides; the issue's bound is at least 0.95).\n", r)
	}
	b.WriteString("\nCommands per mode (drain):\n\n")
	for _, x := range s.Results {
		fmt.Fprintf(&b, "- %s: %d calls — %s\n", x.Mode, x.RedisCalls, strings.Join(x.TopCommands, ", "))
		for _, n := range x.Notes {
			fmt.Fprintf(&b, "  - note: %s\n", n)
		}
	}
	if t := r.adversarialTable(); t != "" {
		fmt.Fprintf(&b, "\n## Adversarial: the limiter's worst cases\n\n")
		fmt.Fprintf(&b, "In-process against the same Redis, one script call per batch of %d events, a fixed clock; Redis busy from `INFO commandstats`, the slowest call from `SLOWLOG` (every command logged during the mode), window reads are `HMGET` calls (G11: bounded by the batch, see \"Bounded work per call\" in README.md).\n\n", s.Batch)
		b.WriteString(t)
	}
	b.WriteString(r.sideBySideTables())
	if len(r.Sweep) > 0 {
		b.WriteString("\n## Sweep: tenants × batch size\n\n")
		x := r.Sweep[0]
		fmt.Fprintf(&b, "%d events per data set, same skew and event size; limit solved per data set for the same over-limit share; no latency phase.\n\n", x.Events)
		b.WriteString("![sweep](sweep.svg)\n\n")
		b.WriteString(r.sweepTable())
	}
	return b.String()
}

// perM is CPU seconds per million events of x.
func (x result) perM(sec float64) float64 { return sec * 1e6 / float64(max(x.Events, 1)) }

// cpuSum is x's process, broker and Redis CPU seconds; ok is false when
// the broker was not measured.
func (x result) cpuSum() (float64, bool) {
	return x.DrainCPU + x.KafkaCPU + x.RedisCPU, x.KafkaCPU >= 0
}

// passthrough returns the scenario's passthrough result, if it ran.
func (s scenario) passthrough() (result, bool) {
	for _, x := range s.Results {
		if x.Mode == modePassthrough {
			return x, true
		}
	}
	return result{}, false
}

// cpuTable is the CPU account of the main scenario, per million events.
func (r *report) cpuTable() string {
	s := r.Main
	pass, havePass := s.passthrough()
	ratio := func(v, p float64) string {
		if !havePass || p <= 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f", v/p)
	}
	var b strings.Builder
	b.WriteString("| mode | drain time | process CPU / 1M | Kafka broker CPU / 1M | Redis CPU / 1M | sum / 1M | process × passthrough | sum × passthrough | Redis busy | peak RSS × passthrough | forwarded | diverted | dead-lettered |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	passSum, _ := pass.cpuSum()
	for _, x := range s.Results {
		kafka, sum, sumRatio := "–", "–", "–"
		if total, ok := x.cpuSum(); ok {
			kafka = fmt.Sprintf("%.2f s", x.perM(x.KafkaCPU))
			sum = fmt.Sprintf("%.2f s", x.perM(total))
			sumRatio = ratio(x.perM(total), pass.perM(passSum))
		}
		fmt.Fprintf(&b, "| %s | %.1f s | %.2f s | %s | %.2f s | %s | %s | %s | %.1f s | %s | %d | %d | %d |\n", x.Mode, x.Seconds,
			x.perM(x.DrainCPU), kafka, x.perM(x.RedisCPU), sum, ratio(x.perM(x.DrainCPU), pass.perM(pass.DrainCPU)), sumRatio,
			x.RedisBusySeconds, ratio(x.PeakRSSMB, pass.PeakRSSMB), x.Forwarded, x.Diverted, x.DeadLettered)
	}
	return b.String()
}

// floorNotes states, for each gatekeeper binary mode that deferred events,
// its CPU per million events against the floor the retry path implies:
// passthrough's cost for every event, and once more for each deferred one
// (written to a retry tier and read back). What lies above the floor is
// split by process, broker and Redis, and against gatekeeper-within (the
// gate on events within their limits) when it ran.
func (r *report) floorNotes() string {
	s := r.Main
	pass, ok := s.passthrough()
	if !ok || pass.KafkaCPU < 0 {
		return ""
	}
	var within *result
	for i, x := range s.Results {
		if x.Mode == modeGatekeeperIn {
			within = &s.Results[i]
		}
	}
	var b strings.Builder
	for _, x := range s.Results {
		if !isBinary(x.Mode) || x.Diverted == 0 || x.KafkaCPU < 0 {
			continue
		}
		d := float64(x.Diverted) / float64(max(x.Events, 1))
		fp, fk := pass.perM(pass.DrainCPU)*(1+d), pass.perM(pass.KafkaCPU)*(1+d)
		fr := pass.perM(pass.RedisCPU) * (1 + d)
		total, _ := x.cpuSum()
		fmt.Fprintf(&b, "- %s: %.2f s per million events against a floor of %.2f s (%.2fx): passthrough's %.2f s once for every event and once more for the %.1f%% deferred (written to a retry tier and read back). Above the floor: process %+.2f s, broker %+.2f s, Redis %+.2f s.",
			x.Mode, x.perM(total), fp+fk+fr, x.perM(total)/(fp+fk+fr), pass.perM(pass.DrainCPU+pass.KafkaCPU+pass.RedisCPU), 100*d,
			x.perM(x.DrainCPU)-fp, x.perM(x.KafkaCPU)-fk, x.perM(x.RedisCPU)-fr)
		if within != nil && within.KafkaCPU >= 0 {
			wt, _ := within.cpuSum()
			pt, _ := pass.cpuSum()
			fmt.Fprintf(&b, " Of that, the gate itself on admitted traffic (%s above passthrough) is %.2f s (process %+.2f, broker %+.2f, Redis %+.2f); the rest, %.2f s, is the deferral path beyond one more write and read.",
				within.Mode, within.perM(wt)-pass.perM(pt), within.perM(within.DrainCPU)-pass.perM(pass.DrainCPU),
				within.perM(within.KafkaCPU)-pass.perM(pass.KafkaCPU), within.perM(within.RedisCPU)-pass.perM(pass.RedisCPU),
				x.perM(total)-(fp+fk+fr)-(within.perM(wt)-pass.perM(pt)))
		}
		b.WriteString("\n")
	}
	return b.String()
}

func overShare(s scenario) float64 {
	ranks := s.Workload.ranks()
	return float64(overLimit(counts(ranks, s.Workload.Tenants), s.Limit)) / float64(max(s.Workload.Events, 1))
}

// bar is one bar of a chart.
type bar struct {
	label, sub string
	value      float64
	accent     bool
}

// barChart draws horizontal bars as a standalone SVG.
func barChart(title, unit string, bars []bar) string {
	const w, left, right, rowH, top = 760, 230, 110, 34, 48
	h := top + rowH*len(bars) + 30
	maxV := 0.0
	for _, b := range bars {
		maxV = math.Max(maxV, b.value)
	}
	if maxV == 0 {
		maxV = 1
	}
	var s strings.Builder
	fmt.Fprintf(&s, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="13">`+"\n", w, h, w, h)
	fmt.Fprintf(&s, `<rect width="100%%" height="100%%" fill="#fff"/>`+"\n")
	fmt.Fprintf(&s, `<text x="%d" y="26" font-size="16" font-weight="bold">%s</text>`+"\n", 12, html.EscapeString(title))
	span := float64(w - left - right)
	for i, b := range bars {
		y := top + i*rowH
		bw := span * b.value / maxV
		color := "#8a9bb0"
		if b.accent {
			color = "#2f6fb3"
		}
		fmt.Fprintf(&s, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", left-8, y+17, html.EscapeString(b.label))
		if b.sub != "" {
			fmt.Fprintf(&s, `<text x="%d" y="%d" text-anchor="end" font-size="10" fill="#666">%s</text>`+"\n", left-8, y+29, html.EscapeString(b.sub))
		}
		fmt.Fprintf(&s, `<rect x="%d" y="%d" width="%.1f" height="22" fill="%s"/>`+"\n", left, y+4, math.Max(bw, 1), color)
		fmt.Fprintf(&s, `<text x="%.1f" y="%d">%s %s</text>`+"\n", float64(left)+math.Max(bw, 1)+6, y+20, fmtRate(b.value), unit)
	}
	fmt.Fprintf(&s, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", left, top, left, top+rowH*len(bars))
	s.WriteString("</svg>\n")
	return s.String()
}

func (r *report) mainChart() string {
	var bars []bar
	for _, x := range r.Main.Results {
		sub := fmt.Sprintf("%.2f× passthrough, %s Redis calls/1k", x.Ratio, fmtPer1k(x.per1k(x.RedisCalls)))
		bars = append(bars, bar{label: x.Mode, sub: sub, value: x.EventsPerSec, accent: isBinary(x.Mode)})
	}
	w := r.Main.Workload
	return barChart(fmt.Sprintf("End to end, %d events, %d tenants, batch %d: events per second", w.Events, w.Tenants, r.Main.Batch), "ev/s", bars)
}

func (r *report) sweepChart() string {
	var bars []bar
	for _, x := range r.Sweep {
		label := fmt.Sprintf("%s, batch %d", x.Mode, x.Batch)
		if x.Mode != modePassthrough {
			label = fmt.Sprintf("%d tenants, batch %d", x.Tenants, x.Batch)
		}
		sub := fmt.Sprintf("%s Redis calls/1k, %s EVALSHA/1k", fmtPer1k(x.per1k(x.RedisCalls)), fmtPer1k(x.per1k(x.EvalSHA)))
		bars = append(bars, bar{label: label, sub: sub, value: x.EventsPerSec, accent: isBinary(x.Mode)})
	}
	return barChart(fmt.Sprintf("Sweep, %d events per data set: events per second", r.Sweep[0].Events), "ev/s", bars)
}

// overridesRatio is the gatekeeper-overrides mode's events/s over the
// gatekeeper mode's, 0 unless both ran.
func overridesRatio(results []result) float64 {
	var gk, over float64
	for _, x := range results {
		switch x.Mode {
		case modeGatekeeper:
			gk = x.EventsPerSec
		case modeGatekeeperOver:
			over = x.EventsPerSec
		}
	}
	if gk == 0 {
		return 0
	}
	return over / gk
}
