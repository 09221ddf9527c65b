package deploy

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"
)

// The alert rules, their promtool unit tests, the runbook, and the rules as
// a PrometheusRule; the dashboard is DashboardFile (monitoring.go).
const (
	rulesTestFile      = "prometheus/gatekeeper-rules_test.yaml"
	runbookFile        = "prometheus/RUNBOOK.md"
	prometheusRuleFile = k8sDir + "/prometheusrule.yaml"
	promtoolScript     = "local/promtool.sh"
	// runbookURL is where each alert's runbook_url points, before the anchor.
	runbookURL = "https://github.com/gatekeeper-dev/gatekeeper/blob/main/deploy/prometheus/RUNBOOK.md"
)

var updatePrometheusRule = flag.Bool("update-prometheusrule", false,
	"rewrite "+prometheusRuleFile+" from "+RulesFile)

// prometheusRule is prometheus-operator's PrometheusRule
// (monitoring.coreos.com/v1), from its own API package.
type prometheusRule = monitoringv1.PrometheusRule

// promtool runs deploy/local/promtool.sh, which installs promtool when it
// is missing. It fails the test, with promtool's output, if promtool cannot
// be installed or run, or reports a problem: never a skip.
func promtool(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(promtoolScript, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", promtoolScript, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestPrometheusRulesPromtool checks the rule file and runs its unit tests
// with promtool.
func TestPrometheusRulesPromtool(t *testing.T) {
	t.Log(promtool(t, "check", "rules", RulesFile))
	t.Log(promtool(t, "test", "rules", rulesTestFile))
}

// loadRules decodes the rule file strictly, as the groups of a
// PrometheusRule's spec.
func loadRules(t *testing.T) monitoringv1.PrometheusRuleSpec {
	t.Helper()
	data, err := os.ReadFile(RulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var spec monitoringv1.PrometheusRuleSpec
	if err := decodeStrict(data, &spec); err != nil {
		t.Fatalf("%s: %v", RulesFile, err)
	}
	if len(spec.Groups) == 0 {
		t.Fatalf("%s: no groups", RulesFile)
	}
	return spec
}

// alerts returns the alert rules of spec.
func alerts(spec monitoringv1.PrometheusRuleSpec) []monitoringv1.Rule {
	var out []monitoringv1.Rule
	for _, g := range spec.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r)
			}
		}
	}
	return out
}

// runbookAnchor is GitHub's anchor of a Markdown heading: lower case, spaces
// as hyphens, other punctuation dropped.
func runbookAnchor(heading string) string {
	s := strings.ReplaceAll(strings.ToLower(strings.TrimSpace(heading)), " ", "-")
	return regexp.MustCompile(`[^a-z0-9_-]`).ReplaceAllString(s, "")
}

// TestPrometheusRulesAnnotated checks that every alert has a severity, a
// summary, a description and a runbook_url whose anchor is a section of
// RUNBOOK.md, that RUNBOOK.md has no section without an alert, and that the
// promtool tests make every alert both fire and stay silent.
func TestPrometheusRulesAnnotated(t *testing.T) {
	runbook, err := os.ReadFile(runbookFile)
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^## (.+)$`).FindAllStringSubmatch(string(runbook), -1) {
		sections[runbookAnchor(m[1])] = true
	}
	fires, silent := promtoolCases(t)

	as := alerts(loadRules(t))
	if len(as) == 0 {
		t.Fatalf("%s: no alerts", RulesFile)
	}
	linked := map[string]bool{}
	for _, a := range as {
		if sev := a.Labels["severity"]; sev != "critical" && sev != "warning" {
			t.Errorf("alert %s label severity: got %q, want critical or warning", a.Alert, sev)
		}
		for _, k := range []string{"summary", "description"} {
			if strings.TrimSpace(a.Annotations[k]) == "" {
				t.Errorf("alert %s: no %s annotation", a.Alert, k)
			}
		}
		anchor := runbookAnchor(a.Alert)
		if got, want := a.Annotations["runbook_url"], runbookURL+"#"+anchor; got != want {
			t.Errorf("alert %s runbook_url: got %q, want %q", a.Alert, got, want)
		}
		if !sections[anchor] {
			t.Errorf("alert %s: %s has no section \"## %s\"", a.Alert, runbookFile, a.Alert)
		}
		linked[anchor] = true
		if !fires[a.Alert] {
			t.Errorf("alert %s: no case in %s where it fires", a.Alert, rulesTestFile)
		}
		if !silent[a.Alert] {
			t.Errorf("alert %s: no case in %s where it stays silent", a.Alert, rulesTestFile)
		}
	}
	for s := range sections {
		if !linked[s] {
			t.Errorf("%s: section #%s belongs to no alert", runbookFile, s)
		}
	}
}

