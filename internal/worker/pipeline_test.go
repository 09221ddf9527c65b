package worker

import (
	"context"
	"testing"

	"github.com/gatekeeper-dev/gatekeeper/internal/route"
)

// fakeGroup is a consumerGroup that has joined or not.
type fakeGroup struct{ joined bool }

func (g fakeGroup) Run(context.Context) error { return nil }
func (g fakeGroup) Ready() bool               { return g.joined }

func TestBuiltPipelineHealth(t *testing.T) {
	tests := []struct {
		name                  string
		groups                []consumerGroup
		paused                bool
		wantGroups, wantPause string
	}{
		{name: "healthy", groups: []consumerGroup{fakeGroup{true}, fakeGroup{true}}},
		{name: "one group not joined", groups: []consumerGroup{fakeGroup{true}, fakeGroup{false}}, wantGroups: "not joined"},
		{name: "paused", groups: []consumerGroup{fakeGroup{true}}, paused: true, wantPause: "paused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &BuiltPipeline{router: &route.Router{}, groups: tt.groups}
			b.paused.Store(tt.paused)
			h := b.Health()
			if got := errText(h.Groups); got != tt.wantGroups {
				t.Errorf("groups: got %q, want %q", got, tt.wantGroups)
			}
			if got := errText(h.Consumption); got != tt.wantPause {
				t.Errorf("consumption: got %q, want %q", got, tt.wantPause)
			}
			if h.Writes != nil {
				t.Errorf("writes: got %v, want nil", h.Writes)
			}
		})
	}
}

// errText is err's text, or "" for nil.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// The retry tiers move a waiting backlog into the capacity's idle room only
// with CAPACITY_ADVANCE and a capacity (of events, bytes or units) on
// aligned windows.
func TestAdvancesBacklog(t *testing.T) {
	cfg := func(capacity, window string, advance bool) Config {
		var c Config
		c.Capacity, c.Window, c.CapacityAdvance = capacity, window, advance
		return c
	}
	for _, tt := range []struct {
		name string
		cfg  Config
		want bool
	}{
		{"events, aligned", cfg("100/1s", "aligned", true), true},
		{"CAPACITY_ADVANCE=false", cfg("100/1s", "aligned", false), false},
		{"no capacity", cfg("", "aligned", true), false},
		{"bytes", cfg("10MiB/1s", "aligned", true), true},
		{"units", cfg("2000u/1s", "aligned", true), true},
		{"ttl windows", cfg("100/1s", "ttl", true), false},
	} {
		if got := tt.cfg.advancesBacklog(); got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
		// With the moves on, claims are checked (a moved event handled
		// again after a crash); otherwise only as LATE_TAKES_SLOTS says.
		tt.cfg.LateTakesSlots = lateOff
		if got := tt.cfg.checksClaims(); got != tt.want {
			t.Errorf("%s, LATE_TAKES_SLOTS=off: claims checked %v, want %v", tt.name, got, tt.want)
		}
		tt.cfg.LateTakesSlots = lateCheck
		if !tt.cfg.checksClaims() {
			t.Errorf("%s, LATE_TAKES_SLOTS=check: claims not checked", tt.name)
		}
		// The bound on the slots taken is kept and trusted only by
		// replicas that take slots, and not with the moves on (they need
		// every claim checked).
		if tt.cfg.boundsTakes() {
			t.Errorf("%s, LATE_TAKES_SLOTS=check: bound trusted", tt.name)
		}
		tt.cfg.LateTakesSlots = lateOn
		if got := tt.cfg.boundsTakes(); got == tt.want {
			t.Errorf("%s, LATE_TAKES_SLOTS=on: bound trusted %v, want %v", tt.name, got, !tt.want)
		}
	}
}
