package override

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

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
		under: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gatekeeper_override_decisions_total",
			Help: "Events decided under a live override, by decision."}, []string{"decision"}),
		shadow: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gatekeeper_override_shadow_decisions_total",
			Help: "What shadow overrides would have decided (not enforced), by decision; errors counts failed shadow calls."}, []string{"decision"}),
	}
	for _, k := range []string{"admit", "defer", "reject", "fail"} {
		m.under.WithLabelValues(k)
		m.shadow.WithLabelValues(k)
	}
	m.shadow.WithLabelValues("error")
	if reg != nil {
		for _, c := range []prometheus.Collector{m.under, m.shadow} {
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
	under, shadow *prometheus.CounterVec
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

// report counts the decisions under overrides, logs the first decision of
// each tenant under each override version, and tallies.
func (a *Admitter) report(events []limit.Event, ds []limit.Decision) {
	if a.Tally != nil {
		a.Tally.Record(limit.Tenants(events), ds)
	}
	var n [5]int
	any := false
	for i, d := range ds {
		if d.Override == 0 {
			continue
		}
		any = true
		if int(d.Kind) < len(n) {
			n[d.Kind]++
		}
		a.trace(events[i].Tenant, d)
	}
	if !any {
		return
	}
	for k, c := range n {
		if c > 0 {
			a.m.under.WithLabelValues(limit.Kind(k).String()).Add(float64(c))
		}
	}
}

// trace logs the first decision of tenant under an override version.
func (a *Admitter) trace(tenant string, d limit.Decision) {
	a.mu.Lock()
	seen := a.logged[tenant] == d.Override
	if !seen {
		a.logged[tenant] = d.Override
		if len(a.logged) > 1<<20 {
			clear(a.logged)
		}
	}
	a.mu.Unlock()
	if !seen {
		a.Log.Debug("deciding under override", slog.String("tenant", tenant), slog.Int64("override_version", d.Override),
			slog.String("first_decision", d.Kind.String()))
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
