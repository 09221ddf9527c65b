package limit

import (
	"context"
	"fmt"
	"math/rand"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// admit.lua's compact reply leaves out the tenants whose new events were all
// admitted with their ttl chains as sent (see Reply there): it must decide,
// write and cache exactly what the full reply does. Two limiters, one asking
// for the full reply (fullReply), decide the same calls at the same times on
// one private Redis: event, byte and unit rules that bind (deferrals,
// rejections up to the horizon, the budget), aligned and ttl windows, a
// capacity, replays of the last batch (AdmitFrom with a source), late
// events and claims (AdmitLate), lost keys (an eviction: cached chains
// gone) and a tenant's window of the wrong type (Fail). Their decisions,
// every key they wrote (prefix aside) and the state their caches keep
// (chains, known full) must be the same; and most tenant-calls must have
// been left out of the compact reply, or the test would not test it.
func TestCompactReplySame(t *testing.T) {
	rdb := privateRedis(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name, rules, capacity string
		kind                  WindowKind
		bytes                 bool
		horizon               time.Duration
	}{
		{"aligned", "*=40/1s,300/1m;a=6/1s;b=4/1s,30/1m", "", Aligned, false, 20 * time.Second},
		{"ttl", "*=30/1s,200/1m;a=5/1s;b=3/1s,25/1m", "", TTL, false, 20 * time.Second},
		{"bytes", "*=100/1s,8KB/1s;a=2KB/1s;b=500u/1s", "", Aligned, true, 10 * time.Second},
		{"bytes-ttl", "*=8KB/1s;a=2KB/1s,10/1s", "", TTL, true, 10 * time.Second},
		{"capacity", "*=100000/1m;a=100000/1m,weight:2,floor:20/1s;b=8/1s", "150/1s", Aligned, false, time.Minute},
		{"capacity-ttl", "*=100000/1m;a=100000/1m,weight:2;b=8/1s", "150/1s", TTL, false, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var caps Capacity
			if tc.capacity != "" {
				var err error
				if caps, err = ParseCapacity(tc.capacity); err != nil {
					t.Fatal(err)
				}
			}
			clk := newFakeClock(t0)
			mk := func(prefix string) *Limiter {
				return newTestLimiter(t, rdb, tc.rules, Options{Clock: clk.Now, Capacity: caps, Prefix: prefix,
					WindowKind: tc.kind, Horizon: tc.horizon, MaxScan: 64})
			}
			cpt, full := mk("compact:"+tc.name), mk("full:"+tc.name)
			full.fullReply = true
			rnd := rand.New(rand.NewSource(11))
			kinds := map[Kind]int{}
			var prev []Event
			next := int64(0)
			for call := range 150 {
				clk.Add(time.Duration(40+rnd.Intn(200)) * time.Millisecond)
				var evs []Event
				add := func(tenant string, n int) {
					for range n {
						e := Event{Tenant: tenant, Offset: next}
						next++
						if tc.bytes {
							e.Cost = Cost{Bytes: int64(20 + rnd.Intn(300)), Units: int64(1 + rnd.Intn(40))}
						}
						evs = append(evs, e)
					}
				}
				add("a", rnd.Intn(10))
				add("b", rnd.Intn(6))
				for i := range 40 {
					add("t"+strconv.Itoa(i), rnd.Intn(3))
				}
				if len(evs) == 0 {
					continue
				}
				late := call%9 == 8
				if late {
					// Late events and claims back from the first retry tier.
					for i := range evs {
						evs[i].InSlot = rnd.Intn(3) == 0
					}
				}
				if call%7 == 6 && prev != nil {
					// A replay: the last batch again, its decisions recorded.
					evs = append(slices.Clone(prev), evs...)
				}
				switch call {
				case 40, 100:
					loseKeys(t, rdb, []string{"compact:" + tc.name, "full:" + tc.name}, "t1", "a")
				case 60:
					breakWindows(t, rdb, []string{"compact:" + tc.name, "full:" + tc.name}, "t2")
				}
				src := Source{Topic: "in", Partition: 1, Low: max(0, next-400)}
				decide := func(l *Limiter) ([]Decision, error) {
					if late {
						return l.AdmitLate(ctx, src, evs, call%2 == 0)
					}
					return l.AdmitFrom(ctx, src, evs)
				}
				dc, errc := decide(cpt)
				df, errf := decide(full)
				if fmt.Sprint(errc) != strings.ReplaceAll(fmt.Sprint(errf), "full:", "compact:") {
					t.Fatalf("call %d: error %v compact, %v full", call, errc, errf)
				}
				for i := range dc {
					kinds[dc[i].Kind]++
					c := dc[i]
					c.Reason = strings.ReplaceAll(c.Reason, "compact:", "full:")
					if c != df[i] {
						t.Fatalf("call %d, event %d of %s: %+v compact, %+v full", call, i, evs[i].Tenant, dc[i], df[i])
					}
				}
				if !late {
					prev = evs
				}
				sameStates(t, call, cpt, full)
			}
			n := sameKeys(t, rdb, "compact:"+tc.name, "full:"+tc.name)
			t.Logf("%d keys the same; decisions %v", n, kinds)
			if kinds[Admit] == 0 || kinds[Defer] == 0 || kinds[Reject]+kinds[Fail] == 0 {
				t.Errorf("decisions %v: want events admitted, deferred, and rejected or failed", kinds)
			}
		})
	}
}

