package consume

import (
	"testing"
)

func TestOffsetTracker(t *testing.T) {
	tests := []struct {
		name    string
		fetched []int64
		done    [][]int64
		want    int64
		wantOK  bool
	}{
		{name: "nothing fetched", wantOK: false},
		{name: "nothing done", fetched: []int64{5, 6, 7}, want: 5, wantOK: true},
		{name: "all done", fetched: []int64{5, 6, 7}, done: [][]int64{{5, 6, 7}}, want: 8, wantOK: true},
		{name: "prefix done", fetched: []int64{5, 6, 7}, done: [][]int64{{5, 6}}, want: 7, wantOK: true},
		{name: "hole holds commit", fetched: []int64{5, 6, 7, 8}, done: [][]int64{{5, 7, 8}}, want: 6, wantOK: true},
		{name: "first undone holds all", fetched: []int64{5, 6, 7}, done: [][]int64{{7}, {6}}, want: 5, wantOK: true},
		{name: "hole filled later", fetched: []int64{5, 6, 7}, done: [][]int64{{7}, {6}, {5}}, want: 8, wantOK: true},
		{name: "gaps in offsets", fetched: []int64{10, 12, 20}, done: [][]int64{{10, 12}}, want: 20, wantOK: true},
		{name: "gaps all done", fetched: []int64{10, 12, 20}, done: [][]int64{{20, 10, 12}}, want: 21, wantOK: true},
		{name: "unknown offsets ignored", fetched: []int64{1, 2}, done: [][]int64{{0, 3, 1}}, want: 2, wantOK: true},
		{name: "done twice", fetched: []int64{1, 2}, done: [][]int64{{1}, {1}}, want: 2, wantOK: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tr offsetTracker
			for _, o := range tt.fetched {
				tr.add(o)
			}
			for _, d := range tt.done {
				tr.done(d...)
			}
			got, ok := tr.commitPoint()
			if ok != tt.wantOK || (ok && got != tt.want) {
				t.Errorf("commitPoint() = %d, %v; want %d, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

// The tracker keeps only unfinished offsets: one stuck message does not make
// it grow with the messages finished after it.
func TestOffsetTrackerMemoryBoundedByUndone(t *testing.T) {
	var tr offsetTracker
	tr.add(0) // stuck
	for o := int64(1); o <= 100000; o++ {
		tr.add(o)
		tr.done(o)
	}
	if got := tr.pending(); got != 1 {
		t.Errorf("pending() = %d, want 1", got)
	}
	if got, _ := tr.commitPoint(); got != 0 {
		t.Errorf("commitPoint() = %d, want 0", got)
	}
	tr.done(0)
	if got, _ := tr.commitPoint(); got != 100001 {
		t.Errorf("commitPoint() = %d, want 100001", got)
	}
}
