package top

import (
	"fmt"
	"testing"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

func decisions(kinds string) []limit.Decision {
	out := make([]limit.Decision, len(kinds))
	for i, k := range kinds {
		out[i].Kind = map[rune]limit.Kind{'a': limit.Admit, 'd': limit.Defer, 'r': limit.Reject}[k]
	}
	return out
}

func TestTrackerWindowsAndRankings(t *testing.T) {
	clock := testenv.NewClock(time.Date(2026, 12, 1, 10, 0, 5, 0, time.UTC))
	tr := NewTracker(time.Minute, 3, clock.Now)
	tr.Record([]string{"a", "a", "b", "b", "b", "c"}, decisions("addrra"))
	tr.Waiting("b", 2)
	got := tr.Top(10)
	want := map[string]Row{
		"a": {Tenant: "a", Counts: Counts{Admitted: 1, Deferred: 1}},
		"b": {Tenant: "b", Counts: Counts{Deferred: 1, Rejected: 2}, Waiting: 2},
		"c": {Tenant: "c", Counts: Counts{Admitted: 1}},
	}
	if len(got.Current.Rows) != 3 {
		t.Fatalf("rows %+v", got.Current.Rows)
	}
	for _, r := range got.Current.Rows {
		if r != want[r.Tenant] {
			t.Errorf("got %+v, want %+v", r, want[r.Tenant])
		}
	}
	// A fourth tenant past MaxTenants is summed as other.
	tr.Record([]string{"d", "d"}, decisions("dd"))
	if got := tr.Top(10).Current.Other; got.Deferred != 2 {
		t.Errorf("other: %+v, want 2 deferred", got)
	}
	// The next window: the current becomes the last.
	clock.Add(time.Minute)
	tr.Record([]string{"a"}, decisions("a"))
	got = tr.Top(10)
	// b still has 2 waiting events: the current window shows it.
	if len(got.Current.Rows) != 2 || len(got.Last.Rows) != 3 || !got.Last.Start.Equal(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)) {
		t.Errorf("after a minute: current %+v last %+v", got.Current, got.Last)
	}
	// Two windows later, nothing is left of the first.
	clock.Add(2 * time.Minute)
	if got := tr.Top(10); len(got.Last.Rows) != 0 {
		t.Errorf("stale last window: %+v", got.Last)
	}
}

func TestTopRowsKeepsEachRankingsTop(t *testing.T) {
	var rows []Row
	for i := range 100 {
		rows = append(rows, Row{Tenant: fmt.Sprintf("t%03d", i), Counts: Counts{Admitted: int64(i), Deferred: int64(100 - i)}})
	}
	rows = append(rows, Row{Tenant: "waits", Waiting: 7})
	got := TopRows(rows, 2)
	names := map[string]bool{}
	for _, r := range got {
		names[r.Tenant] = true
	}
	for _, want := range []string{"t000", "t001", "t099", "t098", "waits"} {
		if !names[want] {
			t.Errorf("%s missing from %v", want, names)
		}
	}
	if len(got) != 5 {
		t.Errorf("got %d rows, want 5", len(got))
	}
}
