package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/kelseyhightower/envconfig"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"golang.org/x/term"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/worker"
)

// The demo's tenants, limits and deferral horizon. Windows are short so that
// deferred events come back within the run; the horizon is short so that the
// flood tenant also shows rejections.
var demoTenants = []demoTenant{
	{Name: "flood", Rule: "20/1s", Rate: 100, About: "100/s, far over its limit"},
	{Name: "steady", Rule: "50/1s", Rate: 20, About: "20/s, under its limit"},
	{Name: "bursty", Rule: "30/5s", Burst: 60, Every: 10 * time.Second, About: "bursts of 60 every 10s"},
	{Name: "bulk", Rule: "4KiB/1s", Rate: 30, Size: 256, About: "30/s of 256 bytes, over its 4KiB/1s"},
}

const (
	demoHorizon    = 10 * time.Second
	demoPartitions = 3
)

// demoLimits is the LIMITS value of the demo tenants.
func demoLimits() string {
	parts := make([]string, len(demoTenants))
	for i, t := range demoTenants {
		parts[i] = t.Name + "=" + t.Rule
	}
	return strings.Join(parts, ";")
}

// demoConn holds the connection variables the demo honours when it runs
// against real servers. Field names match Config's, so the variables are the
// same GATEKEEPER_* ones. An empty KafkaBrokers or RedisAddrs means the
// embedded server.
type demoConn struct {
	KafkaBrokers       []string `split_words:"true"`
	KafkaTLS           bool     `split_words:"true"`
	KafkaTLSCaFile     string   `split_words:"true"`
	KafkaTLSCertFile   string   `split_words:"true"`
	KafkaTLSKeyFile    string   `split_words:"true"`
	KafkaSASLMechanism string   `split_words:"true"`
	KafkaSASLUsername  string   `split_words:"true"`
	KafkaSASLPassword  string   `split_words:"true"`
	RedisAddrs         []string `split_words:"true"`
	RedisUsername      string   `split_words:"true"`
	RedisPassword      string   `split_words:"true"`
	RedisTLS           bool     `split_words:"true"`
	RedisTLSCaFile     string   `split_words:"true"`
	RedisTLSCertFile   string   `split_words:"true"`
	RedisTLSKeyFile    string   `split_words:"true"`
}

// demoOptions configure runDemo. It is a plain value.
type demoOptions struct {
	// Duration is how long traffic is produced (the run ends earlier when
	// ctx is done).
	Duration time.Duration
	// Out receives the view and the summary; Live redraws the view in
	// place with ANSI escapes about once a Refresh, otherwise one plain line
	// is printed about every PlainEvery.
	Out                 io.Writer
	Live                bool
	Refresh, PlainEvery time.Duration
	// Log receives the pipeline's warnings and errors.
	Log io.Writer
	// Conn names real servers; its empty address lists mean embedded ones.
	Conn demoConn
	// Drain bounds the wait, after traffic stops, for the gate to route
	// every offered event.
	Drain time.Duration
	// Capacity is GATEKEEPER_CAPACITY for the run: a budget shared by the
	// tenants (empty: none).
	Capacity string
}

