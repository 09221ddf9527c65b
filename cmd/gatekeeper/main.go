// Command gatekeeper is a Kafka consumer-group worker that throttles events
// per tenant: it forwards events within their tenant's limits (counted in
// Redis) to a downstream topic, defers the others to a retry topic until the
// tenant has room, and dead-letters what cannot be admitted.
//
// Usage:
//
//	gatekeeper [run]          run the worker (the default)
//	gatekeeper usage TENANT   print a tenant's current usage as JSON
//	gatekeeper check-config   print the effective configuration (secrets masked)
//	gatekeeper demo           run the gate and retry path over synthetic traffic on
//	                          an embedded Kafka-protocol broker and Redis
//	gatekeeper version        print the version
//	gatekeeper help           print this help and the configuration variables
//
// It is configured only by GATEKEEPER_* environment variables; a bad value
// stops it with one line naming the variable and exit status 1.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	_ "time/tzdata" // TIMEZONE works in images without a zone database.

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/errgroup"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/route"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := realMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usageText = `gatekeeper throttles Kafka events per tenant, with counters in Redis.

Usage:
  gatekeeper [run]          run the worker (the default)
  gatekeeper usage TENANT   print a tenant's current usage as JSON (reads Redis)
  gatekeeper check-config   print the effective configuration, secrets masked;
                            exit 1 with one line naming a bad variable
  gatekeeper demo [-duration 30s] [-plain]
                            run the gate and retry path over synthetic traffic of a
                            few tenants on an embedded Kafka-protocol broker and Redis
                            (or GATEKEEPER_KAFKA_BROKERS and GATEKEEPER_REDIS_ADDRS)
  gatekeeper version        print the version
  gatekeeper help           print this help

Configuration is read from the environment only:
`

// realMain runs the subcommand in args (without the program name) and
// returns the exit status: 0 ok, 1 failure, 2 bad usage.
func realMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := "run"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	wantArgs := func(n int, what string) bool {
		if len(args) == n {
			return true
		}
		fmt.Fprintf(stderr, "gatekeeper %s: want %s\n", cmd, what)
		return false
	}
	switch cmd {
	case "run":
		if !wantArgs(0, "no arguments") {
			return 2
		}
		return runCmd(ctx, stderr)
	case "usage":
		if !wantArgs(1, "one argument: gatekeeper usage TENANT") {
			return 2
		}
		return usageCmd(ctx, args[0], stdout, stderr)
	case "check-config":
		if !wantArgs(0, "no arguments") {
			return 2
		}
		return checkConfigCmd(stdout, stderr)
	case "demo":
		return demoCmd(ctx, args, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, versionString())
		return 0
	case "help", "-h", "-help", "--help":
		printUsage(stdout)
		return 0
	case "config-table": // hidden: the README's configuration table
		t, err := configTable()
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		fmt.Fprint(stdout, t)
		return 0
	}
	fmt.Fprintf(stderr, "gatekeeper: unknown command %q\n\n", cmd)
	printUsage(stderr)
	return 2
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, usageText)
	_ = writeConfigList(w)
}

func versionString() string {
	s := fmt.Sprintf("gatekeeper %s (%s, %s/%s", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, kv := range bi.Settings {
			if kv.Key == "vcs.revision" && len(kv.Value) >= 12 {
				s += ", commit " + kv.Value[:12]
			}
		}
	}
	return s + ")"
}

// checkConfigCmd prints the effective configuration, masked, as
// GATEKEEPER_X=value lines.
func checkConfigCmd(stdout, stderr io.Writer) int {
	cfg, err := loadConfig()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	lines, err := cfg.Masked().Environ()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if unknown, _ := unknownVars(os.Environ()); len(unknown) > 0 {
		fmt.Fprintf(stderr, "warning: not Gatekeeper variables (typos?): %s\n", strings.Join(unknown, ", "))
	}
	for _, l := range lines {
		fmt.Fprintln(stdout, l)
	}
	return 0
}

