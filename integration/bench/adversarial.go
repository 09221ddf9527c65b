package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// The adversarial mode runs the limiter's worst cases (G11: the Redis work
// of one script call is bounded by its batch) in-process against the bench
// Redis, one -batch sized batch per script call, without Kafka: what one
// call costs Redis does not depend on how the batch was consumed. Per case
// it reports the script calls, Redis busy time per 1,000 events (INFO
// commandstats), the slowest call (SLOWLOG, which the mode turns on for its
// run and sets back after) and the most windows one call read (HMGET).
// The same cases are tests: internal/limit/bounded_test.go.

const modeAdversarial = "adversarial"

// advResult is one adversarial case.
type advResult struct {
	Case      string  `json:"case"`
	Rules     string  `json:"rules"`
	Events    int     `json:"events"`
	Calls     int     `json:"script_calls"`
	BusyPer1k float64 `json:"redis_busy_us_per_1000_events"`
	SlowestMs float64 `json:"slowest_call_ms"`
	// MostCPUMs is the most CPU time Redis's main thread spent on one call
	// (INFO cpu): unlike SLOWLOG's wall time, other load on the machine
	// hardly moves it.
	MostCPUMs float64 `json:"most_redis_cpu_per_call_ms"`
	MaxReads  int64   `json:"most_window_reads_per_call"`
	Decisions string  `json:"decisions"`
}

// advCase is a case: its rules and horizon, the batches to measure, and
// what to do before them (not measured).
type advCase struct {
	name, rules string
	capacity    string // CAPACITY, or none
	horizon     time.Duration
	setup       func(ctx context.Context, a *advRun) error
	// batch returns the i-th batch to measure and its costs, or nil when
	// done; last holds the decisions of the batch before.
	batch func(i int, last []limit.Decision) ([]string, []limit.Cost)
}

// advRun is one case being run.
type advRun struct {
	l      *limit.Limiter
	rdb    *redis.Client
	prefix string
}

// adversarialCases are the worst cases at batch size n.
func adversarialCases(n int) []advCase {
	madeUp := func(i, k int) []string {
		out := make([]string, k)
		for j := range out {
			out[j] = fmt.Sprintf("made-up-%d-%d", i, j)
		}
		return out
	}
	spread := func(tenants, n int, name string) []string {
		out := make([]string, n)
		for j := range out {
			out[j] = fmt.Sprintf("%s-%d", name, j%tenants)
		}
		return out
	}
	costs := func(n int, bytes int64) []limit.Cost {
		out := make([]limit.Cost, n)
		for j := range out {
			out[j] = limit.Cost{Bytes: bytes}
		}
		return out
	}
	// far fills the next 15 minutes of 20 tenants (one per second, no
	// frontier left: it expired), then sends events that fit only past them,
	// and after each batch the events it deferred unreserved (its budget
	// spent), as they would come back, until none is left.
	far := func(name, rules string, fill, cost int64) advCase {
		var sent []string
		const tenants, ahead = 20, 15 * 60 // windows of 1s
		perWindow := int64(1)
		if cost > 0 {
			perWindow = 1000 / fill
		}
		return advCase{
			name: name, rules: rules, horizon: time.Hour,
			setup: func(ctx context.Context, a *advRun) error {
				for k := 0; k < tenants*ahead*int(perWindow)/n+1; k++ {
					if _, err := a.l.AdmitCosts(ctx, spread(tenants, n, "far"), costs(n, fill)); err != nil {
						return err
					}
				}
				_, err := deleteMatch(ctx, a.rdb, a.prefix+":*:frontier:*")
				return err
			},
			batch: func(i int, last []limit.Decision) ([]string, []limit.Cost) {
				if i == 0 {
					sent = spread(tenants, n, "far")
					return sent, costs(n, cost)
				}
				var back []string
				for j, d := range last {
					if d.Kind == limit.Defer && d.Until.Equal(d.Due) {
						back = append(back, sent[j])
					}
				}
				if len(back) == 0 || i == 100 {
					return nil, nil
				}
				sent = back
				return sent, costs(len(sent), cost)
			},
		}
	}
	return []advCase{{
		name: "made-up tenants limited to 0, good beside them", rules: "*=0/1s;good=1000/1s", horizon: 24 * time.Hour,
		batch: func(i int, _ []limit.Decision) ([]string, []limit.Cost) {
			if i == 20 {
				return nil, nil
			}
			b := append(madeUp(i, n-10), make([]string, 10)...)
			for j := n - 10; j < n; j++ {
				b[j] = "good"
			}
			return b, nil
		},
	}, {
		name: "daily quota spent beside a per-second rule", rules: "*=1000/1s,5/1d", horizon: 24 * time.Hour,
		batch: func(i int, _ []limit.Decision) ([]string, []limit.Cost) {
			if i == 4 {
				return nil, nil
			}
			return spread(n/5, n, "daily"), nil
		},
	},
		far("events fit only 15 min ahead, 20 tenants", "*=1/1s", 1, 0),
		far("bytes fit only 15 min ahead, 20 tenants", "*=1000B/1s", 500, 600),
		{
			// Every tenant's search reads the capacity windows that those
			// before it in the call filled (TestBoundedCapacityManyTenants).
			name: "made-up tenants under CAPACITY=10/1s", rules: "*=1000000/1m", capacity: "10/1s", horizon: 15 * time.Minute,
			batch: func(i int, _ []limit.Decision) ([]string, []limit.Cost) {
				if i == 10 {
					return nil, nil
				}
				return madeUp(100+i, n), nil
			},
		},
	}
}