// demoCmd runs `gatekeeper-demo [-duration 30s] [-plain]` with args (without
// the program name) and returns the exit status: 0 ok, 1 failure, 2 bad usage.
func demoCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gatekeeper-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	duration := fs.Duration("duration", 30*time.Second, "how long to produce traffic (Ctrl-C ends the run early)")
	capacity := fs.String("capacity", "50/1s", "a capacity shared fairly by the tenants, as GATEKEEPER_CAPACITY (empty: none)")
	plain := fs.Bool("plain", false, "plain output: one line about every 5s instead of a live view (default when stdout is not a terminal)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: gatekeeper-demo [-duration 30s] [-plain]\n\n"+
			"Runs the gate and the retry path over synthetic traffic of a few tenants, on an embedded\n"+
			"Kafka-protocol broker (kfake) and an embedded Redis (miniredis), or on the servers named by\n"+
			"GATEKEEPER_KAFKA_BROKERS and GATEKEEPER_REDIS_ADDRS when set. Flags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gatekeeper-demo: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *duration <= 0 {
		fmt.Fprintln(stderr, "gatekeeper-demo: -duration must be positive")
		return 2
	}
	var conn demoConn
	if err := envconfig.Process(worker.EnvPrefix, &conn); err != nil {
		fmt.Fprintln(stderr, worker.ProcessError(err))
		return 1
	}
	live := !*plain && worker.IsTerminal(stdout)
	logw := &logBuffer{}
	opts := demoOptions{
		Duration:   *duration,
		Out:        stdout,
		Live:       live,
		Refresh:    time.Second,
		PlainEvery: 5 * time.Second,
		Log:        logw,
		Conn:       conn,
		Drain:      20 * time.Second,
		Capacity:   *capacity,
	}
	if !live {
		// Plain output goes to logs (CI): warnings go there as they happen.
		opts.Log = stderr
	}
	sum, err := runDemo(ctx, opts)
	if live {
		logw.printTo(stderr)
	}
	if err != nil {
		fmt.Fprintf(stderr, "gatekeeper-demo: %s\n", worker.OneLine(err.Error()))
		return 1
	}
	if !sum.OK() {
		return 1
	}
	return 0
}

// logBuffer keeps log lines for printing after the live view ends. Safe for
// concurrent use.
type logBuffer struct {
	mu    sync.Mutex
	buf   strings.Builder
	lines int
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lines += strings.Count(string(p), "\n")
	return b.buf.Write(p)
}

// printTo writes what was logged, if anything, under a heading.
func (b *logBuffer) printTo(w io.Writer) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() == 0 {
		return
	}
	fmt.Fprintf(w, "\nwarnings and errors logged during the run (%d lines):\n%s", b.lines, b.buf.String())
}

// demoNames are the topics, group and key prefix of one run.
type demoNames struct {
	Source, Downstream, Retry, DLQ string
	Group, Prefix                  string
}

// outputs lists the topics the gatekeeper writes to.
func (n demoNames) outputs() []string {
	return []string{n.Downstream, n.Retry, n.Retry + ".1h", n.Retry + ".long", n.DLQ}
}

func newDemoNames(unique bool) demoNames {
	base, prefix := "demo", "gkdemo"
	if unique {
		b := make([]byte, 3)
		_, _ = rand.Read(b)
		id := time.Now().UTC().Format("20060102-150405") + "-" + hex.EncodeToString(b)
		base, prefix = "gatekeeper-demo-"+id, "gkdemo-"+id
	}
	return demoNames{
		Source:     base + ".events",
		Downstream: base + ".out",
		Retry:      base + ".out.retry",
		DLQ:        base + ".out.dlq",
		Group:      base,
		Prefix:     prefix,
	}
}

// demoConfig is the gatekeeper configuration of the demo: the values an
// operator would set, with short windows, a short horizon and short waits.
func demoConfig(conn demoConn, brokers, redisAddrs []string, n demoNames) *worker.Config {
	// Every other variable keeps its default (worker.DefaultConfig).
	cfg := worker.DefaultConfig()
	cfg.KafkaBrokers, cfg.GroupID = brokers, n.Group
	cfg.SourceTopics, cfg.DownstreamTopic, cfg.RetryTopic, cfg.DLQTopic = []string{n.Source}, n.Downstream, n.Retry, n.DLQ
	cfg.RedisAddrs, cfg.RedisKeyPrefix = redisAddrs, n.Prefix
	cfg.TenantFrom = "json:tenant"
	cfg.Limits = demoLimits()
	cfg.DeferHorizon = demoHorizon
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.LogLevel = "warn"
	cfg.BatchWait = 20 * time.Millisecond
	cfg.ShutdownGrace = 15 * time.Second
	cfg.KafkaSessionTimeout = 10 * time.Second
	cfg.Retention = 10 * time.Minute
	cfg.RedisUsername, cfg.RedisPassword = conn.RedisUsername, conn.RedisPassword
	cfg.RedisTLS, cfg.RedisTLSCaFile, cfg.RedisTLSCertFile, cfg.RedisTLSKeyFile = conn.RedisTLS, conn.RedisTLSCaFile, conn.RedisTLSCertFile, conn.RedisTLSKeyFile
	cfg.KafkaSASLMechanism, cfg.KafkaSASLUsername, cfg.KafkaSASLPassword = conn.KafkaSASLMechanism, conn.KafkaSASLUsername, conn.KafkaSASLPassword
	cfg.KafkaTLS, cfg.KafkaTLSCaFile, cfg.KafkaTLSCertFile, cfg.KafkaTLSKeyFile = conn.KafkaTLS, conn.KafkaTLSCaFile, conn.KafkaTLSCertFile, conn.KafkaTLSKeyFile
	return &cfg
}

