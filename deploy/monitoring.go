package deploy

import (
	"cmp"
	"embed"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// The monitoring files, relative to this directory.
const (
	DashboardFile = "grafana/gatekeeper.json"
	RulesFile     = "prometheus/gatekeeper-rules.yaml"
)

//go:embed grafana/gatekeeper.json prometheus/gatekeeper-rules.yaml
var monitoringFiles embed.FS

// Query is one PromQL expression of the dashboard or the rule file.
type Query struct {
	// Where names the file and the panel, variable or rule that holds it.
	Where string
	// Expr is the expression. In the dashboard's, Grafana's variables are
	// replaced by concrete values, so that it parses as PromQL.
	Expr string
}

// grafanaBuiltins are the values given to Grafana's built-in variables.
var grafanaBuiltins = map[string]string{
	"__rate_interval": "5m",
	"__interval":      "1m",
	"__range":         "1h",
}

// grafanaVarRE matches a Grafana variable: $name, ${name}, ${name:format}
// or [[name]].
var grafanaVarRE = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)

// labelValuesRE matches a query variable's label_values(selector, label).
var labelValuesRE = regexp.MustCompile(`^\s*label_values\((.*),\s*\w+\s*\)\s*$`)

// dashboard is the part of Grafana's dashboard JSON model that holds queries.
type dashboard struct {
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name     string          `json:"name"`
			Type     string          `json:"type"`
			Query    json.RawMessage `json:"query"`
			AllValue string          `json:"allValue"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"` // a collapsed row's panels
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

// DashboardQueries returns every PromQL expression of the dashboard: each
// panel target's expr and the selector of each query variable's
// label_values(). Grafana's variables are replaced: built-ins such as
// $__rate_interval by a duration, a textbox variable by its default, a
// query variable by its allValue (else "value"). An unknown variable is an
// error.
func DashboardQueries() ([]Query, error) {
	data, err := monitoringFiles.ReadFile(DashboardFile)
	if err != nil {
		return nil, err
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", DashboardFile, err)
	}
	values := map[string]string{}
	for k, v := range grafanaBuiltins {
		values[k] = v
	}
	var raw []Query
	for _, v := range d.Templating.List {
		var q any
		if len(v.Query) > 0 {
			if err := json.Unmarshal(v.Query, &q); err != nil {
				return nil, fmt.Errorf("%s: variable %s: %w", DashboardFile, v.Name, err)
			}
		}
		if m, ok := q.(map[string]any); ok { // the Prometheus query editor's form
			q = m["query"]
		}
		s, _ := q.(string)
		switch v.Type {
		case "textbox", "constant", "custom":
			values[v.Name] = s
		case "query":
			values[v.Name] = cmp.Or(v.AllValue, "value")
			m := labelValuesRE.FindStringSubmatch(s)
			if m == nil {
				return nil, fmt.Errorf("%s: variable %s: query %q is not label_values(selector, label)", DashboardFile, v.Name, s)
			}
			raw = append(raw, Query{Where: fmt.Sprintf("%s variable %s", DashboardFile, v.Name), Expr: m[1]})
		default:
			values[v.Name] = "value"
		}
	}
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				raw = append(raw, Query{Where: fmt.Sprintf("%s panel %q target %s", DashboardFile, p.Title, t.RefID), Expr: t.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for i, q := range raw {
		var unknown []string
		raw[i].Expr = grafanaVarRE.ReplaceAllStringFunc(q.Expr, func(v string) string {
			m := grafanaVarRE.FindStringSubmatch(v)
			name := m[1] + m[2] + m[3]
			val, ok := values[name]
			if !ok {
				unknown = append(unknown, v)
			}
			return val
		})
		if len(unknown) > 0 {
			return nil, fmt.Errorf("%s: unknown variables %v", q.Where, unknown)
		}
		if strings.TrimSpace(q.Expr) == "" {
			return nil, fmt.Errorf("%s: empty expression", q.Where)
		}
	}
	return raw, nil
}

// RuleQueries returns the expression of every rule of the rule file.
func RuleQueries() ([]Query, error) {
	data, err := monitoringFiles.ReadFile(RulesFile)
	if err != nil {
		return nil, err
	}
	var f struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert  string `json:"alert"`
				Record string `json:"record"`
				Expr   string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", RulesFile, err)
	}
	var qs []Query
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			qs = append(qs, Query{Where: fmt.Sprintf("%s group %s rule %s", RulesFile, g.Name, r.Alert+r.Record), Expr: r.Expr})
		}
	}
	if len(qs) == 0 {
		return nil, fmt.Errorf("%s: no rules", RulesFile)
	}
	return qs, nil
}

// MonitoringMetricNames returns every metric name the dashboard and the rule
// file select, each with the places that use it.
func MonitoringMetricNames() (map[string][]string, error) {
	dq, err := DashboardQueries()
	if err != nil {
		return nil, err
	}
	rq, err := RuleQueries()
	if err != nil {
		return nil, err
	}
	names := map[string][]string{}
	for _, q := range append(dq, rq...) {
		for _, n := range MetricNames(q.Expr) {
			names[n] = append(names[n], q.Where)
		}
	}
	return names, nil
}

var (
	// promStringRE matches PromQL string literals.
	promStringRE = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	// promMatchersRE matches label matchers (once strings are gone) and
	// range or subquery brackets.
	promMatchersRE = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	// promGroupingRE matches the label lists of by, without, on, ignoring,
	// group_left and group_right.
	promGroupingRE = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	// promIdentRE matches an identifier, or the tail of a number ("15m",
	// "1e18"), which MetricNames tells apart by the character before it.
	promIdentRE = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	// promKeywords are identifiers that are not metric names.
	promKeywords = map[string]bool{
		"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true, "without": true,
		"on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true, "atan2": true,
	}
)

// MetricNames returns the metric names that expr selects, sorted, as
// written: a histogram's series keep their _bucket, _sum or _count suffix.
// It reads the expression with regular expressions, not a PromQL parser: an
// identifier is a metric name unless it is a keyword, is followed by "("
// (a function or an aggregation), or stands in a label matcher, a string,
// a grouping label list or a range. Use it on expressions that parse.
func MetricNames(expr string) []string {
	s := promStringRE.ReplaceAllString(expr, `""`)
	s = promMatchersRE.ReplaceAllString(s, " ")
	s = promGroupingRE.ReplaceAllString(s, " ")
	var names []string
	for _, loc := range promIdentRE.FindAllStringIndex(s, -1) {
		name := s[loc[0]:loc[1]]
		glued := loc[0] > 0 && strings.ContainsRune("0123456789.", rune(s[loc[0]-1]))
		call := strings.HasPrefix(strings.TrimLeft(s[loc[1]:], " \t\n"), "(")
		if glued || call || promKeywords[strings.ToLower(name)] {
			continue
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// HistogramSuffixes are the suffixes of a histogram's series names.
var HistogramSuffixes = []string{"_bucket", "_sum", "_count"}

// MetricIn reports whether the series name belongs to one of families (by
// family name, as /metrics and the client library name them): name itself,
// or a histogram's or summary's series of one.
func MetricIn(name string, families map[string]bool) bool {
	if families[name] {
		return true
	}
	for _, suffix := range HistogramSuffixes {
		if base, ok := strings.CutSuffix(name, suffix); ok && families[base] {
			return true
		}
	}
	return false
}
