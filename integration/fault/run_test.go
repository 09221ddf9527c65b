//go:build fault

package fault

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// How a scenario runs: its topics, group and key prefix (flow), the
// gatekeepers, the load and the fault, the drain, and the readiness monitor.

// flow names one scenario's topics, consumer group and key prefix.
type flow struct {
	Source, Downstream, Retry, DLQ string
	Group, Prefix                  string
}

// newFlow creates a scenario's topics, named after it and the run: the
// source (6 partitions), downstream, the three retry tiers and the dead
// letter topic (3 each). Downstream and the retry tiers stamp the broker's
// append time, so the tally knows when an event was forwarded. The topics are
// deleted when the test ends.
func newFlow(t *testing.T, name string) flow {
	t.Helper()
	base := fmt.Sprintf("gkf-%s-%s", runID, name)
	f := flow{Source: base, Downstream: base + ".out", Group: base, Prefix: base}
	f.Retry = f.Downstream + ".retry"
	f.DLQ = f.Downstream + ".dlq"
	appendTime := []kafka.ConfigEntry{{ConfigName: "message.timestamp.type", ConfigValue: "LogAppendTime"}}
	topics := []kafka.TopicConfig{
		{Topic: f.Source, NumPartitions: sourcePartitions, ReplicationFactor: 1},
		{Topic: f.DLQ, NumPartitions: tierPartitions, ReplicationFactor: 1},
		{Topic: f.Downstream, NumPartitions: tierPartitions, ReplicationFactor: 1, ConfigEntries: appendTime},
	}
	for _, tier := range f.Tiers() {
		topics = append(topics, kafka.TopicConfig{Topic: tier, NumPartitions: tierPartitions, ReplicationFactor: 1, ConfigEntries: appendTime})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := createTopics(ctx, topics); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		var names []string
		for _, tc := range topics {
			names = append(names, tc.Topic)
		}
		deleteTopics(names)
	})
	return f
}

// Tiers are the retry tier topics.
func (f flow) Tiers() []string { return []string{f.Retry, f.Retry + ".1h", f.Retry + ".long"} }

// RetryGroup is the consumer group of the retry role (cmd/gatekeeper: GROUP_ID + ".retry").
func (f flow) RetryGroup() string { return f.Group + ".retry" }

// env is the gatekeeper configuration of the flow.
func (f flow) env() map[string]string {
	return map[string]string{
		"GATEKEEPER_SOURCE_TOPICS":         f.Source,
		"GATEKEEPER_DOWNSTREAM_TOPIC":      f.Downstream,
		"GATEKEEPER_RETRY_TOPIC":           f.Retry,
		"GATEKEEPER_DLQ_TOPIC":             f.DLQ,
		"GATEKEEPER_GROUP_ID":              f.Group,
		"GATEKEEPER_REDIS_KEY_PREFIX":      f.Prefix,
		"GATEKEEPER_KAFKA_BROKERS":         kafkaAddr(),
		"GATEKEEPER_REDIS_ADDRS":           redisAddr(),
		"GATEKEEPER_LIMITS":                limits,
		"GATEKEEPER_BATCH_SIZE":            strconv.Itoa(batchSize),
		"GATEKEEPER_BATCH_WAIT":            "20ms",
		"GATEKEEPER_SHUTDOWN_GRACE":        shutdownGrace.String(),
		"GATEKEEPER_KAFKA_SESSION_TIMEOUT": sessionTimeout.String(),
		"GATEKEEPER_LOG_LEVEL":             logLevel(),
	}
}

// logLevel is the gatekeepers' log level: GATEKEEPER_FAULT_LOG_LEVEL when
// set (debug shows kafka-go's joins and the partitions' fetches, to read a
// scenario's phases from GATEKEEPER_FAULT_LOG_DIR), else info.
func logLevel() string {
	if l := os.Getenv("GATEKEEPER_FAULT_LOG_LEVEL"); l != "" {
		return l
	}
	return "info"
}

