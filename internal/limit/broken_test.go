package limit

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A key of tenant b that is not what the script expects (someone SET a
// string at it, or wrote a count that is not an integer) fails b's events
// alone: the other tenants of the batch are decided and counted once, and
// nothing of b's is counted either.
func testBrokenKeyIsolated(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	now := t0.Add(10 * time.Second)
	setString := func(key string) error { return rdb.Set(ctx, key, "x", time.Hour).Err() }
	setCount := func(count string) func(key string) error {
		return func(key string) error {
			return rdb.HSet(ctx, key, "count", count, "expire", now.Add(time.Hour).UnixMilli()).Err()
		}
	}
	window := func(rule int, at time.Time) func(*Limiter) string {
		return func(l *Limiter) string {
			r := l.Rules().For("b")[rule]
			if l.opts.WindowKind == TTL {
				return l.keys.window("b", r, at)
			}
			s, _ := WindowBounds(r, at, time.UTC)
			return l.keys.window("b", r, s)
		}
	}
	frontier := func(l *Limiter) string {
		return l.keys.frontier("b", ruleSetID(l.opts.WindowKind, l.Rules().For("b")))
	}
	anchor := func(l *Limiter) string { return l.keys.anchor("b", l.Rules().For("b")[0]) }
	const wrongType, notInteger = "has the wrong type", "holds a count that is not an integer"
	tests := []struct {
		name   string
		spec   string
		window WindowKind
		n      int // b's events
		key    func(*Limiter) string
		breaks func(key string) error
		why    string
	}{
		{"current window is a string", "*=10/1m", Aligned, 2, window(0, now), setString, wrongType},
		{"current window count is not an integer", "*=10/1m", Aligned, 2, window(0, now), setCount("1.5"), notInteger},
		{"current window count of two rules is not a number", "*=10/1m;b=2/1s,100/1m", Aligned, 1, window(1, now), setCount("many"), notInteger},
		{"frontier is a hash", "*=10/1m;b=2/1m", Aligned, 3, frontier, setCount("1"), wrongType},
		{"next window is a string", "*=10/1m;b=2/1m", Aligned, 3, window(0, now.Add(time.Minute)), setString, wrongType},
		{"next window of two rules is a string", "*=10/1m;b=2/1s,100/1m", Aligned, 3, window(0, now.Add(time.Second)), setString, wrongType},
		{"ttl anchor is a string", "*=10/1m", TTL, 2, anchor, setString, wrongType},
		{"ttl window is a string", "*=10/1m", TTL, 2, window(0, now), setString, wrongType},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newTestLimiter(t, rdb, tc.spec, Options{Clock: func() time.Time { return now }, WindowKind: tc.window, Horizon: time.Hour})
			broken := tc.key(l)
			if err := tc.breaks(broken); err != nil {
				t.Fatal(err)
			}
			batch := []string{"a", "b", "a", "a"}
			for range tc.n - 1 {
				batch = append(batch, "b")
			}
			ds := admit(t, l, batch)
			if got, want := kinds(ds), "afaa"+strings.Repeat("f", tc.n-1); got != want {
				t.Fatalf("decisions: got %s, want %s", got, want)
			}
			for i, d := range ds {
				if batch[i] == "b" && (!strings.Contains(d.Reason, broken) || !strings.Contains(d.Reason, tc.why)) {
					t.Errorf("b's reason: got %q, want one naming %s and saying %q", d.Reason, broken, tc.why)
				}
			}
			us, err := l.Usage(ctx, "a")
			if err != nil || us[0].Count != 3 {
				t.Errorf("a's usage: got %+v %v, want count 3", us, err)
			}
			checkUntouched(t, rdb, l, broken)
		})
	}
}

// checkUntouched checks that none of tenant b's keys but broken exists: b had
// none before, and what the failed call wrote for b was taken back.
func checkUntouched(t *testing.T, rdb redis.UniversalClient, l *Limiter, broken string) {
	t.Helper()
	now := l.opts.Clock()
	rules := l.Rules().For("b")
	keys := []string{l.keys.frontier("b", ruleSetID(l.opts.WindowKind, rules))}
	for _, r := range rules {
		keys = append(keys, l.keys.anchor("b", r), l.keys.window("b", r, now))
		s, e := WindowBounds(r, now, time.UTC)
		for range 3 {
			keys = append(keys, l.keys.window("b", r, s))
			s, e = e, e.Add(r.Length())
		}
	}
	for _, k := range keys {
		if k == broken {
			continue
		}
		if n, err := rdb.Exists(context.Background(), k).Result(); err != nil || n != 0 {
			t.Errorf("b's key %s: exists %d (%v), want it absent", k, n, err)
		}
	}
}

