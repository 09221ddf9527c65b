package worker

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"
)

// Scopes of API tokens. A write token may also read.
const (
	ScopeRead  = "read"
	ScopeWrite = "write"
)

// AdminTokenName is the name of ADMIN_TOKEN in the audit.
const AdminTokenName = "admin"

// apiToken is one bearer token of the HTTP API: its name (the audit's
// "who"), its scope and the digest of its secret.
type apiToken struct {
	name, scope string
	digest      [sha256.Size]byte
}

// apiTokens returns the tokens of ADMIN_TOKEN (admin:write) and
// ADMIN_TOKENS, checked (checkAdminTokens).
func (c *Config) apiTokens() ([]apiToken, error) {
	var out []apiToken
	if c.AdminToken != "" {
		out = append(out, apiToken{name: AdminTokenName, scope: ScopeWrite, digest: sha256.Sum256([]byte(c.AdminToken))})
	}
	if strings.TrimSpace(c.AdminTokens) == "" {
		return out, nil
	}
	names := map[string]bool{}
	if c.AdminToken != "" {
		names[AdminTokenName] = true
	}
	for i, item := range strings.Split(c.AdminTokens, ",") {
		name, rest, ok1 := strings.Cut(strings.TrimSpace(item), ":")
		scope, secret, ok2 := strings.Cut(rest, ":")
		switch {
		case !ok1 || !ok2:
			return nil, fmt.Errorf("item %d: want NAME:SCOPE:TOKEN", i+1)
		case !tokenName(name):
			return nil, fmt.Errorf("item %d: name %q: want 1 to 64 of A-Z a-z 0-9 . _ -", i+1, name)
		case names[name]:
			return nil, fmt.Errorf("item %d: name %q given twice (ADMIN_TOKEN is %q)", i+1, name, AdminTokenName)
		case scope != ScopeRead && scope != ScopeWrite:
			return nil, fmt.Errorf("token %q: scope %q is not read or write", name, scope)
		case strings.ContainsFunc(secret, func(r rune) bool { return r <= ' ' || r == 0x7f }):
			return nil, fmt.Errorf("token %q: must not hold spaces or control characters", name)
		case strings.HasPrefix(strings.ToUpper(secret), adminTokenPlaceholder):
			return nil, fmt.Errorf("token %q: is a %s... placeholder: set a random token", name, adminTokenPlaceholder)
		case len(secret) < MinAdminTokenBytes:
			return nil, fmt.Errorf("token %q: must be at least %d bytes (e.g. openssl rand -base64 24)", name, MinAdminTokenBytes)
		}
		d := sha256.Sum256([]byte(secret))
		for _, t := range out {
			if t.digest == d {
				return nil, fmt.Errorf("token %q: the same token as %q", name, t.name)
			}
		}
		names[name] = true
		out = append(out, apiToken{name: name, scope: scope, digest: d})
	}
	return out, nil
}

func tokenName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// checkAdminTokens checks ADMIN_TOKENS. The messages name a token by its
// name, never show a secret nor its length.
func (c *Config) checkAdminTokens() error {
	if _, err := c.apiTokens(); err != nil {
		return bad("ADMIN_TOKENS", "%v", err)
	}
	return nil
}

type tokenNameKey struct{}

// TokenName returns the name of the token that authenticated the request
// ("" when the API is open).
func TokenName(ctx context.Context) string {
	s, _ := ctx.Value(tokenNameKey{}).(string)
	return s
}

// requireScope lets a request through only with "Authorization: Bearer
// <token>" of a token whose scope covers scope, and puts the token's name
// in its context. With no token configured, reads are open (with a
// warning at start-up) and writes are refused: an override names who made
// it.
func (c httpConfig) requireScope(scope string, next http.Handler) http.Handler {
	tokens := c.Tokens
	if len(tokens) == 0 && c.AdminToken != "" {
		tokens = []apiToken{{name: AdminTokenName, scope: ScopeWrite, digest: sha256.Sum256([]byte(c.AdminToken))}}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(tokens) == 0 {
			if scope == ScopeWrite {
				writeJSON(w, http.StatusForbidden, errorResponse{Error: "writes need a token: set " + EnvPrefix + "_ADMIN_TOKEN or " + EnvPrefix + "_ADMIN_TOKENS"})
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		got := sha256.Sum256([]byte(strings.TrimSpace(token)))
		var match *apiToken
		for i := range tokens {
			// Every token compared, in constant time each.
			if subtle.ConstantTimeCompare(got[:], tokens[i].digest[:]) == 1 {
				match = &tokens[i]
			}
		}
		if !ok || !strings.EqualFold(scheme, "Bearer") || match == nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="gatekeeper"`)
			writeJSON(w, http.StatusUnauthorized, errorResponse{Error: "missing or wrong bearer token"})
			return
		}
		if scope == ScopeWrite && match.scope != ScopeWrite {
			writeJSON(w, http.StatusForbidden, errorResponse{Error: fmt.Sprintf("token %q has scope %s; this needs write", match.name, match.scope)})
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tokenNameKey{}, match.name)))
	})
}

// The variables of the commands that call the API (gatekeeper override,
// gatekeeper top): the API's base URL and the bearer token. They are not
// worker configuration (nor typos: UnknownVars skips them).
const (
	EnvURL   = EnvPrefix + "_URL"
	EnvToken = EnvPrefix + "_TOKEN"
)

var cliVars = []string{EnvURL, EnvToken}
