package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/route"
)

// usagePath is the prefix of the usage API; the tenant follows, escaped.
const usagePath = "/v1/usage/"

// readyCheck is one dependency of readiness. Check must be safe for
// concurrent use and return nil when the dependency is usable.
type readyCheck struct {
	Name  string
	Check func(ctx context.Context) error
}

// usageFunc returns the usage of a tenant; limiter.Usage has this shape.
// A non-nil error means the counters could not be read (Redis trouble).
type usageFunc func(ctx context.Context, tenant string) ([]limit.Usage, error)

// httpConfig is what the HTTP handler serves.
type httpConfig struct {
	Gatherer   prometheus.Gatherer
	Registerer prometheus.Registerer // for promhttp's own metrics; may be nil
	// Ready runs the readiness checks of /readyz; nil: no checks.
	Ready *readiness
	Usage usageFunc
	// Capacity returns the tenant's share of the capacity; nil: none.
	Capacity   func(ctx context.Context, tenant string) ([]limit.CapacityShare, error)
	AdminToken string // empty: the usage API is open
	// Tokens are the API's tokens (ADMIN_TOKEN and ADMIN_TOKENS); when
	// empty, AdminToken alone is.
	Tokens []apiToken
	// Overrides serves the override API; nil: not served.
	Overrides *overrideAPI
	// Capacities serves the capacity's pacing and cap API and its line in
	// /readyz; nil: not served.
	Capacities *capacityAPI
	// Pprof serves net/http/pprof under /debug/pprof/, behind AdminToken.
	Pprof bool
	Log   *slog.Logger
}

// UsageResponse is the body of GET /v1/usage/{tenant}. Tenants are opaque
// bytes; JSON shows bytes that are not UTF-8 as U+FFFD.
type UsageResponse struct {
	Tenant string        `json:"tenant"`
	Rules  []limit.Usage `json:"rules"`
	// Capacity is the tenant's share of each capacity rule (with a capacity).
	Capacity []limit.CapacityShare `json:"capacity,omitempty"`
}

type errorResponse struct {
	Error string `json:"error"`
}

// newHandler returns the handler of /metrics, /healthz, /readyz,
// GET /v1/usage/{tenant} and, with Pprof, /debug/pprof/ (pprof.Index
// serves the named profiles: heap, allocs, goroutine, ...).
func newHandler(c httpConfig) http.Handler {
	if c.Ready == nil {
		c.Ready = newReadiness(nil, 0, 0)
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	metrics := promhttp.HandlerFor(c.Gatherer, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(c.Log.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      c.Registerer,
	})
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", c.readyz)
	// {tenant...} takes the rest of the path, so a tenant holding "/" works
	// escaped (%2F) or not; the tenant is unescaped from the escaped path.
	mux.Handle("GET "+usagePath+"{tenant...}", c.requireToken(http.HandlerFunc(c.usage)))
	if c.Overrides != nil {
		c.Overrides.routes(mux, c.requireScope)
	}
	if c.Capacities != nil {
		c.Capacities.routes(mux, c.requireScope)
	}
	if c.Pprof {
		mux.Handle("GET /debug/pprof/", c.requireToken(http.HandlerFunc(pprof.Index)))
		mux.Handle("GET /debug/pprof/profile", c.requireToken(http.HandlerFunc(pprof.Profile)))
		mux.Handle("GET /debug/pprof/trace", c.requireToken(http.HandlerFunc(pprof.Trace)))
	}
	return mux
}

// readyz answers 200 only if every readiness check passes, with results
// at most about a second old (see readiness). The body lists each check:
// "[+]name ok" or "[-]name failed: reason".
func (c httpConfig) readyz(w http.ResponseWriter, r *http.Request) {
	errs, err := c.Ready.results(r.Context())
	if err != nil {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "%s\nnot ready\n", OneLine(err.Error()))
		return
	}
	var b strings.Builder
	status := http.StatusOK
	for i, ch := range c.Ready.checks {
		if errs[i] != nil {
			status = http.StatusServiceUnavailable
			fmt.Fprintf(&b, "[-]%s failed: %s\n", ch.Name, OneLine(errs[i].Error()))
		} else {
			fmt.Fprintf(&b, "[+]%s ok\n", ch.Name)
		}
	}
	if c.Capacities != nil {
		if note := c.Capacities.note(); note != "" {
			fmt.Fprintf(&b, "[i]capacity %s\n", OneLine(note))
		}
	}
	if status == http.StatusOK {
		b.WriteString("ready\n")
	} else {
		b.WriteString("not ready\n")
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

// requireToken lets a request through only with the bearer token of a
// token of any scope, when a token is configured (requireScope).
func (c httpConfig) requireToken(next http.Handler) http.Handler {
	return c.requireScope(ScopeRead, next)
}

// tenantFromPath returns the tenant of a usage request: the escaped path
// after /v1/usage/, unescaped once, so "acme%2Fsub" is "acme/sub" and
// "%FF" is the byte 0xFF.
func tenantFromPath(r *http.Request) (string, error) {
	escaped := r.URL.EscapedPath()
	rest, ok := strings.CutPrefix(escaped, usagePath)
	if !ok {
		return "", errors.New("not a usage path")
	}
	tenant, err := url.PathUnescape(rest)
	if err != nil {
		return "", fmt.Errorf("bad escape in tenant: %w", err)
	}
	return tenant, nil
}

func (c httpConfig) usage(w http.ResponseWriter, r *http.Request) {
	tenant, err := tenantFromPath(r)
	switch {
	case err != nil:
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: err.Error()})
		return
	case tenant == "":
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: "empty tenant: GET /v1/usage/{tenant}, with / in a tenant escaped as %2F"})
		return
	case len(tenant) > route.MaxTenantBytes:
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: fmt.Sprintf("tenant over %d bytes", route.MaxTenantBytes)})
		return
	}
	rules, err := c.Usage(r.Context(), tenant)
	if err != nil {
		c.Log.LogAttrs(r.Context(), slog.LevelWarn, "usage query failed", slog.String("tenant", tenant), slog.String("err", err.Error()))
		writeJSON(w, http.StatusServiceUnavailable, errorResponse{Error: "counters unavailable: " + OneLine(err.Error())})
		return
	}
	if rules == nil {
		rules = []limit.Usage{}
	}
	var shares []limit.CapacityShare
	if c.Capacity != nil {
		if shares, err = c.Capacity(r.Context(), tenant); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, errorResponse{Error: "counters unavailable: " + OneLine(err.Error())})
			return
		}
	}
	writeJSON(w, http.StatusOK, UsageResponse{Tenant: tenant, Rules: rules, Capacity: shares})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// newHTTPServer returns a server of h with timeouts on every phase.
func newHTTPServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// serveHTTP serves on ln until stop is closed, then shuts down gracefully,
// waiting at most grace for requests in flight. It returns nil after a
// clean shutdown.
func serveHTTP(stop <-chan struct{}, srv *http.Server, ln net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-stop:
	}
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("http shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http server: %w", err)
	}
	return nil
}
