package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/override"
	"github.com/gatekeeper-dev/gatekeeper/internal/top"
)

// Paths of the override API, the audit and the top view.
const (
	overridesPath = "/v1/overrides"
	auditPath     = "/v1/audit"
	topPath       = "/v1/tenants/top"
)

// maxOverrideBody bounds the body of a PUT.
const maxOverrideBody = 64 << 10

// overrideAPI serves the live overrides, their audit and the top view.
// Safe for concurrent use.
type overrideAPI struct {
	live    func() *live          // nil until started
	limiter func() *limit.Limiter // nil until started
	kind    limit.WindowKind
	rdb     func() redis.UniversalClient
	prefix  string
	timeout time.Duration
	log     *slog.Logger
}

func (a *overrideAPI) routes(mux *http.ServeMux, auth func(string, http.Handler) http.Handler) {
	h := func(scope string, f func(http.ResponseWriter, *http.Request, *live)) http.Handler {
		return auth(scope, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			l := a.live()
			if l == nil {
				writeJSON(w, http.StatusServiceUnavailable, errorResponse{Error: errNotStarted.Error()})
				return
			}
			f(w, r, l)
		}))
	}
	mux.Handle("GET "+overridesPath, h(ScopeRead, a.list))
	mux.Handle("GET "+overridesPath+"/{tenant...}", h(ScopeRead, a.get))
	mux.Handle("PUT "+overridesPath+"/{tenant...}", h(ScopeWrite, a.put))
	mux.Handle("DELETE "+overridesPath+"/{tenant...}", h(ScopeWrite, a.delete))
	mux.Handle("GET "+auditPath, h(ScopeRead, a.audit))
	mux.Handle("GET "+topPath, h(ScopeRead, a.top))
}

// OverrideView is an override as the API shows it, with the rules the
// tenant has without it and the version this replica applies; with a
// capacity, the tenant's share in force (and, for a shadow override with
// a weight or floors, what that share would give it now).
type OverrideView struct {
	Override       *override.Record `json:"override"`
	BaseRules      []string         `json:"base_rules"`
	RulesInForce   []string         `json:"rules_in_force"`
	BaseShare      []string         `json:"base_share,omitempty"`
	ShareInForce   []string         `json:"share_in_force,omitempty"`
	AppliedVersion int64            `json:"applied_version"`
	// Capacity is the tenant's part of each capacity rule now (none
	// without a capacity); ShadowCapacity the same under a shadow
	// override's share: its entitlement at the current level.
	Capacity       []limit.CapacityShare `json:"capacity,omitempty"`
	ShadowCapacity []limit.CapacityShare `json:"shadow_capacity,omitempty"`
}

