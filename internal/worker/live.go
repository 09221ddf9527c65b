package worker

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/override"
	"github.com/gatekeeper-dev/gatekeeper/internal/route"
	"github.com/gatekeeper-dev/gatekeeper/internal/top"
)

// live is what one replica runs for the live overrides and the top view:
// the store and its watcher, the layers that join the overrides with the
// rules of LIMITS or LIMITS_FILE, the shadow limiter, the admitter that
// reports decisions, the expediter of raised tenants and the top tracker
// and its publisher.
type live struct {
	Store     *override.Store
	Watcher   *override.Watcher
	Layers    *override.Layers
	Admitter  *override.Admitter
	Expediter *override.Expediter
	Tracker   *top.Tracker
	Publisher *top.Publisher
}

// startLive builds the live parts over the running limiter and loads the
// overrides (waiting while Redis cannot be reached). It returns nil, nil
// when ctx ends first.
func startLive(ctx context.Context, log *slog.Logger, cfg *Config, rdb redis.UniversalClient, lim *limit.Limiter, base *limit.Rules, opts limit.Options, reg prometheus.Registerer) (*live, error) {
	l := &live{Tracker: top.NewTracker(cfg.TopWindow, 0, nil)}
	l.Expediter = &override.Expediter{Keep: cfg.DeferHorizon, TenantOf: func(m kafka.Message) (string, bool) {
		return route.LastHeader(m, route.HeaderTenant)
	}, CheckedSince: route.CheckedSince}
	var shadow *limit.Limiter
	err := retryRedis(ctx, log, "load the live overrides", func() (err error) {
		if l.Store, err = override.NewStore(ctx, rdb, override.StoreOptions{Prefix: cfg.RedisKeyPrefix,
			AuditMax: int64(cfg.OverrideAuditMax), AuditRetention: cfg.OverrideAuditRetention, Timeout: cfg.RedisTimeout,
			Floors: func() override.FloorCheck {
				// The floors of every write are checked in Redis against
				// the capacity and this replica's rules of LIMITS.
				fc := override.FloorCheck{Capacity: lim.Capacity()}
				if l.Layers != nil {
					_, fc.Base = l.Layers.Current()
				}
				return fc
			}}); err != nil {
			return err
		}
		sopts := opts
		sopts.Prefix, sopts.Registerer = cfg.RedisKeyPrefix+":shadow", nil
		shadow, err = limit.New(ctx, rdb, (*limit.Rules)(nil).WithOverlays(nil, 0), sopts)
		return err
	})
	if err != nil || l.Store == nil || shadow == nil {
		return nil, err
	}
	l.Layers = &override.Layers{Enforce: lim.SetRules, Shadow: shadow.SetRules, OnRaise: l.Expediter.Raise,
		OnRaiseBase: l.Expediter.RaiseBase}
	if err := l.Layers.SetBase(base); err != nil {
		return nil, err
	}
	if l.Watcher, err = override.NewWatcher(l.Store, func(s *override.Snapshot) {
		if err := l.Layers.Apply(s); err != nil {
			log.Error("overrides not applied, keeping the rules in force", slog.Int64("version", s.Version), slog.String("err", OneLine(err.Error())))
		}
	}, override.WatcherOptions{Log: log, Registerer: reg}); err != nil {
		return nil, err
	}
	loaded := false
	if err := retryRedis(ctx, log, "load the live overrides", func() error {
		err := l.Watcher.Load(ctx)
		loaded = err == nil
		return err
	}); err != nil || !loaded {
		return nil, err
	}
	if l.Admitter, err = override.NewAdmitter(lim, shadow, l.Tracker, log, reg); err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	l.Publisher = &top.Publisher{Tracker: l.Tracker, Redis: rdb, Prefix: cfg.RedisKeyPrefix,
		Replica: strings.ReplaceAll(host, ":", "_") + "/" + strconv.Itoa(os.Getpid()), Timeout: cfg.RedisTimeout, Log: log}
	return l, nil
}

// The live Admitter stands in for the Limiter on the pipeline, so it must
// offer every optional interface the route package looks for on an
// Admitter: without SlotReleaser, late deferred events kept their missed
// slots counted (each counted twice).
var _ interface {
	route.Admitter
	route.NowAdmitter
	route.BeforeAdmitter
	route.SlotReleaser
	route.BacklogAdvancer
} = (*override.Admitter)(nil)

// admitter is the pipeline's Admitter: the live one when there is one.
func (p Pipeline) admitter() route.Admitter {
	if p.Live != nil && p.Live.Admitter != nil {
		return p.Live.Admitter
	}
	return p.Limiter
}

// retryHooks hooks the expediter and the tracker's waiting counts into the
// retry tiers' consumer.
func (l *live) retryHooks(dc *consume.DelayedConfig) {
	if l == nil {
		return
	}
	dc.Expedite = l.Expediter
	dc.OnWaitingMessage = func(m kafka.Message, delta int) {
		if t, ok := route.LastHeader(m, route.HeaderTenant); ok {
			l.Tracker.Waiting(t, delta)
		}
	}
}

// errNotStarted answers API calls made before the live parts are built.
var errNotStarted = errors.New("overrides not loaded yet (waiting for Redis)")
