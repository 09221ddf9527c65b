package worker

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/pace"
)

// PaceConfig is the Pace group of Config: a capacity that follows what the downstream drains (internal/pace), and an operator's cap on it.
type PaceConfig struct {
	// CapacityFrom paces CAPACITY by the downstream group: group:<name>.
	CapacityFrom string `split_words:"true" desc:"pace CAPACITY by what the downstream drains: group:NAME, the consumer group that reads DOWNSTREAM_TOPIC; CAPACITY is then the ceiling"`
	// CapacityTargetWait is the downstream wait (lag / drain rate) to keep
	// the downstream under, through a halving of its drain too.
	CapacityTargetWait time.Duration `split_words:"true" default:"2s" desc:"the wait of events in DOWNSTREAM_TOPIC (lag / drain rate) that the paced capacity keeps under, through a halving of the drain too (it holds half of it for the partition that waits longest)"`
	// CapacityFloor is the least the paced capacity may be.
	CapacityFloor string `split_words:"true" doc_default:"a tenth of CAPACITY" desc:"the least the paced capacity may be, in events per second or minute like CAPACITY, e.g. 100/1s"`
	// CapacityInterval is how often the paced capacity is computed.
	CapacityInterval time.Duration `split_words:"true" default:"1s" desc:"how often the paced capacity is computed, by one replica at a time (a lease in Redis)"`
	// CapacityHold is how long the last paced value holds while the signal is lost.
	CapacityHold time.Duration `split_words:"true" default:"30s" desc:"how long the paced capacity keeps its last value while the downstream group has no members or its offsets cannot be read, before it falls to the floor"`
	// CapacityShadow computes and exports the paced capacity without enforcing it.
	CapacityShadow bool `split_words:"true" default:"false" desc:"compute and export the paced capacity (metrics, GET /v1/capacity) without enforcing it"`
}

// paceGroup returns the downstream group of CAPACITY_FROM, "" when unset.
func (c *Config) paceGroup() (string, error) {
	if c.CapacityFrom == "" {
		return "", nil
	}
	g, ok := strings.CutPrefix(c.CapacityFrom, "group:")
	if !ok || strings.TrimSpace(g) == "" {
		return "", fmt.Errorf("%q is not group:NAME (the consumer group of the downstream topic)", c.CapacityFrom)
	}
	return g, nil
}

// paceFloor returns CAPACITY_FLOOR as a rate; when unset, a tenth of the
// capacity's, at least one event a second, at most the capacity's (a
// capacity of hours, days or weeks may be under one a second).
func (c *Config) paceFloor(capacity limit.Capacity) (float64, error) {
	if c.CapacityFloor == "" {
		return min(capacity.Rate(), max(1, capacity.Rate()/10)), nil
	}
	f, err := limit.ParseCapacity(c.CapacityFloor)
	if err != nil {
		return 0, err
	}
	if len(f) != 1 {
		return 0, fmt.Errorf("%q: one rule, e.g. 100/1s", c.CapacityFloor)
	}
	return f.Rate(), nil
}

