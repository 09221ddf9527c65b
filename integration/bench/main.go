// Command bench is Gatekeeper's end-to-end benchmark (`make bench`). Against
// a real Kafka and a real Redis it produces one data set into one source
// topic, then drains it, in one run, with each mode:
//
//   - passthrough: the same consumer group, Router and Kafka writer as
//     Gatekeeper, every event forwarded, no limiter: the ceiling;
//   - gate-local: passthrough's consumer, Router and writer behind the real
//     Gate, whose admitter admits every event at once without Redis: the
//     Gate's own work per event (the tenant, the decisions) and the origin
//     headers every admitted event carries (G8), without the limiter;
//   - seed-naive: one EVALSHA of the seed's ttl script per event, the count
//     against the limit deciding forward or divert to the retry topic;
//   - redis-rate: one go-redis/redis_rate Allow (GCRA) per event, then
//     forward or divert;
//   - gatekeeper-within: the real binary on the same data set with the
//     limit raised to the heaviest tenant's events, so that every event is
//     within its limit: what the gate costs traffic that it lets through;
//   - gatekeeper: the real binary (cmd/gatekeeper) as shipped, configured
//     only by its environment;
//   - gatekeeper-bytes: the same binary with a byte rule beside the event
//     rule on every tenant (the bytes of about as many events), so that
//     every event's cost is counted too;
//   - gatekeeper-overrides: the gatekeeper mode with -overrides live
//     overrides (100,000) written through the override store before it
//     starts, one per tenant t-0, t-1, ... (the data set's tenants first),
//     each with the rule of "*": the same decisions as gatekeeper, so that
//     the difference is the cost of carrying the overrides;
//   - adversarial: the limiter's worst cases (made-up tenants limited to 0,
//     daily quotas spent, events that fit only far ahead), in-process, one
//     script call per batch: Redis time per 1,000 events and the slowest
//     call (SLOWLOG); see adversarial.go.
//
// Modes 1-4 run in a child process of this command (it re-executes itself
// with -child MODE), Gatekeeper as its own binary, so that each mode's peak
// RSS is its own. Each mode consumes the source topic with its own consumer
// group and writes to its own output topics (LogAppendTime).
//
// Per mode it reports events per second (events divided by the time from the
// first to the last append to the output topics), the ratio to passthrough,
// Redis calls per 1,000 events from Redis's own INFO commandstats (which
// counts the commands scripts run too) and EVALSHA calls alone, p50/p99
// latency from source append to output append in a paced phase that follows
// the drain (see -live-rate), and peak RSS. A second scenario sweeps tenants
// and batch size. Results go to -out as results.md, results.json and SVG
// charts.
//
//	go run ./integration/bench -events 1000000 -tenants 10000
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// The modes. gatekeeper-lib is Gatekeeper's packages wired in-process (for
// profiling); it is not run unless asked for.
const (
	modePassthrough     = "passthrough"
	modeGateLocal       = "gate-local"
	modeSeedNaive       = "seed-naive"
	modeRedisRate       = "redis-rate"
	modeGatekeeper      = "gatekeeper"
	modeGatekeeperIn    = "gatekeeper-within"
	modeGatekeeperBytes = "gatekeeper-bytes"
	modeGatekeeperOver  = "gatekeeper-overrides"
	modeGatekeeperLib   = "gatekeeper-lib"
	// gatekeeper-capacity is gatekeeper with a shared capacity
	// (GATEKEEPER_CAPACITY) above the data set's rate: what keeping the
	// capacity and the tenants' shares costs, beside the same run without.
	modeGatekeeperCapacity = "gatekeeper-capacity"
)

var allModes = []string{modePassthrough, modeGateLocal, modeGatekeeperIn, modeSeedNaive, modeRedisRate, modeGatekeeper, modeGatekeeperBytes, modeGatekeeperCapacity, modeGatekeeperOver, modeGatekeeperLib, modeAdversarial, modePaceCPU, modeCapacityCPU}

// isBinary says whether mode runs the gatekeeper binary.
func isBinary(mode string) bool {
	return mode == modeGatekeeper || mode == modeGatekeeperIn || mode == modeGatekeeperBytes || mode == modeGatekeeperCapacity || mode == modeGatekeeperOver
}

// containsMode reports whether modes holds mode.
func containsMode(modes []string, mode string) bool { return slices.Contains(modes, mode) }

// drained says whether mode drains the main data set (the others are
// scenarios of their own: adversarial, pace-cpu, capacity-cpu).
func drained(mode string) bool {
	return mode != modeAdversarial && mode != modePaceCPU && mode != modeCapacityCPU
}

