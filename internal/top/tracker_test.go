package top

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

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

// sortedTopRows is TopRows as it was before the heaps: each ranking sorted
// whole, its first k with a count kept.
func sortedTopRows(rows []Row, k int) []Row {
	rows = slices.Clone(rows)
	keep := map[string]bool{}
	for _, rank := range rankings {
		slices.SortFunc(rows, func(a, b Row) int {
			return cmp.Or(cmp.Compare(rank(b), rank(a)), cmp.Compare(a.Tenant, b.Tenant))
		})
		for i := 0; i < len(rows) && i < k; i++ {
			if rank(rows[i]) > 0 {
				keep[rows[i].Tenant] = true
			}
		}
	}
	var out []Row
	for _, r := range rows {
		if keep[r.Tenant] {
			out = append(out, r)
		}
	}
	SortRows(out, "deferred")
	return out
}

// randomRows returns n rows with small counts, so that ties and zeros are
// common.
func randomRows(rng *rand.Rand, n int) []Row {
	rows := make([]Row, n)
	for i := range rows {
		rows[i] = Row{Tenant: fmt.Sprintf("t%d", rng.IntN(10*n+1)*1000+i), Counts: Counts{
			Admitted: rng.Int64N(5), Deferred: rng.Int64N(3), Rejected: rng.Int64N(2),
			ShadowDeferred: rng.Int64N(2),
		}, Waiting: rng.Int64N(3)}
	}
	return rows
}

func TestTopRowsSameAsSortingEveryRanking(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 3, 10, 50, 400} {
		for _, k := range []int{0, 1, 2, 5, 50} {
			rows := randomRows(rng, n)
			before := slices.Clone(rows)
			got := TopRows(rows, k)
			if diff := gocmp.Diff(sortedTopRows(rows, k), got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("n=%d k=%d: TopRows (-sorted +heaps):\n%s", n, k, diff)
			}
			if diff := gocmp.Diff(before, rows); diff != "" {
				t.Errorf("n=%d k=%d: TopRows changed its input (-before +after):\n%s", n, k, diff)
			}
		}
	}
}

// BenchmarkTop is the Publisher's once-a-second Top over a full window of
// DefaultMaxTenants tenants.
func BenchmarkTop(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	rows := randomRows(rng, DefaultMaxTenants)
	for _, f := range []struct {
		name string
		top  func([]Row, int) []Row
	}{{"heaps", TopRows}, {"sorted", sortedTopRows}} {
		b.Run(f.name, func(b *testing.B) {
			for b.Loop() {
				f.top(rows, PublishK)
			}
		})
	}
}
