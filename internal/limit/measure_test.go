package limit

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseRuleMeasures(t *testing.T) {
	tests := []struct {
		rule    string
		limit   int64
		measure Measure
		str     string // Rule.String
		counter string // Rule.Counter
	}{
		{"1000/1m", 1000, Events, "1000/1m", "1m"},
		{"10MiB/1m", 10 << 20, Bytes, "10MiB/1m", "1m/bytes"},
		{"500KB/1s", 500000, Bytes, "500KB/1s", "1s/bytes"},
		{"500kB/1s", 500000, Bytes, "500KB/1s", "1s/bytes"},
		{"2GiB/1d", 2 << 30, Bytes, "2GiB/1d", "1d/bytes"},
		{"3GB/1d", 3e9, Bytes, "3GB/1d", "1d/bytes"},
		{"7MB/1h", 7e6, Bytes, "7MB/1h", "1h/bytes"},
		{"1TiB/mo", 1 << 40, Bytes, "1TiB/1mo", "1mo/bytes"},
		{"2TB/1w", 2e12, Bytes, "2TB/1w", "1w/bytes"},
		{"1024KiB/1m", 1 << 20, Bytes, "1MiB/1m", "1m/bytes"},
		{"1500B/1s", 1500, Bytes, "1500B/1s", "1s/bytes"},
		{"2048B/1s", 2048, Bytes, "2KiB/1s", "1s/bytes"},
		{"0B/1s", 0, Bytes, "0B/1s", "1s/bytes"},
		{"1024PiB/1s", 0, 0, "", ""}, // no such suffix: an error below
		{"5000u/1m", 5000, Units, "5000u/1m", "1m/units"},
		{"0u/15m", 0, Units, "0u/15m", "15m/units"},
	}
	for _, tt := range tests {
		t.Run(tt.rule, func(t *testing.T) {
			r, err := parseRule(tt.rule)
			if tt.str == "" {
				if err == nil {
					t.Fatalf("parseRule(%q): got %+v, want an error", tt.rule, r)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseRule(%q): %v", tt.rule, err)
			}
			if r.Limit != tt.limit || r.Measure != tt.measure {
				t.Errorf("parseRule(%q): got limit %d %v, want %d %v", tt.rule, r.Limit, r.Measure, tt.limit, tt.measure)
			}
			if got := r.String(); got != tt.str {
				t.Errorf("String: got %q, want %q", got, tt.str)
			}
			if got := r.Counter(); got != tt.counter {
				t.Errorf("Counter: got %q, want %q", got, tt.counter)
			}
			back, err := parseRule(r.String())
			if err != nil || back != r {
				t.Errorf("parseRule(String()): got %+v, %v, want %+v", back, err, r)
			}
		})
	}
}

func TestParseRuleMeasureErrors(t *testing.T) {
	tests := []struct{ rule, quote string }{
		{"10mib/1m", `rule "10mib/1m": limit "10mib"`},
		{"1.5MiB/1m", `limit "1.5MiB" is not a whole number of bytes`},
		{"-1MiB/1m", `limit "-1MiB" is not a whole number of bytes`},
		{"MiB/1m", `limit "MiB"`},
		{"1025TiB/1m", `up to 1PiB`},
		{"1126TB/1m", `up to 1PiB`},
		{"u/1m", `limit "u" is not a whole number of units`},
		{"1.5u/1m", `limit "1.5u" is not a whole number of units`},
		{"1099511627777u/1m", `units from 0 to 2^40`},
		{"1099511627777/1m", `from 0 to 2^40`},
		{"+5u/1m", `limit "+5u"`},
		{"10 MiB/1m", `limit "10 MiB"`},
		{"10MiB/1x", `unknown unit "x"`},
	}
	for _, tt := range tests {
		t.Run(tt.rule, func(t *testing.T) {
			_, err := parseRule(tt.rule)
			if err == nil || !strings.Contains(err.Error(), tt.quote) {
				t.Errorf("parseRule(%q): got %v, want an error containing %s", tt.rule, err, tt.quote)
			}
		})
	}
}

func TestParseRulesMixed(t *testing.T) {
	rs, err := ParseRules("acme=1000/1m,10MiB/1m,2GiB/1d;*=5000u/1m,100/1m")
	if err != nil {
		t.Fatal(err)
	}
	want := []Rule{{1000, 1, Minute, Events}, {10 << 20, 1, Minute, Bytes}, {2 << 30, 1, Day, Bytes}}
	if diff := cmp.Diff(want, rs.For("acme")); diff != "" {
		t.Errorf("acme (-want +got):\n%s", diff)
	}
	if !CountsCosts(rs.For("acme")) || !CountsCosts(rs.For("other")) {
		t.Errorf("CountsCosts: got false, want true for tenants with byte or unit rules")
	}
	if !rs.Counts(Units) || !rs.Counts(Bytes) {
		t.Errorf("Counts: got false, want true for bytes and units")
	}
	events := mustRules(t, "a=1/1m")
	if CountsCosts(events.For("a")) || events.Counts(Bytes) || events.Counts(Units) {
		t.Errorf("event rules: got counting costs, want not")
	}
	for spec, quote := range map[string]string{
		"a=1MiB/1m,2MiB/1m": `"a=1MiB/1m,2MiB/1m": two bytes rules for window 1m`,
		"a=1u/1m,2u/1m":     `two units rules for window 1m`,
		"a=1/1m,2/1m":       `two rules for window 1m`,
	} {
		if _, err := ParseRules(spec); err == nil || !strings.Contains(err.Error(), quote) {
			t.Errorf("ParseRules(%q): got %v, want an error containing %s", spec, err, quote)
		}
	}
}

func TestCostCheck(t *testing.T) {
	tests := []struct {
		c     Cost
		quote string // "" for no error
	}{
		{Cost{}, ""},
		{Cost{Bytes: 10, Units: MaxCost}, ""},
		{Cost{Bytes: -1}, "-1 bytes is negative"},
		{Cost{Units: -2}, "-2 units is negative"},
		{Cost{Units: MaxCost + 1}, "over 2^40"},
		{Cost{Bytes: MaxBytesLimit + 1}, "over 2^50"},
	}
	for _, tt := range tests {
		err := tt.c.Check()
		if tt.quote == "" && err != nil || tt.quote != "" && (err == nil || !strings.Contains(err.Error(), tt.quote)) {
			t.Errorf("%+v.Check(): got %v, want %q", tt.c, err, tt.quote)
		}
	}
}

func TestOverLimit(t *testing.T) {
	rules := mustRules(t, "a=10/1m,1KiB/1m,5u/1s").For("a")
	tests := []struct {
		c    Cost
		want string
	}{
		{Cost{Bytes: 1024, Units: 5}, ""},
		{Cost{Bytes: 1025, Units: 5}, "cost of 1025 bytes over the whole limit of rule 1KiB/1m"},
		{Cost{Bytes: 1, Units: 6}, "cost of 6 units over the whole limit of rule 5u/1s"},
	}
	for _, tt := range tests {
		if got := overLimit(rules, tt.c); got != tt.want {
			t.Errorf("overLimit(%+v): got %q, want %q", tt.c, got, tt.want)
		}
	}
}