// loseKeys deletes every key of tenants under each prefix, as an eviction
// would: their cached ttl chains are gone.
func loseKeys(t *testing.T, rdb *redis.Client, prefixes []string, tenants ...string) {
	t.Helper()
	for _, p := range prefixes {
		for _, tn := range tenants {
			for k := range keysOf(t, rdb, p+":{"+tn+"}") {
				rdb.Del(context.Background(), p+":{"+tn+"}"+k)
			}
		}
	}
}

// breakWindows replaces each window key of tenant under each prefix by a
// string: its events fail (Fail) until the key is repaired.
func breakWindows(t *testing.T, rdb *redis.Client, prefixes []string, tenant string) {
	t.Helper()
	ctx := context.Background()
	for _, p := range prefixes {
		for k := range keysOf(t, rdb, p+":{"+tenant+"}") {
			if !strings.Contains(k, "frontier") && !strings.Contains(k, "anchor") {
				rdb.Del(ctx, p+":{"+tenant+"}"+k)
				rdb.Set(ctx, p+":{"+tenant+"}"+k, "junk", 0)
			}
		}
	}
}

// sameKeys fails unless the keys under prefixes a and b (each cut off) are
// the same with the same contents, and returns how many there are.
func sameKeys(t *testing.T, rdb *redis.Client, a, b string) int {
	t.Helper()
	ka, kb := keysOf(t, rdb, a), keysOf(t, rdb, b)
	if len(ka) == 0 || len(ka) != len(kb) {
		t.Fatalf("%d keys under %s, %d under %s", len(ka), a, len(kb), b)
	}
	for k, v := range ka {
		if w, ok := kb[k]; !ok || v != w {
			t.Errorf("key %s: %q under %s, %q under %s", k, v, a, w, b)
		}
	}
	return len(ka)
}

// sameStates fails unless a and b remember the same tenants with the same
// ttl chains and fullness.
func sameStates(t *testing.T, call int, a, b *Limiter) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if a.states.len() != b.states.len() {
		t.Fatalf("call %d: %d states compact, %d full", call, a.states.len(), b.states.len())
	}
	for k, sa := range a.states.m {
		sb := b.states.m[k]
		if sb == nil {
			t.Fatalf("call %d: state %v compact only", call, k)
		}
		if !slices.Equal(sa.chains, sb.chains) || !sa.full.Equal(sb.full) || sa.fullCost != sb.fullCost {
			t.Fatalf("call %d: state %v: chains %v full %v (%v) compact, chains %v full %v (%v) full", call, k,
				sa.chains, sa.full, sa.fullCost, sb.chains, sb.full, sb.fullCost)
		}
	}
}

// Within its limits a tenant whose chains did not move is left out of the
// compact reply: a call of such tenants comes back with no tenant's numbers
// (issue 23), on a single Redis and on Redis Cluster, where each tenant has
// a call of its own.
func TestCompactReplyWithin(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cluster bool
		kind    WindowKind
	}{
		{"redis/aligned", false, Aligned},
		{"redis/ttl", false, TTL},
		{"cluster/ttl", true, TTL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := testRedis(t)
			if tc.cluster {
				rdb = testCluster(t)
			}
			ctx := context.Background()
			clk := newFakeClock(t0)
			l := newTestLimiter(t, rdb, "*=1000/1h", Options{Clock: clk.Now, WindowKind: tc.kind})
			names := []string{"a", "b", "b", "c", "a", "d"}
			calls := func() ([]*group, []reply) {
				s := getScratch()
				defer s.release()
				order, err := l.groups(s, names, true)
				if err != nil {
					t.Fatal(err)
				}
				l.mu.Lock()
				for _, g := range order {
					g.st = l.stateLocked(g, clk.Now())
					g.chains = g.st.chains
				}
				l.mu.Unlock()
				rs, err := l.call(ctx, s, clk.Now(), order, positions{}, clk.Now().Add(time.Hour))
				if err != nil {
					t.Fatal(err)
				}
				if tc.kind == TTL {
					l.cacheChains(order, rs)
				}
				return order, slices.Clone(rs)
			}
			_, first := calls() // ttl: the chains start, and are listed
			for i, r := range first {
				if r.cached == (tc.kind == TTL) {
					t.Errorf("first call, tenant %d: cached %v, want %v", i, r.cached, tc.kind != TTL)
				}
			}
			clk.Add(time.Second)
			order, again := calls()
			for i, r := range again {
				if !r.cached || r.n != nil {
					t.Errorf("second call, tenant %s: cached %v, numbers %v; want left out", order[i].tenant, r.cached, r.n)
				}
			}
			ds, err := l.Admit(ctx, names)
			if err != nil {
				t.Fatal(err)
			}
			if got := kinds(ds); got != "aaaaaa" {
				t.Errorf("decisions %s, want aaaaaa", got)
			}
		})
	}
}
