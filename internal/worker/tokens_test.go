package worker

import (
	"net/http"
	"strings"
	"testing"
)

func TestAdminTokensConfig(t *testing.T) {
	long := "0123456789abcdefXYZ"
	for _, c := range []struct {
		tokens, wantErr string
	}{
		{"", ""},
		{"ops:write:" + long + ",viewer:read:" + long + "2", ""},
		{"ops:write", "want NAME:SCOPE:TOKEN"},
		{"ops:admin:" + long, `scope "admin" is not read or write`},
		{"ops:read:short", "at least 16 bytes"},
		{"ops:read:" + long + ",ops:write:" + long + "2", `name "ops" given twice`},
		{"admin:read:" + long + "2", `name "admin" given twice`},
		{"a b:read:" + long, "want 1 to 64"},
		{"ops:read:" + long + ",dev:read:" + long, `the same token as "ops"`},
		{"ops:read:REPLACE-ME-0123456789", "placeholder"},
	} {
		t.Run(c.tokens, func(t *testing.T) {
			setEnv(t, with(minimal(), "ADMIN_TOKEN", "the-admin-token-0123", "ADMIN_TOKENS", c.tokens))
			_, err := LoadConfig()
			switch {
			case c.wantErr == "" && err != nil:
				t.Fatalf("got %v, want no error", err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr) || !strings.HasPrefix(err.Error(), "GATEKEEPER_ADMIN_TOKENS: ")):
				t.Fatalf("got %v, want GATEKEEPER_ADMIN_TOKENS: ...%s", err, c.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), long) {
				t.Errorf("the error shows a token: %v", err)
			}
		})
	}
}

func TestTokenScopes(t *testing.T) {
	cfg := Config{HTTPConfig: HTTPConfig{AdminToken: "the-admin-token-0123", AdminTokens: "viewer:read:viewer-token-0123456,ops:write:ops-token-0123456789"}}
	tokens, err := cfg.apiTokens()
	if err != nil {
		t.Fatal(err)
	}
	var who string
	h := func(scope string) http.Handler {
		return httpConfig{Tokens: tokens}.requireScope(scope, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			who = TokenName(r.Context())
		}))
	}
	for _, c := range []struct {
		scope, token string
		status       int
		who          string
	}{
		{ScopeRead, "viewer-token-0123456", 200, "viewer"},
		{ScopeWrite, "viewer-token-0123456", 403, ""},
		{ScopeWrite, "ops-token-0123456789", 200, "ops"},
		{ScopeWrite, "the-admin-token-0123", 200, "admin"},
		{ScopeRead, "wrong-token-0123456789", 401, ""},
		{ScopeRead, "", 401, ""},
	} {
		who = ""
		rec := &statusRecorder{header: http.Header{}}
		req, _ := http.NewRequest(http.MethodGet, "/x", nil)
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		h(c.scope).ServeHTTP(rec, req)
		if rec.status == 0 {
			rec.status = 200
		}
		if rec.status != c.status || who != c.who {
			t.Errorf("%s with %q: got %d as %q, want %d as %q", c.scope, c.token, rec.status, who, c.status, c.who)
		}
	}
	// No token at all: reads open, writes refused.
	open := httpConfig{}.requireScope(ScopeWrite, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("write let through without tokens") }))
	rec := &statusRecorder{header: http.Header{}}
	req, _ := http.NewRequest(http.MethodPut, "/x", nil)
	open.ServeHTTP(rec, req)
	if rec.status != http.StatusForbidden {
		t.Errorf("write without tokens: got %d, want 403", rec.status)
	}
}

type statusRecorder struct {
	header http.Header
	status int
}

func (r *statusRecorder) Header() http.Header         { return r.header }
func (r *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *statusRecorder) WriteHeader(s int)           { r.status = s }