// usageCmd prints a tenant's usage, read from Redis, as the usage API would.
func usageCmd(ctx context.Context, tenant string, stdout, stderr io.Writer) int {
	cfg, err := loadConfig()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if tenant == "" || len(tenant) > maxTenantBytes {
		fmt.Fprintf(stderr, "gatekeeper usage: tenant must be 1 to %d bytes\n", maxTenantBytes)
		return 2
	}
	rules, err := cfg.Rules()
	if err != nil {
		fmt.Fprintln(stderr, oneLine(err.Error()))
		return 1
	}
	rdb := newRedis(cfg)
	defer rdb.Close()
	opts, err := limiterOptions(cfg, nil)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	lim, err := limit.New(ctx, rdb, rules, opts)
	if err != nil {
		fmt.Fprintf(stderr, "gatekeeper usage: start limiter: %s\n", oneLine(err.Error()))
		return 1
	}
	usage, err := lim.Usage(ctx, tenant)
	if err != nil {
		fmt.Fprintf(stderr, "gatekeeper usage: %s\n", oneLine(err.Error()))
		return 1
	}
	if usage == nil {
		usage = []limit.Usage{}
	}
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(usageResponse{Tenant: tenant, Rules: usage}); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// limiterOptions turns the configuration into limiter options.
func limiterOptions(cfg *Config, reg prometheus.Registerer) (limit.Options, error) {
	loc, err := cfg.Location()
	if err != nil {
		return limit.Options{}, err
	}
	return limit.Options{
		Prefix:     cfg.RedisKeyPrefix,
		Window:     limit.WindowKind(cfg.Window),
		Location:   loc,
		Horizon:    cfg.DeferHorizon,
		Retention:  cfg.Retention,
		Timeout:    cfg.RedisTimeout,
		Registerer: reg,
	}, nil
}

// runCmd runs the worker until ctx is done (SIGINT, SIGTERM) or it fails.
// A bad configuration is one line on stderr and status 1.
func runCmd(ctx context.Context, stderr io.Writer) int {
	cfg, err := loadConfig()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	log, err := newLogger(stderr, cfg.LogLevel)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, log) }()
	var serr error
	select {
	case serr = <-done:
	case <-ctx.Done():
		log.Info("stopping", slog.String("grace", cfg.ShutdownGrace.String()))
		select {
		case serr = <-done:
		case <-time.After(cfg.ShutdownGrace):
			log.Error("shutdown grace exceeded, exiting with work unfinished", slog.String("grace", cfg.ShutdownGrace.String()))
			return 1
		}
	}
	if serr != nil {
		log.Error("gatekeeper stopped", slog.String("error", oneLine(serr.Error())))
		return 1
	}
	log.Info("stopped")
	return 0
}

// state is what readiness reports besides Kafka and Redis reachability.
// Safe for concurrent use.
type state struct {
	limiter  atomic.Pointer[limit.Limiter]
	paused   atomic.Bool // consumption paused (Redis trouble, ON_REDIS_ERROR=pause)
	draining atomic.Bool // shutting down
	joined   atomic.Pointer[[]func() bool]
	router   atomic.Pointer[route.Router]
}

