package worker

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// fakeUsage records the tenants asked for and answers with rules or err.
// Safe for concurrent use.
type fakeUsage struct {
	mu      sync.Mutex
	tenants []string
	rules   []limit.Usage
	err     error
}

func (f *fakeUsage) Usage(_ context.Context, tenant string) ([]limit.Usage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tenants = append(f.tenants, tenant)
	return f.rules, f.err
}

func (f *fakeUsage) lastTenant() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.tenants) == 0 {
		return "<none>"
	}
	return f.tenants[len(f.tenants)-1]
}

func newTestServer(t *testing.T, c httpConfig) *httptest.Server {
	t.Helper()
	if c.Gatherer == nil {
		c.Gatherer = prometheus.NewRegistry()
	}
	if c.Log == nil {
		c.Log = testenv.DiscardLogger()
	}
	srv := httptest.NewServer(newHandler(c))
	t.Cleanup(srv.Close)
	return srv
}

// get sends GET with the raw (already escaped) path and returns status and body.
func get(t *testing.T, srv *httptest.Server, rawPath string, header ...string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL+rawPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body), resp.Header
}

func TestHealthz(t *testing.T) {
	srv := newTestServer(t, httpConfig{})
	if code, body, _ := get(t, srv, "/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("got %d %q, want 200 ok", code, body)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "gatekeeper_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	srv := newTestServer(t, httpConfig{Gatherer: reg, Registerer: reg})
	code, body, _ := get(t, srv, "/metrics")
	if code != 200 || !strings.Contains(body, "gatekeeper_test_total 3") {
		t.Errorf("got %d, body:\n%s\nwant 200 with gatekeeper_test_total 3", code, body)
	}
}

// passingCheck, failingCheck and hangingCheck are readiness checks that
// pass, fail with err, and wait for their context to end.
func passingCheck(name string) readyCheck {
	return readyCheck{Name: name, Check: func(context.Context) error { return nil }}
}

func failingCheck(name string, err error) readyCheck {
	return readyCheck{Name: name, Check: func(context.Context) error { return err }}
}

func hangingCheck(name string) readyCheck {
	return readyCheck{Name: name, Check: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }}
}

func TestReadyz(t *testing.T) {
	ok := passingCheck("redis")
	down := failingCheck("kafka", errors.New("dial tcp: refused\nsecond line"))
	slow := hangingCheck("slow")
	tests := []struct {
		name     string
		checks   []readyCheck
		wantCode int
		wantBody string
	}{
		{"all pass", []readyCheck{ok}, 200, "[+]redis ok\nready\n"},
		{"none", nil, 200, "ready\n"},
		{"one fails", []readyCheck{ok, down}, 503, "[+]redis ok\n[-]kafka failed: dial tcp: refused; second line\nnot ready\n"},
		{"timeout", []readyCheck{slow}, 503, "[-]slow failed: context deadline exceeded\nnot ready\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newTestServer(t, httpConfig{Ready: newReadiness(tt.checks, 50*time.Millisecond, readyMaxAge)})
			code, body, _ := get(t, srv, "/readyz")
			if code != tt.wantCode || body != tt.wantBody {
				t.Errorf("got %d %q, want %d %q", code, body, tt.wantCode, tt.wantBody)
			}
		})
	}
}

