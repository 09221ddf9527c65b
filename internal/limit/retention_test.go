package limit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// pttl returns the time key has left to live; it fails the test when key
// is missing or never expires.
func pttl(t *testing.T, rdb redis.UniversalClient, key string) time.Duration {
	t.Helper()
	d, err := rdb.PTTL(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("PTTL %s: %v", key, err)
	}
	if d < 0 {
		t.Fatalf("PTTL %s: got %v, want a live key with an expiry", key, d)
	}
	return d
}

// checkLife checks that key lives until its window's end (end - now on the
// test clock) plus want, within a few seconds of slack for the real time the
// test itself takes.
func checkLife(t *testing.T, rdb redis.UniversalClient, key string, untilEnd, want time.Duration) {
	t.Helper()
	got := pttl(t, rdb, key)
	if got > untilEnd+want || got < untilEnd+want-5*time.Second {
		t.Errorf("key %s lives %v, want its window's end (%v) plus %v", key, got, untilEnd, want)
	}
}

// Window keys live their window plus a retention that grows with the
// window: a flood of made-up tenants with second or minute rules leaves keys
// that are gone within minutes, not 7 days. Aligned and ttl windows alike.
func testWindowKeysExpire(t *testing.T, rdb redis.UniversalClient) {
	now := t0.Add(100 * time.Millisecond)
	tests := []struct {
		spec   string
		window WindowKind
		want   time.Duration
	}{
		{"1/1s", Aligned, time.Minute},
		{"1/10s", Aligned, 4 * time.Minute},
		{"1/1m", Aligned, 24 * time.Minute},
		{"1/1h", Aligned, 24 * time.Hour},
		{"1/1d", Aligned, 7 * 24 * time.Hour},
		{"1/1s", TTL, time.Minute},
		{"1/1m", TTL, 24 * time.Minute},
		{"1/1d", TTL, 7 * 24 * time.Hour},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s %s", tc.spec, tc.window), func(t *testing.T) {
			l := newTestLimiter(t, rdb, "*="+tc.spec, Options{Clock: func() time.Time { return now }, WindowKind: tc.window})
			if got := kinds(admit(t, l, []string{"made-up"})); got != "a" {
				t.Fatalf("got %s, want a", got)
			}
			r := l.Rules().For("made-up")[0]
			start, end := now, now.Add(r.Length())
			if tc.window == Aligned {
				start, end = WindowBounds(r, now, time.UTC)
			}
			checkLife(t, rdb, l.keys.window("made-up", r, start), end.Sub(now), tc.want)
		})
	}
}

// A slot reserved in a future window keeps its key until that window ends
// plus the retention, however far ahead it lies within the horizon; the
// usage query still reads the current window.
func testReservedWindowKeyLives(t *testing.T, rdb redis.UniversalClient) {
	now := t0.Add(10 * time.Second)
	l := newTestLimiter(t, rdb, "acme=1/1m", Options{Clock: func() time.Time { return now }, Horizon: time.Hour})
	ds := admit(t, l, repeat("acme", 40))
	last := ds[len(ds)-1]
	if got, want := kinds(ds), "a"+strings.Repeat("d", 39); got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if !last.Due.Equal(t0.Add(39 * time.Minute)) {
		t.Fatalf("last due: got %v, want %v", last.Due, t0.Add(39*time.Minute))
	}
	r := l.Rules().For("acme")[0]
	checkLife(t, rdb, l.keys.window("acme", r, last.Due), last.Until.Sub(now), 24*time.Minute)
	us, err := l.Usage(context.Background(), "acme")
	if err != nil || len(us) != 1 || us[0].Count != 1 {
		t.Errorf("usage: got %+v %v, want count 1", us, err)
	}
}

// TestFloodOfTenants is the report of the issue: 1,500 events from 1,500
// made-up tenants under a one-second rule left 1,500 keys to live 7 days.
func TestFloodOfTenants(t *testing.T) {
	rdb := testRedis(t)
	now := t0.Add(100 * time.Millisecond)
	prefix := testPrefix(t)
	l := newTestLimiter(t, rdb, "*=10/1s", Options{Prefix: prefix, Clock: func() time.Time { return now }})
	tenants := make([]string, 1500)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("made-up-%d", i)
	}
	admit(t, l, tenants)
	ctx := context.Background()
	var keys int
	iter := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		keys++
		if got := pttl(t, rdb, iter.Val()); got > time.Minute+time.Second {
			t.Fatalf("key %s lives %v, want at most a minute past its one-second window", iter.Val(), got)
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	if keys != len(tenants) {
		t.Errorf("got %d keys, want %d", keys, len(tenants))
	}
}

func TestRetentionRule(t *testing.T) {
	week := 7 * 24 * time.Hour
	tests := []struct {
		rule       string
		configured time.Duration
		want       time.Duration
	}{
		{"1/1s", week, time.Minute},
		{"1/2s", week, time.Minute},
		{"1/10s", week, 4 * time.Minute},
		{"1/1m", week, 24 * time.Minute},
		{"1/15m", week, 6 * time.Hour},
		{"1/1h", week, 24 * time.Hour},
		{"1/6h", week, 144 * time.Hour},
		{"1/12h", week, week},
		{"1/1d", week, week},
		{"1/1w", week, week},
		{"1/1mo", week, week},
		{"1/1m", time.Hour, 24 * time.Minute},
		{"1/1h", time.Hour, time.Hour},
		{"1/1d", time.Hour, time.Hour},
		{"1/1s", 10 * time.Second, 10 * time.Second},
		{"1/1d", 30 * 24 * time.Hour, 30 * 24 * time.Hour},
		{"1/12h", 30 * 24 * time.Hour, 12 * 24 * time.Hour},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s of %v", tc.rule, tc.configured), func(t *testing.T) {
			r, err := parseRule(tc.rule)
			if err != nil {
				t.Fatal(err)
			}
			if got := retention(r, tc.configured); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
