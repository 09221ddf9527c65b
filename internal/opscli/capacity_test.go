package opscli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gatekeeper-dev/gatekeeper/internal/worker"
)

// TestCapacityCommand: `gatekeeper capacity cap` and `lift` send the cap
// with the token and the reason; wrong arguments are usage errors.
func TestCapacityCommand(t *testing.T) {
	type call struct {
		method, path, auth string
		body               worker.CapacityCap
	}
	var got []call
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := call{method: r.Method, path: r.URL.Path, auth: r.Header.Get("Authorization")}
		b, _ := io.ReadAll(r.Body)
		if len(b) > 0 {
			_ = json.Unmarshal(b, &c.body)
		}
		got = append(got, c)
		w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	t.Setenv(worker.EnvURL, srv.URL)
	t.Setenv(worker.EnvToken, "ops-token")
	var out, errb bytes.Buffer
	for _, tc := range []struct {
		args   []string
		status int
		want   *call
	}{
		{[]string{"cap", "500", "--for", "15m", "--reason", "db slow"}, 0, &call{"PUT", "/v1/capacity/cap", "Bearer ops-token", worker.CapacityCap{Rate: 500, For: "15m0s", Reason: "db slow"}}},
		{[]string{"cap", "30000/1m", "--reason", "db slow", "--for", "1h"}, 0, &call{"PUT", "/v1/capacity/cap", "Bearer ops-token", worker.CapacityCap{Capacity: "30000/1m", For: "1h0m0s", Reason: "db slow"}}},
		{[]string{"lift", "--reason", "db fine"}, 0, &call{"DELETE", "/v1/capacity/cap", "Bearer ops-token", worker.CapacityCap{Reason: "db fine"}}},
		{[]string{}, 0, &call{"GET", "/v1/capacity", "Bearer ops-token", worker.CapacityCap{}}},
		{[]string{"cap", "500", "--until", "tomorrow", "--reason", "x"}, 2, nil},
		{[]string{"cap"}, 2, nil},
		{[]string{"raise", "5"}, 2, nil},
	} {
		got = nil
		if s := Capacity(context.Background(), tc.args, &out, &errb); s != tc.status {
			t.Errorf("%v: status %d, want %d (%s)", tc.args, s, tc.status, errb.String())
		}
		if tc.want == nil {
			if len(got) != 0 {
				t.Errorf("%v: sent %+v, want nothing", tc.args, got)
			}
			continue
		}
		if len(got) != 1 || got[0] != *tc.want {
			t.Errorf("%v: sent %+v, want %+v", tc.args, got, *tc.want)
		}
	}
}