// run is one scenario while it runs. Its methods other than those taking
// the test are safe for concurrent use.
type run struct {
	t            *testing.T
	sc           scenario
	flow         flow
	fleet        *fleet
	kafkaVersion string
	coll         *collector // downstream and dead letter
	mon          *monitor
	counts       *countPoller
	prod         *producer
	start        time.Time // of the load

	mu    sync.Mutex
	marks []faultMark
	backs []faultMark // when a fault's cause went away (the broker serving again)
}

// since is the time since the load started.
func (r *run) since() time.Duration { return time.Since(r.start).Round(100 * time.Millisecond) }

// sleepUntil sleeps until d after the start of the load.
func (r *run) sleepUntil(d time.Duration) { time.Sleep(time.Until(r.start.Add(d))) }

// mark records the start of a fault.
func (r *run) mark(name string) {
	r.mu.Lock()
	r.marks = append(r.marks, faultMark{name: name, at: time.Now()})
	r.mu.Unlock()
	r.t.Logf("fault: %s at +%v (%s)", name, r.since(), time.Now().UTC().Format("15:04:05.000"))
}

// markBack records the end of a fault's cause (the broker serving again).
func (r *run) markBack(name string) { r.markBackAt(name, time.Now()) }

// markBackAt records the end of a fault's cause at a time seen earlier.
func (r *run) markBackAt(name string, at time.Time) {
	r.mu.Lock()
	r.backs = append(r.backs, faultMark{name: name, at: at})
	r.mu.Unlock()
}

// runScenario runs sc: fresh topics, group and key prefix; the gatekeepers;
// the load with the fault; the wait until every event is out; SIGTERM; the
// figures and the assertions.
func runScenario(t *testing.T, sc scenario) {
	began := time.Now()
	r := startRun(t, sc)
	params := sc.fault(r)
	t.Logf("phase fault done at +%v; waiting for the load to end", r.since())
	o := r.finish(params)
	o.took = time.Since(began)
	report(t, o)
	check(t, o)
	if sc.capacity != "" {
		checkCapacityWindows(t, r.flow.Prefix, capacityPerSecond)
	}
}

// startRun creates the flow, starts the gatekeepers and waits until they
// own every partition, then starts reading the outputs, polling readiness
// and the load.
func startRun(t *testing.T, sc scenario) *run {
	r := &run{t: t, sc: sc, kafkaVersion: servers.broker.Version()}
	t.Logf("phase setup: %s, kafka %s, %d replicas", sc.name, r.kafkaVersion, sc.replicas)
	r.flow = newFlow(t, sc.name)
	r.fleet = &fleet{env: r.flow.env()}
	if sc.capacity != "" {
		r.fleet.env["GATEKEEPER_CAPACITY"] = sc.capacity
	}
	if sc.boundSettled {
		settleTakesBound(t, r.flow.Prefix)
	}
	if sc.lastEnv != nil {
		r.fleet.startReady(t, sc.replicas-1)
		r.fleet.startWith(t, sc.lastEnv()).WaitReady(t, 90*time.Second)
	} else {
		r.fleet.startReady(t, sc.replicas)
	}
	groups := map[string]int{r.flow.Group: sourcePartitions, r.flow.RetryGroup(): retryPartitions}
	r.fleet.waitAssigned(t, groups, 90*time.Second)

	var err error
	if r.coll, err = startCollector([]string{r.flow.Downstream, r.flow.DLQ}, t.Logf); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.coll.stop() })
	r.mon = startMonitor(r.fleet, monitorEvery)
	t.Cleanup(func() { r.mon.stop() })
	r.counts = startCountPoller(r.flow.Prefix, 5*time.Second)
	t.Cleanup(func() { r.counts.stop() })

	// The load starts just after a window starts: a hot tenant then fills
	// every window early and is never admitted directly near a window's
	// end, where an event decided in one window can be appended in the next.
	now := time.Now().UnixMilli()
	time.Sleep(time.Until(time.UnixMilli(now - now%window.Milliseconds() + window.Milliseconds() + 100)))
	ctx, cancel := context.WithCancel(context.Background())
	tenants := loadTenants(sourcePartitions, sc.scale)
	if r.prod, err = startLoad(ctx, r.flow.Source, tenants, sc.load, t.Logf); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); r.prod.wait() })
	r.start = r.prod.startedAt()
	hot := 0
	for _, tn := range tenants {
		if tn.hot {
			hot++
		}
	}
	t.Logf("phase load: %d tenants (%d hot at %v to %v/s, %d at %v/s) for %v from %s, limit %s",
		len(tenants), hot, hotRateMin, hotRateMax, len(tenants)-hot, normalRate, sc.load,
		r.start.UTC().Format("15:04:05.000"), limits)
	return r
}