// OverrideWrite is the body of PUT /v1/overrides/{tenant}.
type OverrideWrite struct {
	Rules  []string `json:"rules"`
	Reason string   `json:"reason"`
	// Version is the tenant's current version (0: it has none); required.
	Version *int64 `json:"version"`
	// ExpiresIn (a Go duration) or ExpiresAt ends the override.
	ExpiresIn string     `json:"expires_in,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	Shadow    bool       `json:"shadow,omitempty"`
	// KeepRules, Weight and Floors: see override.Record.
	KeepRules bool     `json:"keep_rules,omitempty"`
	Weight    int64    `json:"weight,omitempty"`
	Floors    []string `json:"floors,omitempty"`
	// DryRun: check and show, write nothing.
	DryRun bool `json:"dry_run,omitempty"`
}

// DryRun is the answer to a dry run: the tenant's current usage under the
// rules in force and under the override's rules; with a capacity, its
// share of it (booked, share, entitlement at the current level) under its
// share in force and under the override's.
type DryRun struct {
	DryRun         bool                  `json:"dry_run"`
	Tenant         string                `json:"tenant"`
	Before         []limit.Usage         `json:"before"`
	After          []limit.Usage         `json:"after"`
	CapacityBefore []limit.CapacityShare `json:"capacity_before,omitempty"`
	CapacityAfter  []limit.CapacityShare `json:"capacity_after,omitempty"`
	Record         override.Record       `json:"override"`
	Current        int64                 `json:"current_version"`
}

// pathTenant returns the escaped path after prefix+"/", unescaped once.
func pathTenant(r *http.Request, prefix string) (string, error) {
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), prefix+"/")
	if !ok {
		return "", errors.New("no tenant in the path")
	}
	t, err := url.PathUnescape(rest)
	if err != nil {
		return "", fmt.Errorf("bad escape in tenant: %w", err)
	}
	if err := limit.CheckTenant(t); err != nil {
		return "", err
	}
	return t, nil
}

func (a *overrideAPI) view(r *http.Request, l *live, tenant string, rec *override.Record) (OverrideView, error) {
	snap, rules := l.Layers.Current()
	v := OverrideView{Override: rec, BaseRules: limit.RuleStrings(rules.Base().For(tenant)), RulesInForce: limit.RuleStrings(rules.For(tenant))}
	if snap != nil {
		v.AppliedVersion = snap.Version
	}
	lim := a.limiter()
	if lim == nil || len(lim.Capacity()) == 0 {
		return v, nil
	}
	v.BaseShare, v.ShareInForce = rules.Base().Share(tenant).Items(), rules.Share(tenant).Items()
	var err error
	if v.Capacity, err = lim.CapacityUsage(r.Context(), tenant); err != nil {
		return v, err
	}
	if rec != nil && rec.Shadow && rec.HasShare() {
		s, err := rec.Share()
		if err != nil {
			return v, err
		}
		if v.ShadowCapacity, err = lim.CapacityUsageUnder(r.Context(), tenant, *s); err != nil {
			return v, err
		}
	}
	return v, nil
}

func (a *overrideAPI) fail(w http.ResponseWriter, r *http.Request, err error) {
	var stale *override.StaleError
	var floors *override.FloorsError
	switch {
	case errors.As(err, &floors):
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: err.Error()})
	case errors.As(err, &stale):
		writeJSON(w, http.StatusConflict, map[string]any{"error": err.Error(), "current_version": stale.Current})
	case errors.Is(err, override.ErrNotFound):
		writeJSON(w, http.StatusNotFound, errorResponse{Error: err.Error()})
	default:
		a.log.LogAttrs(r.Context(), slog.LevelWarn, "override API failed", slog.String("path", r.URL.Path), slog.String("err", err.Error()))
		writeJSON(w, http.StatusServiceUnavailable, errorResponse{Error: "overrides unavailable: " + OneLine(err.Error())})
	}
}

func (a *overrideAPI) get(w http.ResponseWriter, r *http.Request, l *live) {
	tenant, err := pathTenant(r, overridesPath)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: err.Error()})
		return
	}
	rec, err := l.Store.Get(r.Context(), tenant)
	var v OverrideView
	switch {
	case errors.Is(err, override.ErrNotFound):
		v, err = a.view(r, l, tenant, nil)
	case err == nil:
		v, err = a.view(r, l, tenant, &rec)
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// OverrideList is the body of GET /v1/overrides.
type OverrideList struct {
	Overrides      []override.Record `json:"overrides"`
	NextCursor     uint64            `json:"next_cursor"`
	AppliedVersion int64             `json:"applied_version"`
}

func (a *overrideAPI) list(w http.ResponseWriter, r *http.Request, l *live) {
	q := r.URL.Query()
	cursor, err := strconv.ParseUint(cmpOr(q.Get("cursor"), "0"), 10, 64)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: "cursor: not a whole number"})
		return
	}
	count, err := strconv.ParseInt(cmpOr(q.Get("count"), "100"), 10, 64)
	if err != nil || count < 1 || count > 1000 {
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: "count: want 1 to 1000"})
		return
	}
	recs, next, err := l.Store.List(r.Context(), cursor, count)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	out := OverrideList{Overrides: recs, NextCursor: next}
	if snap, _ := l.Layers.Current(); snap != nil {
		out.AppliedVersion = snap.Version
	}
	writeJSON(w, http.StatusOK, out)
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// record turns a write's body into the record to store, checked (its
// share against the capacity and the rules in force on this replica).
func (a *overrideAPI) record(r *http.Request, l *live, tenant string, body OverrideWrite, now time.Time) (override.Record, error) {
	rec := override.Record{Tenant: tenant, Rules: body.Rules, KeepRules: body.KeepRules, Shadow: body.Shadow,
		Weight: body.Weight, Floors: body.Floors, Reason: body.Reason, By: TokenName(r.Context())}
	if rec.Rules == nil {
		rec.Rules = []string{}
	}
	switch {
	case body.ExpiresIn != "" && body.ExpiresAt != nil:
		return rec, errors.New("expires_in and expires_at: give one")
	case body.ExpiresIn != "":
		d, err := time.ParseDuration(body.ExpiresIn)
		if err != nil || d <= 0 {
			return rec, fmt.Errorf("expires_in: %q is not a positive duration (e.g. 30m, 2h)", body.ExpiresIn)
		}
		at := now.Add(d).UTC().Truncate(time.Millisecond)
		rec.Expires = &at
	case body.ExpiresAt != nil:
		at := body.ExpiresAt.UTC().Truncate(time.Millisecond)
		rec.Expires = &at
	}
	if body.Version == nil {
		return rec, errors.New("version: required: the tenant's current version (0 when it has no override), from GET " + overridesPath + "/{tenant}")
	}
	if _, err := rec.Check(now, a.kind); err != nil {
		return rec, err
	}
	if rec.HasShare() {
		var c limit.Capacity
		if lim := a.limiter(); lim != nil {
			c = lim.Capacity()
		}
		// The sum of all floors is checked by the write's script, against
		// the overrides in Redis (this replica's copy may lag another's
		// write by a poll); here the floors alone, and for a dry run
		// against the rules in force on this replica.
		var inForce *limit.Rules
		if body.DryRun {
			_, inForce = l.Layers.Current()
		}
		if err := rec.CheckCapacity(c, inForce); err != nil {
			return rec, err
		}
	}
	return rec, nil
}

func (a *overrideAPI) put(w http.ResponseWriter, r *http.Request, l *live) {
	tenant, err := pathTenant(r, overridesPath)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: err.Error()})
		return
	}
	var body OverrideWrite
	dec := json.NewDecoder(io.LimitReader(r.Body, maxOverrideBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: "body: " + OneLine(err.Error())})
		return
	}
	rec, err := a.record(r, l, tenant, body, time.Now())
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: err.Error()})
		return
	}
	if body.DryRun {
		a.dryRun(w, r, l, rec)
		return
	}
	out, err := l.Store.Set(r.Context(), rec, *body.Version)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.Info("override set", slog.String("tenant", tenant), slog.Int64("version", out.Version), slog.String("by", out.By),
		slog.String("rules", strings.Join(out.Rules, ",")), slog.Bool("keep_rules", out.KeepRules), slog.Int64("weight", out.Weight),
		slog.String("floors", strings.Join(out.Floors, ",")), slog.Bool("shadow", out.Shadow), slog.String("reason", out.Reason))
	writeJSON(w, http.StatusOK, out)
}

// dryRun answers with the tenant's usage now under the rules in force and
// under rec's rules, and its share of the capacity under its share in
// force and under rec's; nothing is written.
func (a *overrideAPI) dryRun(w http.ResponseWriter, r *http.Request, l *live, rec override.Record) {
	lim := a.limiter()
	if lim == nil {
		writeJSON(w, http.StatusServiceUnavailable, errorResponse{Error: "limiter not started"})
		return
	}
	rules, err := limit.ParseRuleList(rec.Rules)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: err.Error()})
		return
	}
	if rec.KeepRules {
		rules = lim.Rules().Base().For(rec.Tenant)
	}
	share := lim.Rules().Share(rec.Tenant)
	if rec.HasShare() {
		s, err := rec.Share()
		if err != nil {
			writeJSON(w, http.StatusBadRequest, errorResponse{Error: err.Error()})
			return
		}
		share = *s
	}
	out := DryRun{DryRun: true, Tenant: rec.Tenant, Record: rec}
	if out.Before, err = lim.Usage(r.Context(), rec.Tenant); err == nil {
		out.After, err = lim.UsageUnder(r.Context(), rec.Tenant, rules)
	}
	if err == nil {
		out.CapacityBefore, err = lim.CapacityUsage(r.Context(), rec.Tenant)
	}
	if err == nil {
		out.CapacityAfter, err = lim.CapacityUsageUnder(r.Context(), rec.Tenant, share)
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if cur, err := l.Store.Get(r.Context(), rec.Tenant); err == nil {
		out.Current = cur.Version
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *overrideAPI) delete(w http.ResponseWriter, r *http.Request, l *live) {
	tenant, err := pathTenant(r, overridesPath)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: err.Error()})
		return
	}
	q := r.URL.Query()
	ver, err := strconv.ParseInt(q.Get("version"), 10, 64)
	if err != nil || ver < 1 {
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: "version: required, the override's current version"})
		return
	}
	rec := override.Record{Tenant: tenant, Rules: []string{}, Reason: q.Get("reason"), By: TokenName(r.Context())}
	if _, err := rec.Check(time.Now(), a.kind); err != nil {
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: err.Error()})
		return
	}
	v, err := l.Store.Delete(r.Context(), tenant, ver, rec.By, rec.Reason)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.Info("override deleted", slog.String("tenant", tenant), slog.Int64("version", v), slog.String("by", rec.By), slog.String("reason", rec.Reason))
	writeJSON(w, http.StatusOK, map[string]any{"tenant": tenant, "deleted": true, "version": v})
}

// AuditResponse is the body of GET /v1/audit.
type AuditResponse struct {
	Entries []override.Entry `json:"entries"`
}

func (a *overrideAPI) audit(w http.ResponseWriter, r *http.Request, l *live) {
	q := r.URL.Query()
	count, err := strconv.Atoi(cmpOr(q.Get("count"), "50"))
	if err != nil || count < 1 || count > 1000 {
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: "count: want 1 to 1000"})
		return
	}
	es, err := l.Store.Audit(r.Context(), q.Get("tenant"), count)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, AuditResponse{Entries: es})
}

// TopRow is a tenant of the top view with its rules in force and its
// override on the replica that answers.
type TopRow struct {
	top.Row
	Rules    []string         `json:"rules"`
	Override *override.Record `json:"override,omitempty"`
}

// TopTable is one window of the top view.
type TopTable struct {
	Start time.Time  `json:"start"`
	Rows  []TopRow   `json:"rows"`
	Other top.Counts `json:"other"`
}

// TopResponse is the body of GET /v1/tenants/top.
type TopResponse struct {
	Window   string   `json:"window"`
	Replicas int      `json:"replicas"`
	Sort     string   `json:"sort"`
	Current  TopTable `json:"current"`
	Last     TopTable `json:"last"`
}

func (a *overrideAPI) top(w http.ResponseWriter, r *http.Request, l *live) {
	q := r.URL.Query()
	count, err := strconv.Atoi(cmpOr(q.Get("count"), "20"))
	if err != nil || count < 1 || count > 200 {
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: "count: want 1 to 200"})
		return
	}
	by := cmpOr(q.Get("sort"), "deferred")
	switch by {
	case "deferred", "rejected", "admitted", "waiting":
	default:
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: "sort: want deferred, rejected, admitted or waiting"})
		return
	}
	m, err := top.Read(r.Context(), a.rdb(), a.prefix, a.timeout)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	snap, rules := l.Layers.Current()
	table := func(t top.Table) TopTable {
		top.SortRows(t.Rows, by)
		out := TopTable{Start: t.Start, Other: t.Other, Rows: []TopRow{}}
		for i, row := range t.Rows {
			if i == count {
				break
			}
			tr := TopRow{Row: row, Rules: limit.RuleStrings(rules.For(row.Tenant))}
			if snap != nil {
				if rec, ok := snap.Records[row.Tenant]; ok && !rec.Expired(time.Now()) {
					tr.Override = &rec
				}
			}
			out.Rows = append(out.Rows, tr)
		}
		return out
	}
	writeJSON(w, http.StatusOK, TopResponse{Window: m.Window, Replicas: m.Replicas, Sort: by, Current: table(m.Current), Last: table(m.Last)})
}
