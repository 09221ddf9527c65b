package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/errgroup"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/pace"
)

// LimiterOptions turns the configuration into limiter options.
func LimiterOptions(cfg *Config, reg prometheus.Registerer) (limit.Options, error) {
	loc, err := cfg.Location()
	if err != nil {
		return limit.Options{}, err
	}
	return limit.Options{
		Prefix:     cfg.RedisKeyPrefix,
		WindowKind: limit.WindowKind(cfg.Window),
		Location:   loc,
		Horizon:    cfg.DeferHorizon,
		Retention:  cfg.Retention,
		Timeout:    cfg.RedisTimeout,
		CacheBytes: int64(cfg.LimiterCacheBytes),
		// Replay records of another deployment sharing Redis and the
		// prefix are never matched.
		ReplayScope: cfg.GroupID,
		Registerer:  reg,
		Capacity:    cfg.CapacityRules(),
	}, nil
}

// state is what readiness reports besides Kafka and Redis reachability.
// Safe for concurrent use.
type state struct {
	redis    atomic.Pointer[redis.UniversalClient] // nil until made (see NewRedis)
	limiter  atomic.Pointer[limit.Limiter]
	draining atomic.Bool                   // shutting down
	pipeline atomic.Pointer[BuiltPipeline] // nil until built
	live     atomic.Pointer[live]
	pace     atomic.Pointer[pace.Runner] // nil without a capacity (pace.go)
}

// worker is what Serve builds before anything runs: the configuration, the
// logger, the metrics registry, the clients and the readiness state.
type worker struct {
	cfg       *Config
	log       *slog.Logger
	reg       *prometheus.Registry
	dialer    *kafka.Dialer
	transport *kafka.Transport
	st        state
}

// Serve builds everything in dependency order and runs the HTTP server, the
// limits file watcher and the pipeline until ctx is done or one fails.
// version is the build's version, logged and exported as
// gatekeeper_build_info.
func Serve(ctx context.Context, cfg *Config, log *slog.Logger, version string) error {
	logStart(log, cfg, version)
	if soft, from := setMemoryLimit(os.Getenv, hostCgroups); soft > 0 {
		log.Info("Go memory limit set from the cgroup's", slog.Int64("gomemlimit_bytes", soft), slog.String("cgroup_file", from))
	}
	w := &worker{cfg: cfg, log: log, reg: prometheus.NewRegistry()}
	if err := registerProcessMetrics(w.reg, version); err != nil {
		return err
	}

	redis.SetLogger(redisLogger{log: log})
	defer func() {
		if rdb := w.st.redis.Load(); rdb != nil {
			(*rdb).Close()
		}
	}()

	var err error
	if w.dialer, err = NewKafkaDialer(cfg); err != nil {
		return err
	}
	if w.transport, err = NewKafkaTransport(cfg); err != nil {
		return err
	}
	defer w.transport.CloseIdleConnections()

	context.AfterFunc(ctx, func() { w.st.draining.Store(true) })

	watcher, rules, err := w.loadRules()
	if err != nil {
		return err
	}
	opts, err := LimiterOptions(cfg, w.reg)
	if err != nil {
		return err
	}
	srv, ln, err := w.listenHTTP(ctx)
	if err != nil {
		return err
	}

	g, gctx := errgroup.WithContext(ctx)
	httpStop := make(chan struct{})
	g.Go(func() error { return serveHTTP(httpStop, srv, ln, 5*time.Second) })
	g.Go(func() error {
		// HTTP (metrics, readiness) stays up until the pipeline has drained.
		defer close(httpStop)
		return w.run(gctx, watcher, rules, opts)
	})
	return g.Wait()
}

// logStart logs the start-up line and warns of what the configuration
// leaves open.
func logStart(log *slog.Logger, cfg *Config, version string) {
	log.Info("starting", slog.String("version", version),
		slog.String("roles", strings.Join(cfg.Roles, ",")),
		slog.String("source_topics", strings.Join(cfg.SourceTopics, ",")),
		slog.String("downstream_topic", cfg.DownstreamTopic),
		slog.String("window", cfg.Window), slog.Bool("shadow", cfg.Shadow))
	if unknown, _ := UnknownVars(os.Environ()); len(unknown) > 0 {
		log.Warn("environment holds GATEKEEPER_ variables that configure nothing (typos?)", slog.String("variables", strings.Join(unknown, ",")))
	}
	for _, w := range cfg.Warnings() {
		log.Warn(w)
	}
}

