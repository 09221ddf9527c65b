package limit

import (
	"context"
	"testing"
	"time"
)

func TestOverlaysReplaceTenantRules(t *testing.T) {
	base := mustRules(t, "*=5/1m;acme=10/1m")
	lists := func(specs ...string) []Rule {
		r, err := ParseRuleList(specs)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	over := base.WithOverlays(map[string]Overlay{
		"acme":  {Rules: lists("50/1m", "1000/1d"), Version: 7},
		"trial": {Rules: lists("0/1m"), Version: 9},
	}, 9)
	for _, c := range []struct {
		tenant  string
		want    string
		version int64
	}{
		{"acme", "50/1m,1000/1d", 7},
		{"trial", "0/1m", 9},
		{"other", "5/1m", 0},
	} {
		got := ""
		for i, r := range over.For(c.tenant) {
			if i > 0 {
				got += ","
			}
			got += r.String()
		}
		if got != c.want || over.OverrideVersion(c.tenant) != c.version {
			t.Errorf("%s: got %s version %d, want %s version %d", c.tenant, got, over.OverrideVersion(c.tenant), c.want, c.version)
		}
	}
	if base.For("acme")[0].Limit != 10 || base.Version() != 0 || over.Version() != 9 {
		t.Errorf("the base rules changed or the version is wrong: %v %d %d", base.For("acme"), base.Version(), over.Version())
	}
	if got := over.Base().For("acme")[0].Limit; got != 10 {
		t.Errorf("Base: acme limit %d, want 10", got)
	}
}

func TestRaised(t *testing.T) {
	l := func(s ...string) []Rule {
		r, err := ParseRuleList(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, c := range []struct {
		before, now []Rule
		want        bool
	}{
		{l("5/1m"), l("50/1m"), true},
		{l("5/1m"), l("5/1m"), false},
		{l("5/1m"), l("2/1m"), false},
		{l("5/1m", "100/1d"), l("5/1m"), true},  // a rule dropped
		{l("5/1m"), l("5/1m", "100/1d"), false}, // a rule added
		{l("5/1m"), nil, true},                  // no rules: everything admitted
		{nil, l("5/1m"), false},
	} {
		if got := Raised(c.before, c.now); got != c.want {
			t.Errorf("Raised(%v, %v) = %v, want %v", c.before, c.now, got, c.want)
		}
	}
}

// AdmitNow admits what fits in the current window and reserves nothing;
// the decisions carry the override's version.
func TestAdmitNowReservesNothing(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock(time.Date(2026, 3, 1, 12, 0, 10, 0, time.UTC))
	l := newTestLimiter(t, testRedis(t), "*=3/1m", Options{Clock: clock.Now})
	ds, err := l.AdmitNow(ctx, Source{}, testSource{}.events(repeat("a", 5), nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := kinds(ds); got != "aaarr" {
		t.Fatalf("AdmitNow: got %s, want aaarr", got)
	}
	if ds[4].Reason != NowReason {
		t.Errorf("reason %q, want %q", ds[4].Reason, NowReason)
	}
	// Nothing was reserved: the next window still has all 3 slots, which
	// AdmitFrom reserves now.
	ds, err = l.Admit(ctx, repeat("a", 4))
	if err != nil {
		t.Fatal(err)
	}
	if got := kinds(ds); got != "dddd" {
		t.Fatalf("Admit after AdmitNow: got %s, want dddd", got)
	}
	if ds[2].Due != ds[0].Due || ds[3].Due == ds[0].Due {
		t.Errorf("want 3 slots in the next window, then one later: %v", ds)
	}
	// Raised by an overlay: room now again, and the version on each decision.
	raised, _ := ParseRuleList([]string{"10/1m"})
	if err := l.SetRules(l.Rules().WithOverlays(map[string]Overlay{"a": {Rules: raised, Version: 42}}, 42)); err != nil {
		t.Fatal(err)
	}
	ds, err = l.AdmitNow(ctx, Source{}, testSource{}.events(repeat("a", 9), nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := kinds(ds); got != "aaaaaaarr" {
		t.Fatalf("AdmitNow raised: got %s, want aaaaaaarr (10 - 3 counted)", got)
	}
	for _, d := range ds {
		if d.Override != 42 {
			t.Fatalf("decision %v: override %d, want 42", d, d.Override)
		}
	}
	ds, _ = l.Admit(ctx, []string{"b"})
	if ds[0].Override != 0 {
		t.Errorf("tenant without override: version %d, want 0", ds[0].Override)
	}
}
