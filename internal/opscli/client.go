// Package opscli is the operator's side of the HTTP API: the commands
// `gatekeeper override` and `gatekeeper top`. They talk to a replica's HTTP
// API (GATEKEEPER_URL, default http://localhost:8080) with the bearer token
// of GATEKEEPER_TOKEN, so that every change is audited under the token's
// name.
package opscli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/worker"
)

// client calls one replica's API.
type client struct {
	base  string
	token string
	http  *http.Client
}

func newClient() *client {
	base := strings.TrimRight(os.Getenv(worker.EnvURL), "/")
	if base == "" {
		base = "http://localhost:8080"
	}
	return &client{base: base, token: os.Getenv(worker.EnvToken), http: &http.Client{Timeout: 10 * time.Second}}
}

// apiError is an answer other than 2xx: its status and error text.
type apiError struct {
	status int
	msg    string
	body   map[string]any
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s", e.status, e.msg) }

// do sends method path with body (JSON; nil: none) and decodes the answer
// into out (nil: dropped).
func (c *client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		e := &apiError{status: resp.StatusCode, msg: strings.TrimSpace(string(data))}
		if json.Unmarshal(data, &e.body) == nil {
			if s, ok := e.body["error"].(string); ok {
				e.msg = s
			}
		}
		return e
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	return nil
}

// isStale reports a refused stale write.
func isStale(err error) bool {
	var e *apiError
	return errors.As(err, &e) && e.status == http.StatusConflict
}
