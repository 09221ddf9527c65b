package override

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// Snapshot is the set of overrides one replica applies: built by the
// Watcher after each change it read, immutable once handed on, safe for
// concurrent use.
type Snapshot struct {
	// Version is the version of the last change applied (0: none yet).
	Version int64
	// Records are the overrides stored, by tenant: those in force, and an
	// expired one until the expiry sweep deletes it (within a second; see
	// Record.Expires).
	Records map[string]Record
	// Enforced are the rules of the overrides in force that are not
	// shadow, and Shadow those of the shadow ones, by tenant.
	Enforced map[string]limit.Overlay
	Shadow   map[string]limit.Overlay
	// Changed are the tenants whose override changed since the previous
	// snapshot; with All, any may have (a full load).
	Changed []string
	All     bool
	// Applied is when this replica built the snapshot.
	Applied time.Time
}

// WatcherOptions configure a Watcher. The zero value of each field means
// its default.
type WatcherOptions struct {
	// PollInterval is how often the version counter is read. Default 100ms.
	PollInterval time.Duration
	// PageSize bounds the records or audit entries one Redis call reads.
	// Default 1000.
	PageSize int64
	// Clock: default time.Now.
	Clock func() time.Time
	// Log: default slog.Default().
	Log *slog.Logger
	// Registerer receives the metrics; nil: not registered.
	Registerer prometheus.Registerer
}

// Watcher keeps one replica's copy of the overrides in step with Redis and
// hands each new Snapshot to apply (from Run's goroutine only). See the
// package comment. Load, then Run once; Current is safe for concurrent use.
type Watcher struct {
	store *Store
	apply func(*Snapshot)
	opts  WatcherOptions
	m     *watchMetrics

	// Only Load and Run's goroutine touch these. records and overlays are
	// shared with the last snapshot (its Records, and its Enforced when no
	// override is shadow or expired) and copied before a change (owned):
	// 100,000 overrides are held once, not twice.
	records   map[string]Record
	overlays  map[string]limit.Overlay
	owned     bool
	version   int64
	lastID    string
	nextCheck time.Time // the earliest expiry among records (zero: none)
	lastSweep time.Time
	failing   bool
	// parsed are the rule lists parsed so far, by their text: overrides
	// with the same rules share one list (parsed once, held once).
	parsed map[string][]limit.Rule
}