// adversarialScenario runs every adversarial case when the mode is asked for.
func (d *driver) adversarialScenario(ctx context.Context, rep *report) error {
	if !containsMode(d.o.Modes, modeAdversarial) {
		return nil
	}
	restore, err := slowlogAll(ctx, d.rdb)
	if err != nil {
		return err
	}
	defer restore()
	for i, c := range adversarialCases(d.o.Batch) {
		r, err := d.runAdversarial(ctx, c, fmt.Sprintf("gkbench-%s-adv%d", d.runID, i))
		if err != nil {
			return fmt.Errorf("adversarial %q: %w", c.name, err)
		}
		logf("[adversarial] %s: %d events, %d calls, Redis busy %.0f µs per 1,000 events, slowest call %.1f ms (most Redis CPU in one call %.1f ms), at most %d window reads per call",
			r.Case, r.Events, r.Calls, r.BusyPer1k, r.SlowestMs, r.MostCPUMs, r.MaxReads)
		rep.Adversarial = append(rep.Adversarial, r)
		if err := rep.write(d.o.Out); err != nil {
			return err
		}
	}
	return nil
}

// runAdversarial runs one case under key prefix prefix, then deletes its keys.
func (d *driver) runAdversarial(ctx context.Context, c advCase, prefix string) (advResult, error) {
	res := advResult{Case: c.name, Rules: c.rules}
	rules, err := limit.ParseRules(c.rules)
	if err != nil {
		return res, err
	}
	rdb := redis.NewClient(&redis.Options{Addr: d.o.Redis, ClientName: "gkbench-adversarial"})
	defer rdb.Close()
	defer deletePrefix(context.WithoutCancel(ctx), d.rdb, prefix)
	now := time.Now().Truncate(time.Hour)
	var capacity limit.Capacity
	if c.capacity != "" {
		if capacity, err = limit.ParseCapacity(c.capacity); err != nil {
			return res, err
		}
	}
	l, err := limit.New(ctx, rdb, rules, limit.Options{Prefix: prefix, Horizon: c.horizon, Clock: func() time.Time { return now },
		Timeout: time.Minute, Capacity: capacity})
	if err != nil {
		return res, err
	}
	a := &advRun{l: l, rdb: d.rdb, prefix: prefix}
	if c.setup != nil {
		if err := c.setup(ctx, a); err != nil {
			return res, fmt.Errorf("setup: %w", err)
		}
	}
	if err := resetStats(ctx, d.rdb); err != nil {
		return res, err
	}
	kinds := map[limit.Kind]int{}
	var busy int64
	var last []limit.Decision
	for i := 0; ; i++ {
		tenants, costs := c.batch(i, last)
		if tenants == nil {
			break
		}
		if err := d.rdb.Do(ctx, "SLOWLOG", "RESET").Err(); err != nil {
			return res, err
		}
		cpu0, err := mainThreadCPU(ctx, d.rdb)
		if err != nil {
			return res, err
		}
		if last, err = l.AdmitCosts(ctx, tenants, costs); err != nil {
			return res, err
		}
		cpu1, err := mainThreadCPU(ctx, d.rdb)
		if err != nil {
			return res, err
		}
		res.MostCPUMs = max(res.MostCPUMs, float64(cpu1-cpu0)/float64(time.Millisecond))
		stats, usec, err := readStats(ctx, d.rdb)
		if err != nil {
			return res, err
		}
		if err := resetStats(ctx, d.rdb); err != nil {
			return res, err
		}
		slow, err := slowestScript(ctx, d.rdb)
		if err != nil {
			return res, err
		}
		res.Events += len(tenants)
		res.Calls += int(stats["evalsha"] + stats["eval"])
		busy += usec.busy()
		res.SlowestMs = max(res.SlowestMs, float64(slow)/float64(time.Millisecond))
		res.MaxReads = max(res.MaxReads, stats["hmget"])
		for _, x := range last {
			kinds[x.Kind]++
		}
	}
	res.BusyPer1k = 1000 * float64(busy) / float64(max(res.Events, 1))
	res.Decisions = fmt.Sprintf("admit %d, defer %d, reject %d", kinds[limit.Admit], kinds[limit.Defer], kinds[limit.Reject])
	return res, nil
}

