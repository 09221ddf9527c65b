package limit

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Reading the capacity: a tenant's share for the usage API and the fleet's
// use per window for the metrics. Both only read.

// waitingWindows is how many windows after the current one CapacityUsage
// sums a tenant's reserved events over (fewer when the horizon is shorter).
const waitingWindows = 60

// CapacityShare is a tenant's part of one capacity rule in its current
// window, in the rule's measure (Measure: events, bytes or units; the
// counts below, floor, level and entitlement are of it, and Waiting and
// Refused too). It is a value type.
type CapacityShare struct {
	// Capacity is the rule, as in GATEKEEPER_CAPACITY ("5000/1s", "10MiB/1s").
	Capacity string `json:"capacity"`
	// Measure is what the capacity counts: "events", "bytes" or "units".
	Measure string `json:"measure"`
	// Used is what all tenants booked in the current window (admitted or reserved).
	Used int64 `json:"used"`
	// Booked is what this tenant booked there, and Share its part of the capacity.
	Booked int64   `json:"booked"`
	Share  float64 `json:"share"`
	// Weight and Floor are the tenant's, from LIMITS.
	Weight int64 `json:"weight"`
	Floor  int64 `json:"floor"`
	// Level is the window's water level per unit of weight (0 before its
	// first call; the equal share in a window without history), and Entitlement the tenant's max(floor, weight × level):
	// what it may book before the end-of-window ramp.
	Level       float64 `json:"level"`
	Entitlement int64   `json:"entitlement"`
	// ActiveWeight sums the weights of the tenants that sent events in the window.
	ActiveWeight int64 `json:"active_weight"`
	// Refused is the tenant's events decided in this window that went to later ones.
	Refused int64 `json:"refused"`
	// Waiting is the tenant's events reserved in the WaitingWindows windows
	// after the current one: its deferred events waiting for their slot.
	Waiting        int64 `json:"waiting"`
	WaitingWindows int   `json:"waiting_windows"`
	// Reset is when the current window ends.
	Reset time.Time `json:"reset"`
	// InForce is the capacity in force in the current window (fixed at its
	// first call: a paced or capped capacity may be under the rule's limit;
	// capacity_pace.go), or what calls pass now before that call.
	InForce int64 `json:"in_force"`
}

// CapacityUsage returns the tenant's share of each capacity rule (none
// without a capacity). It reads only.
func (l *Limiter) CapacityUsage(ctx context.Context, tenant string) ([]CapacityShare, error) {
	return l.CapacityUsageUnder(ctx, tenant, l.rules.Load().Share(tenant))
}

// CapacityUsageUnder returns the tenant's share of each capacity rule as
// CapacityUsage does, but with share as its weight and floors: what it
// booked against the entitlement share would give it at the current
// level (a dry run of an override's share). It reads only.
func (l *Limiter) CapacityUsageUnder(ctx context.Context, tenant string, share Share) ([]CapacityShare, error) {
	c := l.opts.Capacity
	if len(c) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	now := l.opts.Clock()
	name := encodeTenant(tenant)
	type read struct {
		cur  *redis.SliceCmd
		next []*redis.StringCmd
	}
	reads := make([]read, len(c))
	nwin := make([]int, len(c))
	if _, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, r := range c {
			s, _ := WindowBounds(r, now, l.opts.Location)
			key := l.keys.capacity(r)
			reads[i].cur = p.HMGet(ctx, key+WindowSep+strconv.FormatInt(s.UnixMilli(), 10), "count", "lv", "a", "t:"+name, "r:"+name, "cl")
			nwin[i] = min(waitingWindows, int(l.opts.Horizon/r.Length()))
			for k := 1; k <= nwin[i]; k++ {
				ws := s.Add(time.Duration(k) * r.Length())
				reads[i].next = append(reads[i].next, p.HGet(ctx, key+WindowSep+strconv.FormatInt(ws.UnixMilli(), 10), "t:"+name))
			}
		}
		return nil
	}); err != nil && err != redis.Nil {
		l.metrics.redisErrors.Inc()
		return nil, fmt.Errorf("capacity usage: %w", err)
	}
	out := make([]CapacityShare, len(c))
	for i, r := range c {
		v := reads[i].cur.Val()
		num := func(j int) float64 {
			if j >= len(v) {
				return 0
			}
			s, _ := v[j].(string)
			f, _ := strconv.ParseFloat(s, 64)
			return f
		}
		_, end := WindowBounds(r, now, l.opts.Location)
		cs := CapacityShare{
			Capacity: r.String(), Measure: r.Measure.String(), Used: int64(num(0)), Level: num(1), ActiveWeight: int64(num(2)),
			Booked: int64(num(3)), Refused: int64(num(4)), Weight: share.weight(), Floor: share.floor(r),
			WaitingWindows: nwin[i], Reset: end,
		}
		cs.InForce = int64(num(5))
		if cs.InForce == 0 {
			cs.InForce = l.CapacityInForce()[i].Limit
		}
		if len(v) > 1 && v[1] != nil && cs.Level == 0 {
			// No history: the level is the equal share (35_capacity.lua's cap_room).
			cs.Level = float64(cs.InForce) / float64(max(1, cs.ActiveWeight))
		}
		cs.Share = float64(cs.Booked) / float64(cs.InForce)
		cs.Entitlement = max(cs.Floor, int64(float64(cs.Weight)*cs.Level+1e-9))
		for _, n := range reads[i].next {
			w, _ := n.Int64()
			cs.Waiting += w
		}
		out[i] = cs
	}
	return out, nil
}

