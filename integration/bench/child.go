package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/errgroup"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/lua"
	"github.com/gatekeeper-dev/gatekeeper/internal/route"
)

// childConfig is what the driver passes to a child process that runs one
// in-process mode (flags after -child).
type childConfig struct {
	Mode       string
	Brokers    string
	Redis      string
	Group      string
	Sources    string // comma-separated
	Downstream string
	BatchSize  int
	Limit      int64
	Window     time.Duration
	WindowKind string // ttl or aligned (gatekeeper-lib only)
	Prefix     string
	CPUProfile string
}

func (c childConfig) args() []string {
	return []string{
		"-child", c.Mode, "-c.brokers", c.Brokers, "-c.redis", c.Redis, "-c.group", c.Group,
		"-c.sources", c.Sources, "-c.downstream", c.Downstream, "-c.batch", fmt.Sprint(c.BatchSize),
		"-c.limit", fmt.Sprint(c.Limit), "-c.window", c.Window.String(), "-c.window-kind", c.WindowKind,
		"-c.prefix", c.Prefix, "-c.cpuprofile", c.CPUProfile,
	}
}

func (c *childConfig) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.Mode, "child", "", "internal: run one in-process mode as a child of the driver")
	fs.StringVar(&c.Brokers, "c.brokers", "", "internal")
	fs.StringVar(&c.Redis, "c.redis", "", "internal")
	fs.StringVar(&c.Group, "c.group", "", "internal")
	fs.StringVar(&c.Sources, "c.sources", "", "internal")
	fs.StringVar(&c.Downstream, "c.downstream", "", "internal")
	fs.IntVar(&c.BatchSize, "c.batch", 500, "internal")
	fs.Int64Var(&c.Limit, "c.limit", 0, "internal")
	fs.DurationVar(&c.Window, "c.window", time.Hour, "internal")
	fs.StringVar(&c.WindowKind, "c.window-kind", "ttl", "internal")
	fs.StringVar(&c.Prefix, "c.prefix", "", "internal")
	fs.StringVar(&c.CPUProfile, "c.cpuprofile", "", "internal")
}

// The settings below are Gatekeeper's defaults (cmd/gatekeeper), so that
// every mode consumes and writes exactly as Gatekeeper does.
const (
	kafkaTimeout     = 10 * time.Second
	redisTimeout     = 2 * time.Second
	batchWait        = 50 * time.Millisecond
	shutdownGrace    = 25 * time.Second
	rebalanceTimeout = 30 * time.Second
)

// runChild runs one in-process mode until SIGTERM.
func runChild(c childConfig) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if c.CPUProfile != "" {
		stopProfile, err := startCPUProfile(c.CPUProfile)
		if err != nil {
			return err
		}
		defer stopProfile()
	}
	p, closeParts := newChildParts(c)
	defer closeParts()
	g, gctx := errgroup.WithContext(ctx)
	h, err := p.handler(ctx, c, func(run func(context.Context) error) { g.Go(func() error { return run(gctx) }) })
	if err != nil {
		return err
	}
	src, err := consume.NewGroup(p.group, h)
	if err != nil {
		return err
	}
	g.Go(func() error { return src.Run(gctx) })
	return g.Wait()
}

// startCPUProfile writes a CPU profile to path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// childParts are what every in-process mode shares: Gatekeeper's writer,
// Router and consumer settings, and a Redis client (none for passthrough).
type childParts struct {
	log     *slog.Logger
	group   consume.Config
	topics  route.Topics
	rdb     *redis.Client
	reg     *prometheus.Registry
	metrics *route.Metrics
	router  *route.Router
}