// NewWatcher returns a Watcher of store's overrides.
func NewWatcher(store *Store, apply func(*Snapshot), opts WatcherOptions) (*Watcher, error) {
	if opts.PollInterval == 0 {
		opts.PollInterval = 100 * time.Millisecond
	}
	if opts.PageSize == 0 {
		opts.PageSize = 1000
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	m, err := newWatchMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	return &Watcher{store: store, apply: apply, opts: opts, m: m}, nil
}

// Load reads every override (in pages) and applies the first snapshot.
func (w *Watcher) Load(ctx context.Context) error {
	// The newest audit entry first: changes made while the pages are read
	// come after it and are read again by Run (applying them twice is
	// harmless: a change older than a record's version is skipped).
	last, err := w.store.lastID(ctx)
	if err != nil {
		return err
	}
	ver, err := w.store.Version(ctx)
	if err != nil {
		return err
	}
	records := map[string]Record{}
	overlays := map[string]limit.Overlay{}
	var cursor uint64
	for {
		page, next, err := w.store.List(ctx, cursor, w.opts.PageSize)
		if err != nil {
			return err
		}
		for _, r := range page {
			o, err := w.overlayOf(r)
			if err != nil {
				w.opts.Log.Error("stored override not applied", slog.String("tenant", r.Tenant), slog.String("err", err.Error()))
				continue
			}
			records[r.Tenant], overlays[r.Tenant] = r, o
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	w.records, w.overlays, w.version, w.lastID = records, overlays, ver, last
	w.publish(nil, true)
	return nil
}

// overlayOf parses a stored record's rules and share.
func overlayOf(r Record) (limit.Overlay, error) {
	rules, err := limit.ParseRuleList(r.Rules)
	if err != nil {
		return limit.Overlay{}, err
	}
	share, err := r.Share()
	if err != nil {
		return limit.Overlay{}, err
	}
	return limit.Overlay{Rules: rules, KeepRules: r.KeepRules, Share: share, Version: r.Version}, nil
}

// overlayOf parses a record's rules, or takes the list parsed for the same
// text before, and its share.
func (w *Watcher) overlayOf(r Record) (limit.Overlay, error) {
	key := strings.Join(r.Rules, ",")
	if rules, ok := w.parsed[key]; ok {
		share, err := r.Share()
		if err != nil {
			return limit.Overlay{}, err
		}
		return limit.Overlay{Rules: rules, KeepRules: r.KeepRules, Share: share, Version: r.Version}, nil
	}
	o, err := overlayOf(r)
	if err != nil {
		return o, err
	}
	if w.parsed == nil || len(w.parsed) > 1<<16 {
		w.parsed = map[string][]limit.Rule{}
	}
	w.parsed[key] = o.Rules
	return o, nil
}

// Run follows the changes until ctx is done; Redis trouble is logged and
// counted, and the snapshot in force stays. It returns nil.
func (w *Watcher) Run(ctx context.Context) error {
	t := time.NewTicker(w.opts.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := w.poll(ctx); err != nil && ctx.Err() == nil {
			w.m.errors.Inc()
			if !w.failing {
				w.opts.Log.Warn("cannot read the overrides; keeping those in force", slog.String("err", err.Error()))
			}
			w.failing = true
			continue
		}
		w.failing = false
	}
}

// poll reads the version and, when it moved, the changes since the last
// applied; then applies what changed or expired.
func (w *Watcher) poll(ctx context.Context) error {
	ver, err := w.store.Version(ctx)
	if err != nil {
		return err
	}
	var changed []string
	if ver < w.version {
		// The counter went back (the keys were deleted): start again.
		return w.Load(ctx)
	}
	for ver > w.version {
		entries, err := w.store.changesSince(ctx, w.lastID, w.opts.PageSize)
		if err != nil {
			return err
		}
		if len(entries) == 0 || entries[0].Version > w.version+1 {
			// Entries were trimmed (or the stream deleted) before this
			// replica read them: load everything again.
			w.opts.Log.Info("override changes missed, loading all overrides again", slog.Int64("version", w.version))
			return w.Load(ctx)
		}
		for _, e := range entries {
			w.lastID = e.ID
			if e.Version <= w.version {
				continue
			}
			w.own()
			w.version = e.Version
			changed = append(changed, e.Tenant)
			w.m.lag.Observe(max(0, w.opts.Clock().Sub(e.At).Seconds()))
			if e.After == nil {
				delete(w.records, e.Tenant)
				delete(w.overlays, e.Tenant)
				continue
			}
			o, err := w.overlayOf(*e.After)
			if err != nil {
				w.opts.Log.Error("override change not applied", slog.String("tenant", e.Tenant), slog.Int64("version", e.Version), slog.String("err", err.Error()))
				continue
			}
			w.records[e.Tenant], w.overlays[e.Tenant] = *e.After, o
		}
	}
	now := w.opts.Clock()
	if !w.nextCheck.IsZero() && !now.Before(w.nextCheck) {
		for t, r := range w.records {
			if r.expired(now) {
				changed = append(changed, t)
			}
		}
		if now.Sub(w.lastSweep) >= time.Second {
			w.lastSweep = now
			if _, err := w.store.ExpireDue(ctx, 100); err != nil {
				return err
			}
		}
	}
	if len(changed) > 0 {
		w.publish(changed, false)
	}
	return nil
}

// own makes records and overlays the Watcher's own (copies) before a
// change: the last snapshot keeps the maps it was given.
func (w *Watcher) own() {
	if !w.owned {
		w.records, w.overlays, w.owned = maps.Clone(w.records), maps.Clone(w.overlays), true
	}
}

// publish builds the snapshot of the records (enforcing those neither
// expired nor shadow) and applies it. The snapshot shares the Watcher's
// maps, which are copied before the next change.
func (w *Watcher) publish(changed []string, all bool) {
	now := w.opts.Clock()
	s := &Snapshot{Version: w.version, Records: w.records, Shadow: map[string]limit.Overlay{},
		Changed: changed, All: all, Applied: now}
	w.owned = false
	w.nextCheck = time.Time{}
	aside := 0 // records not enforced: expired or shadow
	for _, r := range w.records {
		if r.expired(now) {
			// Checked again at each poll until the sweep deletes it.
			w.nextCheck = now
			aside++
			continue
		}
		if r.Expires != nil && (w.nextCheck.IsZero() || r.Expires.Before(w.nextCheck)) {
			w.nextCheck = *r.Expires
		}
		if r.Shadow {
			aside++
		}
	}
	shared := aside == 0 && len(w.overlays) == len(w.records)
	if shared {
		s.Enforced = w.overlays
	} else {
		s.Enforced = make(map[string]limit.Overlay, len(w.overlays))
	}
	for t, r := range w.records {
		if shared || r.expired(now) {
			continue
		}
		if r.Shadow {
			// The shadow limiter counts rules only (it has no capacity):
			// a shadow share is reported from the capacity's counts (the
			// API's shadow_capacity), and a share alone has no rules to count.
			if o := w.overlays[t]; !o.KeepRules {
				o.Share = nil
				s.Shadow[t] = o
			}
		} else {
			s.Enforced[t] = w.overlays[t]
		}
	}
	w.opts.Log.Info("overrides applied", slog.Int64("override_version", s.Version), slog.Int("changed", len(changed)),
		slog.Bool("all", all), slog.Int("enforced", len(s.Enforced)), slog.Int("shadow", len(s.Shadow)))
	w.m.version.Set(float64(s.Version))
	w.m.count.WithLabelValues("enforced").Set(float64(len(s.Enforced)))
	w.m.count.WithLabelValues("shadow").Set(float64(len(s.Shadow)))
	w.apply(s)
}

type watchMetrics struct {
	version prometheus.Gauge
	count   *prometheus.GaugeVec
	lag     prometheus.Histogram
	errors  prometheus.Counter
}

func newWatchMetrics(reg prometheus.Registerer) (*watchMetrics, error) {
	m := &watchMetrics{
		version: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gatekeeper_override_version",
			Help: "Version of the last override change this replica applies (every decision under an override carries its own version: see the README)."}),
		count: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gatekeeper_overrides",
			Help: "Live overrides in force on this replica, by kind (enforced, shadow)."}, []string{"kind"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gatekeeper_override_apply_lag_seconds",
			Help:    "Time from an override change (the writer's clock) to its application on this replica.",
			Buckets: []float64{.01, .025, .05, .1, .2, .3, .5, .75, 1, 2, 5}}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "gatekeeper_override_watch_errors_total",
			Help: "Failed reads of the overrides in Redis (the overrides in force stay)."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.version, m.count, m.lag, m.errors} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("override metrics: %w", err)
			}
		}
	}
	return m, nil
}