// capacityCollector exports, at each scrape, the capacity's use in its
// current and last windows, read from Redis (the fleet's, not this
// replica's): no tenant labels, one series per capacity rule. It is
// registered with every Limiter and reports nothing without a capacity.
type capacityCollector struct {
	l                                  *Limiter
	limit, used, level, active, capped *prometheus.Desc
}

func newCapacityCollector(l *Limiter) *capacityCollector {
	return &capacityCollector{
		l:      l,
		limit:  prometheus.NewDesc("gatekeeper_capacity_limit", "The capacity: events (bytes, units: see the capacity label) per window that all tenants together may be admitted or have reserved (GATEKEEPER_CAPACITY).", []string{"capacity"}, nil),
		used:   prometheus.NewDesc("gatekeeper_capacity_used", "Events (bytes, units: the capacity's measure) booked (admitted or reserved) by all tenants in a capacity window: window=current (so far) or last (the window before, complete).", []string{"capacity", "window"}, nil),
		level:  prometheus.NewDesc("gatekeeper_capacity_level", "The current capacity window's water level: what a tenant of weight 1 is entitled to, in the capacity's measure.", []string{"capacity"}, nil),
		active: prometheus.NewDesc("gatekeeper_capacity_active_weight", "Summed weight of the tenants that sent events in the current capacity window.", []string{"capacity"}, nil),
		capped: prometheus.NewDesc("gatekeeper_capacity_capped_weight", "Summed weight of the tenants held at the level in the current capacity window (predicted to ask more than their share).", []string{"capacity"}, nil),
	}
}

func (cc *capacityCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{cc.limit, cc.used, cc.level, cc.active, cc.capped} {
		ch <- d
	}
}

func (cc *capacityCollector) Collect(ch chan<- prometheus.Metric) {
	l := cc.l
	c := l.opts.Capacity
	if len(c) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.opts.Timeout)
	defer cancel()
	now := l.opts.Clock()
	cur := make([]*redis.SliceCmd, len(c))
	last := make([]*redis.SliceCmd, len(c))
	if _, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, r := range c {
			s, _ := WindowBounds(r, now, l.opts.Location)
			key := l.keys.capacity(r) + WindowSep
			cur[i] = p.HMGet(ctx, key+strconv.FormatInt(s.UnixMilli(), 10), "count", "lv", "a", "wc")
			last[i] = p.HMGet(ctx, key+strconv.FormatInt(s.Add(-r.Length()).UnixMilli(), 10), "count")
		}
		return nil
	}); err != nil {
		l.metrics.redisErrors.Inc()
		return
	}
	for i, r := range c {
		name := r.String()
		cv, lv := floats(cur[i].Val(), 4), floats(last[i].Val(), 1)
		ch <- prometheus.MustNewConstMetric(cc.limit, prometheus.GaugeValue, float64(r.Limit), name)
		ch <- prometheus.MustNewConstMetric(cc.used, prometheus.GaugeValue, cv[0], name, "current")
		ch <- prometheus.MustNewConstMetric(cc.used, prometheus.GaugeValue, lv[0], name, "last")
		ch <- prometheus.MustNewConstMetric(cc.level, prometheus.GaugeValue, cv[1], name)
		ch <- prometheus.MustNewConstMetric(cc.active, prometheus.GaugeValue, cv[2], name)
		ch <- prometheus.MustNewConstMetric(cc.capped, prometheus.GaugeValue, cv[3], name)
	}
}

// floats reads n numbers of an HMGET reply, 0 for a missing field.
func floats(v []any, n int) []float64 {
	out := make([]float64, n)
	for j := 0; j < n && j < len(v); j++ {
		s, _ := v[j].(string)
		out[j], _ = strconv.ParseFloat(s, 64)
	}
	return out
}
