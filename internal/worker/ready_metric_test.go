package worker

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

func TestReadyCollector(t *testing.T) {
	ok, down, slow := passingCheck("redis"), failingCheck("consumption", errors.New("paused")), hangingCheck("kafka")
	tests := []struct {
		name   string
		checks []readyCheck
		want   map[string]float64 // check -> gatekeeper_ready
	}{
		{"all pass", []readyCheck{ok}, map[string]float64{"redis": 1}},
		{"one fails", []readyCheck{ok, down}, map[string]float64{"redis": 1, "consumption": 0}},
		{"timeout", []readyCheck{slow, ok}, map[string]float64{"kafka": 0, "redis": 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			reg.MustRegister(newReadyCollector(newReadiness(tt.checks, 50*time.Millisecond, readyMaxAge)))
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]float64{}
			for _, mf := range mfs {
				if mf.GetName() != "gatekeeper_ready" || mf.GetType().String() != "GAUGE" {
					t.Fatalf("got family %s of type %s, want only the gauge gatekeeper_ready", mf.GetName(), mf.GetType())
				}
				for _, m := range mf.GetMetric() {
					got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("gatekeeper_ready by check (-want +got):\n%s", diff)
			}
		})
	}
}
