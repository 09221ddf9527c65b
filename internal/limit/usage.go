package limit

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Usage is the state of one rule's current window for one tenant: the seed's
// "current access count". Count, Limit and Remaining are in the rule's Unit:
// "events", "bytes" or "units". It is a value type.
type Usage struct {
	Rule      string    `json:"rule"`
	Unit      string    `json:"unit"`
	Count     int64     `json:"count"`
	Limit     int64     `json:"limit"`
	Remaining int64     `json:"remaining"`
	Reset     time.Time `json:"reset"`
}

// Usage returns, per rule of the tenant, the count in the current window
// (admitted events and slots reserved in it), the limit, what remains, and
// when the window ends. A ttl rule with no live window reports zero and a
// reset of now (its window starts at the next event). It reads only.
func (l *Limiter) Usage(ctx context.Context, tenant string) (_ []Usage, err error) {
	ctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	start := time.Now()
	defer func() {
		l.metrics.redisSeconds.WithLabelValues("usage").Observe(time.Since(start).Seconds())
		if err != nil {
			l.metrics.redisErrors.Inc()
		}
	}()
	now := l.opts.Clock()
	rules := l.rules.Load().For(tenant)
	out := make([]Usage, len(rules))
	wkeys := make([]string, len(rules))
	if l.opts.WindowKind == TTL {
		anchors := make([]*redis.SliceCmd, len(rules))
		if _, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, r := range rules {
				anchors[i] = p.HMGet(ctx, l.keys.anchor(tenant, r), "start", "until")
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("usage: %w", err)
		}
		for i, r := range rules {
			var a struct {
				Start int64 `redis:"start"`
				Until int64 `redis:"until"`
			}
			if err := anchors[i].Scan(&a); err != nil {
				return nil, fmt.Errorf("usage: anchor: %w", err)
			}
			if a.Until > now.UnixMilli() {
				step := r.Length().Milliseconds()
				s := a.Start + (now.UnixMilli()-a.Start)/step*step
				wkeys[i] = l.keys.window(tenant, r, time.UnixMilli(s))
			}
		}
	} else {
		for i, r := range rules {
			s, _ := WindowBounds(r, now, l.opts.Location)
			wkeys[i] = l.keys.window(tenant, r, s)
		}
	}
	cmds := make([]*redis.Cmd, len(rules))
	if _, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range wkeys {
			if k != "" {
				cmds[i] = l.get.Eval(ctx, p, []string{k}, now.UnixMilli())
			}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	for i, r := range rules {
		u := Usage{Rule: r.String(), Unit: r.Measure.String(), Limit: r.Limit, Reset: now}
		if l.opts.WindowKind == Aligned {
			_, u.Reset = WindowBounds(r, now, l.opts.Location)
		}
		if cmds[i] != nil {
			v, err := cmds[i].Int64Slice()
			if err != nil || len(v) != 2 {
				return nil, fmt.Errorf("usage: %q: %v %w", wkeys[i], v, err)
			}
			if v[0] > 0 {
				u.Count, u.Reset = v[0], time.UnixMilli(v[1])
			}
		}
		u.Remaining = max(0, u.Limit-u.Count)
		out[i] = u
	}
	return out, nil
}