// runDemo starts the servers (embedded unless opts.Conn names real ones),
// creates the topics, runs the real pipeline (gate and retry) over synthetic
// traffic for opts.Duration while showing the live view, then drains, stops
// the pipeline, reads every output topic to its end and prints the summary.
func runDemo(ctx context.Context, opts demoOptions) (*demoSummary, error) {
	opts = opts.withDefaults()
	say := func(format string, args ...any) { fmt.Fprintf(opts.Out, "gatekeeper-demo: "+format+"\n", args...) }

	srv, err := startDemoServers(opts.Conn)
	defer srv.close()
	if err != nil {
		return nil, err
	}
	env, err := newDemoEnv(opts, srv)
	if err != nil {
		return nil, err
	}
	say("%s", strings.Join(srv.where, "; "))
	if err := env.connect(opts.Log, srv.brokers); err != nil {
		return nil, err
	}
	cfg, names, admin := env.cfg, env.names, env.admin
	defer env.transport.CloseIdleConnections()

	if err := createDemoTopics(ctx, admin, names); err != nil {
		return nil, err
	}
	if env.realKafka {
		// The shutdown steps run on their own context: Ctrl-C ends the
		// traffic, not the drain, the summary and the clean-up.
		defer deleteDemoTopics(context.Background(), admin, names, env.log)
	}

	reg := prometheus.NewRegistry()
	lim, closeRedis, err := env.startLimiter(ctx, reg)
	defer closeRedis()
	if err != nil {
		return nil, err
	}

	tl := newTally(env.rules, time.UTC)
	stopReaders := env.startReaders(srv.brokers, tl)
	defer stopReaders()

	pipe := startDemoPipeline(env, reg, lim)
	defer pipe.cancel()

	say("waiting for the consumer groups to join")
	if err := waitGroupsJoined(ctx, admin, []string{cfg.GroupID, cfg.GroupID + ".retry"}, pipe.done); err != nil {
		perr := pipe.stop(cfg.ShutdownGrace)
		return nil, errors.Join(err, perr)
	}

	say("%s of traffic; limits %s, deferral horizon %v", opts.Duration, cfg.Limits, demoHorizon)
	if cfg.Capacity != "" {
		say("capacity %s shared by the tenants (weight 1 each): flood gets no more than the others while they send", cfg.Capacity)
	}
	return showDemo(ctx, opts, env, srv, tl, pipe, stopReaders)
}

