package worker

import (
	"strings"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// checkCapacity parses CAPACITY and checks the tenants' floors against it;
// a capacity needs a single Redis, or every key in one slot of a Redis
// Cluster (limit.ErrCapacityCluster).
func (c *Config) checkCapacity() error {
	capacity, err := limit.ParseCapacity(c.Capacity)
	if err != nil {
		return bad("CAPACITY", "%v", err)
	}
	if len(capacity) == 0 {
		return nil
	}
	if (len(c.RedisAddrs) > 1 || strings.EqualFold(c.RedisCluster, "true")) && !limit.OneSlot(c.RedisKeyPrefix) {
		return bad("CAPACITY", "%v: set REDIS_KEY_PREFIX to one, e.g. {%s}", limit.ErrCapacityCluster, c.RedisKeyPrefix)
	}
	if loc, err := c.Location(); err == nil {
		if err := limit.CheckCapacityZone(capacity, loc, time.Now()); err != nil {
			return bad("CAPACITY", "%v", err)
		}
	}
	if capacity.Measure() == limit.Units && c.CostFrom == "" {
		return bad("CAPACITY", "%s counts units, and COST_FROM is not set (where an event's units are)", capacity)
	}
	if c.limits != nil {
		if err := limit.CheckCapacity(c.limits.rules, capacity); err != nil {
			if c.LimitsFile != "" {
				return bad("LIMITS_FILE", "%s: %v", c.LimitsFile, err)
			}
			return bad("LIMITS", "%v", err)
		}
	}
	return nil
}

// CapacityRules returns the capacity of CAPACITY, none when unset or bad
// (Validate reports a bad one).
func (c *Config) CapacityRules() limit.Capacity {
	capacity, _ := limit.ParseCapacity(c.Capacity)
	return capacity
}