// newChildParts builds the shared parts of c's mode; closeParts closes them.
func newChildParts(c childConfig) (p *childParts, closeParts func()) {
	p = &childParts{log: slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
		reg: prometheus.NewRegistry()}
	brokers := strings.Split(c.Brokers, ",")
	transport := &kafka.Transport{ClientID: "gkbench", DialTimeout: kafkaTimeout, IdleTimeout: 30 * time.Second, MetadataTTL: 15 * time.Second}
	writer := route.NewKafkaWriter(brokers, route.WriterOptions{
		Transport: transport, WriteTimeout: kafkaTimeout, ReadTimeout: kafkaTimeout, Logger: p.log,
	})
	p.topics = route.Topics{Downstream: c.Downstream, Retry: c.Downstream + ".retry", DLQ: c.Downstream + ".dlq"}
	p.group = consume.Config{
		Brokers:          brokers,
		GroupID:          c.Group,
		Topics:           strings.Split(c.Sources, ","),
		BatchSize:        c.BatchSize,
		BatchWait:        batchWait,
		DrainTimeout:     min(shutdownGrace, rebalanceTimeout-time.Second),
		Timeout:          kafkaTimeout,
		RebalanceTimeout: rebalanceTimeout,
		Dialer:           &kafka.Dialer{ClientID: "gkbench", Timeout: kafkaTimeout, DualStack: true},
		Logger:           p.log,
	}
	if c.Mode != modePassthrough && c.Mode != modeGateLocal {
		p.rdb = redis.NewClient(&redis.Options{
			Addr: c.Redis, DialTimeout: redisTimeout, ReadTimeout: redisTimeout, WriteTimeout: redisTimeout,
			PoolTimeout: redisTimeout, ContextTimeoutEnabled: true,
		})
	}
	p.router = &route.Router{Writer: writer, Topics: p.topics, Clock: time.Now, Logger: p.log}
	return p, func() {
		if p.rdb != nil {
			p.rdb.Close()
		}
		writer.Close()
		transport.CloseIdleConnections()
	}
}

// handler returns the source consumer's handler for c's mode; goRun runs a
// further consumer the mode needs beside it (the retry tiers of
// gatekeeper-lib).
func (p *childParts) handler(ctx context.Context, c childConfig, goRun func(func(context.Context) error)) (consume.Handler, error) {
	if c.Mode == modePassthrough {
		return passthrough(p.router), nil
	}
	var err error
	if p.metrics, err = route.NewMetrics(p.reg); err != nil {
		return nil, err
	}
	p.router.Metrics = p.metrics
	switch c.Mode {
	case modeGateLocal:
		return p.gate(admitAll{})
	case modeSeedNaive:
		a := &seedAdmitter{rdb: p.rdb, script: redis.NewScript(lua.TTLIncr), prefix: c.Prefix, limit: c.Limit, window: c.Window}
		if err := a.script.Load(ctx, p.rdb).Err(); err != nil {
			return nil, fmt.Errorf("load seed script: %w", err)
		}
		return p.gate(a)
	case modeRedisRate:
		return p.gate(&rateAdmitter{
			lim: redis_rate.NewLimiter(p.rdb), prefix: c.Prefix,
			limit: redis_rate.Limit{Rate: int(c.Limit), Burst: int(c.Limit), Period: c.Window},
		})
	case modeGatekeeperLib:
		return p.gatekeeperLib(ctx, c, goRun)
	default:
		return nil, fmt.Errorf("unknown mode %q", c.Mode)
	}
}

// passthrough is the ceiling: the same consumer, Router and writer; every
// event goes downstream, nothing is asked of Redis. The items slice is
// recycled, as the Gate recycles its own.
func passthrough(router *route.Router) consume.Handler {
	var pool sync.Pool
	return consume.HandlerFunc(func(ctx context.Context, b consume.Batch) error {
		msgs := b.Messages
		p, _ := pool.Get().(*[]route.Item)
		if p == nil {
			p = new([]route.Item)
		}
		items := slices.Grow((*p)[:0], len(msgs))[:len(msgs)]
		for i, m := range msgs {
			items[i] = route.Item{Msg: m, Outcome: route.Forward}
		}
		err := router.Route(ctx, items)
		clear(items)
		*p = items
		pool.Put(p)
		return err
	})
}

// admission is the Gate's and the Retrier's admission over a.
func (p *childParts) admission(a route.Admitter) route.Admission {
	return route.Admission{Admitter: a, Router: p.router, OnRedisError: route.RedisPause, Clock: time.Now,
		Logger: p.log, Metrics: p.metrics}
}

// gate is a Gate over a that takes the tenant from the key.
func (p *childParts) gate(a route.Admitter) (consume.Handler, error) {
	extractor, err := route.ParseTenantFrom("key")
	if err != nil {
		return nil, err
	}
	gate, err := route.NewGate(route.Gate{Extractor: extractor, Admission: p.admission(a)})
	if err != nil {
		return nil, err
	}
	return gate, nil
}