// showDemo runs the traffic for opts.Duration under the live view, drains,
// stops the pipeline and summarises what the readers saw.
func showDemo(ctx context.Context, opts demoOptions, env *demoEnv, srv *demoServers, tl *tally,
	pipe *demoPipeline, stopReaders func()) (*demoSummary, error) {
	view := newDemoView(opts, env.names, srv.short)
	defer view.close()

	// Traffic, with the view refreshed until it ends.
	start := time.Now()
	tick := time.NewTicker(opts.redrawEvery())
	defer tick.Stop()
	prod := newDemoProducer(srv.brokers, env.transport, env.names.Source, tl)
	defer prod.Close()
	trafficErr, err := runDemoTraffic(ctx, prod, opts.Duration, tl, view, tick, pipe.done, start)
	if err != nil {
		return nil, err
	}
	trafficTime := time.Since(start)
	interrupted := ctx.Err() != nil

	if err := drainDemo(opts.Drain, interrupted, tl, view, tick, pipe.done, start); err != nil {
		return nil, err
	}
	view.draw(tl.snapshot(time.Now()), "stopping", time.Since(start))
	perr := pipe.stop(env.cfg.ShutdownGrace)
	sum := env.collect(tl, stopReaders)
	sum.Traffic = trafficTime
	sum.Interrupted = interrupted
	sum.Where = strings.Join(srv.where, "; ")
	view.finish(sum)
	if opts.Capacity != "" {
		fmt.Fprintln(opts.Out, demoCapacityLine(context.WithoutCancel(ctx), env.cfg))
	}
	if trafficErr != nil {
		return sum, fmt.Errorf("producer: %w", trafficErr)
	}
	if perr != nil {
		return sum, fmt.Errorf("pipeline: %w", perr)
	}
	return sum, nil
}

// withDefaults returns opts with a refresh of 1s, a plain line every 5s and
// a discarding log where they are not set.
func (opts demoOptions) withDefaults() demoOptions {
	if opts.Refresh <= 0 {
		opts.Refresh = time.Second
	}
	if opts.PlainEvery <= 0 {
		opts.PlainEvery = 5 * time.Second
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	return opts
}

// redrawEvery is how often the view is drawn: every Refresh when it is
// live, every PlainEvery otherwise.
func (opts demoOptions) redrawEvery() time.Duration {
	if opts.Live {
		return opts.Refresh
	}
	return opts.PlainEvery
}

// demoServers are the Kafka and Redis of a run: real ones named by the
// demoConn, or embedded ones started for the run.
type demoServers struct {
	brokers, redisAddrs []string
	// where says where the servers are, in full; short, for the live view.
	where, short []string
	closers      []func()
}

// startDemoServers starts an embedded Kafka-protocol broker and an embedded
// Redis where conn names none. Call close even when it fails: it stops what
// was started.
func startDemoServers(conn demoConn) (*demoServers, error) {
	s := &demoServers{brokers: conn.KafkaBrokers, redisAddrs: conn.RedisAddrs}
	if len(s.brokers) == 0 {
		kc, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return s, fmt.Errorf("start embedded kafka (kfake): %w", err)
		}
		s.closers = append(s.closers, kc.Close)
		s.brokers = kc.ListenAddrs()
		s.where = append(s.where, "embedded Kafka-protocol broker (kfake) at "+strings.Join(s.brokers, ","))
		s.short = append(s.short, "kfake "+strings.Join(s.brokers, ","))
	} else {
		s.where = append(s.where, "Kafka at "+strings.Join(s.brokers, ","))
		s.short = append(s.short, "Kafka "+strings.Join(s.brokers, ","))
	}
	if len(s.redisAddrs) == 0 {
		mr := miniredis.NewMiniRedis()
		if err := mr.StartAddr("127.0.0.1:0"); err != nil {
			return s, fmt.Errorf("start embedded redis (miniredis): %w", err)
		}
		s.closers = append(s.closers, mr.Close)
		// TTLs follow the wall clock, as on a real Redis.
		mr.ClockTTL(true)
		s.redisAddrs = []string{mr.Addr()}
		s.where = append(s.where, "embedded Redis (miniredis) at "+mr.Addr())
		s.short = append(s.short, "miniredis "+mr.Addr())
	} else {
		s.where = append(s.where, "Redis at "+strings.Join(s.redisAddrs, ","))
		s.short = append(s.short, "Redis "+strings.Join(s.redisAddrs, ","))
	}
	return s, nil
}

