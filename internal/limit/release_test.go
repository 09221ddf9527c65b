package limit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestReleaseRedis(t *testing.T)        { testRelease(t, testRedis(t)) }
func TestReleaseRedisCluster(t *testing.T) { testRelease(t, testCluster(t)) }

// A deferred event that came back after its slot gives the slot back: every
// rule's window that held its due time counts its cost less, once per trip
// however often Release is called (a retried call, a redelivered batch).
func testRelease(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	clk := newFakeClock(t0)
	l := newTestLimiter(t, rdb, "acme=2/1m,5/1h;bulk=100B/1m", Options{Clock: clk.Now})
	ds, err := l.AdmitCosts(ctx, []string{"acme", "acme", "acme", "bulk", "bulk"},
		[]Cost{{Bytes: 1}, {Bytes: 1}, {Bytes: 1}, {Bytes: 60}, {Bytes: 60}})
	if err != nil {
		t.Fatal(err)
	}
	if got := kinds(ds); got != "aadad" {
		t.Fatalf("decisions: got %s, want aadad", got)
	}
	acmeDue, bulkDue := ds[2].Due, ds[4].Due
	count := func(tenant, rule string, start time.Time) int64 {
		t.Helper()
		r, err := parseRule(rule)
		if err != nil {
			t.Fatal(err)
		}
		n, err := rdb.HGet(ctx, l.keys.window(tenant, r, start), "count").Int64()
		if err != nil && err != redis.Nil {
			t.Fatal(err)
		}
		return n
	}
	check := func(when string, wantMinute, wantHour, wantBulk int64) {
		t.Helper()
		if got := count("acme", "2/1m", acmeDue); got != wantMinute {
			t.Errorf("%s: acme's minute window of %s counts %d, want %d", when, acmeDue.Format("15:04"), got, wantMinute)
		}
		if got := count("acme", "5/1h", t0); got != wantHour {
			t.Errorf("%s: acme's hour window counts %d, want %d", when, got, wantHour)
		}
		if got := count("bulk", "100B/1m", bulkDue); got != wantBulk {
			t.Errorf("%s: bulk's minute window of %s counts %d bytes, want %d", when, bulkDue.Format("15:04"), got, wantBulk)
		}
	}
	check("deferred", 1, 3, 60)

	clk.Set(t0.Add(5 * time.Minute)) // both slots missed
	slots := []MissedSlot{
		{Tenant: "acme", Due: acmeDue, Cost: Cost{Bytes: 1}, Trip: "events:0:2:1"},
		{Tenant: "bulk", Due: bulkDue, Cost: Cost{Bytes: 60}, Trip: "events:0:4:1"},
		{Tenant: "no-rules-at-all", Due: bulkDue, Trip: "events:0:9:1"},
	}
	n, err := l.Release(ctx, slots)
	if err != nil || n != 2 {
		t.Fatalf("Release: got %d, %v; want 2, nil", n, err)
	}
	check("released", 0, 2, 0)
	n, err = l.Release(ctx, slots)
	if err != nil || n != 0 {
		t.Fatalf("Release again: got %d, %v; want 0, nil", n, err)
	}
	check("released twice", 0, 2, 0)

	// Another trip of the same event is another slot; a window that
	// counts less than the event is left alone.
	if n, err := l.Release(ctx, []MissedSlot{{Tenant: "acme", Due: acmeDue, Cost: Cost{Bytes: 1}, Trip: "events:0:2:2"}}); err != nil || n != 1 {
		t.Fatalf("Release of another trip: got %d, %v; want 1, nil", n, err)
	}
	check("another trip", 0, 1, 0)
}

// TTL windows give nothing back: their window depends on the chain.
func TestReleaseTTL(t *testing.T) {
	rdb := testRedis(t)
	clk := newFakeClock(t0)
	l := newTestLimiter(t, rdb, "acme=1/1m", Options{Clock: clk.Now, WindowKind: TTL})
	n, err := l.Release(context.Background(), []MissedSlot{{Tenant: "acme", Due: t0, Trip: "x"}})
	if err != nil || n != 0 {
		t.Fatalf("Release: got %d, %v; want 0, nil", n, err)
	}
}