// mainThreadCPU returns the CPU time of Redis's main thread so far.
func mainThreadCPU(ctx context.Context, rdb *redis.Client) (time.Duration, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var d time.Duration
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_user_main_thread" || k == "used_cpu_sys_main_thread" {
			var f float64
			fmt.Sscanf(v, "%g", &f)
			d += time.Duration(f * float64(time.Second))
		}
	}
	return d, nil
}

// slowlogAll makes Redis log every command in SLOWLOG and returns what sets
// its settings back.
func slowlogAll(ctx context.Context, rdb *redis.Client) (restore func(), err error) {
	old, err := rdb.ConfigGet(ctx, "slowlog-*").Result()
	if err != nil {
		return nil, err
	}
	for k, v := range map[string]string{"slowlog-log-slower-than": "0", "slowlog-max-len": "10000"} {
		if err := rdb.ConfigSet(ctx, k, v).Err(); err != nil {
			return nil, err
		}
	}
	return func() {
		for k, v := range old {
			if err := rdb.ConfigSet(context.WithoutCancel(ctx), k, v).Err(); err != nil {
				logf("warning: set %s back to %s: %v", k, v, err)
			}
		}
	}, nil
}

// slowestScript returns the longest script call in SLOWLOG.
func slowestScript(ctx context.Context, rdb *redis.Client) (time.Duration, error) {
	logs, err := rdb.SlowLogGet(ctx, -1).Result()
	if err != nil {
		return 0, err
	}
	var d time.Duration
	for _, l := range logs {
		if len(l.Args) > 0 && strings.HasPrefix(strings.ToLower(l.Args[0]), "eval") {
			d = max(d, l.Duration)
		}
	}
	return d, nil
}

// deleteMatch deletes the keys that match pattern.
func deleteMatch(ctx context.Context, rdb *redis.Client, pattern string) (int, error) {
	n := 0
	iter := rdb.Scan(ctx, 0, pattern, 5000).Iterator()
	for iter.Next(ctx) {
		if err := rdb.Del(ctx, iter.Val()).Err(); err != nil {
			return n, err
		}
		n++
	}
	return n, iter.Err()
}

// adversarialTable is the report's table of the adversarial cases.
func (r *report) adversarialTable() string {
	if len(r.Adversarial) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("| case | rules | events | script calls | Redis busy per 1,000 events | slowest call (SLOWLOG) | most Redis CPU in one call | most window reads per call | decisions |\n|---|---|---:|---:|---:|---:|---:|---:|---|\n")
	for _, x := range r.Adversarial {
		fmt.Fprintf(&b, "| %s | `%s` | %d | %d | %.0f µs | %.1f ms | %.1f ms | %d | %s |\n", x.Case, x.Rules, x.Events, x.Calls, x.BusyPer1k, x.SlowestMs, x.MostCPUMs, x.MaxReads, x.Decisions)
	}
	return b.String()
}