// close stops the embedded servers, the last started first.
func (s *demoServers) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
}

// demoEnv is the configuration of a run and the Kafka clients built from it.
type demoEnv struct {
	cfg       *worker.Config
	rules     *limit.Rules
	names     demoNames
	realKafka bool
	log       *slog.Logger
	dialer    *kafka.Dialer
	transport *kafka.Transport
	admin     *kafka.Client
}

// newDemoEnv builds and validates the demo's configuration for the servers;
// connect adds the clients.
func newDemoEnv(opts demoOptions, srv *demoServers) (*demoEnv, error) {
	realKafka := len(opts.Conn.KafkaBrokers) > 0
	names := newDemoNames(realKafka || len(opts.Conn.RedisAddrs) > 0)
	cfg := demoConfig(opts.Conn, srv.brokers, srv.redisAddrs, names)
	cfg.Capacity = opts.Capacity
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("demo configuration: %w", err)
	}
	rules, err := cfg.Rules()
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	return &demoEnv{cfg: cfg, rules: rules, names: names, realKafka: realKafka}, nil
}

// connect sets the logger (warnings and errors to w) and the Kafka dialer,
// transport and admin client of the run.
func (e *demoEnv) connect(w io.Writer, brokers []string) error {
	e.log = slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dialer, err := worker.NewKafkaDialer(e.cfg)
	if err != nil {
		return err
	}
	transport, err := worker.NewKafkaTransport(e.cfg)
	if err != nil {
		return err
	}
	e.dialer, e.transport = dialer, transport
	e.admin = &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: e.cfg.KafkaTimeout, Transport: transport}
	return nil
}

// startLimiter returns the limiter of the run, its metrics in reg, and a
// function that closes its Redis client; call it even when startLimiter
// fails.
func (e *demoEnv) startLimiter(ctx context.Context, reg prometheus.Registerer) (*limit.Limiter, func(), error) {
	rdb, err := worker.NewRedis(ctx, e.cfg)
	if err != nil {
		return nil, func() {}, fmt.Errorf("redis: %w", err)
	}
	closeRedis := func() { rdb.Close() }
	lopts, err := worker.LimiterOptions(e.cfg, reg)
	if err != nil {
		return nil, closeRedis, err
	}
	lim, err := limit.New(ctx, rdb, e.rules, lopts)
	if err != nil {
		return nil, closeRedis, fmt.Errorf("start limiter: %w", err)
	}
	return lim, closeRedis, nil
}

// collect reads every output topic to its end, so that the summary sees
// every write the pipeline made, stops the readers and returns the summary.
func (e *demoEnv) collect(tl *tally, stopReaders func()) *demoSummary {
	if err := catchUp(context.Background(), e.admin, e.names, tl, 30*time.Second); err != nil {
		e.log.Warn("output topics not read to their end", slog.String("err", err.Error()))
	}
	stopReaders()
	return tl.summary(time.Now())
}

// startReaders reads every partition of every output topic into tl until
// the returned function is called; that function waits for the readers to
// end and may be called more than once.
func (e *demoEnv) startReaders(brokers []string, tl *tally) (stop func()) {
	rctx, cancel := context.WithCancel(context.Background())
	var readers sync.WaitGroup
	for _, topic := range e.names.outputs() {
		for p := 0; p < demoPartitions; p++ {
			readers.Add(1)
			go func() {
				defer readers.Done()
				readDemoTopic(rctx, brokers, e.dialer, topic, p, tl, e.names, e.log)
			}()
		}
	}
	return func() {
		cancel()
		readers.Wait()
	}
}

// demoPipeline is the worker's pipeline running for the demo.
type demoPipeline struct {
	cancel context.CancelFunc
	done   chan error
}

