package worker

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// TestPaceReservations: a paced capacity, enforced, bounds what the
// windows ahead may hold by its floor (limit.Limiter.PaceReservations);
// in shadow, or unpaced, nothing is bounded.
func TestPaceReservations(t *testing.T) {
	rdb, _ := testenv.Redis(t)
	for _, tc := range []struct {
		from, floor string
		shadow      bool
		want        float64
	}{
		{"group:down", "50/1s", false, 50},
		{"group:down", "", false, 300}, // a tenth of CAPACITY
		{"group:down", "50/1s", true, 0},
		{"", "", false, 0},
	} {
		cfg := &Config{}
		cfg.Capacity, cfg.CapacityFrom, cfg.CapacityFloor, cfg.CapacityShadow = "3000/1s", tc.from, tc.floor, tc.shadow
		cfg.DownstreamTopic, cfg.RedisKeyPrefix, cfg.CapacityInterval, cfg.RedisTimeout = "down", "gktest-pace", time.Second, time.Second
		rules, err := limit.ParseRules("*=100/1s")
		if err != nil {
			t.Fatal(err)
		}
		lim, err := limit.New(context.Background(), rdb, rules, limit.Options{Prefix: "gktest-pace", Capacity: cfg.CapacityRules()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := newPaceRunner(cfg, rdb, lim, nil, slog.New(slog.DiscardHandler), prometheus.NewRegistry()); err != nil {
			t.Fatal(err)
		}
		if got := lim.PacedReservations(); got != tc.want {
			t.Errorf("CAPACITY_FROM %q, CAPACITY_FLOOR %q, shadow %v: reservations ahead bounded by a floor of %v, want %v", tc.from, tc.floor, tc.shadow, got, tc.want)
		}
	}
}
