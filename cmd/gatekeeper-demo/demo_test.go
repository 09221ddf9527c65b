package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/lua"
)

// lockedBuffer is a bytes.Buffer safe for concurrent writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestDemo runs the demo for a few seconds on the embedded servers, in
// process and without a terminal, and checks its summary: every tenant held
// to its limit, nothing lost, and events admitted, deferred and back from
// the retry topic.
func TestDemo(t *testing.T) {
	var out, logs lockedBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sum, err := runDemo(ctx, demoOptions{
		Duration:   5 * time.Second,
		Out:        &out,
		PlainEvery: time.Second,
		Log:        &logs,
		Drain:      time.Minute,
	})
	t.Logf("demo output:\n%s", out.String())
	if l := logs.String(); l != "" {
		t.Logf("demo logs:\n%s", l)
	}
	if err != nil {
		t.Fatalf("runDemo: %v", err)
	}

	if got := len(sum.Checks); got != len(demoTenants) {
		t.Errorf("got %d limit checks, want %d (one per tenant)", got, len(demoTenants))
	}
	for _, ck := range sum.Checks {
		if !ck.Held || int64(ck.Max) > ck.Rule.Limit {
			t.Errorf("tenant %s rule %v: got held %v, max %d, worst %d; want held, max <= %d",
				ck.Tenant, ck.Rule, ck.Held, ck.Max, ck.Worst, ck.Rule.Limit)
		}
	}
	tot := sum.Total
	if tot.Lost != 0 {
		t.Errorf("got %d events lost, want 0", tot.Lost)
	}
	for _, c := range sum.Tenants {
		if c.Offered == 0 {
			t.Errorf("tenant %s: got 0 events offered, want some", c.Tenant)
		}
		if got := c.Direct + c.Deferred + c.Rejected; got != c.Offered {
			t.Errorf("tenant %s: got admitted %d + deferred %d + rejected %d = %d, want offered %d",
				c.Tenant, c.Direct, c.Deferred, c.Rejected, got, c.Offered)
		}
	}
	if tot.Direct == 0 || tot.Deferred == 0 || tot.Back == 0 {
		t.Errorf("got admitted %d, deferred %d, back from retry %d; want each above 0", tot.Direct, tot.Deferred, tot.Back)
	}
	if sum.Unknown != 0 {
		t.Errorf("got %d output records with an id never offered, want 0", sum.Unknown)
	}
	text := out.String()
	for _, want := range []string{"lost: 0 ", "limits: every tenant held to its limit"} {
		if !strings.Contains(text, want) {
			t.Errorf("summary lacks %q", want)
		}
	}
	if strings.Contains(text, "EXCEEDED") || strings.Contains(text, "\x1b[") {
		t.Errorf("plain summary holds EXCEEDED or ANSI escapes:\n%s", text)
	}
}

func TestCheckWindows(t *testing.T) {
	rule := limit.Rule{Limit: 2, Count: 1, Unit: limit.Second}
	base := time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	span := func(lo, hi int) [2]time.Time { return [2]time.Time{at(lo), at(hi)} }
	tests := []struct {
		name      string
		spans     [][2]time.Time
		wantHeld  bool
		wantMax   int
		wantWorst int
	}{
		{"empty", nil, true, 0, 0},
		{"within the limit", [][2]time.Time{span(100, 100), span(200, 300), span(1100, 1100)}, true, 2, 0},
		{"three in one window", [][2]time.Time{span(100, 100), span(200, 210), span(300, 400)}, false, 3, 3},
		// The straddling span fits in the second window.
		{"straddle placed later", [][2]time.Time{span(100, 100), span(200, 200), span(990, 1010)}, true, 2, 0},
		// The straddling span fits in the first window.
		{"straddle placed earlier", [][2]time.Time{span(990, 1010), span(1100, 1100), span(1200, 1200)}, true, 2, 0},
		// Two full windows leave no room for a span over both.
		{"straddle with no room", [][2]time.Time{span(100, 100), span(200, 200), span(990, 1010), span(1100, 1100), span(1200, 1200)}, false, 2, 3},
		{"empty window in between", [][2]time.Time{span(100, 100), span(2100, 2100), span(2200, 2200)}, true, 2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := checkWindows(rule, tt.spans, time.UTC)
			if got.Held != tt.wantHeld || got.Max != tt.wantMax || got.Worst != tt.wantWorst {
				t.Errorf("got held %v, max %d, worst %d; want held %v, max %d, worst %d",
					got.Held, got.Max, got.Worst, tt.wantHeld, tt.wantMax, tt.wantWorst)
			}
		})
	}
}