// A script call that fails for another reason than a tenant's keys (here a
// record naming a rule the call does not describe, as a bug would) takes
// back all it wrote: the counts of a tenant decided in the fast path (a),
// and the admission, reservations and frontier of one that searched (s).
// The caller retries the batch, and the retry counts each event once.
func TestFailedCallCountsNothing(t *testing.T) {
	rdb := testRedis(t)
	for _, window := range []WindowKind{Aligned, TTL} {
		t.Run(string(window), func(t *testing.T) {
			ctx := context.Background()
			now := t0.Add(10 * time.Second)
			l := newTestLimiter(t, rdb, "*=10/1m;s=2/1m", Options{Clock: func() time.Time { return now }, WindowKind: window})
			admit(t, l, []string{"a"}) // a's ttl chain is now cached: its next events take the fast path
			groups := []*group{{tenant: "a", idx: []int{0, 1, 2}}, {tenant: "s", idx: []int{3, 4, 5, 6}}, {tenant: "bad", idx: []int{7}}}
			l.mu.Lock()
			for _, g := range groups {
				g.rules = l.Rules().For(g.tenant)
				g.set = ruleSetID(l.opts.WindowKind, g.rules)
				g.st = l.stateLocked(g, now)
				g.chains = g.st.chains
			}
			l.mu.Unlock()
			ks, av := l.script(groups, now, now.Add(l.opts.Horizon), positions{}, l.scanBudget(1), nil)
			// The tenants' records come last but for the replay argument (none).
			var recs []int64
			if err := json.Unmarshal(av[len(av)-2].([]byte), &recs); err != nil {
				t.Fatal(err)
			}
			recs[len(recs)-3] = 99 // bad's rule is descriptor 99
			av[len(av)-2], _ = json.Marshal(recs)
			if err := l.runAdmit(ctx, ks, av, nil).Err(); err == nil {
				t.Fatal("script with a bad record: got no error, want one")
			}
			for tenant, want := range map[string]int64{"a": 1, "s": 0} {
				if us, err := l.Usage(ctx, tenant); err != nil || us[0].Count != want {
					t.Errorf("%s's usage after the failed call: got %+v %v, want count %d", tenant, us, err, want)
				}
			}
			r := l.Rules().For("s")[0]
			for _, key := range []string{l.keys.frontier("s", groups[1].set), l.keys.anchor("s", r),
				l.keys.window("s", r, t0.Add(time.Minute)), l.keys.window("s", r, now.Add(time.Minute))} {
				if n, err := rdb.Exists(ctx, key).Result(); err != nil || n != 0 {
					t.Errorf("s's key %s: exists %d (%v), want it taken back", key, n, err)
				}
			}
			if got := kinds(admit(t, l, repeat("a", 3))); got != "aaa" {
				t.Fatalf("retry: got %s, want aaa", got)
			}
			if us, err := l.Usage(ctx, "a"); err != nil || us[0].Count != 4 {
				t.Errorf("a's usage after the retry: got %+v %v, want count 4", us, err)
			}
		})
	}
}

// An error that is not a tenant's key's own, here Redis out of memory (a
// Redis of the test's own, maxmemory 1 byte, noeviction), fails the whole
// batch: nothing is decided or counted, and the batch decided once Redis
// has room again counts every event once.
func TestTransientErrorFailsBatch(t *testing.T) {
	rdb := privateRedis(t, "--maxmemory-policy", "noeviction")
	ctx := context.Background()
	now := t0.Add(10 * time.Second)
	l := newTestLimiter(t, rdb, "*=10/1m", Options{Clock: func() time.Time { return now }})
	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	batch := []string{"a", "b", "a", "a"}
	if ds, err := l.Admit(ctx, batch); err == nil || !redis.HasErrorPrefix(err, "OOM") {
		t.Fatalf("Admit out of memory: got %v %v, want an OOM error", kinds(ds), err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if got := kinds(admit(t, l, batch)); got != "aaaa" {
		t.Fatalf("retry: got %s, want aaaa", got)
	}
	for tenant, want := range map[string]int64{"a": 3, "b": 1} {
		if us, err := l.Usage(ctx, tenant); err != nil || us[0].Count != want {
			t.Errorf("%s's usage: got %+v %v, want count %d", tenant, us, err, want)
		}
	}
}
