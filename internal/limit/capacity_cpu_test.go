package limit

import (
	"context"
	"maps"
	"math/rand"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A capacity window is a hash table from its first call (field ht, longer
// than hash-max-listpack-value), not a listpack, whose every lookup scans
// the whole hash: a call reads and writes a field or two of each of its
// tenants there, and in TestCapacityCommands' calls the scans were 17% of
// Redis's instructions. So are the next window's (the call's tenants'
// demand). The private redis-server keeps up to 512 fields in a listpack.
func TestCapacityWindowHashTable(t *testing.T) {
	rdb := privateRedis(t)
	ctx := context.Background()
	clk := newFakeClock(t0)
	c, _ := ParseCapacity("1000/1s")
	l := newTestLimiter(t, rdb, "*=1000/1m", Options{Clock: clk.Now, Capacity: c})
	var batch []string
	for i := range 20 {
		batch = append(batch, "tenant-"+strconv.Itoa(i))
	}
	if _, err := l.Admit(ctx, batch); err != nil {
		t.Fatal(err)
	}
	for _, s := range []time.Time{t0, t0.Add(time.Second)} {
		key := l.keys.capacity(c[0]) + WindowSep + strconv.FormatInt(s.UnixMilli(), 10)
		enc, err := rdb.ObjectEncoding(ctx, key).Result()
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		n, _ := rdb.HLen(ctx, key).Result()
		if enc != "hashtable" {
			t.Errorf("%s (%d fields): encoding %s, want hashtable", key, n, enc)
		}
	}
}

// A decided tenant's writes in the capacity's hashes are not journaled
// (cap_book) unless a field they read there is not a number: then a failure
// there takes them back, and the tenant fails alone. Here the next window's
// demand of x is junk: x fails naming that window, y and z are admitted,
// and the current window holds y's and z's events alone.
func TestCapacityBrokenDemand(t *testing.T) {
	rdb := privateRedis(t)
	ctx := context.Background()
	clk := newFakeClock(t0)
	c, _ := ParseCapacity("100/1s")
	l := newTestLimiter(t, rdb, "*=100000/1m", Options{Clock: clk.Now, Capacity: c})
	next := l.keys.capacity(c[0]) + WindowSep + strconv.FormatInt(t0.Add(time.Second).UnixMilli(), 10)
	if err := rdb.HSet(ctx, next, "q:"+encodeTenant("x"), "junk").Err(); err != nil {
		t.Fatal(err)
	}
	ds, err := l.Admit(ctx, []string{"y", "x", "z"})
	if err != nil {
		t.Fatal(err)
	}
	if got := kinds(ds); got != "afa" {
		t.Errorf("decisions %s, want afa", got)
	}
	if !strings.Contains(ds[1].Reason, next) {
		t.Errorf("x's failure: %q, want one naming %s", ds[1].Reason, next)
	}
	count, active, booked := capWindow(t, l, c[0], t0)
	if count != 2 || active != 2 || booked["x"] != 0 {
		t.Errorf("capacity window: count %d, active weight %d, booked %v; want 2, 2 (y, z), none for x", count, active, booked)
	}
}

// BenchmarkCapacityCalls decides TestCapacityCommands' 60 batches (500
// events over 1,000 Zipf tenants, ten calls a one-second window, a fixed
// clock) once per iteration, with a capacity that never binds, one of
// bytes, or none. Redis's own instructions for them, repeatable on a loaded
// machine, are what the README's "The cost" gives; count them with
// callgrind on a Redis of its own, in its script calls alone:
//
//	valgrind --tool=callgrind --toggle-collect=evalShaCommand redis-server --port 6399 --save '' &
//	GATEKEEPER_TEST_REDIS=127.0.0.1:6399 go test -run '^$' -bench 'CapacityCalls/events' -benchtime 1x ./internal/limit/
//
// and callgrind_control -d: the 60 calls hold 10,580 tenant-calls (14,127
// with 10,000 tenants).
func BenchmarkCapacityCalls(b *testing.B) {
	rdb := testRedis(b)
	ctx := context.Background()
	for _, m := range []struct {
		name, capacity, rules string
		tenants               int
		kind                  WindowKind
	}{
		{"none", "", "*=1000/1m", benchTenants, Aligned},
		{"events", "100000000/1s", "*=1000/1m", benchTenants, Aligned},
		{"bytes", "100GB/1s", "*=1000/1m", benchTenants, Aligned},
		// 10,000 tenants (235 a call), and with part of the events
		// deferred or rejected by their tenant's rule (decide's path).
		{"none-10k", "", "*=1000/1m", 10000, Aligned},
		{"events-10k", "100000000/1s", "*=1000/1m", 10000, Aligned},
		{"none-defer", "", "*=20/1m", 10000, Aligned},
		{"events-defer", "100000000/1s", "*=20/1m", 10000, Aligned},
		// ttl windows, as the gatekeeper binary's default and make bench.
		{"none-ttl", "", "*=1000/1m", benchTenants, TTL},
		{"events-ttl", "100000000/1s", "*=1000/1m", benchTenants, TTL},
	} {
		batches := skewedBatches(60, benchBatch, m.tenants)
		b.Run(m.name, func(b *testing.B) {
			caps, _ := ParseCapacity(m.capacity)
			run := func(bs [][]string) {
				clk := newFakeClock(t0)
				l := newTestLimiter(b, rdb, m.rules, Options{Clock: clk.Now, Capacity: caps, WindowKind: m.kind})
				for _, batch := range bs {
					clk.Add(100 * time.Millisecond)
					costs := make([]Cost, len(batch))
					for i := range costs {
						costs[i].Bytes = int64(100 + (i*37)%400)
					}
					if _, err := l.AdmitCosts(ctx, batch, costs); err != nil {
						b.Fatal(err)
					}
				}
			}
			for range b.N {
				run(batches)
			}
		})
	}
}

// cap_one (90_run.lua) decides most tenants of a call with a capacity in one
// function, an inlined copy of cap_quick, fast_many and cap_book: it must
// decide and write exactly what the general path does. Two limiters, one
// forced through the general path (capGeneral), decide the same calls of
// many tenants at the same times on one private Redis: a capacity that
// binds, with weights and floors, through the ramp and the end of every
// window (calls every 30 ms); one of bytes; own rules that bind before the
// capacity; aligned and ttl windows; lost keys, and a tenant's window of
// the wrong type. Their decisions and every key they wrote (prefix aside) must
// be the same.
func TestCapacityFastPathSame(t *testing.T) {
	rdb := privateRedis(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name, capacity, rules string
		bytes                 bool
		kind                  WindowKind
	}{
		{"events", "800/1s", "*=100000/1m;a=100000/1m,weight:2,floor:100/1s;b=100000/1m,weight:3;c=100000/1m,floor:60/1s;d=100000/1m,floor:40/1s", false, Aligned},
		{"bytes", "150KB/1s", "*=100000/1m;a=100000/1m,weight:2,floor:20KB/1s;b=100000/1m,weight:3", true, Aligned},
		{"own-rules", "2000/1s", "*=40/1m;a=100000/1m,weight:2,floor:20/1s", false, Aligned},
		// ttl windows: chains cached by the replies, windows opened in
		// them (checked against the anchor), own rules that bind.
		{"events-ttl", "800/1s", "*=100000/1m;a=100000/1m,weight:2,floor:100/1s;b=100000/1m,weight:3;c=100000/1m,floor:60/1s;d=100000/1m,floor:40/1s", false, TTL},
		{"own-rules-ttl", "2000/1s", "*=10/1s;a=100000/1m,weight:2,floor:20/1s", false, TTL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			caps, err := ParseCapacity(tc.capacity)
			if err != nil {
				t.Fatal(err)
			}
			clk := newFakeClock(t0)
			mk := func(prefix string) *Limiter {
				return newTestLimiter(t, rdb, tc.rules, Options{Clock: clk.Now, Capacity: caps, Prefix: prefix, WindowKind: tc.kind})
			}
			fast, general := mk("fast:"+tc.name), mk("general:"+tc.name)
			general.capGeneral = true
			rnd := rand.New(rand.NewSource(7))
			kinds := map[Kind]int{}
			for call := range 140 {
				clk.Add(30 * time.Millisecond)
				var batch []string
				var costs []Cost
				add := func(tenant string, n int) {
					for range n {
						batch = append(batch, tenant)
						costs = append(costs, Cost{Bytes: int64(20 + rnd.Intn(380))})
					}
				}
				add("a", 8)
				add("b", 6)
				add("c", rnd.Intn(2))
				add("d", 2)
				for i := range 30 {
					add("t"+strconv.Itoa(i), rnd.Intn(2))
				}
				rnd.Shuffle(len(batch), func(i, j int) {
					batch[i], batch[j] = batch[j], batch[i]
					costs[i], costs[j] = costs[j], costs[i]
				})
				if !tc.bytes {
					costs = nil
				}
				prefixes := []string{"fast:" + tc.name, "general:" + tc.name}
				if tc.kind == TTL && call%40 == 39 {
					// Lost keys (an eviction): the chains the replies
					// cached are gone, and a window opened in one must not
					// be trusted (chains_hold).
					loseKeys(t, rdb, prefixes, "t1", "t10", "t11", "t12", "t13", "t14", "t15", "t16", "t17", "t18", "t19")
				}
				if call == 50 {
					// A tenant's own window of the wrong type: it fails
					// alone, in cap_one as in the general path.
					breakWindows(t, rdb, prefixes, "t2")
				}
				df, err := fast.AdmitCosts(ctx, batch, costs)
				if err != nil {
					t.Fatal(err)
				}
				dg, err := general.AdmitCosts(ctx, batch, costs)
				if err != nil {
					t.Fatal(err)
				}
				for i := range df {
					kinds[df[i].Kind]++
					f, g := df[i], dg[i]
					f.Reason = strings.ReplaceAll(f.Reason, "fast:", "general:")
					if f != g {
						t.Fatalf("call %d, event %d of %s: %+v with cap_one, %+v without", call, i, batch[i], df[i], dg[i])
					}
				}
			}
			n := sameKeys(t, rdb, "fast:"+tc.name, "general:"+tc.name)
			t.Logf("%d keys the same; decisions %v", n, kinds)
			if kinds[Defer] == 0 || kinds[Admit] == 0 || kinds[Fail] == 0 {
				t.Errorf("decisions %v: want events admitted, deferred (the capacity or the rules binding) and failed", kinds)
			}
		})
	}
}

// keysOf returns every key under prefix (the prefix cut off) with its
// content: a hash's fields sorted, a string as is.
func keysOf(t *testing.T, rdb *redis.Client, prefix string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		var v string
		switch typ, _ := rdb.Type(ctx, k).Result(); typ {
		case "hash":
			h, err := rdb.HGetAll(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			fs := slices.Sorted(maps.Keys(h))
			for _, f := range fs {
				v += f + "=" + h[f] + " "
			}
		default:
			s, err := rdb.Get(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			v = s
		}
		out[strings.TrimPrefix(k, prefix)] = v
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