// startDemoPipeline builds and runs worker's pipeline, the same wiring as
// gatekeeper run, on a context of its own.
func startDemoPipeline(env *demoEnv, reg *prometheus.Registry, lim *limit.Limiter) *demoPipeline {
	pctx, cancel := context.WithCancel(context.Background())
	p := &demoPipeline{cancel: cancel, done: make(chan error, 1)}
	go func() {
		pl, err := worker.Pipeline{
			Config:     env.cfg,
			Log:        env.log,
			Registerer: reg,
			Limiter:    lim,
			Dialer:     env.dialer,
			Transport:  env.transport,
		}.Build(pctx)
		if err == nil && pl != nil { // nil: stopped while waiting for Kafka
			err = pl.Run(pctx)
		}
		p.done <- err
	}()
	return p
}

// stop stops the pipeline and returns its error, or an error if it has not
// stopped within grace and 10s.
func (p *demoPipeline) stop(grace time.Duration) error {
	p.cancel()
	select {
	case err := <-p.done:
		return err
	case <-time.After(grace + 10*time.Second):
		return errors.New("pipeline did not stop within the shutdown grace")
	}
}

// newDemoView returns the view of a run, as wide as the terminal when Out is
// one and the view is live.
func newDemoView(opts demoOptions, names demoNames, short []string) *demoView {
	view := &demoView{
		out: opts.Out, live: opts.Live, tenants: demoTenants, where: strings.Join(short, ", "),
		names: names, horizon: demoHorizon, duration: opts.Duration,
	}
	if f, ok := opts.Out.(*os.File); ok && opts.Live {
		if w, _, err := term.GetSize(int(f.Fd())); err == nil {
			view.width = w
		}
	}
	if lb, ok := opts.Log.(*logBuffer); ok {
		view.logLines = func() int { lb.mu.Lock(); defer lb.mu.Unlock(); return lb.lines }
	}
	return view
}

// runDemoTraffic runs prod, the demo traffic, for duration (or until ctx is
// done), redrawing the view at every tick. It returns the producer's error,
// and an error if the pipeline stopped meanwhile.
func runDemoTraffic(ctx context.Context, prod *demoProducer, duration time.Duration, tl *tally,
	view *demoView, tick *time.Ticker, pipeDone <-chan error, start time.Time,
) (trafficErr, err error) {
	tctx, stopTraffic := context.WithTimeout(ctx, duration)
	defer stopTraffic()
	trafficDone := make(chan error, 1)
	go func() { trafficDone <- prod.Run(tctx, context.Background(), start, demoTenants) }()
	view.draw(tl.snapshot(time.Now()), "traffic", time.Since(start))
	for {
		select {
		case trafficErr = <-trafficDone:
			return trafficErr, nil
		case err := <-pipeDone:
			stopTraffic()
			<-trafficDone
			if err == nil {
				err = errors.New("stopped early")
			}
			return nil, fmt.Errorf("pipeline: %w", err)
		case <-tick.C:
			view.draw(tl.snapshot(time.Now()), "traffic", time.Since(start))
		}
	}
}

