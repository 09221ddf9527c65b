package limit

import (
	"strings"
	"testing"
	"unicode"

	"github.com/google/go-cmp/cmp"
)

func TestParseRules(t *testing.T) {
	rs, err := ParseRules("*=100/1m;acme=1000/1m,50000/1d;trial=10/1s; big co =5/2h,7/mo")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		tenant string
		want   []Rule
	}{
		{"acme", []Rule{{1000, 1, Minute, Events}, {50000, 1, Day, Events}}},
		{"trial", []Rule{{10, 1, Second, Events}}},
		{"big co", []Rule{{5, 2, Hour, Events}, {7, 1, Month, Events}}},
		{"someone else", []Rule{{100, 1, Minute, Events}}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, rs.For(tt.tenant)); diff != "" {
			t.Errorf("For(%q) (-want +got):\n%s", tt.tenant, diff)
		}
	}
	if got, want := rs.For("acme")[1].String(), "50000/1d"; got != want {
		t.Errorf("String: got %q, want %q", got, want)
	}
}

func TestParseRulesErrors(t *testing.T) {
	tests := []struct{ spec, quote string }{
		{"", `no rules`},
		{"acme", `"acme"`},
		{"acme=10", `rule "10"`},
		{"acme=x/1m", `limit "x"`},
		{"acme=-1/1m", `limit "-1"`},
		{"acme=10/1x", `unknown unit "x"`},
		{"acme=10/0m", `window count "0"`},
		{"acme=10/1m,20/1m", `two rules for window 1m`},
		{"=10/1m", `empty tenant`},
		{"a=1/1m;a=2/1m", `tenant "a" given twice`},
		{"*=1/1m;*=2/1m", `"*" given twice`},
		{"acme=10/1m;trial=5/q", `"trial=5/q"`},
		// Windows over a year, of every unit; the first two overflowed Go
		// durations (a 25-minute window; every script call failing).
		{"a=10/213504d", `rule "10/213504d": window longer than a year (at most 366d`},
		{"a=10/106752d", `rule "10/106752d": window longer than a year`},
		{"a=10/367d", `at most 366d`},
		{"a=10/31622401s", `at most 31622400s`},
		{"a=10/527041m", `at most 527040m`},
		{"a=10/8785h", `at most 8784h`},
		{"a=10/53w", `at most 52w`},
		{"a=10/13mo", `at most 12mo`},
		{"a=10/99999999999999999999d", `window count "99999999999999999999"`},
		{"a=1099511627777/1m", `limit "1099511627777"`},
		// Tenant names: no "=", no control characters, quoted in errors.
		{"a=b=10/1m", `tenant "a=b": must not hold "="`},
		{"a\x1b[31mb=10/1m", `tenant "a\x1b[31mb": must not hold control characters`},
		{"a\u0085b=10/1m", `tenant "a\u0085b": must not hold control characters`},
		{strings.Repeat("x", 257) + "=10/1m", `over 256 bytes`},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			_, err := ParseRules(tt.spec)
			if err == nil {
				t.Fatalf("ParseRules(%q): got no error, want one quoting %s", tt.spec, tt.quote)
			}
			if !strings.Contains(err.Error(), tt.quote) {
				t.Errorf("ParseRules(%q): got %q, want it to contain %s", tt.spec, err, tt.quote)
			}
			if strings.ContainsFunc(err.Error(), unicode.IsControl) {
				t.Errorf("ParseRules(%q): error %q holds a raw control character", tt.spec, err)
			}
		})
	}
}

// TestParseRulesLongestWindows accepts the longest window of every unit, in
// both window kinds, and the largest limit.
func TestParseRulesLongestWindows(t *testing.T) {
	spec := "a=1/31622400s;b=1/527040m;c=1/8784h;d=1/366d;e=1/52w;f=1/12mo;g=1099511627776/1s;h=0/1m"
	rs, err := ParseRules(spec)
	if err != nil {
		t.Fatalf("ParseRules(%q): %v", spec, err)
	}
	for _, tenant := range rs.Tenants() {
		r := rs.For(tenant)[0]
		if r.Length() <= 0 || r.Length() > MaxWindow {
			t.Errorf("tenant %s: got window length %v, want from 1s to %v", tenant, r.Length(), MaxWindow)
		}
	}
	if err := CheckRules(mustRules(t, "a=1/1d;b=1/1w;c=1/12mo"), Aligned); err != nil {
		t.Errorf("aligned 1d, 1w, 12mo: got %v, want nil", err)
	}
}