func TestUsageTenants(t *testing.T) {
	reset := time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC)
	fake := &fakeUsage{rules: []limit.Usage{{Rule: "100/1m", Count: 7, Limit: 100, Remaining: 93, Reset: reset}}}
	srv := newTestServer(t, httpConfig{Usage: fake.Usage})
	tests := []struct {
		path       string // escaped, after /v1/usage/
		wantTenant string // what the limiter is asked for
	}{
		{"acme", "acme"},
		{"acme%2Fsub", "acme/sub"},
		{"acme/sub", "acme/sub"},
		{"a%2F%2Fb", "a//b"},
		{"with%20space", "with space"},
		{"a+b", "a+b"},
		{"caf%C3%A9", "caf\u00e9"},
		{"%E7%A7%9F%E6%88%B7", "\u79df\u6237"},
		{"%FF%00%01", "\xff\x00\x01"},
		{"%2E%2E", ".."},
		{"%25", "%"},
		{"%3Fq%23x", "?q#x"},
		{"weird%20tenant%2Fwith:chars", "weird tenant/with:chars"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			code, body, h := get(t, srv, "/v1/usage/"+tt.path)
			if code != 200 {
				t.Fatalf("got %d %s, want 200", code, body)
			}
			if got := fake.lastTenant(); got != tt.wantTenant {
				t.Errorf("limiter asked for %q, want %q", got, tt.wantTenant)
			}
			if ct := h.Get("Content-Type"); ct != "application/json" {
				t.Errorf("got Content-Type %q, want application/json", ct)
			}
			var got struct {
				Tenant string `json:"tenant"`
				Rules  []struct {
					Rule                    string
					Count, Limit, Remaining int64
					Reset                   time.Time
				} `json:"rules"`
			}
			if err := json.Unmarshal([]byte(body), &got); err != nil {
				t.Fatalf("body %q: %v", body, err)
			}
			// JSON holds UTF-8 only: other bytes show as U+FFFD.
			if want := strings.ToValidUTF8(tt.wantTenant, "\ufffd"); got.Tenant != want {
				t.Errorf("got tenant %q, want %q", got.Tenant, want)
			}
			if len(got.Rules) != 1 || got.Rules[0].Rule != "100/1m" || got.Rules[0].Count != 7 ||
				got.Rules[0].Limit != 100 || got.Rules[0].Remaining != 93 || !got.Rules[0].Reset.Equal(reset) {
				t.Errorf("got rules %+v, want the fake's", got.Rules)
			}
		})
	}
}

func TestUsageBody(t *testing.T) {
	reset := time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC)
	fake := &fakeUsage{rules: []limit.Usage{
		{Rule: "1000/1m", Unit: "events", Count: 1000, Limit: 1000, Remaining: 0, Reset: reset},
		{Rule: "50000/1d", Unit: "events", Count: 1000, Limit: 50000, Remaining: 49000, Reset: reset.Add(20 * time.Hour)},
	}}
	srv := newTestServer(t, httpConfig{Usage: fake.Usage})
	_, body, _ := get(t, srv, "/v1/usage/acme")
	want := `{"tenant":"acme","rules":[` +
		`{"rule":"1000/1m","unit":"events","count":1000,"limit":1000,"remaining":0,"reset":"2030-01-02T03:04:00Z"},` +
		`{"rule":"50000/1d","unit":"events","count":1000,"limit":50000,"remaining":49000,"reset":"2030-01-02T23:04:00Z"}]}` + "\n"
	if diff := cmp.Diff(want, body); diff != "" {
		t.Errorf("body (-want +got):\n%s", diff)
	}

	// A tenant without rules has an empty list, not null.
	fake.rules = nil
	_, body, _ = get(t, srv, "/v1/usage/free")
	if want := `{"tenant":"free","rules":[]}` + "\n"; body != want {
		t.Errorf("got %q, want %q", body, want)
	}
}

func TestUsageErrors(t *testing.T) {
	fake := &fakeUsage{err: errors.New("dial tcp 127.0.0.1:6379: connection refused")}
	srv := newTestServer(t, httpConfig{Usage: fake.Usage})
	tests := []struct {
		name, path string
		wantCode   int
		wantErrIn  string
	}{
		{"redis down", "/v1/usage/acme", 503, "connection refused"},
		{"empty tenant", "/v1/usage/", 400, "empty tenant"},
		{"long tenant", "/v1/usage/" + strings.Repeat("x", 257), 400, "256"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body, h := get(t, srv, tt.path)
			if code != tt.wantCode {
				t.Errorf("got %d, want %d", code, tt.wantCode)
			}
			var e errorResponse
			if err := json.Unmarshal([]byte(body), &e); err != nil || !strings.Contains(e.Error, tt.wantErrIn) {
				t.Errorf("got body %q (%v), want a JSON error containing %q", body, err, tt.wantErrIn)
			}
			if ct := h.Get("Content-Type"); ct != "application/json" {
				t.Errorf("got Content-Type %q, want application/json", ct)
			}
		})
	}
	// 256 bytes is still a tenant.
	if code, _, _ := get(t, srv, "/v1/usage/"+strings.Repeat("x", 256)); code != 503 {
		t.Errorf("256-byte tenant: got %d, want 503 (reached the limiter)", code)
	}
	// Other methods are refused.
	resp, err := srv.Client().Post(srv.URL+"/v1/usage/acme", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: got %d, want 405", resp.StatusCode)
	}
}