// checkPace checks the Pace group: CAPACITY_FROM needs CAPACITY of
// events with a rule of at most a minute and a group other than GROUP_ID;
// the floor is under the capacity.
func (c *Config) checkPace() error {
	g, err := c.paceGroup()
	if err != nil {
		return bad("CAPACITY_FROM", "%v", err)
	}
	capacity := c.CapacityRules()
	if g != "" && len(capacity) == 0 {
		return bad("CAPACITY_FROM", "needs CAPACITY (the ceiling of the paced capacity)")
	}
	if g != "" && capacity.Measure() != limit.Events {
		return bad("CAPACITY_FROM", "paces a capacity of events (the downstream drains events a second); CAPACITY %s counts %s", capacity, capacity.Measure())
	}
	if g != "" && g == c.GroupID {
		return bad("CAPACITY_FROM", "group %q is Gatekeeper's own GROUP_ID, not the downstream's", g)
	}
	if g != "" && shortestWindow(capacity) > time.Minute {
		return bad("CAPACITY_FROM", "paces the capacity's rule of the shortest window, fixed at each window's first call: CAPACITY %s would follow the drain once every %s; give a rule of at most a minute beside it (e.g. 5000/1s,%s)", capacity, strings.TrimSuffix(strings.TrimSuffix(shortestWindow(capacity).String(), "0s"), "0m"), capacity)
	}
	if c.CapacityFloor != "" && len(capacity) == 0 {
		return bad("CAPACITY_FLOOR", "needs CAPACITY and CAPACITY_FROM")
	}
	if len(capacity) > 0 {
		floor, err := c.paceFloor(capacity)
		if err != nil {
			return bad("CAPACITY_FLOOR", "%v", err)
		}
		if floor > capacity.Rate() {
			return bad("CAPACITY_FLOOR", "%s is above CAPACITY %s", c.CapacityFloor, capacity)
		}
	}
	if c.CapacityShadow && g == "" {
		return bad("CAPACITY_SHADOW", "needs CAPACITY_FROM (there is no paced capacity to shadow)")
	}
	return nil
}

// newPaceRunner returns the pacing of this replica (nil: no capacity), its
// metrics registered with reg. The downstream is read with its own
// kafka-go client.
func newPaceRunner(cfg *Config, rdb redis.UniversalClient, lim *limit.Limiter, transport *kafka.Transport, log *slog.Logger, reg prometheus.Registerer) (*pace.Runner, error) {
	capacity := cfg.CapacityRules()
	if len(capacity) == 0 {
		return nil, nil
	}
	group, _ := cfg.paceGroup()
	floor, _ := cfg.paceFloor(capacity)
	r := &pace.Runner{
		Fleet:   pace.NewFleet(rdb, cfg.RedisKeyPrefix, cfg.RedisTimeout),
		Params:  pace.Params{TargetWait: cfg.CapacityTargetWait, Floor: floor, Ceiling: capacity.Rate(), Interval: cfg.CapacityInterval, Hold: cfg.CapacityHold},
		Shadow:  cfg.CapacityShadow,
		Ceiling: capacity.Rate(),
		Apply:   lim.SetCapacityRate,
		ID:      paceID(),
		Log:     log,
	}
	if group != "" && !cfg.CapacityShadow {
		// Reservations in the windows ahead within what the pacing may set
		// (limit.Limiter.PaceReservations): a cut takes effect at once.
		lim.PaceReservations(floor)
	}
	if group != "" {
		r.Downstream = &pace.Downstream{
			Client:  &kafka.Client{Addr: kafka.TCP(cfg.KafkaBrokers...), Transport: transport, Timeout: cfg.KafkaTimeout},
			Group:   group,
			Topic:   cfg.DownstreamTopic,
			Timeout: cfg.KafkaTimeout,
			// The members say only whether the signal is lost: once per interval.
			MembersEvery: cfg.CapacityInterval,
		}
	}
	if err := r.Register(reg); err != nil {
		return nil, fmt.Errorf("pace metrics: %w", err)
	}
	return r, nil
}

// paceID names this replica in the pacing's lease.
func paceID() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%d/%d", host, os.Getpid(), time.Now().UnixNano())
}

// runPace runs r until ctx is done; nil r does nothing.
func runPace(ctx context.Context, r *pace.Runner) error {
	if r == nil {
		return nil
	}
	return r.Run(ctx)
}

// shortestWindow returns the length of the capacity's shortest rule (the
// one a paced rate sets: limit.Limiter.SetCapacityRate).
func shortestWindow(c limit.Capacity) time.Duration {
	var d time.Duration
	for i, r := range c {
		if i == 0 || r.Length() < d {
			d = r.Length()
		}
	}
	return d
}