func TestDemoTenantOfferedBy(t *testing.T) {
	flood := demoTenant{Rate: 100}
	bursty := demoTenant{Burst: 60, Every: 10 * time.Second}
	tests := []struct {
		t       demoTenant
		elapsed time.Duration
		want    int
	}{
		{flood, 0, 0},
		{flood, 1500 * time.Millisecond, 150},
		{bursty, 400 * time.Millisecond, 0},
		{bursty, demoFirstBurst, 60},
		{bursty, 10 * time.Second, 60},
		{bursty, 10*time.Second + demoFirstBurst, 120},
	}
	for _, tt := range tests {
		if got := tt.t.offeredBy(tt.elapsed); got != tt.want {
			t.Errorf("%+v after %v: got %d, want %d", tt.t, tt.elapsed, got, tt.want)
		}
	}
}

func TestDemoConfigValid(t *testing.T) {
	for _, unique := range []bool{false, true} {
		cfg := demoConfig(demoConn{}, []string{"127.0.0.1:9092"}, []string{"127.0.0.1:6379"}, newDemoNames(unique))
		if err := cfg.Validate(); err != nil {
			t.Errorf("unique names %v: got %v, want a valid configuration", unique, err)
		}
	}
}

func TestDemoFlags(t *testing.T) {
	tests := []struct {
		args    []string
		code    int
		wantErr string
	}{
		{[]string{"-duration", "0s"}, 2, "-duration must be positive"},
		{[]string{"extra"}, 2, `unexpected argument "extra"`},
		{[]string{"-bogus"}, 2, "flag provided but not defined"},
		{[]string{"-h"}, 0, "-plain"},
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		code := demoCmd(context.Background(), tt.args, &stdout, &stderr)
		errOut := stderr.String()
		if code != tt.code || !strings.Contains(errOut, tt.wantErr) {
			t.Errorf("%v: got %d, stderr %q; want %d, stderr with %q", tt.args, code, errOut, tt.code, tt.wantErr)
		}
	}
}