// serve builds everything in dependency order and runs the HTTP server, the
// limits file watcher and the pipeline until ctx is done or one fails.
func serve(ctx context.Context, cfg *Config, log *slog.Logger) error {
	log.Info("starting", slog.String("version", version),
		slog.String("roles", strings.Join(cfg.Roles, ",")),
		slog.String("source_topics", strings.Join(cfg.SourceTopics, ",")),
		slog.String("downstream_topic", cfg.DownstreamTopic),
		slog.String("window", cfg.Window), slog.Bool("shadow", cfg.Shadow))
	if unknown, _ := unknownVars(os.Environ()); len(unknown) > 0 {
		log.Warn("environment holds GATEKEEPER_ variables that configure nothing (typos?)", slog.String("variables", strings.Join(unknown, ",")))
	}
	if cfg.AdminToken == "" {
		log.Warn("GATEKEEPER_ADMIN_TOKEN is not set: the usage API is open to anyone who reaches " + cfg.HTTPAddr)
	}

	reg := prometheus.NewRegistry()
	if err := registerProcessMetrics(reg); err != nil {
		return err
	}

	redis.SetLogger(redisLogger{log: log})
	rdb := newRedis(cfg)
	defer rdb.Close()

	dialer, err := newKafkaDialer(cfg)
	if err != nil {
		return err
	}
	transport, err := newKafkaTransport(cfg)
	if err != nil {
		return err
	}
	defer transport.CloseIdleConnections()

	var st state
	context.AfterFunc(ctx, func() { st.draining.Store(true) })

	var watcher *Watcher
	var rules *limit.Rules
	if cfg.LimitsFile != "" {
		watcher, err = NewWatcher(cfg.LimitsFile, func(r *limit.Rules) error {
			lim := st.limiter.Load()
			if lim == nil {
				return errors.New("limiter not started")
			}
			return lim.SetRules(r)
		}, log, reg)
		if err != nil {
			return err
		}
		rules, err = watcher.Load()
	} else {
		rules, err = cfg.Rules()
	}
	if err != nil {
		return fmt.Errorf("rules: %w", err)
	}
	opts, err := limiterOptions(cfg, reg)
	if err != nil {
		return err
	}

	checks := []readyCheck{
		{Name: "redis", Check: redisCheck(rdb)},
		{Name: "kafka", Check: kafkaCheck(dialer, cfg.KafkaBrokers)},
		{Name: "limiter", Check: func(context.Context) error {
			if st.limiter.Load() == nil {
				return errors.New("not started")
			}
			return nil
		}},
		{Name: "groups", Check: func(context.Context) error {
			js := st.joined.Load()
			if js == nil {
				return errors.New("not started")
			}
			for _, ready := range *js {
				if !ready() {
					return errors.New("not joined")
				}
			}
			return nil
		}},
		{Name: "consumption", Check: func(context.Context) error {
			if st.paused.Load() {
				return errors.New("paused")
			}
			return nil
		}},
		{Name: "writes", Check: func(context.Context) error {
			if r := st.router.Load(); r != nil && r.WritesFailing() > 0 {
				return fmt.Errorf("%d batches' Kafka writes keep failing (their partitions wait; see the log)", r.WritesFailing())
			}
			return nil
		}},
		{Name: "shutdown", Check: func(context.Context) error {
			if st.draining.Load() {
				return errors.New("shutting down")
			}
			return nil
		}},
	}
	checkTimeout := min(cfg.RedisTimeout, cfg.KafkaTimeout)
	if err := reg.Register(newReadyCollector(checks, checkTimeout)); err != nil {
		return fmt.Errorf("readiness metrics: %w", err)
	}
	handler := newHandler(httpConfig{
		Gatherer:   reg,
		Registerer: reg,
		Checks:     checks,
		Usage: func(ctx context.Context, tenant string) ([]limit.Usage, error) {
			lim := st.limiter.Load()
			if lim == nil {
				return nil, errors.New("limiter not started")
			}
			return lim.Usage(ctx, tenant)
		},
		AdminToken:   cfg.AdminToken,
		Log:          log,
		CheckTimeout: checkTimeout,
	})
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("http listen: %w", err)
	}
	srv := newHTTPServer(handler, log)
	log.Info("http listening", slog.String("addr", ln.Addr().String()))

	g, gctx := errgroup.WithContext(ctx)
	httpStop := make(chan struct{})
	g.Go(func() error { return serveHTTP(httpStop, srv, ln, 5*time.Second) })
	g.Go(func() error {
		// HTTP (metrics, readiness) stays up until the pipeline has drained.
		defer close(httpStop)
		lim, err := startLimiter(gctx, log, rdb, rules, opts)
		if err != nil {
			return err
		}
		if lim == nil { // ctx done while waiting for Redis
			return nil
		}
		st.limiter.Store(lim)
		if w, err := limit.CheckEviction(gctx, rdb); err != nil {
			log.Debug("cannot read redis maxmemory-policy", slog.String("error", oneLine(err.Error())))
		} else if w != "" {
			log.Warn(w)
		}

		pctx, cancel := context.WithCancel(gctx)
		defer cancel()
		pg, pctx := errgroup.WithContext(pctx)
		if watcher != nil {
			pg.Go(func() error { return watcher.Run(pctx) })
		}
		pg.Go(func() error {
			defer cancel()
			return startPipeline(pctx, pipeline{
				Config:     cfg,
				Log:        log,
				Registerer: reg,
				Limiter:    lim,
				Dialer:     dialer,
				Transport:  transport,
				Paused:     &st.paused,
				Joined:     &st.joined,
				Router:     &st.router,
			})
		})
		return pg.Wait()
	})
	return g.Wait()
}