func TestCheckRulesAligned(t *testing.T) {
	for spec, ok := range map[string]bool{"a=1/15m": true, "a=1/7m": false, "a=1/6h": true, "a=1/5h": false,
		"a=1/2d": false, "a=1/3mo": true, "a=1/5mo": false, "a=1/1w": true, "*=1/30s": true} {
		err := CheckRules(mustRules(t, spec), Aligned)
		if (err == nil) != ok {
			t.Errorf("CheckRules(%q, aligned): got %v, want ok=%v", spec, err, ok)
		}
		if err := CheckRules(mustRules(t, spec), TTL); err != nil {
			t.Errorf("CheckRules(%q, ttl): got %v, want nil", spec, err)
		}
	}
}

func FuzzParseRules(f *testing.F) {
	for _, s := range []string{"*=100/1m;acme=1000/1m,50000/1d;trial=10/1s", "a=1/mo", "x=0/1w", "a=b=1/1s", ";;", "a=1/99999999999s", "a=1000/1m,10MiB/1m,2GiB/1d;*=5u/1s,500KB/1s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		rs, err := ParseRules(spec)
		if err != nil {
			return
		}
		// What parses must print back to rules that parse to the same thing.
		for _, tenant := range append(rs.Tenants(), "*") {
			for _, r := range rs.For(tenant) {
				back, err := parseRule(r.String())
				if err != nil || back != r {
					t.Fatalf("rule %+v prints as %q, parses back as %+v, %v", r, r.String(), back, err)
				}
				if r.Count < 1 || r.Limit < 0 || r.Unit < Second || r.Unit > Month {
					t.Fatalf("accepted bad rule %+v from %q", r, spec)
				}
			}
		}
	})
}

func TestNewRules(t *testing.T) {
	rs, err := NewRules([]string{"100/1m"}, map[string][]string{"weird tenant/with:chars{}": {"10/1s", "500/1d"}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Rule{{10, 1, Second, Events}, {500, 1, Day, Events}}, rs.For("weird tenant/with:chars{}")); diff != "" {
		t.Errorf("tenant rules (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]Rule{{100, 1, Minute, Events}}, rs.For("other")); diff != "" {
		t.Errorf("fallback (-want +got):\n%s", diff)
	}
	for _, bad := range []struct {
		fallback []string
		tenants  map[string][]string
		quote    string
	}{
		{nil, nil, "no rules"},
		{[]string{"1/1q"}, nil, `unknown unit "q"`},
		{nil, map[string][]string{"acme": {"5/1m", "6/1m"}}, `tenant "acme": two rules`},
		{nil, map[string][]string{"acme": {}}, `tenant "acme": no rules`},
		{nil, map[string][]string{"": {"1/1m"}}, `tenant ""`},
		{nil, map[string][]string{"a=b": {"1/1m"}}, `tenant "a=b": must not hold "="`},
		{nil, map[string][]string{"a\x00b": {"1/1m"}}, `tenant "a\x00b": must not hold control characters`},
		{nil, map[string][]string{"acme": {"1/400d"}}, `tenant "acme": rule "1/400d": window longer than a year`},
		{[]string{"1/13mo"}, nil, `default: rule "1/13mo": window longer than a year`},
	} {
		_, err := NewRules(bad.fallback, bad.tenants)
		if err == nil || !strings.Contains(err.Error(), bad.quote) {
			t.Errorf("NewRules(%v, %v): got %v, want an error containing %s", bad.fallback, bad.tenants, err, bad.quote)
		}
	}
}

// TestUnitStringMatchesNames checks that Unit.String (a switch, on the Admit
// path) names every unit as LIMITS writes it.
func TestUnitStringMatchesNames(t *testing.T) {
	if len(unitNames) != 6 {
		t.Fatalf("got %d unit names, want 6: extend Unit.String with the new unit", len(unitNames))
	}
	for name, u := range unitNames {
		if got := u.String(); got != name {
			t.Errorf("Unit(%d).String(): got %q, want %q", u, got, name)
		}
		r := Rule{Limit: 7, Count: 3, Unit: u}
		if got, want := r.String(), "7/3"+name; got != want {
			t.Errorf("Rule.String(): got %q, want %q", got, want)
		}
	}
	if got := Unit(0).String(); got != "?" {
		t.Errorf("Unit(0).String(): got %q, want %q", got, "?")
	}
}