// gatekeeperLib is Gatekeeper's own parts wired as
// internal/worker/pipeline.go does, in-process, so that it can be profiled
// (-cpuprofile): the Gate over the limiter, and the retry tiers' consumer
// (started with goRun).
func (p *childParts) gatekeeperLib(ctx context.Context, c childConfig, goRun func(func(context.Context) error)) (consume.Handler, error) {
	rules, err := limit.ParseRules(fmt.Sprintf("*=%d/%s", c.Limit, ruleUnit(c.Window)))
	if err != nil {
		return nil, err
	}
	lim, err := limit.New(ctx, p.rdb, rules, limit.Options{Prefix: c.Prefix, WindowKind: limit.WindowKind(c.WindowKind),
		Timeout: redisTimeout, Registerer: p.reg})
	if err != nil {
		return nil, err
	}
	h, err := p.gate(lim)
	if err != nil {
		return nil, err
	}
	retrier, err := route.NewRetrier(route.Retrier{Admission: p.admission(lim)})
	if err != nil {
		return nil, err
	}
	dc := consume.DelayedConfig{Config: p.group, ReleaseAt: retrier.ReleaseAt}
	dc.GroupID = c.Group + ".retry"
	dc.Topics = nil
	for _, t := range p.topics.Tiers() {
		dc.Topics = append(dc.Topics, t.Topic)
	}
	retry, err := consume.NewDelayed(dc, retrier)
	if err != nil {
		return nil, err
	}
	goRun(retry.Run)
	return h, nil
}

// ruleUnit writes a window length in LIMITS units.
func ruleUnit(d time.Duration) string {
	switch {
	case d%(24*time.Hour) == 0:
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	}
	return fmt.Sprintf("%ds", d/time.Second)
}

// seedAdmitter is the naive limiter: one EVALSHA of the seed's ttl script
// per event; the count against the limit decides. Over the limit, the event
// is diverted until its window resets (the script's seconds left).
// admitAll admits every event at once, without Redis (gate-local): one
// decisions slice per batch, as the limiter returns.
type admitAll struct{}

func (admitAll) AdmitFrom(_ context.Context, _ limit.Source, events []limit.Event) ([]limit.Decision, error) {
	ds := make([]limit.Decision, len(events))
	for i := range ds {
		ds[i].Kind = limit.Admit
	}
	return ds, nil
}

type seedAdmitter struct {
	rdb    *redis.Client
	script *redis.Script
	prefix string
	limit  int64
	window time.Duration
}

// AdmitFrom is Admit: the seed's script keeps no replay record, and it counts every event
// as 1, whatever its cost.
func (a *seedAdmitter) AdmitFrom(ctx context.Context, _ limit.Source, events []limit.Event) ([]limit.Decision, error) {
	return a.Admit(ctx, limit.Tenants(events))
}

func (a *seedAdmitter) Admit(ctx context.Context, tenants []string) ([]limit.Decision, error) {
	now := time.Now()
	out := make([]limit.Decision, len(tenants))
	secs := int64(a.window / time.Second)
	for i, t := range tenants {
		ctx, cancel := context.WithTimeout(ctx, redisTimeout)
		v, err := a.script.Run(ctx, a.rdb, []string{a.prefix + ":{" + t + "}"}, secs).Int64Slice()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("seed script: %w", err)
		}
		if len(v) != 2 {
			return nil, errors.New("seed script: unexpected reply")
		}
		if v[0] <= a.limit {
			out[i] = limit.Decision{Kind: limit.Admit}
			continue
		}
		due := now.Add(time.Duration(v[1]) * time.Second)
		out[i] = limit.Decision{Kind: limit.Defer, Due: due, Until: due.Add(a.window)}
	}
	return out, nil
}

// rateAdmitter is the common peer: go-redis/redis_rate's Allow (GCRA) per
// event. Denied events are diverted until the limiter's RetryAfter.
type rateAdmitter struct {
	lim    *redis_rate.Limiter
	prefix string
	limit  redis_rate.Limit
}

// AdmitFrom is Admit: redis_rate keeps no replay record, and it counts every event
// as 1, whatever its cost.
func (a *rateAdmitter) AdmitFrom(ctx context.Context, _ limit.Source, events []limit.Event) ([]limit.Decision, error) {
	return a.Admit(ctx, limit.Tenants(events))
}

func (a *rateAdmitter) Admit(ctx context.Context, tenants []string) ([]limit.Decision, error) {
	now := time.Now()
	out := make([]limit.Decision, len(tenants))
	for i, t := range tenants {
		ctx, cancel := context.WithTimeout(ctx, redisTimeout)
		res, err := a.lim.Allow(ctx, a.prefix+":"+t, a.limit)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("redis_rate: %w", err)
		}
		if res.Allowed > 0 {
			out[i] = limit.Decision{Kind: limit.Admit}
			continue
		}
		due := now.Add(max(res.RetryAfter, 0))
		out[i] = limit.Decision{Kind: limit.Defer, Due: due, Until: due.Add(a.limit.Period / time.Duration(max(a.limit.Rate, 1)))}
	}
	return out, nil
}
