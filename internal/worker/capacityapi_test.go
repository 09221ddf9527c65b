package worker

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/pace"
	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// TestCapacityCapAPI: a write token caps the capacity until a time, recorded
// with the token's name and the reason; every replica's runner applies it;
// a read token may look, not write; bad bodies name the field.
func TestCapacityCapAPI(t *testing.T) {
	rdb, _ := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	var applied float64
	runner := &pace.Runner{Fleet: pace.NewFleet(rdb, prefix, time.Second), Params: pace.Params{Floor: 10, Interval: time.Second},
		Ceiling: 1000, Apply: func(x float64) { applied = x }}
	runner.Init(context.Background())
	cfg := Config{HTTPConfig: HTTPConfig{AdminTokens: "viewer:read:viewer-token-0123456,ops:write:ops-token-0123456789"}}
	tokens, err := cfg.apiTokens()
	if err != nil {
		t.Fatal(err)
	}
	srv := newTestServer(t, httpConfig{Tokens: tokens, Capacities: &capacityAPI{pace: func() *pace.Runner { return runner }, clock: time.Now, log: testenv.DiscardLogger()}})
	send := func(method, token, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+capacityCapPath, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		token, body string
		status      int
		err         string
	}{
		{"viewer-token-0123456", `{"rate":300,"for":"10m","reason":"db slow"}`, 403, ""},
		{"ops-token-0123456789", `{"rate":300,"for":"10m"}`, 400, "reason"},
		{"ops-token-0123456789", `{"rate":300,"reason":"x"}`, 400, "until"},
		{"ops-token-0123456789", `{"rate":-1,"for":"10m","reason":"x"}`, 400, "rate"},
		{"ops-token-0123456789", `{"capacity":"5/1mo","for":"10m","reason":"x"}`, 400, "capacity"},
		{"ops-token-0123456789", `{"rate":300,"for":"-1m","reason":"x"}`, 400, "end after now"},
		{"ops-token-0123456789", `{"rate":300,"for":"10m","reason":"x","speed":1}`, 400, "unknown field"},
		{"ops-token-0123456789", `{"capacity":"18000/1m","for":"10m","reason":"db slow"}`, 200, ""},
	} {
		status, body := send(http.MethodPut, tc.token, tc.body)
		if status != tc.status || !strings.Contains(body, tc.err) {
			t.Errorf("PUT %s: got %d %s, want %d with %q", tc.body, status, body, tc.status, tc.err)
		}
	}
	runner.Init(context.Background()) // reads the fleet's state again
	status, body, _ := get(t, srv, capacityPath, "Authorization", "Bearer viewer-token-0123456")
	var view CapacityView
	if err := json.Unmarshal([]byte(body), &view); status != 200 || err != nil {
		t.Fatalf("GET: %d %s %v", status, body, err)
	}
	if applied != 300 || view.Cap == nil || view.Cap.By != "ops" || view.Cap.Why != "db slow" || view.InForce != 300 {
		t.Fatalf("after the cap: applied %v, view %+v; want 300 by ops", applied, view.Status)
	}
	if len(view.Audit) != 1 || view.Audit[0].Op != "set" || view.Audit[0].By != "ops" {
		t.Errorf("audit %+v, want one set by ops", view.Audit)
	}
	if status, body := send(http.MethodDelete, "ops-token-0123456789", `{"reason":"db fine"}`); status != 200 {
		t.Fatalf("DELETE: %d %s", status, body)
	}
	runner.Init(context.Background())
	if applied != 1000 {
		t.Errorf("after the lift: applied %v, want the ceiling 1000", applied)
	}
	if _, body, _ := get(t, srv, "/readyz"); strings.Contains(body, "capped") {
		t.Errorf("readyz after the lift still says capped: %s", body)
	}
}

// TestCapacityCapMeasure: a cap given as a capacity must count what
// CAPACITY counts; a rate is of that measure a second.
func TestCapacityCapMeasure(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		body CapacityCap
		m    limit.Measure
		rate float64
		err  string
	}{
		{CapacityCap{Capacity: "500/1s", For: "1m", Reason: "x"}, limit.Bytes, 0, "counts events, CAPACITY counts bytes"},
		{CapacityCap{Capacity: "1MiB/1s", For: "1m", Reason: "x"}, limit.Events, 0, "counts bytes, CAPACITY counts events"},
		{CapacityCap{Capacity: "1MiB/1s", For: "1m", Reason: "x"}, limit.Bytes, 1 << 20, ""},
		{CapacityCap{Rate: 5000, For: "1m", Reason: "x"}, limit.Bytes, 5000, ""},
		{CapacityCap{Rate: -1, For: "1m", Reason: "x"}, limit.Units, 0, "want units a second"},
	} {
		c, err := capOf(tc.body, now, tc.m)
		switch {
		case tc.err == "" && (err != nil || c.Rate != tc.rate):
			t.Errorf("%+v under %s: got %v, %v; want rate %v", tc.body, tc.m, c.Rate, err, tc.rate)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%+v under %s: got %v, want an error with %q", tc.body, tc.m, err, tc.err)
		}
	}
}