// finish waits for the end of the load and until every event is out,
// stops the gatekeepers with SIGTERM, reads everything back and tallies.
func (r *run) finish(params dupParams) outcome {
	t, f := r.t, r.flow
	res := r.prod.wait()
	samples := r.mon.stop()
	t.Logf("load done: %d events in %v, %d writes acknowledged, %d failed, %d never acknowledged, %d skipped after stalls",
		len(res.Events), res.End.Sub(res.Start).Round(time.Millisecond), res.Writes, res.Failed, res.Unacked, res.Skipped)

	t.Logf("phase drain: waiting until every event is downstream or dead-lettered and both groups committed all")
	if err := waitDrained(f, r.fleet, r.coll, res, r.sc.load+90*time.Second, t.Logf); err != nil {
		t.Errorf("not drained: %v", err)
	}
	t.Logf("phase stop: SIGTERM to %d gatekeepers", len(r.fleet.procs()))
	r.fleet.terminate(t, shutdownGrace, r.fleet.procs()...)

	t.Logf("phase tally")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	outputs := map[string]int{f.Downstream: tierPartitions, f.DLQ: tierPartitions}
	if err := r.coll.waitCaughtUp(ctx, outputs, time.Minute); err != nil {
		t.Errorf("read the outputs: %v", err)
	}
	out, foreign := r.coll.stop()
	source, err := readAll(ctx, f.Source)
	if err != nil {
		t.Fatalf("read the source: %v", err)
	}
	fig := tally(res, source, out, f.Downstream, window)
	fig.Foreign = foreign
	retry, err := readAll(ctx, f.Retry)
	if err != nil {
		t.Errorf("read the first retry tier: %v", err)
	}
	fig.RetryDups = retryDups(retry)
	if fig.RedisCounted, fig.RedisByTenant, fig.RedisMost, fig.RedisMostKey, err = redisCounted(ctx, f.Prefix, r.counts.stop()); err != nil {
		t.Errorf("read the window counts: %v", err)
	}
	logTakesBound(t, f.Prefix)
	r.mu.Lock()
	marks, backs := r.marks, r.backs
	r.mu.Unlock()
	fig.Backs = backs
	return outcome{sc: r.sc, flow: f, kafkaVersion: r.kafkaVersion, fig: fig, res: res, out: out, retry: retry,
		recs: recoveries(marks, res.End, samples, fig.Latency), marks: marks,
		bound: dupBound(r.sc.name, params)}
}

// waitDrained waits until every acknowledged event has been read back from
// downstream or the dead-letter topic and both consumer groups have committed
// every offset of the source and the retry tiers (nothing deferred is left
// waiting), bounded by timeout.
func waitDrained(f flow, fl *fleet, coll *collector, res loadResult, timeout time.Duration, logf func(string, ...any)) error {
	start := time.Now()
	var missing []int
	for id, s := range res.Events {
		if !s.produced.IsZero() {
			missing = append(missing, id)
		}
	}
	nextLog := start.Add(10 * time.Second)
	var status string
	for {
		still := missing[:0]
		for _, id := range missing {
			if !coll.seen(id) {
				still = append(still, id)
			}
		}
		missing = still
		ok, s := drainedGroups(f)
		status = fmt.Sprintf("%d events not out yet; %s", len(missing), s)
		if len(missing) == 0 && ok {
			logf("drained %v after the load", time.Since(start).Round(100*time.Millisecond))
			return nil
		}
		if time.Since(start) > timeout {
			return fmt.Errorf("after %v: %s (first missing ids %v)", timeout, status, missing[:min(len(missing), 10)])
		}
		if time.Now().After(nextLog) {
			logf("drain: %v: %s", time.Since(start).Round(time.Second), status)
			nextLog = nextLog.Add(10 * time.Second)
		}
		for _, p := range fl.procs() {
			if p.Exited() {
				return fmt.Errorf("%s exited during the drain: %v\n%s", p.Name, p.Err(), p.Tail(20))
			}
		}
		time.Sleep(time.Second)
	}
}

