package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// TestOverrideShare sets a tenant's weight and floor of the shared capacity
// through the API and the CLI of the built binary: validated as in LIMITS
// (a floor that would take the floors over the capacity is refused), tried
// first with a dry run that shows the change in entitlement, applied
// (share_in_force, and the usage of the capacity under it), audited before
// and after, shadowed (reported, not applied), and deleted.
func TestOverrideShare(t *testing.T) {
	f := newFlow(t, 1)
	prefix := keyPrefix(t)
	env := f.env(t, append(ovTokensEnv(), "GATEKEEPER_LIMITS", "*=1000/1m;b=floor:60/1s", "GATEKEEPER_CAPACITY", "100/1s",
		"GATEKEEPER_REDIS_KEY_PREFIX", prefix)...)
	p := startGatekeeper(t, "gk", env)
	p.waitReady(90 * time.Second)
	// Some traffic, so that the capacity's windows have a level.
	var msgs []kafka.Message
	for i := range 20 {
		msgs = append(msgs, kafka.Message{Key: []byte([]string{"acme", "b"}[i%2]), Value: ev{ID: i}.value()})
	}
	produce(t, f.Source, msgs)

	type capShare struct {
		Weight, Floor, Entitlement, Booked int64
		Level                              float64
	}
	var dry struct {
		Before []capShare `json:"capacity_before"`
		After  []capShare `json:"capacity_after"`
	}
	put := func(body map[string]any, out any) int {
		return ovDo(t, p, ovWriteToken, "PUT", "/v1/overrides/acme", body, out)
	}
	if st := put(map[string]any{"keep_rules": true, "weight": 3, "floors": []string{"20/1s"}, "reason": "try", "version": 0, "dry_run": true}, &dry); st != 200 ||
		len(dry.Before) != 1 || len(dry.After) != 1 || dry.Before[0].Weight != 1 || dry.After[0].Weight != 3 || dry.After[0].Floor != 20 ||
		dry.After[0].Entitlement < 20 {
		t.Fatalf("dry run: status %d %+v, want weight 1 -> 3, floor 0 -> 20, entitlement at least the floor", st, dry)
	}
	t.Logf("dry run: before %+v, after %+v", dry.Before[0], dry.After[0])
	for _, bad := range []struct {
		body map[string]any
		want string
	}{
		{map[string]any{"keep_rules": true, "floors": []string{"41/1s"}, "reason": "x", "version": 0}, "over the capacity"},
		{map[string]any{"keep_rules": true, "floors": []string{"5/1m"}, "reason": "x", "version": 0}, "no capacity rule of window 1m"},
		{map[string]any{"keep_rules": true, "weight": 1001, "reason": "x", "version": 0}, "weight"},
		{map[string]any{"rules": []string{"5/1m"}, "keep_rules": true, "weight": 2, "reason": "x", "version": 0}, "keep_rules"},
	} {
		var e struct{ Error string }
		if st := ovDoErr(t, p, ovWriteToken, "PUT", "/v1/overrides/acme", bad.body, &e); st != 400 || !strings.Contains(e.Error, bad.want) {
			t.Errorf("PUT %v: status %d %q, want 400 naming %q", bad.body, st, e.Error, bad.want)
		}
	}
	cli := map[string]string{"GATEKEEPER_URL": "http://" + p.HTTP, "GATEKEEPER_TOKEN": ovWriteToken}
	out, errOut, code := opsRun(t, cli, "override", "set", "acme", "weight:3,floor:20/1s", "--reason", "INC-1: acme's share", "--version", "0", "--dry-run")
	if code != 0 || !strings.Contains(out, "ENTITLEMENT") || !strings.Contains(out, "new") {
		t.Errorf("CLI dry run: exit %d:\n%s%s", code, out, errOut)
	}
	t.Logf("gatekeeper override set --dry-run:\n%s", out)
	out, errOut, code = opsRun(t, cli, "override", "set", "acme", "weight:3,floor:20/1s", "--reason", "INC-1: acme's share", "--version", "0")
	if code != 0 {
		t.Fatalf("CLI set: exit %d:\n%s%s", code, out, errOut)
	}
	var view struct {
		RulesInForce []string   `json:"rules_in_force"`
		ShareInForce []string   `json:"share_in_force"`
		BaseShare    []string   `json:"base_share"`
		Capacity     []capShare `json:"capacity"`
		Shadow       []capShare `json:"shadow_capacity"`
	}
	waitFor(t, 5*time.Second, "acme's share in force", func() (bool, string) {
		ovDo(t, p, ovReadToken, "GET", "/v1/overrides/acme", nil, &view)
		return strings.Join(view.ShareInForce, ",") == "weight:3,floor:20/1s", strings.Join(view.ShareInForce, ",")
	})
	if strings.Join(view.RulesInForce, ",") != "1000/1m" || strings.Join(view.BaseShare, ",") != "weight:1" ||
		len(view.Capacity) != 1 || view.Capacity[0].Weight != 3 || view.Capacity[0].Floor != 20 {
		t.Errorf("GET acme: %+v, want its rules 1000/1m kept, share weight:1 -> weight:3,floor:20/1s", view)
	}
	// The CLI's audit: before and after.
	out, _, code = opsRun(t, cli, "override", "set", "acme", "5/1m,weight:4", "--reason", "INC-1: more", "--version", "1")
	if code != 0 {
		t.Fatalf("CLI set v2: exit %d:\n%s", code, out)
	}
	out, _, _ = opsRun(t, cli, "override", "audit", "acme")
	t.Logf("gatekeeper override audit acme:\n%s", out)
	if !strings.Contains(out, "(its rules),weight:3,floor:20/1s") || !strings.Contains(out, "5/1m,weight:4") {
		t.Errorf("audit does not show the shares before and after:\n%s", out)
	}
	out, _, _ = opsRun(t, cli, "override", "list")
	if !strings.Contains(out, "5/1m,weight:4") {
		t.Errorf("list does not show the share:\n%s", out)
	}
	// A shadow share: reported, not applied.
	if st := ovDo(t, p, ovWriteToken, "PUT", "/v1/overrides/sh", map[string]any{"keep_rules": true, "weight": 5, "shadow": true,
		"reason": "what if", "version": 0}, nil); st != 200 {
		t.Fatalf("PUT shadow share: %d", st)
	}
	time.Sleep(500 * time.Millisecond)
	ovDo(t, p, ovReadToken, "GET", "/v1/overrides/sh", nil, &view)
	if strings.Join(view.ShareInForce, ",") != "weight:1" || len(view.Shadow) != 1 || view.Shadow[0].Weight != 5 || view.Capacity[0].Weight != 1 {
		t.Errorf("GET sh: %+v, want weight 1 in force and the shadow's weight 5 reported", view)
	}
	out, errOut, code = opsRun(t, cli, "override", "delete", "acme", "--reason", "over", "--version", "2")
	if code != 0 {
		t.Fatalf("delete: exit %d %s%s", code, out, errOut)
	}
	waitFor(t, 5*time.Second, "acme's share back", func() (bool, string) {
		ovDo(t, p, ovReadToken, "GET", "/v1/overrides/acme", nil, &view)
		return strings.Join(view.ShareInForce, ",") == "weight:1", strings.Join(view.ShareInForce, ",")
	})
	ovSlowlog(t, prefix)
}