// drainDemo waits until the gate has routed every offered event and the
// retrier has released every deferred event due by the end of the traffic,
// for at most drain (5s after Ctrl-C), redrawing the view at every tick.
func drainDemo(drain time.Duration, interrupted bool, tl *tally, view *demoView, tick *time.Ticker,
	pipeDone <-chan error, start time.Time,
) error {
	trafficEnd := time.Now()
	if interrupted {
		drain = min(drain, 5*time.Second)
	}
	drainEnd := trafficEnd.Add(drain)
	for time.Now().Before(drainEnd) {
		if unrouted, overdue := tl.pending(trafficEnd); unrouted+overdue == 0 {
			return nil
		}
		select {
		case err := <-pipeDone:
			return fmt.Errorf("pipeline stopped while draining: %v", err)
		case <-tick.C:
			view.draw(tl.snapshot(time.Now()), "draining", time.Since(start))
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// createDemoTopics creates the source and output topics and waits until
// their metadata shows every partition with a leader.
func createDemoTopics(ctx context.Context, admin *kafka.Client, n demoNames) error {
	var topics []kafka.TopicConfig
	for _, t := range append([]string{n.Source}, n.outputs()...) {
		topics = append(topics, kafka.TopicConfig{Topic: t, NumPartitions: demoPartitions, ReplicationFactor: -1})
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res, err := admin.CreateTopics(cctx, &kafka.CreateTopicsRequest{Topics: topics})
	if err != nil {
		return fmt.Errorf("create topics: %w", err)
	}
	var names []string
	for _, tc := range topics {
		if err := res.Errors[tc.Topic]; err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", tc.Topic, err)
		}
		names = append(names, tc.Topic)
	}
	for {
		md, err := admin.Metadata(cctx, &kafka.MetadataRequest{Topics: names})
		if err == nil && topicsReady(md, names) {
			return nil
		}
		select {
		case <-cctx.Done():
			return fmt.Errorf("topics not ready: %w", errors.Join(err, cctx.Err()))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func topicsReady(md *kafka.MetadataResponse, names []string) bool {
	ready := 0
	for _, t := range md.Topics {
		if t.Error != nil || len(t.Partitions) != demoPartitions {
			return false
		}
		for _, p := range t.Partitions {
			if p.Error != nil || p.Leader.Host == "" {
				return false
			}
		}
		ready++
	}
	return ready == len(names)
}

// deleteDemoTopics removes a run's topics from a real cluster.
func deleteDemoTopics(ctx context.Context, admin *kafka.Client, n demoNames, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	topics := append([]string{n.Source}, n.outputs()...)
	res, err := admin.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: topics})
	if err == nil {
		for _, t := range topics {
			if err = res.Errors[t]; err != nil {
				break
			}
		}
	}
	if err != nil {
		log.Warn("delete demo topics", slog.String("err", err.Error()))
	}
}

// waitGroupsJoined waits until every group is stable with a member that has
// partitions assigned, so that traffic starts when the gatekeeper consumes.
func waitGroupsJoined(ctx context.Context, admin *kafka.Client, groups []string, pipeDone <-chan error) error {
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var last string
	for {
		res, err := admin.DescribeGroups(wctx, &kafka.DescribeGroupsRequest{GroupIDs: groups})
		if err == nil {
			ready := 0
			for _, g := range res.Groups {
				assigned := 0
				for _, m := range g.Members {
					for _, t := range m.MemberAssignments.Topics {
						assigned += len(t.Partitions)
					}
				}
				if g.Error == nil && g.GroupState == "Stable" && assigned > 0 {
					ready++
				} else {
					last = fmt.Sprintf("group %s: state %q, %d partitions assigned, error %v", g.GroupID, g.GroupState, assigned, g.Error)
				}
			}
			if ready == len(groups) {
				return nil
			}
		} else {
			last = err.Error()
		}
		select {
		case err := <-pipeDone:
			return fmt.Errorf("pipeline stopped before its groups joined: %v", err)
		case <-wctx.Done():
			return fmt.Errorf("consumer groups did not join: %s", last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// catchUp waits until the tally has read every output partition up to its
// end offset as of now.
func catchUp(ctx context.Context, admin *kafka.Client, n demoNames, tl *tally, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for _, t := range n.outputs() {
		for p := 0; p < demoPartitions; p++ {
			req.Topics[t] = append(req.Topics[t], kafka.LastOffsetOf(p))
		}
	}
	res, err := admin.ListOffsets(ctx, req)
	if err != nil {
		return fmt.Errorf("list offsets: %w", err)
	}
	for {
		behind := ""
		for t, ps := range res.Topics {
			for _, p := range ps {
				if p.Error != nil {
					return fmt.Errorf("list offsets of %s/%d: %w", t, p.Partition, p.Error)
				}
				if next := tl.next(t, p.Partition); next < p.LastOffset {
					behind = fmt.Sprintf("%s/%d at %d of %d", t, p.Partition, next, p.LastOffset)
				}
			}
		}
		if behind == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("still behind: %s", behind)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
