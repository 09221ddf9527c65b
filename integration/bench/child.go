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
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if c.CPUProfile != "" {
		f, err := os.Create(c.CPUProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	brokers := strings.Split(c.Brokers, ",")
	transport := &kafka.Transport{ClientID: "gkbench", DialTimeout: kafkaTimeout, IdleTimeout: 30 * time.Second, MetadataTTL: 15 * time.Second}
	defer transport.CloseIdleConnections()
	writer := route.NewKafkaWriter(brokers, route.WriterOptions{
		Transport: transport, WriteTimeout: kafkaTimeout, ReadTimeout: kafkaTimeout, Logger: log,
	})
	defer writer.Close()
	topics := route.Topics{Downstream: c.Downstream, Retry: c.Downstream + ".retry", DLQ: c.Downstream + ".dlq"}
	group := consume.Config{
		Brokers:          brokers,
		GroupID:          c.Group,
		Topics:           strings.Split(c.Sources, ","),
		BatchSize:        c.BatchSize,
		BatchWait:        batchWait,
		DrainTimeout:     min(shutdownGrace, rebalanceTimeout-time.Second),
		Timeout:          kafkaTimeout,
		RebalanceTimeout: rebalanceTimeout,
		Dialer:           &kafka.Dialer{ClientID: "gkbench", Timeout: kafkaTimeout, DualStack: true},
		Logger:           log,
	}
	var rdb *redis.Client
	if c.Mode != modePassthrough {
		rdb = redis.NewClient(&redis.Options{
			Addr: c.Redis, DialTimeout: redisTimeout, ReadTimeout: redisTimeout, WriteTimeout: redisTimeout,
			PoolTimeout: redisTimeout, ContextTimeoutEnabled: true,
		})
		defer rdb.Close()
	}
	reg := prometheus.NewRegistry()
	metrics, err := route.NewMetrics(reg)
	if err != nil {
		return err
	}
	router := &route.Router{Writer: writer, Topics: topics, Clock: time.Now, Logger: log, Metrics: metrics}
	extractor, err := route.ParseTenantFrom("key")
	if err != nil {
		return err
	}
	gate := func(a route.Admitter) consume.Handler {
		return &route.Gate{Extractor: extractor, Admission: route.Admission{Admitter: a, Router: router,
			OnRedisError: route.RedisPause, Clock: time.Now, Logger: log, Metrics: metrics}}
	}

	g, gctx := errgroup.WithContext(ctx)
	var h consume.Handler
	switch c.Mode {
	case modePassthrough:
		// The ceiling: the same consumer, Router and writer; every event
		// goes downstream, nothing is asked of Redis.
		// The items slice is recycled, as the Gate recycles its own.
		router.Metrics = nil
		var pool sync.Pool
		h = consume.HandlerFunc(func(ctx context.Context, msgs []kafka.Message) error {
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
	case modeSeedNaive:
		a := &seedAdmitter{rdb: rdb, script: redis.NewScript(lua.TTLIncr), prefix: c.Prefix, limit: c.Limit, window: c.Window}
		if err := a.script.Load(ctx, rdb).Err(); err != nil {
			return fmt.Errorf("load seed script: %w", err)
		}
		h = gate(a)
	case modeRedisRate:
		h = gate(&rateAdmitter{
			lim: redis_rate.NewLimiter(rdb), prefix: c.Prefix,
			limit: redis_rate.Limit{Rate: int(c.Limit), Burst: int(c.Limit), Period: c.Window},
		})
	case modeGatekeeperLib:
		// Gatekeeper's own parts wired as internal/worker/pipeline.go does,
		// in-process, so that it can be profiled (-cpuprofile).
		rules, err := limit.ParseRules(fmt.Sprintf("*=%d/%s", c.Limit, ruleUnit(c.Window)))
		if err != nil {
			return err
		}
		lim, err := limit.New(ctx, rdb, rules, limit.Options{Prefix: c.Prefix, WindowKind: limit.WindowKind(c.WindowKind),
			Timeout: redisTimeout, Registerer: reg})
		if err != nil {
			return err
		}
		h = gate(lim)
		retrier := &route.Retrier{Admission: route.Admission{Admitter: lim, Router: router,
			OnRedisError: route.RedisPause, Clock: time.Now, Logger: log, Metrics: metrics}}
		dc := consume.DelayedConfig{Config: group, ReleaseAt: topics.ReleaseAt}
		dc.GroupID = c.Group + ".retry"
		dc.Topics = nil
		for _, t := range topics.Tiers() {
			dc.Topics = append(dc.Topics, t.Topic)
		}
		retry, err := consume.NewDelayed(dc, retrier)
		if err != nil {
			return err
		}
		g.Go(func() error { return retry.Run(gctx) })
	default:
		return fmt.Errorf("unknown mode %q", c.Mode)
	}
	src, err := consume.NewGroup(group, h)
	if err != nil {
		return err
	}
	g.Go(func() error { return src.Run(gctx) })
	return g.Wait()
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
type seedAdmitter struct {
	rdb    *redis.Client
	script *redis.Script
	prefix string
	limit  int64
	window time.Duration
}

// AdmitFrom is Admit: the seed's script keeps no replay record.
func (a *seedAdmitter) AdmitFrom(ctx context.Context, _ limit.Source, tenants []string) ([]limit.Decision, error) {
	return a.Admit(ctx, tenants)
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

// AdmitFrom is Admit: redis_rate keeps no replay record.
func (a *rateAdmitter) AdmitFrom(ctx context.Context, _ limit.Source, tenants []string) ([]limit.Decision, error) {
	return a.Admit(ctx, tenants)
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