// ovDoErr is ovDo, decoding the answer into out whatever its status.
func ovDoErr(t testing.TB, p *gkProc, token, method, path string, body, out any) int {
	t.Helper()
	st, data := ovSend(t, p, token, method, path, body)
	if err := json.Unmarshal(data, out); err != nil {
		t.Fatalf("%s %s: status %d: %v: %s", method, path, st, err, data)
	}
	return st
}

// TestOverrideShareConcurrentWriters writes floors through two replicas at
// once, each within the capacity alone, the two together over it
// (capacity 100/1s, b's floor 20/1s in LIMITS, two floors of 45/1s): the
// check of all floors against the capacity and the write are one step in
// Redis, so exactly one of each pair is written and the other refused
// (400 naming the floors), round after round; both replicas apply every
// resulting set of overrides; and a change that lowers a floor is taken.
func TestOverrideShareConcurrentWriters(t *testing.T) {
	f := newFlow(t, 1)
	prefix := keyPrefix(t)
	env := f.env(t, append(ovTokensEnv(), "GATEKEEPER_LIMITS", "*=1000/1m;b=floor:20/1s", "GATEKEEPER_CAPACITY", "100/1s",
		"GATEKEEPER_REDIS_KEY_PREFIX", prefix)...)
	procs := []*gkProc{startGatekeeper(t, "gk0", env), startGatekeeper(t, "gk1", env)}
	for _, p := range procs {
		p.waitReady(90 * time.Second)
	}
	type result struct {
		status  int
		version int64
		err     string
	}
	const rounds = 5
	for round := range rounds {
		tenants := []string{fmt.Sprintf("x-%d", round), fmt.Sprintf("y-%d", round)}
		res := make([]result, 2)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				st, data := ovSend(t, procs[i], ovWriteToken, "PUT", "/v1/overrides/"+tenants[i],
					map[string]any{"keep_rules": true, "floors": []string{"45/1s"}, "reason": "race", "version": 0})
				var out struct {
					Version int64
					Error   string
				}
				_ = json.Unmarshal(data, &out)
				res[i] = result{st, out.Version, out.Error}
			}()
		}
		close(start)
		wg.Wait()
		won := -1
		for i, r := range res {
			switch {
			case r.status == 200 && won < 0:
				won = i
			case r.status == 200:
				t.Fatalf("round %d: both writes taken (%+v): the floors sum to 20+45+45 = 110, over the capacity 100/1s", round, res)
			case r.status != 400 || !strings.Contains(r.err, "floors"):
				t.Fatalf("round %d: write of %s: status %d %q, want 400 naming the floors", round, tenants[i], r.status, r.err)
			}
		}
		if won < 0 {
			t.Fatalf("round %d: both refused (%+v), want one taken", round, res)
		}
		t.Logf("round %d: %s taken (version %d), %s refused: %s", round, tenants[won], res[won].version, tenants[1-won], res[1-won].err)
		// Both replicas apply the set with the winner's floor.
		for _, p := range procs {
			waitFor(t, 5*time.Second, p.Name+" applies "+tenants[won], func() (bool, string) {
				v := ovInForce(t, p, tenants[won])
				return v.AppliedVersion >= res[won].version, fmt.Sprintf("applied %d", v.AppliedVersion)
			})
		}
		// Lowering the floor is taken; then the override goes, for the next round.
		var lowered struct{ Version int64 }
		if st := ovDo(t, procs[1-won], ovWriteToken, "PUT", "/v1/overrides/"+tenants[won],
			map[string]any{"keep_rules": true, "floors": []string{"40/1s"}, "reason": "lower", "version": res[won].version}, &lowered); st != 200 {
			t.Fatalf("round %d: lowering %s's floor: status %d", round, tenants[won], st)
		}
		if st, data := ovSend(t, procs[won], ovWriteToken, "DELETE", "/v1/overrides/"+tenants[won]+
			fmt.Sprintf("?version=%d&reason=next", lowered.Version), nil); st != 200 {
			t.Fatalf("round %d: delete %s: %d %s", round, tenants[won], st, data)
		}
	}
	ovSlowlog(t, prefix)
}