// drainedGroups reports whether the source group and the retry group have
// committed every offset.
func drainedGroups(f flow) (bool, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lag, lagging, err := lagOf(ctx, f.Group, f.Source, sourcePartitions)
	if err != nil {
		return false, "source lag: " + err.Error()
	}
	parts := []string{fmt.Sprintf("source lag %d [%s]", lag, lagging)}
	total := lag
	for _, tier := range f.Tiers() {
		l, lagging, err := lagOf(ctx, f.RetryGroup(), tier, tierPartitions)
		if err != nil {
			return false, tier + " lag: " + err.Error()
		}
		if l > 0 {
			parts = append(parts, fmt.Sprintf("%s lag %d [%s]", tier, l, lagging))
		}
		total += l
	}
	return total == 0, strings.Join(parts, "; ")
}

// readAll reads every test event of topic present now (testenv.ReadTopic),
// within a minute.
func readAll(ctx context.Context, topic string) ([]outEvent, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	recs, err := testenv.ReadTopic(ctx, kafkaAddr(), topic)
	var events []outEvent
	for _, r := range recs {
		if e, ok := outEventOf(r); ok {
			events = append(events, e)
		}
	}
	return events, err
}

// monitor polls the readiness of the fleet's live processes until stopped.
type monitor struct {
	stopc chan struct{}
	done  chan struct{}
	once  sync.Once

	mu      sync.Mutex
	samples []readySample
}

func startMonitor(fl *fleet, every time.Duration) *monitor {
	m := &monitor{stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			at := time.Now()
			ok, why := fl.allReady(context.Background())
			m.mu.Lock()
			m.samples = append(m.samples, readySample{at: at, ok: ok, why: why})
			m.mu.Unlock()
			select {
			case <-m.stopc:
				return
			case <-tick.C:
			}
		}
	}()
	return m
}

// stop stops polling and returns the samples.
func (m *monitor) stop() []readySample {
	m.once.Do(func() { close(m.stopc) })
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.samples
}

// settleTakesBound sets the fleet's bound on the slots late events took
// (limit.Limiter.TakesUntil) to 0 under prefix before the fleet starts: no
// take is due after the epoch, as in a deployment whose bound was set more
// than DEFER_HORIZON ago and that took no slot since.
func settleTakesBound(t *testing.T, prefix string) {
	t.Helper()
	if err := onRedis(func(ctx context.Context, rdb *redis.Client) error {
		return rdb.Set(ctx, prefix+":takes-until", 0, 0).Err()
	}); err != nil {
		t.Fatalf("settle the bound on slots taken: %v", err)
	}
}

// logTakesBound logs the fleet's bound on the slots taken as the run left
// it: 0 after settleTakesBound means no late event took a slot, and every
// event back in its slot passed on one read of it.
func logTakesBound(t *testing.T, prefix string) {
	t.Helper()
	var v int64
	err := onRedis(func(ctx context.Context, rdb *redis.Client) (err error) {
		v, err = rdb.Get(ctx, prefix+":takes-until").Int64()
		return err
	})
	switch {
	case errors.Is(err, redis.Nil):
		t.Logf("figures: bound on slots taken: none (no replica read it)")
	case err != nil:
		t.Errorf("read the bound on slots taken: %v", err)
	default:
		t.Logf("figures: bound on slots taken: %s (unix ms %d)", time.UnixMilli(v).UTC().Format(time.RFC3339Nano), v)
	}
}

// onRedis runs f with a client of the suite's Redis, within 10 s.
func onRedis(f func(ctx context.Context, rdb *redis.Client) error) error {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return f(ctx, rdb)
}