type options struct {
	Brokers      []string
	Redis        string
	Workload     workload
	Deferred     float64
	Batch        int
	Modes        []string
	Window       string
	WindowLen    time.Duration
	LiveEvents   int
	LiveRate     int
	SweepEvents  int
	SweepTenant  []int
	SweepBatch   []int
	Out          string
	Work         string
	KafkaPIDFile string
	Rounds       int
	GKBin        string
	Keep         bool
	KeepData     bool
	GKEnv        []string
	ModeTimeout  time.Duration
	StallTimeout time.Duration
	Profile      bool
	Overrides    int
	PaceCPURates []int
	PaceCPUFor   time.Duration
}

func main() {
	var child childConfig
	var o options
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	child.flags(fs)
	defKafka := envOr("GATEKEEPER_TEST_KAFKA", "127.0.0.1:9092")
	defRedis := envOr("GATEKEEPER_BENCH_REDIS", envOr("GATEKEEPER_TEST_REDIS", "127.0.0.1:6379"))
	kafkaAddrs := fs.String("kafka", defKafka, "Kafka bootstrap brokers, comma-separated (default $GATEKEEPER_TEST_KAFKA)")
	fs.StringVar(&o.Redis, "redis", defRedis, "Redis address; best a server of its own, as its command stats are reset per mode (default $GATEKEEPER_BENCH_REDIS, else $GATEKEEPER_TEST_REDIS)")
	fs.IntVar(&o.Workload.Events, "events", 1000000, "events in the data set")
	fs.IntVar(&o.Workload.Tenants, "tenants", 10000, "tenants (Zipf-skewed: a few heavy, a long tail)")
	fs.Float64Var(&o.Workload.Skew, "skew", 1.1, "Zipf exponent of the tenant distribution (> 1)")
	fs.IntVar(&o.Workload.EventSize, "event-size", 200, "bytes of each JSON event")
	fs.IntVar(&o.Workload.Partitions, "partitions", 6, "partitions of every topic")
	fs.Int64Var(&o.Workload.Seed, "seed", 1, "seed of the data set")
	fs.Float64Var(&o.Deferred, "deferred", 1.0/3, "share of events the per-tenant limit leaves over it (diverted)")
	fs.IntVar(&o.Batch, "batch", 500, "consumer batch size of every mode (GATEKEEPER_BATCH_SIZE)")
	fs.IntVar(&o.Rounds, "rounds", 1, "times every mode drains the main data set, the modes interleaved; each is reported by its median round")
	modes := fs.String("modes", "passthrough,gate-local,gatekeeper-within,seed-naive,redis-rate,gatekeeper,gatekeeper-bytes,gatekeeper-capacity,gatekeeper-overrides,adversarial,pace-cpu,capacity-cpu", "modes to run: "+strings.Join(allModes, ","))
	fs.IntVar(&o.Overrides, "overrides", 100000, "live overrides of the gatekeeper-overrides mode")
	paceRates := fs.String("pace-cpu-rates", "1000,10000", "events a second of the side-by-side modes (pace-cpu, capacity-cpu), one measurement each")
	fs.DurationVar(&o.PaceCPUFor, "pace-cpu-for", time.Minute, "how long the side-by-side modes (pace-cpu, capacity-cpu) produce at each rate")
	fs.StringVar(&o.Window, "window", "ttl", "Gatekeeper's GATEKEEPER_WINDOW: ttl (the seed's window, as seed-naive counts) or aligned")
	fs.DurationVar(&o.WindowLen, "window-len", time.Hour, "length of the limit's window (every mode)")
	fs.IntVar(&o.LiveEvents, "live-events", 10000, "events of the paced latency phase after each drain (0: none)")
	fs.IntVar(&o.LiveRate, "live-rate", 1000, "events per second of the paced latency phase")
	fs.IntVar(&o.SweepEvents, "sweep-events", 200000, "events per data set of the sweep scenario (0: no sweep)")
	sweepTenants := fs.String("sweep-tenants", "100,10000,1000000", "tenant counts of the sweep")
	sweepBatches := fs.String("sweep-batches", "100,500,2000", "batch sizes of the sweep")
	fs.StringVar(&o.Out, "out", "bench-results", "results folder")
	fs.StringVar(&o.Work, "work", filepath.Join(".local", "bench"), "folder for the modes' logs and profiles")
	fs.StringVar(&o.KafkaPIDFile, "kafka-pid-file", filepath.Join(envOr("KAFKA_DIR", filepath.Join(".local", "kafka")), "kafka.pid"),
		"pid file of a local Kafka broker, whose CPU is then reported per mode (deploy/local/kafka.sh writes it)")
	fs.StringVar(&o.GKBin, "gatekeeper-bin", "", "gatekeeper binary (default: go build ./cmd/gatekeeper into -work)")
	fs.BoolVar(&o.Keep, "keep", false, "keep the topics and Redis keys of each mode")
	gkEnv := fs.String("gatekeeper-env", "", "more variables for the gatekeeper mode, semicolon-separated, without the GATEKEEPER_ prefix (e.g. 'ROLES=gate;WINDOW=aligned')")
	fs.BoolVar(&o.KeepData, "keep-data", false, "keep the source topics of the data sets, for the next run to reuse")
	fs.DurationVar(&o.ModeTimeout, "mode-timeout", 20*time.Minute, "longest one mode may take to drain the data set")
	fs.DurationVar(&o.StallTimeout, "stall-timeout", 2*time.Minute, "longest a mode may go without writing anything (group join included)")
	fs.BoolVar(&o.Profile, "profile", false, "write a CPU profile of each in-process mode to -work, and of each gatekeeper binary mode (GATEKEEPER_PPROF) a CPU profile of its drain and its allocations")
	_ = fs.Parse(os.Args[1:])

	if child.Mode != "" {
		if err := runChild(child); err != nil {
			fmt.Fprintln(os.Stderr, "bench child:", err)
			os.Exit(1)
		}
		return
	}
	o.Brokers = strings.Split(*kafkaAddrs, ",")
	o.Modes = splitList(*modes)
	for _, kv := range strings.Split(*gkEnv, ";") {
		if kv = strings.TrimSpace(kv); kv != "" {
			o.GKEnv = append(o.GKEnv, kv)
		}
	}
	var err error
	if o.Rounds < 1 {
		fatal(fmt.Errorf("-rounds: %d is below 1", o.Rounds))
	}
	if o.PaceCPURates, err = intList(*paceRates); err != nil {
		fatal(fmt.Errorf("-pace-cpu-rates: %w", err))
	}
	if o.SweepTenant, err = intList(*sweepTenants); err != nil {
		fatal(fmt.Errorf("-sweep-tenants: %w", err))
	}
	if o.SweepBatch, err = intList(*sweepBatches); err != nil {
		fatal(fmt.Errorf("-sweep-batches: %w", err))
	}
	for _, m := range o.Modes {
		if !slices.Contains(allModes, m) {
			fatal(fmt.Errorf("-modes: unknown mode %q", m))
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// driver is one benchmark run.
type driver struct {
	o     options
	admin *kafkaAdmin
	rdb   *redis.Client
	runID string
	self  string
}

// run runs the benchmark: every mode on one data set, then the sweep.
func run(ctx context.Context, o options) error {
	d, closeDriver, err := newDriver(ctx, o)
	if err != nil {
		return err
	}
	defer closeDriver()
	if err := d.buildGatekeeper(ctx); err != nil {
		return err
	}
	m, err := describeMachine(ctx, d.rdb)
	if err != nil {
		return err
	}
	logf("machine: %s", m.String())
	rep := report{Machine: m, Started: time.Now().UTC()}
	if err := d.mainScenario(ctx, &rep); err != nil {
		return err
	}
	if err := d.adversarialScenario(ctx, &rep); err != nil {
		return err
	}
	if err := d.sweepScenario(ctx, &rep); err != nil {
		return err
	}
	if err := d.sideBySideScenario(ctx, &rep); err != nil {
		return err
	}
	rep.Finished = time.Now().UTC()
	if err := rep.write(o.Out); err != nil {
		return err
	}
	logf("results in %s", filepath.Join(o.Out, "results.md"))
	fmt.Println(rep.mainTable())
	return nil
}

// newDriver makes the work and output directories, connects to Redis and
// takes the benchmark lock on it; closeDriver releases both.
func newDriver(ctx context.Context, o options) (d *driver, closeDriver func(), err error) {
	if err := os.MkdirAll(o.Work, 0o755); err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	d = &driver{
		o:     o,
		admin: newKafkaAdmin(o.Brokers),
		rdb:   redis.NewClient(&redis.Options{Addr: o.Redis, ClientName: "gkbench-driver", PoolSize: 1}),
		runID: strconv.FormatInt(time.Now().Unix()%1000000, 36),
		self:  self,
	}
	if err := d.rdb.Ping(ctx).Err(); err != nil {
		d.rdb.Close()
		return nil, nil, fmt.Errorf("redis at %s: %w", o.Redis, err)
	}
	unlock, err := lock(ctx, d.rdb, fmt.Sprintf("run %s, pid %d", d.runID, os.Getpid()), 30*time.Minute, logf)
	if err != nil {
		d.rdb.Close()
		return nil, nil, err
	}
	return d, func() { unlock(); d.rdb.Close() }, nil
}

// buildGatekeeper builds ./cmd/gatekeeper into the work directory when a
// gatekeeper binary mode runs and no binary was given.
func (d *driver) buildGatekeeper(ctx context.Context) error {
	if !slices.ContainsFunc(d.o.Modes, isBinary) && !containsMode(d.o.Modes, modePaceCPU) && !containsMode(d.o.Modes, modeCapacityCPU) || d.o.GKBin != "" {
		return nil
	}
	bin, err := filepath.Abs(filepath.Join(d.o.Work, "gatekeeper"))
	if err != nil {
		return err
	}
	logf("building ./cmd/gatekeeper into %s", bin)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/gatekeeper")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build gatekeeper: %w", err)
	}
	d.o.GKBin = bin
	return nil
}

// mainScenario runs every mode on the same data set, o.Rounds times, and
// writes the report after each run with the median of each mode's rounds.
func (d *driver) mainScenario(ctx context.Context, rep *report) error {
	o := d.o
	wl := o.Workload
	if !slices.ContainsFunc(o.Modes, drained) {
		// No mode drains the data set: none is made.
		rep.Main = scenario{Workload: wl, Window: fmt.Sprintf("%s %s", o.Window, ruleUnit(o.WindowLen)), Batch: o.Batch}
		return nil
	}
	src, limit, err := d.dataset(ctx, wl)
	if err != nil {
		return err
	}
	within := slices.Max(counts(wl.ranks(), wl.Tenants))
	rep.Main = scenario{Workload: wl, Limit: limit, Window: fmt.Sprintf("%s %s", o.Window, ruleUnit(o.WindowLen)),
		Batch: o.Batch, LiveEvents: o.LiveEvents, LiveRate: o.LiveRate}
	rounds := map[string][]result{}
	for round := 1; round <= o.Rounds; round++ {
		for _, mode := range o.Modes {
			if !drained(mode) {
				continue // see adversarialScenario and sideBySideScenario
			}
			mr := modeRun{mode: mode, wl: wl, src: src, limit: limit, batch: o.Batch, live: o.LiveEvents, tag: mode}
			if mode == modeGatekeeperIn {
				mr.limit = within // every tenant's events fit
			}
			if o.Rounds > 1 {
				mr.tag = fmt.Sprintf("%s-r%d", mode, round)
				if round > 1 {
					mr.live = 0 // latency is measured once
				}
			}
			r, err := d.runMode(ctx, mr)
			if err != nil {
				return fmt.Errorf("%s: %w", mr.tag, err)
			}
			rounds[mode] = append(rounds[mode], r)
			rep.Main.Results = rep.Main.Results[:0]
			for _, m := range o.Modes {
				if len(rounds[m]) > 0 {
					rep.Main.Results = append(rep.Main.Results, median(rounds[m]))
				}
			}
			rep.fillRatios()
			if err := rep.write(o.Out); err != nil {
				return err
			}
		}
	}
	if !o.Keep && !o.KeepData {
		d.cleanupTopics(ctx, src)
	}
	return nil
}

// sweepScenario runs Gatekeeper over tenants x batch size, with passthrough
// per batch size as its ceiling, when o.SweepEvents is set.
func (d *driver) sweepScenario(ctx context.Context, rep *report) error {
	o := d.o
	if o.SweepEvents <= 0 {
		return nil
	}
	for _, tenants := range o.SweepTenant {
		wl := o.Workload
		wl.Events, wl.Tenants = o.SweepEvents, tenants
		src, limit, err := d.dataset(ctx, wl)
		if err != nil {
			return err
		}
		for _, b := range o.SweepBatch {
			modes := []string{modeGatekeeper}
			if tenants == o.SweepTenant[0] {
				// Passthrough does not look at tenants: once per batch size.
				modes = []string{modePassthrough, modeGatekeeper}
			}
			for _, mode := range modes {
				r, err := d.runMode(ctx, modeRun{mode: mode, wl: wl, src: src, limit: limit, batch: b,
					tag: fmt.Sprintf("sw-%s-t%d-b%d", mode, tenants, b)})
				if err != nil {
					return fmt.Errorf("sweep %s tenants=%d batch=%d: %w", mode, tenants, b, err)
				}
				rep.Sweep = append(rep.Sweep, r)
				rep.fillRatios()
				if err := rep.write(o.Out); err != nil {
					return err
				}
			}
		}
		if !o.Keep && !o.KeepData {
			d.cleanupTopics(ctx, src)
		}
	}
	return nil
}

// dataset makes sure the workload's source topic holds its events and
// returns the topic and the per-tenant limit that leaves about
// options.Deferred of the events over it.
func (d *driver) dataset(ctx context.Context, wl workload) (string, int, error) {
	ranks := wl.ranks()
	c := counts(ranks, wl.Tenants)
	limit := solveLimit(c, d.o.Deferred)
	topic := wl.name()
	heavy := 0
	for _, n := range c {
		if n > limit {
			heavy++
		}
	}
	logf("data set: %d events, %d tenants (heaviest %d events), limit %d per tenant per %s: %d tenants and %.1f%% of events over it",
		wl.Events, wl.Tenants, slices.Max(c), limit, ruleUnit(d.o.WindowLen), heavy, 100*float64(overLimit(c, limit))/float64(wl.Events))
	n, err := d.admin.total(ctx, wl.Partitions, topic)
	if err != nil {
		return "", 0, err
	}
	if n == int64(wl.Events) {
		logf("reusing source topic %s", topic)
		return topic, limit, nil
	}
	if n > 0 {
		if err := d.admin.deleteTopics(ctx, topic); err != nil {
			return "", 0, err
		}
	}
	if err := d.admin.createTopics(ctx, wl.Partitions, false, topic); err != nil {
		return "", 0, err
	}
	if err := produceWorkload(ctx, d.o.Brokers, topic, wl, ranks, logf); err != nil {
		return "", 0, err
	}
	return topic, limit, nil
}

func (d *driver) cleanupTopics(ctx context.Context, topics ...string) {
	if err := d.admin.deleteTopics(ctx, topics...); err != nil {
		logf("warning: %v", err)
	}
}

func kafkaCPU(s float64) string {
	if s < 0 {
		return "not measured (no local broker pid file)"
	}
	return fmt.Sprintf("%.1fs", s)
}

// vmHWM returns the peak resident set size of process pid in kilobytes.
func vmHWM(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, errors.New("no VmHWM in /proc status")
}

func sum(m map[int]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// latency produces the paced events into the mode's live topic, waits for
// all of them in the outputs, and returns each one's time from its producer
// timestamp to its append to an output topic, in milliseconds.
func (d *driver) latency(ctx context.Context, mr modeRun, live string, outputs []string, ends map[string]map[int]int64, exited <-chan error) ([]float64, error) {
	n := mr.live
	logf("[%s] paced phase: %d events at %d ev/s", mr.tag, n, d.o.LiveRate)
	if err := producePaced(ctx, d.o.Brokers, live, mr.wl, n, d.o.LiveRate); err != nil {
		return nil, err
	}
	want := int64(mr.wl.Events + n)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got, err := d.admin.total(ctx, mr.wl.Partitions, outputs...)
		if err != nil {
			return nil, err
		}
		if got >= want {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("paced phase: %d of %d events out after 2 minutes", got-int64(mr.wl.Events), n)
		}
		select {
		case err := <-exited:
			return nil, fmt.Errorf("exited during the paced phase: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	var lat []float64
	for _, t := range outputs {
		now, err := d.admin.ends(ctx, t, mr.wl.Partitions)
		if err != nil {
			return nil, err
		}
		from := map[int]int64{}
		for p := range now {
			from[p] = ends[t][p]
		}
		rs, err := d.admin.read(ctx, t, from, now)
		if err != nil {
			return nil, err
		}
		for _, r := range rs {
			if v, ok := r.Headers[liveHeader]; ok {
				us, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("%s/%d at %d: header %s: %w", t, r.Partition, r.Offset, liveHeader, err)
				}
				lat = append(lat, float64(r.Time.Sub(time.UnixMicro(us)).Microseconds())/1000)
			}
		}
	}
	sort.Float64s(lat)
	return lat, nil
}

// percentile returns the p-quantile of sorted values (nearest rank).
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// gatekeeperEnv is the environment of the gatekeeper child: this process's
// environment without any GATEKEEPER_ variable, plus vars and then extra
// ("KEY=value"), prefixed.
func gatekeeperEnv(vars map[string]string, extra []string) []string {
	for _, kv := range extra {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[strings.TrimPrefix(k, "GATEKEEPER_")] = v
		}
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GATEKEEPER_") {
			env = append(env, kv)
		}
	}
	keys := make([]string, 0, len(vars))
	for k := range vars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, "GATEKEEPER_"+k+"="+vars[k])
	}
	return env
}

// writeJSON writes v as indented JSON to path.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
