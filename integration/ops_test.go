package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// Operations: health and readiness, /metrics, the usage API and its CLI twin,
// and live reloads of LIMITS_FILE, all against the running binary.

// opsUsage is the body of GET /v1/usage/{tenant} and of `gatekeeper usage`.
type opsUsage struct {
	Tenant string `json:"tenant"`
	Rules  []struct {
		Rule      string    `json:"rule"`
		Count     int64     `json:"count"`
		Limit     int64     `json:"limit"`
		Remaining int64     `json:"remaining"`
		Reset     time.Time `json:"reset"`
	} `json:"rules"`
}

// opsAvoidDayEnd waits until a UTC day boundary is not about to pass: the
// tests count against 1d windows, and a window ending mid-test would reset
// the counts they compare.
func opsAvoidDayEnd(t *testing.T) {
	t.Helper()
	now := time.Now().UTC()
	midnight := now.Truncate(24 * time.Hour).Add(24 * time.Hour)
	if left := midnight.Sub(now); left < 3*time.Minute {
		t.Logf("waiting %v for the UTC day to end", left.Round(time.Second))
		time.Sleep(left + 2*time.Second)
	}
}

// opsUsageOf reads the usage API with the bearer token.
func opsUsageOf(t *testing.T, p *gkProc, token, escapedTenant string) opsUsage {
	t.Helper()
	code, body, err := p.Get("/v1/usage/"+escapedTenant, "Authorization", "Bearer "+token)
	if err != nil || code != 200 {
		t.Fatalf("GET /v1/usage/%s: got %d %q (%v), want 200", escapedTenant, code, body, err)
	}
	var u opsUsage
	if err := json.Unmarshal([]byte(body), &u); err != nil {
		t.Fatalf("usage body %q: %v", body, err)
	}
	return u
}

// opsMetrics scrapes /metrics.
func opsMetrics(t *testing.T, p *gkProc) map[string]*dto.MetricFamily {
	t.Helper()
	code, body, err := p.Get("/metrics")
	if err != nil || code != 200 {
		t.Fatalf("GET /metrics: got %d (%v), want 200", code, err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// opsValue returns the sum of the series of family name whose labels
// include want (counter, gauge or untyped; a histogram's sample count), and
// whether one exists.
func opsValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	mf, ok := fams[name]
	if !ok {
		return 0, false
	}
	var sum float64
	found := false
next:
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		default:
			continue
		}
		found = true
	}
	return sum, found
}

// opsSum adds every series of family name.
func opsSum(fams map[string]*dto.MetricFamily, name string) float64 {
	var s float64
	for _, m := range fams[name].GetMetric() {
		s += m.GetGauge().GetValue() + m.GetCounter().GetValue()
	}
	return s
}

// opsRun runs the binary once with the GATEKEEPER_* variables of env (plus
// the test servers) and returns stdout, stderr and the exit code.
func opsRun(t *testing.T, env map[string]string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(gatekeeperBinary(t), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"GATEKEEPER_KAFKA_BROKERS=" + kafkaAddr(), "GATEKEEPER_REDIS_ADDRS=" + redisAddr()}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("gatekeeper %v: still running after a minute; stderr:\n%s", args, stderr.String())
	}
	return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
}

// opsCountKey counts the messages of msgs with key k.
func opsCountKey(msgs []kafka.Message, k string) int {
	n := 0
	for _, m := range msgs {
		if string(m.Key) == k {
			n++
		}
	}
	return n
}

// opsMessages returns n events keyed by tenant, spread over 3 partitions.
func opsMessages(tenant string, n int) []kafka.Message {
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Partition: i % 3, Key: []byte(tenant), Value: []byte(fmt.Sprintf("%s #%d", tenant, i))}
	}
	return msgs
}