// loadRules returns the rules to start with, as Validate parsed them: from
// LIMITS_FILE, with the watcher that applies its changes to the running
// limiter (it starts from the content Validate read), or from LIMITS (and a
// nil watcher).
func (w *worker) loadRules() (*Watcher, *limit.Rules, error) {
	if w.cfg.LimitsFile == "" {
		rules, err := w.cfg.Rules()
		if err != nil {
			return nil, nil, fmt.Errorf("rules: %w", err)
		}
		return nil, rules, nil
	}
	watcher, err := NewWatcher(w.cfg.LimitsFile, func(r *limit.Rules) error {
		lim := w.st.limiter.Load()
		if lim == nil {
			return errors.New("limiter not started")
		}
		if err := w.cfg.CheckUnits(r); err != nil {
			return fmt.Errorf("%s_COST_FROM %w", EnvPrefix, err)
		}
		if lv := w.st.live.Load(); lv != nil {
			return lv.Layers.SetBase(r)
		}
		return lim.SetRules(r)
	}, w.log, w.reg)
	if err != nil {
		return nil, nil, err
	}
	l, err := w.cfg.limitsFile()
	if err != nil {
		return nil, nil, fmt.Errorf("rules: %w", err)
	}
	watcher.loaded(l)
	return watcher, l.rules, nil
}

