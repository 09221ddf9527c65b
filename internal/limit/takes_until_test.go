package limit

import (
	"context"
	"testing"
	"time"
)

// TakesUntil starts, when absent, at now plus the deferral horizon (takes
// made without it may be due that late), is raised by a later time and
// never lowered, and reads back what it holds.
func TestTakesUntil(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis(t)
	clk := newFakeClock(t0)
	l := newTestLimiter(t, rdb, "*=2/1m", Options{Clock: clk.Now, Prefix: testPrefix(t), Horizon: time.Hour})
	steps := []struct {
		name string
		at   time.Time
		want time.Time
	}{
		{"read, absent", time.Time{}, t0.Add(time.Hour)},
		{"raise below", t0.Add(time.Minute), t0.Add(time.Hour)},
		{"raise above", t0.Add(2 * time.Hour), t0.Add(2 * time.Hour)},
		{"read", time.Time{}, t0.Add(2 * time.Hour)},
	}
	for _, s := range steps {
		got, err := l.TakesUntil(ctx, s.at)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if !got.Equal(s.want) {
			t.Errorf("%s: %s, want %s", s.name, got, s.want)
		}
		clk.Add(time.Minute) // a later start must not move a bound already set
	}
	if err := rdb.Del(ctx, l.keys.takesUntil()).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := l.TakesUntil(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if want := clk.Now().Add(time.Hour); !got.Equal(want) {
		t.Errorf("lost, read: %s, want now plus the horizon %s", got, want)
	}
}
