package limit

import (
	"fmt"
	"testing"
)

// groups puts each tenant's events in order in its own group, and allocates
// per batch, not per tenant (it took a group and its index growth per tenant:
// 626 allocations for a batch of 500 events of 151 tenants, now 23).
func TestGroupsPerBatch(t *testing.T) {
	rules, err := ParseRules("*=100/1h;vip=5/1m,1000/1d")
	if err != nil {
		t.Fatal(err)
	}
	l := &Limiter{opts: Options{WindowKind: TTL}}
	l.rules.Store(rules)
	tenants := make([]string, 500)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("t%d", (i*7)%150)
	}
	tenants[3], tenants[400] = "vip", "vip"
	// The scratch was used by a batch of other tenants before: nothing of
	// it may leak into this one.
	s := getScratch()
	other := make([]string, 700)
	for i := range other {
		other[i] = fmt.Sprintf("o%d", i%300)
	}
	if _, err := l.groups(s, other, true); err != nil {
		t.Fatal(err)
	}
	s.release()
	s = getScratch()
	defer s.release()
	order, err := l.groups(s, tenants, true)
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for n, g := range order {
		if n > 0 && g.idx[0] < order[n-1].idx[0] {
			t.Errorf("group %d (%s) starts at event %d, before group %d's first event %d", n, g.tenant, g.idx[0], n-1, order[n-1].idx[0])
		}
		for k, i := range g.idx {
			if tenants[i] != g.tenant || (k > 0 && i <= g.idx[k-1]) {
				t.Fatalf("group %s: events %v are not its own, in order", g.tenant, g.idx)
			}
		}
		if want := len(rules.For(g.tenant)); len(g.rules) != want {
			t.Errorf("group %s: got %d rules, want %d", g.tenant, len(g.rules), want)
		}
		seen += len(g.idx)
	}
	if len(order) != 151 || seen != len(tenants) {
		t.Errorf("got %d groups of %d events, want 151 of %d", len(order), seen, len(tenants))
	}
	allocs := testing.AllocsPerRun(20, func() {
		s := getScratch()
		defer s.release()
		if _, err := l.groups(s, tenants, true); err != nil {
			t.Fatal(err)
		}
	})
	bound := 12.0
	if raceEnabled {
		bound = 40 // the pool drops scratches at random
	}
	if allocs > bound {
		t.Errorf("groups of 500 events, 151 tenants: got %.0f allocations, want at most %.0f: the rule sets' names (it was 626, then 23 before the scratch was reused)", allocs, bound)
	}
	t.Logf("%.0f allocations per batch", allocs)
}
