package limit

import (
	"testing"
	"time"
)

func mustLoc(t *testing.T, name string) *time.Location {
	t.Helper()
	l, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("LoadLocation(%q): %v", name, err)
	}
	return l
}

func TestWindowEdges(t *testing.T) {
	berlin := mustLoc(t, "Europe/Berlin")
	ny := mustLoc(t, "America/New_York")
	kathmandu := mustLoc(t, "Asia/Kathmandu") // +05:45
	tests := []struct {
		name       string
		rule       Rule
		loc        *time.Location
		at         string // RFC 3339
		start, end string
		length     time.Duration
	}{
		{"second", Rule{1, 1, Second, Events}, time.UTC, "2026-03-01T10:00:00.7Z", "2026-03-01T10:00:00Z", "2026-03-01T10:00:01Z", time.Second},
		{"15s", Rule{1, 15, Second, Events}, time.UTC, "2026-03-01T10:00:44Z", "2026-03-01T10:00:30Z", "2026-03-01T10:00:45Z", 15 * time.Second},
		{"15m in +05:45", Rule{1, 15, Minute, Events}, kathmandu, "2026-03-01T10:20:00+05:45", "2026-03-01T10:15:00+05:45", "2026-03-01T10:30:00+05:45", 15 * time.Minute},
		{"6h local", Rule{1, 6, Hour, Events}, berlin, "2026-07-01T05:59:59+02:00", "2026-07-01T00:00:00+02:00", "2026-07-01T06:00:00+02:00", 6 * time.Hour},
		{"day of 23h (spring forward)", Rule{1, 1, Day, Events}, berlin, "2026-03-29T12:00:00+02:00", "2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00", 23 * time.Hour},
		{"day of 25h (fall back)", Rule{1, 1, Day, Events}, berlin, "2026-10-25T12:00:00+01:00", "2026-10-25T00:00:00+02:00", "2026-10-26T00:00:00+01:00", 25 * time.Hour},
		{"day of 25h in New York", Rule{1, 1, Day, Events}, ny, "2026-11-01T23:59:59-05:00", "2026-11-01T00:00:00-04:00", "2026-11-02T00:00:00-05:00", 25 * time.Hour},
		{"hour repeated at fall back, first", Rule{1, 1, Hour, Events}, berlin, "2026-10-25T02:30:00+02:00", "2026-10-25T02:00:00+02:00", "2026-10-25T03:00:00+02:00", time.Hour},
		{"hour repeated at fall back, second", Rule{1, 1, Hour, Events}, berlin, "2026-10-25T02:30:00+01:00", "2026-10-25T02:00:00+01:00", "2026-10-25T03:00:00+01:00", time.Hour},
		{"week starts Monday", Rule{1, 1, Week, Events}, time.UTC, "2026-11-29T23:00:00Z", "2026-11-23T00:00:00Z", "2026-11-30T00:00:00Z", 7 * 24 * time.Hour},
		{"week on Monday", Rule{1, 1, Week, Events}, time.UTC, "2026-11-30T00:00:00Z", "2026-11-30T00:00:00Z", "2026-12-07T00:00:00Z", 7 * 24 * time.Hour},
		{"week over DST", Rule{1, 1, Week, Events}, berlin, "2026-03-29T12:00:00+02:00", "2026-03-23T00:00:00+01:00", "2026-03-30T00:00:00+02:00", 7*24*time.Hour - time.Hour},
		{"February 28 days", Rule{1, 1, Month, Events}, time.UTC, "2026-02-14T00:00:00Z", "2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z", 28 * 24 * time.Hour},
		{"February leap 29 days", Rule{1, 1, Month, Events}, time.UTC, "2028-02-29T23:59:59Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z", 29 * 24 * time.Hour},
		{"January 31 days", Rule{1, 1, Month, Events}, time.UTC, "2026-01-31T12:00:00Z", "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z", 31 * 24 * time.Hour},
		{"April 30 days", Rule{1, 1, Month, Events}, time.UTC, "2026-04-01T00:00:00Z", "2026-04-01T00:00:00Z", "2026-05-01T00:00:00Z", 30 * 24 * time.Hour},
		{"quarter", Rule{1, 3, Month, Events}, time.UTC, "2026-05-10T00:00:00Z", "2026-04-01T00:00:00Z", "2026-07-01T00:00:00Z", 91 * 24 * time.Hour},
		{"month in zone over DST", Rule{1, 1, Month, Events}, berlin, "2026-03-31T23:30:00+02:00", "2026-03-01T00:00:00+01:00", "2026-04-01T00:00:00+02:00", 31*24*time.Hour - time.Hour},
		{"year end", Rule{1, 1, Day, Events}, time.UTC, "2026-12-31T23:59:59.999Z", "2026-12-31T00:00:00Z", "2027-01-01T00:00:00Z", 24 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			at, _ := time.Parse(time.RFC3339Nano, tt.at)
			ws, _ := time.Parse(time.RFC3339, tt.start)
			we, _ := time.Parse(time.RFC3339, tt.end)
			s, e := WindowBounds(tt.rule, at, tt.loc)
			if !s.Equal(ws) || !e.Equal(we) {
				t.Errorf("WindowBounds(%v, %v): got [%v, %v), want [%v, %v)", tt.rule, at, s, e, ws, we)
			}
			if got := e.Sub(s); got != tt.length {
				t.Errorf("length: got %v, want %v", got, tt.length)
			}
		})
	}
}

// Windows tile time: each instant lies in its window, and a window's end is
// the start of the next, for every unit, across DST changes in several zones.
func TestWindowsTile(t *testing.T) {
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu"}
	rules := []Rule{{1, 1, Second, Events}, {1, 30, Second, Events}, {1, 1, Minute, Events}, {1, 20, Minute, Events}, {1, 1, Hour, Events}, {1, 6, Hour, Events}, {1, 1, Day, Events}, {1, 1, Week, Events}, {1, 1, Month, Events}, {1, 6, Month, Events}}
	for _, z := range zones {
		loc := mustLoc(t, z)
		for _, r := range rules {
			from := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
			step := 37 * time.Minute
			if r.Unit == Second {
				step = 7 * time.Second
			}
			for at := from; at.Before(from.Add(24 * 24 * time.Hour)); at = at.Add(step) {
				s, e := WindowBounds(r, at, loc)
				if at.Before(s) || !at.Before(e) {
					t.Fatalf("%s %v at %v: window [%v, %v) does not hold it", z, r, at, s, e)
				}
				if ns, _ := WindowBounds(r, e, loc); !ns.Equal(e) {
					t.Fatalf("%s %v at %v: next window starts %v, want %v", z, r, at, ns, e)
				}
				if r.Unit == Second && step > r.Length() {
					continue
				}
			}
		}
	}
}

func TestBoundaries(t *testing.T) {
	now := time.Date(2026, 3, 28, 13, 0, 0, 0, time.UTC)
	b := boundaries(Rule{1, 1, Day, Events}, now, now.Add(48*time.Hour), mustLoc(t, "Europe/Berlin"))
	want := []string{"2026-03-28T00:00:00+01:00", "2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00", "2026-03-31T00:00:00+02:00"}
	if len(b) != len(want) {
		t.Fatalf("got %v, want %v", b, want)
	}
	for i, w := range want {
		wt, _ := time.Parse(time.RFC3339, w)
		if !b[i].Equal(wt) {
			t.Errorf("boundary %d: got %v, want %v", i, b[i], wt)
		}
	}
}