func TestUsageToken(t *testing.T) {
	fake := &fakeUsage{}
	srv := newTestServer(t, httpConfig{Usage: fake.Usage, AdminToken: "s3cret"})
	tests := []struct {
		name     string
		header   []string
		wantCode int
	}{
		{"no header", nil, 401},
		{"wrong token", []string{"Authorization", "Bearer nope"}, 401},
		{"prefix of token", []string{"Authorization", "Bearer s3cre"}, 401},
		{"longer token", []string{"Authorization", "Bearer s3crets"}, 401},
		{"wrong scheme", []string{"Authorization", "Basic s3cret"}, 401},
		{"no scheme", []string{"Authorization", "s3cret"}, 401},
		{"empty bearer", []string{"Authorization", "Bearer "}, 401},
		{"right token", []string{"Authorization", "Bearer s3cret"}, 200},
		{"scheme in lower case", []string{"Authorization", "bearer s3cret"}, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body, h := get(t, srv, "/v1/usage/acme", tt.header...)
			if code != tt.wantCode {
				t.Errorf("got %d %s, want %d", code, body, tt.wantCode)
			}
			if code == 401 {
				if h.Get("WWW-Authenticate") == "" {
					t.Error("401 without WWW-Authenticate")
				}
				if strings.Contains(body, "s3cret") {
					t.Errorf("401 body shows the token: %s", body)
				}
			}
		})
	}
	// The token guards only the usage API.
	if code, _, _ := get(t, srv, "/healthz"); code != 200 {
		t.Errorf("healthz with a token set: got %d, want 200", code)
	}
}

func TestServeHTTPGraceful(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/slow", func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-release
		io.WriteString(w, "done")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	served := make(chan error, 1)
	go func() { served <- serveHTTP(stop, newHTTPServer(mux, testenv.DiscardLogger()), ln, 5*time.Second) }()

	got := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String() + "/slow")
		if err != nil {
			got <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		got <- string(b)
	}()
	<-entered
	close(stop)
	time.Sleep(50 * time.Millisecond) // shutdown has begun and waits for /slow
	close(release)
	if body := <-got; body != "done" {
		t.Errorf("in-flight request: got %q, want done", body)
	}
	if err := <-served; err != nil {
		t.Errorf("serveHTTP: got %v, want nil", err)
	}
	if _, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		t.Error("still listening after shutdown")
	}
}

func TestNewHTTPServerTimeouts(t *testing.T) {
	s := newHTTPServer(http.NotFoundHandler(), testenv.DiscardLogger())
	if s.ReadHeaderTimeout <= 0 || s.ReadTimeout <= 0 || s.WriteTimeout <= 0 || s.IdleTimeout <= 0 || s.MaxHeaderBytes <= 0 {
		t.Errorf("got %+v, want every timeout and the header limit set", s)
	}
}

// PPROF serves Go's profiles under /debug/pprof/, behind the admin token;
// without it they are not served at all.
func TestPprof(t *testing.T) {
	const token = "0123456789abcdef-token"
	off := newTestServer(t, httpConfig{AdminToken: token})
	if code, _, _ := get(t, off, "/debug/pprof/heap", "Authorization", "Bearer "+token); code != http.StatusNotFound {
		t.Errorf("pprof off: got %d, want 404", code)
	}
	on := newTestServer(t, httpConfig{AdminToken: token, Pprof: true})
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/profile?seconds=1"} {
		if code, _, _ := get(t, on, path); code != http.StatusUnauthorized {
			t.Errorf("%s without token: got %d, want 401", path, code)
		}
	}
	if code, body, _ := get(t, on, "/debug/pprof/", "Authorization", "Bearer "+token); code != http.StatusOK || !strings.Contains(body, "allocs") {
		t.Errorf("index with token: got %d %.80q, want 200 listing allocs", code, body)
	}
	code, body, h := get(t, on, "/debug/pprof/allocs", "Authorization", "Bearer "+token)
	if code != http.StatusOK || h.Get("Content-Type") != "application/octet-stream" || len(body) == 0 {
		t.Errorf("allocs with token: got %d %q, %d bytes; want 200, a profile", code, h.Get("Content-Type"), len(body))
	}
	open := newTestServer(t, httpConfig{Pprof: true})
	if code, _, _ := get(t, open, "/debug/pprof/goroutine?debug=1"); code != http.StatusOK {
		t.Errorf("no token configured: got %d, want 200", code)
	}
}