// readyChecks are the checks of /readyz and gatekeeper_ready: Redis and
// Kafka reachable, and the state st reports.
func (st *state) readyChecks(dialer *kafka.Dialer, brokers []string) []readyCheck {
	return []readyCheck{
		{Name: "redis", Check: func(ctx context.Context) error {
			rdb := st.redis.Load()
			if rdb == nil {
				return errors.New("not connected yet (see the log)")
			}
			return redisCheck(*rdb)(ctx)
		}},
		{Name: "kafka", Check: kafkaCheck(dialer, brokers)},
		{Name: "limiter", Check: func(context.Context) error {
			if st.limiter.Load() == nil {
				return errors.New("not started")
			}
			return nil
		}},
		{Name: "groups", Check: func(context.Context) error {
			pl := st.pipeline.Load()
			if pl == nil {
				return errors.New("not started")
			}
			return pl.Health().Groups
		}},
		{Name: "consumption", Check: func(context.Context) error {
			if pl := st.pipeline.Load(); pl != nil {
				return pl.Health().Consumption
			}
			return nil
		}},
		{Name: "writes", Check: func(context.Context) error {
			if pl := st.pipeline.Load(); pl != nil {
				return pl.Health().Writes
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
}

// listenHTTP registers the readiness metric and listens on HTTP_ADDR with
// the handler of metrics, health and the usage API; serveHTTP serves it.
func (w *worker) listenHTTP(ctx context.Context) (*http.Server, net.Listener, error) {
	cfg := w.cfg
	tokens, err := cfg.apiTokens()
	if err != nil {
		return nil, nil, bad("ADMIN_TOKENS", "%v", err)
	}
	ready := newReadiness(w.st.readyChecks(w.dialer, cfg.KafkaBrokers), min(cfg.RedisTimeout, cfg.KafkaTimeout), readyMaxAge)
	if err := w.reg.Register(newReadyCollector(ready)); err != nil {
		return nil, nil, fmt.Errorf("readiness metrics: %w", err)
	}
	handler := newHandler(httpConfig{
		Gatherer:   w.reg,
		Registerer: w.reg,
		Ready:      ready,
		Usage: func(ctx context.Context, tenant string) ([]limit.Usage, error) {
			lim := w.st.limiter.Load()
			if lim == nil {
				return nil, errors.New("limiter not started")
			}
			return lim.Usage(ctx, tenant)
		},
		Capacity: func(ctx context.Context, tenant string) ([]limit.CapacityShare, error) {
			lim := w.st.limiter.Load()
			if lim == nil {
				return nil, errors.New("limiter not started")
			}
			return lim.CapacityUsage(ctx, tenant)
		},
		AdminToken: cfg.AdminToken,
		Tokens:     tokens,
		Overrides: &overrideAPI{
			live:    w.st.live.Load,
			limiter: w.st.limiter.Load,
			kind:    limit.WindowKind(cfg.Window),
			rdb: func() redis.UniversalClient {
				if rdb := w.st.redis.Load(); rdb != nil {
					return *rdb
				}
				return nil
			},
			prefix:  cfg.RedisKeyPrefix,
			timeout: cfg.RedisTimeout,
			log:     w.log,
		},
		Capacities: &capacityAPI{pace: w.st.pace.Load, clock: time.Now, log: w.log, measure: cfg.CapacityRules().Measure()},
		Pprof:      cfg.Pprof,
		Log:        w.log,
	})
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.HTTPAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("http listen: %w", err)
	}
	w.log.Info("http listening", slog.String("addr", ln.Addr().String()))
	return newHTTPServer(handler, w.log), ln, nil
}

// run starts the limiter (waiting for Redis), then runs the limits file
// watcher, if any, and the pipeline until ctx is done or one fails.
func (w *worker) run(ctx context.Context, watcher *Watcher, rules *limit.Rules, opts limit.Options) error {
	rdb, err := connectRedis(ctx, w.log, w.cfg)
	if err != nil || rdb == nil { // rdb nil: ctx done while waiting for Redis
		return err
	}
	w.st.redis.Store(&rdb)
	lim, err := startLimiter(ctx, w.log, rdb, rules, opts)
	if err != nil {
		return err
	}
	if lim == nil { // ctx done while waiting for Redis
		return nil
	}
	w.st.limiter.Store(lim)
	lv, err := startLive(ctx, w.log, w.cfg, rdb, lim, rules, opts, w.reg)
	if err != nil {
		return fmt.Errorf("live overrides: %w", err)
	}
	if lv == nil { // ctx done while waiting for Redis
		return nil
	}
	w.st.live.Store(lv)
	if warn, err := limit.CheckEviction(ctx, rdb); err != nil {
		w.log.Debug("cannot read redis maxmemory-policy", slog.String("err", OneLine(err.Error())))
	} else if warn != "" {
		w.log.Warn(warn)
	}

	pr, err := newPaceRunner(w.cfg, rdb, lim, w.transport, w.log, w.reg)
	if err != nil {
		return err
	}
	if pr != nil {
		pr.Init(ctx)
	}
	w.st.pace.Store(pr)

	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pg, pctx := errgroup.WithContext(pctx)
	pg.Go(func() error { return runPace(pctx, pr) })
	if watcher != nil {
		pg.Go(func() error { return watcher.Run(pctx) })
	}
	pg.Go(func() error { return lv.Watcher.Run(pctx) })
	pg.Go(func() error { return lv.Publisher.Run(pctx) })
	pg.Go(func() error {
		defer cancel()
		pl, err := Pipeline{
			Config:     w.cfg,
			Log:        w.log,
			Registerer: w.reg,
			Limiter:    lim,
			Leases:     redisLeases{rdb: rdb, prefix: w.cfg.RedisKeyPrefix},
			Dialer:     w.dialer,
			Transport:  w.transport,
			Live:       lv,
		}.Build(pctx)
		if err != nil || pl == nil { // nil: ctx done while waiting for Kafka
			return err
		}
		w.st.pipeline.Store(pl)
		return pl.Run(pctx)
	})
	return pg.Wait()
}

// registerProcessMetrics registers with reg the collectors that exist from
// start-up on: the Go runtime (go_*), the process (process_*) and
// gatekeeper_build_info.
func registerProcessMetrics(reg prometheus.Registerer, version string) error {
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
	var lim *limit.Limiter
	err := retryRedis(ctx, log, "start the limiter", func() (err error) {
		// limit.New registers its metrics only once it has succeeded, so a
		// failed attempt can simply be tried again.
		lim, err = limit.New(ctx, rdb, rules, opts)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("start limiter: %w", err)
	}
	return lim, nil
}

// connectRedis returns the Redis client of the configuration (NewRedis),
// waiting and trying again while Redis cannot be reached, as startLimiter
// does. It returns nil, nil if ctx ends first.
func connectRedis(ctx context.Context, log *slog.Logger, cfg *Config) (redis.UniversalClient, error) {
	var rdb redis.UniversalClient
	err := retryRedis(ctx, log, "connect", func() (err error) {
		rdb, err = NewRedis(ctx, cfg)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("connect to redis: %w", err)
	}
	if rdb != nil {
		_, cluster := rdb.(*redis.ClusterClient)
		log.Info("redis client", slog.String("addrs", strings.Join(cfg.RedisAddrs, ",")), slog.Bool("cluster", cluster))
	}
	return rdb, nil
}

// retryRedis calls try until it succeeds or fails for a reason other than
// Redis being unreachable or temporarily unable to serve, waiting longer
// after each failure (up to 10s) and logging it with what it waits to do.
// It returns nil when try succeeded or ctx ended first.
func retryRedis(ctx context.Context, log *slog.Logger, what string, try func() error) error {
	wait := 250 * time.Millisecond
	for {
		err := try()
		if err == nil || ctx.Err() != nil {
			return nil
		}
		if !transientRedisError(err) {
			return err
		}
		log.Error("redis unavailable, waiting to "+what, slog.String("err", OneLine(err.Error())), slog.String("retry_in", wait.String()))
		select {
		case <-ctx.Done():
			return nil
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

// Pipeline is everything Build wires together into a BuiltPipeline: the
// consumer groups of the source and retry topics, the gate, the retrier and
// the writers.
type Pipeline struct {
	Config     *Config
	Log        *slog.Logger
	Registerer prometheus.Registerer
	Limiter    *limit.Limiter
	// Leases, if set, keeps the retry group members' leases, so that a
	// crashed replica's retry partitions move within a lease.
	Leases consume.Leases

	// metadataMax is the brokers' offset.metadata.max.bytes, read by
	// Build (0: the default).
	metadataMax int
	// paused is the BuiltPipeline's, set by Build: true while consumption
	// is paused (Redis trouble with ON_REDIS_ERROR=pause).
	paused *atomic.Bool
	// Dialer is for consumer groups and readers; Transport for writers.
	// Both carry TLS, SASL and KAFKA_TIMEOUT.
	Dialer    *kafka.Dialer
	Transport *kafka.Transport
	// Live, if set, are the live overrides and the top view: its Admitter
	// decides instead of Limiter, its Expediter and Tracker hook into the
	// retry tiers.
	Live *live
}
