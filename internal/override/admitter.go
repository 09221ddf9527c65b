package override

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// Tally receives every batch's decisions (the operator's top view). It must
// be safe for concurrent use and cheap: it runs on the hot path, without
// Redis.
type Tally interface {
	Record(tenants []string, ds []limit.Decision)
	RecordShadow(tenants []string, ds []limit.Decision)
}

// Admitter decides batches with the Limiter (whose rules carry the live
// overrides), then reports: decisions made under an override (a metric, and
// at debug level one log line per tenant and override version on each
// replica), the decisions of the Shadow
// limiter for the tenants with a shadow override (counted, never
// enforced), and every decision to the Tally. It embeds the Limiter, so
// that every optional interface the route package looks for on an
// Admitter (route.SlotReleaser among them) is the Limiter's unless
// Admitter reports on it too (AdmitFrom, AdmitNow). It is safe for
// concurrent use.
type Admitter struct {
	*limit.Limiter
	// Shadow counts the shadow overrides (its rules are only theirs, under
	// a key prefix of its own); nil: none.
	Shadow *limit.Limiter
	Tally  Tally
	Log    *slog.Logger

	m      *admitMetrics
	mu     sync.Mutex
	logged map[string]int64 // tenant -> override version last logged
}

// NewAdmitter returns an Admitter; its metrics go to reg (nil: not
// registered).
func NewAdmitter(lim, shadow *limit.Limiter, tally Tally, log *slog.Logger, reg prometheus.Registerer) (*Admitter, error) {
	m := &admitMetrics{
		underVec: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gatekeeper_override_decisions_total",
			Help: "Events decided under a live override, by decision."}, []string{"decision"}),
		shadow: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gatekeeper_override_shadow_decisions_total",
			Help: "What shadow overrides would have decided (not enforced), by decision; errors counts failed shadow calls."}, []string{"decision"}),
	}
	for _, k := range []limit.Kind{limit.Admit, limit.Defer, limit.Reject, limit.Fail} {
		m.under[k] = m.underVec.WithLabelValues(k.String())
	}
	for _, k := range []string{"admit", "defer", "reject", "fail"} {
		m.shadow.WithLabelValues(k)
	}
	m.shadow.WithLabelValues("error")
	if reg != nil {
		for _, c := range []prometheus.Collector{m.underVec, m.shadow} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("override metrics: %w", err)
			}
		}
	}
	if log == nil {
		log = slog.Default()
	}
	return &Admitter{Limiter: lim, Shadow: shadow, Tally: tally, Log: log, m: m, logged: map[string]int64{}}, nil
}

type admitMetrics struct {
	underVec, shadow *prometheus.CounterVec
	// under are underVec's counters by limit.Kind (resolved once: a
	// label look-up per batch shows on the hot path).
	under [5]prometheus.Counter
}

// AdmitFrom decides with the Limiter and reports (see Admitter).
func (a *Admitter) AdmitFrom(ctx context.Context, src limit.Source, events []limit.Event) ([]limit.Decision, error) {
	ds, err := a.Limiter.AdmitFrom(ctx, src, events)
	if err != nil {
		return nil, err
	}
	a.report(events, ds)
	a.shadow(ctx, events)
	return ds, nil
}

// AdmitNow decides with the Limiter's AdmitNow and reports.
func (a *Admitter) AdmitNow(ctx context.Context, src limit.Source, events []limit.Event) ([]limit.Decision, error) {
	ds, err := a.Limiter.AdmitNow(ctx, src, events)
	if err != nil {
		return nil, err
	}
	a.report(events, ds)
	return ds, nil
}

// AdmitBefore decides with the Limiter's AdmitBefore and reports.
func (a *Admitter) AdmitBefore(ctx context.Context, src limit.Source, events []limit.Event, before time.Time) ([]limit.Decision, error) {
	ds, err := a.Limiter.AdmitBefore(ctx, src, events, before)
	if err != nil {
		return nil, err
	}
	a.report(events, ds)
	return ds, nil
}

// report counts the decisions under overrides, logs (at debug level) the
// first decision of each tenant under each override version, and tallies.
// Without debug logging it keeps no trace and takes no lock: a batch under
// overrides costs a count per event, not a map look-up. With it, it takes
// the trace's lock once per batch, and looks up a tenant only when its
// version differs from the event before's.
func (a *Admitter) report(events []limit.Event, ds []limit.Decision) {
	if a.Tally != nil {
		a.Tally.Record(limit.Tenants(events), ds)
	}
	debug := a.Log.Enabled(context.Background(), slog.LevelDebug)
	var n [5]int
	var first []int // the decisions to log: a tenant's first under a version
	locked := false
	last, lastV := "", int64(0)
	for i, d := range ds {
		if d.Override == 0 {
			continue
		}
		if int(d.Kind) < len(n) {
			n[d.Kind]++
		}
		if !debug {
			continue
		}
		t := events[i].Tenant
		if d.Override == lastV && t == last {
			continue
		}
		last, lastV = t, d.Override
		if !locked {
			a.mu.Lock()
			locked = true
		}
		if a.logged[t] != d.Override {
			if len(a.logged) >= 1<<20 {
				clear(a.logged)
			}
			a.logged[t] = d.Override
			first = append(first, i)
		}
	}
	if locked {
		a.mu.Unlock()
	}
	for _, i := range first {
		a.Log.Debug("deciding under override", slog.String("tenant", events[i].Tenant), slog.Int64("override_version", ds[i].Override),
			slog.String("first_decision", ds[i].Kind.String()))
	}
	for k, c := range n {
		if c > 0 && a.m.under[k] != nil {
			a.m.under[k].Add(float64(c))
		}
	}
}

// shadow decides the events of the tenants with a shadow override with the
// Shadow limiter, counts and tallies what it would have done. Its errors
// are counted and logged, never the batch's.
func (a *Admitter) shadow(ctx context.Context, events []limit.Event) {
	if a.Shadow == nil {
		return
	}
	rules := a.Shadow.Rules()
	if rules.Overridden() == 0 {
		return
	}
	var se []limit.Event
	for _, e := range events {
		if rules.OverrideVersion(e.Tenant) != 0 {
			se = append(se, e)
		}
	}
	if len(se) == 0 {
		return
	}
	ds, err := a.Shadow.AdmitFrom(ctx, limit.Source{}, se)
	if err != nil {
		a.m.shadow.WithLabelValues("error").Inc()
		a.Log.Warn("shadow override check failed (nothing enforced depends on it)", slog.String("err", err.Error()))
		return
	}
	var n [5]int
	for _, d := range ds {
		if int(d.Kind) < len(n) {
			n[d.Kind]++
		}
	}
	for k, c := range n {
		if c > 0 {
			a.m.shadow.WithLabelValues(limit.Kind(k).String()).Add(float64(c))
		}
	}
	if a.Tally != nil {
		a.Tally.RecordShadow(limit.Tenants(se), ds)
	}
}