// TestDemoRedisScripts runs every embedded script on the demo's embedded
// Redis (miniredis, clock TTLs), so that a script using a command miniredis
// lacks fails here rather than in `make demo`.
func TestDemoRedisScripts(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.ClockTTL(true)
	now := time.Now()
	mr.SetTime(now)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	run := func(src string, keys []string, args ...any) []any {
		t.Helper()
		res, err := redis.NewScript(src).Run(ctx, rdb, keys, args...).Slice()
		if err != nil {
			t.Fatalf("script %.30q: %v", src, err)
		}
		return res
	}
	check := func(what string, got []any, want ...int64) {
		t.Helper()
		ints := make([]int64, len(got))
		for i, v := range got {
			ints[i], _ = v.(int64)
		}
		if diff := cmp.Diff(want, ints); diff != "" {
			t.Errorf("%s (-want +got):\n%s", what, diff)
		}
	}
	ms := now.UnixMilli()

	// ttl windows: EXISTS, INCR, TTL, EXPIRE, SET EX, GET.
	check("ttl_incr first", run(lua.TTLIncr, []string{"k:ttl"}, 2), 1, 2)
	check("ttl_incr second", run(lua.TTLIncr, []string{"k:ttl"}, 2), 2, 2)
	check("ttl_get", run(lua.TTLGet, []string{"k:ttl"}), 2, 2)
	mr.SetTime(now.Add(3 * time.Second)) // the key's TTL runs out with the clock
	check("ttl_get after expiry", run(lua.TTLGet, []string{"k:ttl"}), 0, 0)

	// aligned windows: EXISTS, HGET, HINCRBY, HSET (two fields), PEXPIRE, HMGET.
	ms += 3000
	check("aligned_incr first", run(lua.AlignedIncr, []string{"k:al"}, ms+1000, 60000, ms), 1, ms+1000)
	check("aligned_incr second", run(lua.AlignedIncr, []string{"k:al"}, ms+1000, 60000, ms), 2, ms+1000)
	check("aligned_get", run(lua.AlignedGet, []string{"k:al"}, ms), 2, ms+1000)
	check("aligned_get after the window", run(lua.AlignedGet, []string{"k:al"}, ms+1000), 0, ms+1000)

	// admit.lua through the limiter, both window kinds: HMGET, HSET, HINCRBY,
	// PEXPIRE, GET, SET PX; EVALSHA after SCRIPT LOAD.
	rules, err := limit.ParseRules("t=2/1s")
	if err != nil {
		t.Fatal(err)
	}
	clock := func() time.Time { return now.Add(3 * time.Second) }
	for _, w := range []limit.WindowKind{limit.Aligned, limit.TTL} {
		lim, err := limit.New(ctx, rdb, rules, limit.Options{Prefix: "demo-" + string(w), WindowKind: w, Clock: clock})
		if err != nil {
			t.Fatalf("%s limiter: %v", w, err)
		}
		ds, err := lim.Admit(ctx, []string{"t", "t", "t", "t", "t"})
		if err != nil {
			t.Fatalf("%s admit: %v", w, err)
		}
		var kinds []string
		for _, d := range ds {
			kinds = append(kinds, d.Kind.String())
		}
		if diff := cmp.Diff([]string{"admit", "admit", "defer", "defer", "defer"}, kinds); diff != "" {
			t.Errorf("%s window decisions (-want +got):\n%s", w, diff)
		}
		if w == limit.Aligned {
			u, err := lim.Usage(ctx, "t")
			if err != nil || len(u) != 1 || u[0].Count != 2 {
				t.Errorf("aligned usage: got %+v, %v; want one rule with count 2", u, err)
			}
		}
	}
}

func TestCheckRuleBytes(t *testing.T) {
	rule := limit.Rule{Limit: 1000, Count: 1, Unit: limit.Second, Measure: limit.Bytes}
	base := time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)
	spans := func(n int) [][2]time.Time {
		out := make([][2]time.Time, n)
		for i := range out {
			out[i] = [2]time.Time{base, base}
		}
		return out
	}
	// Events of 300 bytes: three fit in 1000 bytes, four do not.
	if got := checkRule(rule, 300, spans(3), time.UTC); !got.Held || got.Max != 900 {
		t.Errorf("three events of 300 bytes: got held %v, max %d; want held, max 900", got.Held, got.Max)
	}
	if got := checkRule(rule, 300, spans(4), time.UTC); got.Held || got.Worst != 1200 {
		t.Errorf("four events of 300 bytes: got held %v, worst %d; want not held, worst 1200", got.Held, got.Worst)
	}
}

func TestDemoEventSize(t *testing.T) {
	for _, seq := range []int{1, 42, 999999} {
		ev := demoEvent{Tenant: "bulk", ID: fmt.Sprintf("bulk-%06d", seq), Seq: seq}
		v, err := ev.value(256)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(ev.ID) + len(v); got != 256 {
			t.Errorf("seq %d: got %d bytes (key and value), want 256", seq, got)
		}
		var back demoEvent
		if err := json.Unmarshal(v, &back); err != nil || back.Seq != seq {
			t.Errorf("seq %d: value %s reads back as %+v, %v", seq, v, back, err)
		}
	}
}