// registerProcessMetrics registers with reg the collectors that exist from
// start-up on: the Go runtime (go_*), the process (process_*) and
// gatekeeper_build_info.
func registerProcessMetrics(reg prometheus.Registerer) error {
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gatekeeper_build_info",
		Help: "Always 1; the labels give the version.",
	}, []string{"version", "goversion"})
	buildInfo.WithLabelValues(version, runtime.Version()).Set(1)
	for _, c := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo,
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("process metrics: %w", err)
		}
	}
	return nil
}

// startLimiter creates the limiter, which loads the scripts into Redis.
// While Redis cannot be reached it waits and tries again (readiness stays
// false): a replica started during a Redis outage must not crash-loop. It
// returns nil, nil if ctx ends first, and an error for any other failure
// (e.g. wrong password, a broken script).
func startLimiter(ctx context.Context, log *slog.Logger, rdb redis.UniversalClient, rules *limit.Rules, opts limit.Options) (*limit.Limiter, error) {
	wait := 250 * time.Millisecond
	for {
		// limit.New registers its metrics only once it has succeeded, so a
		// failed attempt can simply be tried again.
		lim, err := limit.New(ctx, rdb, rules, opts)
		if err == nil {
			return lim, nil
		}
		if ctx.Err() != nil {
			return nil, nil
		}
		if !transientRedisError(err) {
			return nil, fmt.Errorf("start limiter: %w", err)
		}
		log.Error("redis unavailable, waiting to start the limiter", slog.String("error", oneLine(err.Error())), slog.String("retry_in", wait.String()))
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(wait):
		}
		wait = min(2*wait, 10*time.Second)
	}
}

// transientRedisError reports whether err is Redis being unreachable or
// temporarily unable to serve, as opposed to a refusal that waiting does
// not cure.
func transientRedisError(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, redis.ErrPoolTimeout) {
		return true
	}
	for _, p := range []string{"LOADING", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "READONLY"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

// pipeline is everything startPipeline wires together: the consumer
// groups of the source and retry topics, the gate, the retrier and the
// writers.
type pipeline struct {
	Config     *Config
	Log        *slog.Logger
	Registerer prometheus.Registerer
	Limiter    *limit.Limiter
	// Dialer is for consumer groups and readers; Transport for writers.
	// Both carry TLS, SASL and KAFKA_TIMEOUT.
	Dialer    *kafka.Dialer
	Transport *kafka.Transport
	// Paused must be true while consumption is paused (Redis trouble with
	// ON_REDIS_ERROR=pause); /readyz reports it.
	Paused *atomic.Bool
	// Joined, if set, receives the consumer groups' "joined" checks, for
	// /readyz.
	Joined *atomic.Pointer[[]func() bool]
	// Router, if set, receives the router, whose failing writes /readyz
	// reports.
	Router *atomic.Pointer[route.Router]
}
