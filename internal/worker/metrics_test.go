package worker

import (
	"context"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/gatekeeper-dev/gatekeeper/deploy"
	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/route"
	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// recordingRegisterer registers with a real registry (so that conflicts
// still fail) and remembers the collectors.
type recordingRegisterer struct {
	*prometheus.Registry
	collectors []prometheus.Collector
}

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recordingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// descNameRE reads the name out of a Desc's String(): client_golang gives a
// Desc no accessor for it.
var descNameRE = regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)

// families returns the name of every metric family the collectors
// describe, whether or not it has a series yet.
func (r *recordingRegisterer) families(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for _, c := range r.collectors {
		ch := make(chan *prometheus.Desc)
		go func() {
			c.Describe(ch)
			close(ch)
		}()
		for d := range ch {
			m := descNameRE.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("no fqName in %s", d)
			}
			names[m[1]] = true
		}
	}
	return names
}

// servedMetrics registers what Serve registers over a process's life, the
// way Serve does it: the process collectors and build info, the limits file
// watcher, the readiness checks, the limiter (against miniredis) and the
// pipeline. It returns every metric family they describe.
func servedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	reg := &recordingRegisterer{Registry: prometheus.NewRegistry()}
	if err := registerProcessMetrics(reg, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := NewWatcher(filepath.Join(t.TempDir(), "limits.yaml"), func(*limit.Rules) error { return nil }, testenv.DiscardLogger(), reg); err != nil {
		t.Fatal(err)
	}
	if err := reg.Register(newReadyCollector(newReadiness([]readyCheck{passingCheck("redis")}, 0, readyMaxAge))); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { rdb.Close() })
	rules, err := limit.ParseRules("*=1/1s")
	if err != nil {
		t.Fatal(err)
	}
	if lim, err := startLimiter(context.Background(), testenv.DiscardLogger(), rdb, rules, limit.Options{Registerer: reg}); lim == nil || err != nil {
		t.Fatalf("startLimiter: got %v, %v; want a limiter", lim, err)
	}
	if _, err := newPipelineMetrics(reg); err != nil {
		t.Fatal(err)
	}
	return reg.families(t)
}

// TestMonitoringMetricsRegistered checks the dashboard and the alert rules
// (deploy/grafana, deploy/prometheus) against the collectors the binary
// registers, by their descriptions: every metric name they use is
// registered, including the labelled ones that have no series until their
// first use (offsets lost, signature failures, oversized events, handover
// counters), which a scrape cannot show. And every gatekeeper_ metric has a
// place on the dashboard. integration/ops_metrics_test.go checks the same
// names against a scrape of the running binary.
func TestMonitoringMetricsRegistered(t *testing.T) {
	registered := servedMetrics(t)
	used, err := deploy.MonitoringMetricNames()
	if err != nil {
		t.Fatal(err)
	}
	for name, where := range used {
		if !deploy.MetricIn(name, registered) {
			t.Errorf("%s: not registered by gatekeeper; used by %v", name, where)
		}
	}
	qs, err := deploy.DashboardQueries()
	if err != nil {
		t.Fatal(err)
	}
	onDashboard := map[string]bool{}
	for _, q := range qs {
		for _, n := range deploy.MetricNames(q.Expr) {
			onDashboard[n] = true
		}
	}
	var missing []string
	for name := range registered {
		if !strings.HasPrefix(name, "gatekeeper_") {
			continue
		}
		found := onDashboard[name]
		for _, s := range deploy.HistogramSuffixes {
			found = found || onDashboard[name+s]
		}
		if !found {
			missing = append(missing, name)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("registered but not on %s: %v", deploy.DashboardFile, missing)
	}
	if len(registered) < 40 {
		t.Errorf("got %d registered metric families, want gatekeeper's and the Go and process collectors'", len(registered))
	}
}

// TestPipelineSeriesStartAtZero checks that the labelled counters of the
// pipeline have their known series at 0 from the start, so that the first
// event of a kind is an increase that increase() and the alert rules see.
func TestPipelineSeriesStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newPipelineMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	topics := route.Topics{Downstream: "out", Retry: "out.retry", DLQ: "out.dlq"}
	m.zeroKnownSeries([]string{"in"}, topics)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			if s.GetCounter() == nil || s.GetCounter().GetValue() != 0 {
				continue
			}
			var labels []string
			for _, l := range s.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			got[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = true
		}
	}
	want := []string{
		"gatekeeper_decisions_total{decision=admit}",
		"gatekeeper_decisions_total{decision=defer}",
		"gatekeeper_decisions_total{decision=reject}",
		"gatekeeper_decisions_total{decision=fail}",
		"gatekeeper_decisions_total{decision=invalid}",
		"gatekeeper_decisions_total{decision=reserved}",
		"gatekeeper_decisions_total{decision=max_attempts}",
		"gatekeeper_retry_sig_failures_total{reason=missing}",
		"gatekeeper_events_in_total{topic=in}",
		"gatekeeper_events_in_total{topic=out.retry}",
		"gatekeeper_events_out_total{topic=out}",
		"gatekeeper_events_out_total{topic=out.dlq}",
		"gatekeeper_events_out_total{topic=out.retry}",
		"gatekeeper_oversized_total{topic=out}",
		"gatekeeper_offsets_lost_total{topic=in}",
		"gatekeeper_handover_skipped_total{topic=out.retry}",
	}
	for _, w := range want {
		if !got[w] {
			t.Errorf("series %s: missing or not 0 at start", w)
		}
	}
}