// TestOpsProbesWithoutRedis: with Redis unreachable the process is alive
// (/healthz 200: no restart would help) but not ready (/readyz 503 naming
// Redis), serves /metrics, and still stops cleanly on SIGTERM.
func TestOpsProbesWithoutRedis(t *testing.T) {
	t.Parallel()
	gk := startGatekeeper(t, "gk", map[string]string{
		"GATEKEEPER_SOURCE_TOPICS":    "gkt-ops-unused",
		"GATEKEEPER_DOWNSTREAM_TOPIC": "gkt-ops-unused.out",
		"GATEKEEPER_LIMITS":           "*=10/1m",
		"GATEKEEPER_REDIS_ADDRS":      testenv.FreeAddr(t), // nothing listens there
		"GATEKEEPER_REDIS_TIMEOUT":    "500ms",
		"GATEKEEPER_GROUP_ID":         "gk-" + uniqueName(t),
	})
	waitFor(t, 30*time.Second, "/healthz answers", func() (bool, string) {
		code, body, err := gk.Get("/healthz")
		return err == nil && code == 200 && body == "ok\n", fmt.Sprintf("%d %q %v", code, body, err)
	})
	// Give readiness a few looks: it must stay 503 while Redis is away.
	for i := 0; i < 3; i++ {
		code, body, err := gk.Get("/readyz")
		if err != nil || code != 503 {
			t.Fatalf("/readyz without Redis: got %d %q (%v), want 503", code, body, err)
		}
		for _, want := range []string{"[-]redis failed", "[+]kafka ok", "[-]limiter failed", "not ready"} {
			if !strings.Contains(body, want) {
				t.Errorf("/readyz body: got %q, want it to contain %q", body, want)
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
	fams := opsMetrics(t, gk)
	if _, ok := opsValue(fams, "gatekeeper_build_info", nil); !ok {
		t.Error("/metrics without Redis: no gatekeeper_build_info")
	}
	if code, took := gk.terminate(30 * time.Second); code != 0 {
		t.Errorf("exit code after SIGTERM while waiting for Redis: got %d, want 0 (took %v)", code, took)
	}
}

// TestOpsUsageAndMetrics runs one gatekeeper with an admin token over a
// tenant whose name needs escaping, then checks the usage API (auth, both
// path forms, counts equal to what was admitted), `gatekeeper usage`, and
// the metrics.
func TestOpsUsageAndMetrics(t *testing.T) {
	t.Parallel()
	opsAvoidDayEnd(t)
	const (
		tenant = "a/b c/ünï"
		other  = "plain-tenant"
		token  = "ops-test-token-0123"
	)
	f := newFlow(t, 3)
	limits := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(limits, []byte("default: [1000/1d]\ntenants:\n  \"a/b c/ünï\": [7/1d]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := f.env(t, "GATEKEEPER_LIMITS_FILE", limits, "GATEKEEPER_ADMIN_TOKEN", token)
	gk := startGatekeeper(t, "gk", env)
	gk.waitReady(90 * time.Second)

	if code, body, err := gk.Get("/healthz"); err != nil || code != 200 || body != "ok\n" {
		t.Errorf("/healthz: got %d %q (%v), want 200 \"ok\\n\"", code, body, err)
	}
	code, body, err := gk.Get("/readyz")
	if err != nil || code != 200 {
		t.Errorf("/readyz once joined: got %d %q (%v), want 200", code, body, err)
	}
	for _, want := range []string{"[+]kafka ok", "[+]redis ok", "[+]limiter ok", "[+]consumption ok", "ready"} {
		if !strings.Contains(body, want) {
			t.Errorf("/readyz body: got %q, want it to contain %q", body, want)
		}
	}

	// 20 events of the tenant: 7 fit today's window, 7 get tomorrow's
	// (within the 24h horizon), 6 have no room within the horizon.
	produce(t, f.Source, append(opsMessages(tenant, 20), opsMessages(other, 5)...))
	waitFor(t, 60*time.Second, "25 decisions", func() (bool, string) {
		fams := opsMetrics(t, gk)
		n := 0.0
		for _, d := range []string{"admit", "defer", "reject"} {
			v, _ := opsValue(fams, "gatekeeper_decisions_total", map[string]string{"decision": d})
			n += v
		}
		return n == 25, fmt.Sprintf("%v decisions", n)
	})
	down, dlq := readTopic(t, f.Downstream), readTopic(t, f.DLQ)
	if got := opsCountKey(down, tenant); got != 7 {
		t.Errorf("downstream events of %q: got %d, want 7 (its limit)", tenant, got)
	}
	if got := opsCountKey(down, other); got != 5 {
		t.Errorf("downstream events of %q: got %d, want 5", other, got)
	}
	if got := opsCountKey(dlq, tenant); got != 6 {
		t.Errorf("dead-lettered events of %q: got %d, want 6", tenant, got)
	}

	// Auth: 401 without a token, with a wrong one and with another scheme.
	escaped := url.PathEscape(tenant)
	for _, h := range [][]string{nil, {"Authorization", "Bearer wrong-token"}, {"Authorization", "Basic " + token}, {"Authorization", token}} {
		code, body, err := gk.Get("/v1/usage/"+escaped, h...)
		if err != nil || code != 401 {
			t.Errorf("GET /v1/usage with header %q: got %d %q (%v), want 401", h, code, body, err)
		}
	}

	// The tenant's usage, with its slashes escaped and not: same answer, and
	// the count is what went downstream.
	u := opsUsageOf(t, gk, token, escaped)
	tomorrow := time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
	if u.Tenant != tenant || len(u.Rules) != 1 {
		t.Fatalf("usage of %q: got %+v, want the tenant with 1 rule", tenant, u)
	}
	r := u.Rules[0]
	if r.Rule != "7/1d" || r.Count != 7 || r.Limit != 7 || r.Remaining != 0 || !r.Reset.Equal(tomorrow) {
		t.Errorf("usage of %q: got %+v, want rule 7/1d count 7 limit 7 remaining 0 reset %v", tenant, r, tomorrow)
	}
	raw := "a/b%20c/%C3%BCn%C3%AF"
	if u2 := opsUsageOf(t, gk, token, raw); fmt.Sprint(u2) != fmt.Sprint(u) {
		t.Errorf("usage with unescaped slashes (%s): got %+v, want %+v", raw, u2, u)
	}
	uo := opsUsageOf(t, gk, token, other)
	if len(uo.Rules) != 1 || uo.Rules[0].Rule != "1000/1d" || uo.Rules[0].Count != 5 || uo.Rules[0].Remaining != 995 {
		t.Errorf("usage of %q: got %+v, want rule 1000/1d count 5 remaining 995", other, uo)
	}
	if un := opsUsageOf(t, gk, token, "nobody-yet"); len(un.Rules) != 1 || un.Rules[0].Count != 0 || un.Rules[0].Limit != 1000 {
		t.Errorf("usage of a tenant without events: got %+v, want count 0 limit 1000", un)
	}

	// `gatekeeper usage` reads the same counters.
	stdout, stderr, exit := opsRun(t, env, "usage", tenant)
	if exit != 0 {
		t.Fatalf("gatekeeper usage %q: exit %d: %s", tenant, exit, stderr)
	}
	var cli opsUsage
	if err := json.Unmarshal([]byte(stdout), &cli); err != nil {
		t.Fatalf("gatekeeper usage output %q: %v", stdout, err)
	}
	if fmt.Sprint(cli) != fmt.Sprint(u) {
		t.Errorf("gatekeeper usage %q: got %+v, want the API's %+v", tenant, cli, u)
	}

	// Metrics: decisions, Redis latency, reloads, deferred waiting, flows.
	var fams map[string]*dto.MetricFamily
	waitFor(t, 60*time.Second, "the 7 deferred events waiting in the retry tiers", func() (bool, string) {
		fams = opsMetrics(t, gk)
		w := opsSum(fams, "gatekeeper_deferred_waiting")
		return w == 7, fmt.Sprintf("gatekeeper_deferred_waiting total %v", w)
	})
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64 // -1: present, any value
	}{
		{"gatekeeper_decisions_total", map[string]string{"decision": "admit"}, 12},
		{"gatekeeper_decisions_total", map[string]string{"decision": "defer"}, 7},
		{"gatekeeper_decisions_total", map[string]string{"decision": "reject"}, 6},
		{"gatekeeper_events_in_total", map[string]string{"topic": f.Source}, 25},
		{"gatekeeper_events_out_total", map[string]string{"topic": f.Downstream}, 12},
		{"gatekeeper_events_out_total", map[string]string{"topic": f.DLQ}, 6},
		{"gatekeeper_config_reloads_total", map[string]string{"result": "ok"}, 0},
		{"gatekeeper_config_reloads_total", map[string]string{"result": "error"}, 0},
		{"gatekeeper_redis_errors_total", nil, 0},
		{"gatekeeper_redis_unchecked_total", nil, 0},
		{"gatekeeper_redis_call_seconds", map[string]string{"op": "admit"}, -1},
		{"gatekeeper_limiter_cache_hits_total", nil, -1},
		{"gatekeeper_replayed_decisions_total", nil, 0}, // a clean run replays nothing
		{"gatekeeper_late_reservations_total", nil, 0},
		{"gatekeeper_batch_size", nil, -1},
		{"gatekeeper_consumer_lag", map[string]string{"topic": f.Source}, -1},
		{"gatekeeper_build_info", nil, 1},
	} {
		got, ok := opsValue(fams, c.name, c.labels)
		switch {
		case !ok:
			t.Errorf("/metrics: no %s%v", c.name, c.labels)
		case c.want >= 0 && got != c.want:
			t.Errorf("/metrics %s%v: got %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if n, _ := opsValue(fams, "gatekeeper_redis_call_seconds", map[string]string{"op": "admit"}); n < 1 {
		t.Errorf("gatekeeper_redis_call_seconds{op=admit} count: got %v, want at least 1", n)
	}
	if code, took := gk.terminate(30 * time.Second); code != 0 {
		t.Errorf("exit code after SIGTERM: got %d, want 0 (took %v)", code, took)
	}
}

// opsLimitsDir lays out a limits file as a Kubernetes ConfigMap volume does:
// dir/limits.yaml -> ..data/limits.yaml, ..data -> ..<version>/, and an
// update swaps the ..data symlink atomically.
type opsLimitsDir struct {
	t   *testing.T
	dir string
	n   int
}

func (d *opsLimitsDir) file() string { return filepath.Join(d.dir, "limits.yaml") }

// write publishes content as the kubelet does: a new version directory,
// then a rename of a fresh symlink over ..data.
func (d *opsLimitsDir) write(content string) {
	d.t.Helper()
	d.n++
	version := fmt.Sprintf("..2026_01_01_00_00_%02d.%d", d.n, d.n)
	if err := os.Mkdir(filepath.Join(d.dir, version), 0o755); err != nil {
		d.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.dir, version, "limits.yaml"), []byte(content), 0o644); err != nil {
		d.t.Fatal(err)
	}
	tmp := filepath.Join(d.dir, "..data_tmp")
	if err := os.Symlink(version, tmp); err != nil {
		d.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(d.dir, "..data")); err != nil {
		d.t.Fatal(err)
	}
	if d.n == 1 {
		if err := os.Symlink(filepath.Join("..data", "limits.yaml"), d.file()); err != nil {
			d.t.Fatal(err)
		}
	}
}

// TestOpsLimitsFileReload edits LIMITS_FILE under a running gatekeeper, the
// way a ConfigMap update reaches a pod: a raised limit applies without a
// restart, and invalid edits are refused, counted and leave the rules in
// force and the process running.
func TestOpsLimitsFileReload(t *testing.T) {
	t.Parallel()
	opsAvoidDayEnd(t)
	const token = "ops-reload-token"
	f := newFlow(t, 3)
	ld := &opsLimitsDir{t: t, dir: t.TempDir()}
	ld.write("default: [1000/1d]\ntenants:\n  reload: [5/1d]\n")
	gk := startGatekeeper(t, "gk", f.env(t, "GATEKEEPER_LIMITS_FILE", ld.file(), "GATEKEEPER_ADMIN_TOKEN", token,
		"GATEKEEPER_ROLES", "gate"))
	gk.waitReady(90 * time.Second)

	decided := func(want float64) {
		t.Helper()
		waitFor(t, 60*time.Second, fmt.Sprintf("%v decisions", want), func() (bool, string) {
			fams := opsMetrics(t, gk)
			n := 0.0
			for _, d := range []string{"admit", "defer", "reject"} {
				v, _ := opsValue(fams, "gatekeeper_decisions_total", map[string]string{"decision": d})
				n += v
			}
			return n == want, fmt.Sprintf("%v decisions", n)
		})
	}
	reloads := func(result string) float64 {
		v, ok := opsValue(opsMetrics(t, gk), "gatekeeper_config_reloads_total", map[string]string{"result": result})
		if !ok {
			t.Fatalf("/metrics: no gatekeeper_config_reloads_total{result=%q}", result)
		}
		return v
	}
	check := func(when string, wantDown int, rule string, count, lim int64) {
		t.Helper()
		if got := opsCountKey(readTopic(t, f.Downstream), "reload"); got != wantDown {
			t.Errorf("%s: downstream events: got %d, want %d", when, got, wantDown)
		}
		u := opsUsageOf(t, gk, token, "reload")
		if len(u.Rules) != 1 || u.Rules[0].Rule != rule || u.Rules[0].Count != count || u.Rules[0].Limit != lim {
			t.Errorf("%s: usage: got %+v, want rule %s count %d limit %d", when, u.Rules, rule, count, lim)
		}
	}

	// 5/1d: 5 of 12 go downstream.
	produce(t, f.Source, opsMessages("reload", 12))
	decided(12)
	check("limit 5/1d", 5, "5/1d", 5, 5)

	// Raised to 50/1d: applied live, to what the window already holds
	// (5), so the next 12 all fit and the count is 17.
	ld.write("default: [1000/1d]\ntenants:\n  reload: [50/1d]\n")
	waitFor(t, 30*time.Second, "the new limit in the usage API", func() (bool, string) {
		u := opsUsageOf(t, gk, token, "reload")
		return len(u.Rules) == 1 && u.Rules[0].Limit == 50, fmt.Sprintf("%+v", u.Rules)
	})
	if got := reloads("ok"); got != 1 {
		t.Errorf("gatekeeper_config_reloads_total{result=ok}: got %v, want 1", got)
	}
	produce(t, f.Source, opsMessages("reload", 12))
	decided(24)
	check("limit 50/1d", 17, "50/1d", 17, 50)

	// Invalid edits: a bad rule, then one that parses but does not tile the
	// calendar (refused when applied). Each is counted; 50/1d stays.
	for i, bad := range []string{
		"default: [1000/1d]\ntenants:\n  reload: [fifty/1d]\n",
		"default: [1000/1d]\ntenants:\n  reload: [50/7m]\n",
	} {
		ld.write(bad)
		waitFor(t, 30*time.Second, fmt.Sprintf("invalid edit %d refused", i+1), func() (bool, string) {
			got := reloads("error")
			return got == float64(i+1), fmt.Sprintf("gatekeeper_config_reloads_total{result=error} %v", got)
		})
	}
	select {
	case <-gk.Done():
		t.Fatalf("gatekeeper exited after invalid limits edits: %v", gk.Err())
	default:
	}
	if code, body, err := gk.Get("/readyz"); err != nil || code != 200 {
		t.Errorf("/readyz after invalid edits: got %d %q (%v), want 200", code, body, err)
	}
	if got := reloads("ok"); got != 1 {
		t.Errorf("gatekeeper_config_reloads_total{result=ok} after invalid edits: got %v, want 1", got)
	}
	produce(t, f.Source, opsMessages("reload", 3))
	decided(27)
	check("after invalid edits", 20, "50/1d", 20, 50)
	if !gk.LogContains("limits file not applied") {
		t.Error("log: want a line saying the limits file was not applied")
	}
	if code, took := gk.terminate(30 * time.Second); code != 0 {
		t.Errorf("exit code after SIGTERM: got %d, want 0 (took %v)", code, took)
	}
}