// promtoolCases reads the promtool unit tests and returns the alerts that
// some case expects to fire and those that some case expects silent.
func promtoolCases(t *testing.T) (fires, silent map[string]bool) {
	t.Helper()
	data, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string            `json:"alertname"`
				ExpAlerts []json.RawMessage `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatalf("%s: %v", rulesTestFile, err)
	}
	fires, silent = map[string]bool{}, map[string]bool{}
	for _, tg := range f.Tests {
		for _, c := range tg.AlertRuleTest {
			if len(c.ExpAlerts) > 0 {
				fires[c.Alertname] = true
			} else {
				silent[c.Alertname] = true
			}
		}
	}
	return fires, silent
}

// prometheusRuleHeader is the part of k8s/prometheusrule.yaml before the
// rule file's groups.
const prometheusRuleHeader = `# Gatekeeper's alert rules as a prometheus-operator PrometheusRule: the groups of
# deploy/prometheus/gatekeeper-rules.yaml, unchanged (runbook: deploy/prometheus/RUNBOOK.md).
# Generated: edit the rule file, then run
#   go test ./deploy -run TestPrometheusRuleResource -update-prometheusrule
# (make test fails while the two differ). Needs prometheus-operator's CRDs; add the labels
# your Prometheus's ruleSelector expects (e.g. release: kube-prometheus-stack) in an overlay.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: gatekeeper
  labels:
    app.kubernetes.io/name: gatekeeper
    app.kubernetes.io/instance: gatekeeper
spec:
`

// generatePrometheusRule returns k8s/prometheusrule.yaml as it should be:
// the header, then the rule file from its groups on, indented under spec.
func generatePrometheusRule(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile(RulesFile)
	if err != nil {
		t.Fatal(err)
	}
	loc := regexp.MustCompile(`(?m)^groups:`).FindIndex(data)
	if loc == nil {
		t.Fatalf("%s: no groups: line", RulesFile)
	}
	var b strings.Builder
	b.WriteString(prometheusRuleHeader)
	for _, l := range strings.SplitAfter(string(data[loc[0]:]), "\n") {
		if strings.TrimSpace(l) != "" {
			b.WriteString("  ")
		}
		b.WriteString(l)
	}
	return []byte(b.String())
}

// TestPrometheusRuleResource checks that k8s/prometheusrule.yaml holds
// exactly the groups of the rule file (both decoded strictly), and with
// -update-prometheusrule writes it from the rule file first.
func TestPrometheusRuleResource(t *testing.T) {
	if *updatePrometheusRule {
		if err := os.WriteFile(prometheusRuleFile, generatePrometheusRule(t), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(prometheusRuleFile)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := decodeObject(data)
	if err != nil {
		t.Fatalf("%s: %v", prometheusRuleFile, err)
	}
	pr, ok := obj.(*prometheusRule)
	if !ok {
		t.Fatalf("%s: got %T, want a PrometheusRule", prometheusRuleFile, obj)
	}
	if diff := cmp.Diff(loadRules(t), pr.Spec); diff != "" {
		t.Errorf("%s spec differs from %s (-rule file +PrometheusRule); run go test ./deploy -run %s -update-prometheusrule:\n%s",
			prometheusRuleFile, RulesFile, t.Name(), diff)
	}
	w := loadWiring(t)
	for k, v := range w.dep.Spec.Template.Labels {
		if k == "app.kubernetes.io/name" && pr.Labels[k] != v {
			t.Errorf("%s label %s: got %q, want the pods' %q", prometheusRuleFile, k, pr.Labels[k], v)
		}
	}
}

// TestDashboardQueriesParse checks every PromQL expression of the dashboard
// with promtool: they go, Grafana's variables replaced, into a temporary
// rule file as recording rules, which promtool check rules parses.
func TestDashboardQueriesParse(t *testing.T) {
	qs, err := DashboardQueries()
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) < 20 {
		t.Fatalf("%s: got %d queries, want the full dashboard", DashboardFile, len(qs))
	}
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	var index strings.Builder
	for i, q := range qs {
		name := fmt.Sprintf("dashboard:query_%d", i)
		rules = append(rules, rule{Record: name, Expr: q.Expr})
		fmt.Fprintf(&index, "%s: %s\n    %s\n", name, q.Where, q.Expr)
	}
	data, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtoolScript, "check", "rules", file).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules on the dashboard's queries: %v\n%s\nthe queries:\n%s", err, out, index.String())
	}
	t.Logf("%s: %d queries parse (%s)", DashboardFile, len(qs), strings.TrimSpace(string(out)))
}

// TestDashboardModel checks what Grafana needs from the dashboard: a
// Prometheus data source variable used by every panel and query, job and
// instance variables used by every query, and unique panel ids.
func TestDashboardModel(t *testing.T) {
	data, err := os.ReadFile(DashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	type ds struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	}
	var d struct {
		UID        string `json:"uid"`
		Title      string `json:"title"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Query      any    `json:"query"`
				Datasource *ds    `json:"datasource"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID         int    `json:"id"`
			Type       string `json:"type"`
			Title      string `json:"title"`
			Datasource *ds    `json:"datasource"`
			Targets    []struct {
				Datasource *ds    `json:"datasource"`
				Expr       string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", DashboardFile, err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q title %q: want both", d.UID, d.Title)
	}
	want := ds{Type: "prometheus", UID: "${datasource}"}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Type == "query" && (v.Datasource == nil || *v.Datasource != want) {
			t.Errorf("variable %s datasource: got %+v, want %+v", v.Name, v.Datasource, want)
		}
		if v.Name == "datasource" && v.Query != "prometheus" {
			t.Errorf("variable datasource query: got %v, want prometheus", v.Query)
		}
	}
	for name, typ := range map[string]string{"datasource": "datasource", "job": "query", "instance": "query"} {
		if vars[name] != typ {
			t.Errorf("variable %s: got type %q, want %q", name, vars[name], typ)
		}
	}
	var ids []int
	for _, p := range d.Panels {
		if slices.Contains(ids, p.ID) {
			t.Errorf("panel %q: id %d used twice", p.Title, p.ID)
		}
		ids = append(ids, p.ID)
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || *p.Datasource != want {
			t.Errorf("panel %q datasource: got %+v, want %+v", p.Title, p.Datasource, want)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q: no queries", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Datasource == nil || *tg.Datasource != want {
				t.Errorf("panel %q query datasource: got %+v, want %+v", p.Title, tg.Datasource, want)
			}
			for _, v := range []string{`job=~"$job"`, `instance=~"$instance"`} {
				if !strings.Contains(tg.Expr, v) {
					t.Errorf("panel %q query %s: no %s", p.Title, tg.Expr, v)
				}
			}
		}
	}
}

// TestMetricNames checks how names are read out of PromQL expressions.
func TestMetricNames(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`sum by (decision) (rate(gatekeeper_decisions_total{job=~"$job", decision!="admit"}[5m]))`, []string{"gatekeeper_decisions_total"}},
		{`sum(rate(x_total[5m])) by (topic) / on (topic) group_left (partition) y`, []string{"x_total", "y"}},
		{"histogram_quantile(0.99, sum by (le) (rate(h_bucket{topic=~`.+\\.retry`}[5m]))) > 5", []string{"h_bucket"}},
		{`a unless last_over_time(b[1h] offset 15m) or increase(c[15m]) and bool d`, []string{"a", "b", "c", "d"}},
		{`go_gc_gomemlimit_bytes < 1e18`, []string{"go_gc_gomemlimit_bytes"}},
		{`count(m == 0) or vector(0)`, []string{"m"}},
		{`absent(gatekeeper_build_info)`, []string{"gatekeeper_build_info"}},
		// A name given only as __name__ is not seen; the files never select so.
		{`{__name__="named"}`, nil},
		{`rate(x[5m:1m] @ start())`, []string{"x"}},
		{`max_over_time(deriv(q{a="b(c)"}[10m])[1h:])`, []string{"q"}},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, MetricNames(tt.expr)); diff != "" {
				t.Errorf("MetricNames(%q) (-want +got):\n%s", tt.expr, diff)
			}
		})
	}
}

// TestMetricIn checks the matching of series names to metric families.
func TestMetricIn(t *testing.T) {
	families := map[string]bool{"h": true, "c_total": true}
	tests := []struct {
		name string
		want bool
	}{
		{"h", true}, {"h_bucket", true}, {"h_sum", true}, {"h_count", true},
		{"c_total", true}, {"c", false}, {"h_total", false}, {"other_bucket", false},
	}
	for _, tt := range tests {
		if got := MetricIn(tt.name, families); got != tt.want {
			t.Errorf("MetricIn(%q): got %v, want %v", tt.name, got, tt.want)
		}
	}
}