// The retry group's session timeout is at most retrySessionTimeout, so that
// a crashed replica's retry partitions move before many reserved slots end;
// a shorter KAFKA_SESSION_TIMEOUT applies as it is. The source group keeps
// KAFKA_SESSION_TIMEOUT.
func TestRetryGroupSessionTimeout(t *testing.T) {
	m, err := newPipelineMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	retrier := &route.Retrier{Admission: route.Admission{Router: &route.Router{Topics: route.Topics{Downstream: "out", Retry: "out.retry", DLQ: "out.dlq"}}}}
	for _, tt := range []struct{ session, wantRetry time.Duration }{
		{30 * time.Second, 10 * time.Second},
		{8 * time.Second, 8 * time.Second},
	} {
		p := Pipeline{Config: &Config{KafkaConfig: KafkaConfig{GroupID: "g", KafkaSessionTimeout: tt.session}}}
		dc := p.retryConfig(m, retrier)
		if dc.SessionTimeout != tt.wantRetry || dc.GroupID != "g.retry" {
			t.Errorf("session %v: retry group %s session %v, want g.retry %v", tt.session, dc.GroupID, dc.SessionTimeout, tt.wantRetry)
		}
		if dc.HeartbeatInterval <= 0 || dc.HeartbeatInterval > dc.SessionTimeout/3 {
			t.Errorf("session %v: heartbeat %v for a session of %v", tt.session, dc.HeartbeatInterval, dc.SessionTimeout)
		}
		if got := p.groupConfig(m).SessionTimeout; got != tt.session {
			t.Errorf("source group session: got %v, want %v", got, tt.session)
		}
		// Back soon after the broker returns; with leases, a crashed
		// member is noticed within a lease and the survivors learn of the
		// rebalance within a short heartbeat.
		if dc.JoinGroupBackoff != joinBackoff || dc.BackoffMax != recoverBackoff || dc.Leases != nil {
			t.Errorf("retry group: join backoff %v, backoff max %v, leases %v; want %v, %v, none", dc.JoinGroupBackoff, dc.BackoffMax, dc.Leases, joinBackoff, recoverBackoff)
		}
		// While the restarted coordinator loads the group, the retry group
		// tries to join again every 100 ms (consume/joinwait.go), so that
		// its members' joins reach it soon after the load.
		if dc.CoordinatorJoinBackoff != loadingJoinBackoff || loadingJoinBackoff > 100*time.Millisecond {
			t.Errorf("retry group: join backoff while the coordinator loads %v, want %v (at most 100ms)", dc.CoordinatorJoinBackoff, loadingJoinBackoff)
		}
		// So does the source group, whose other failed joins are tried again
		// every 0.5s as the retry group's (kafka-go's default: 5s).
		if gc := p.groupConfig(m); gc.CoordinatorJoinBackoff != loadingJoinBackoff || gc.JoinGroupBackoff != joinBackoff {
			t.Errorf("source group: join backoff %v, while the coordinator loads %v; want %v, %v", gc.JoinGroupBackoff, gc.CoordinatorJoinBackoff, joinBackoff, loadingJoinBackoff)
		}
		p.Leases = redisLeases{}
		if dc := p.retryConfig(m, retrier); dc.Leases == nil || dc.HeartbeatInterval != retryLeaseHeartbeat {
			t.Errorf("retry group with leases: leases %v, heartbeat %v; want set, %v", dc.Leases, dc.HeartbeatInterval, retryLeaseHeartbeat)
		}
	}
}

// A source partition's fetch responses are at most 1 MiB, and at most
// BATCH_BYTES when that is smaller: not BATCH_BYTES itself (4 MiB by
// default), which held 24 MiB decoded at once over six partitions.
func TestSourceFetchBytes(t *testing.T) {
	m, err := newPipelineMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ batchBytes, want int }{
		{4 << 20, 1 << 20},
		{1 << 20, 1 << 20},
		{64 << 10, 64 << 10},
	} {
		p := Pipeline{Config: &Config{TopicsConfig: TopicsConfig{SourceTopics: []string{"in"}}, BoundsConfig: BoundsConfig{BatchBytes: tt.batchBytes}}}
		gc := p.sourceConfig(m)
		if gc.MaxBytes != tt.want || !slices.Equal(gc.Topics, []string{"in"}) {
			t.Errorf("BATCH_BYTES %d: fetch bytes %d, topics %v; want %d, [in]", tt.batchBytes, gc.MaxBytes, gc.Topics, tt.want)
		}
	}
}
