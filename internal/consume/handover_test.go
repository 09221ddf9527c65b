package consume

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDoneSetRoundTrip(t *testing.T) {
	many := func(n int, step int64) []offsetRange { // n ranges of one offset, step apart
		var rs []offsetRange
		for i := range int64(n) {
			rs = append(rs, offsetRange{101 + i*step, 102 + i*step})
		}
		return rs
	}
	tests := []struct {
		name     string
		base     int64
		done     []offsetRange
		wantKind byte
	}{
		{name: "one long run", base: 100, done: []offsetRange{{101, 5000}}, wantKind: 'r'},
		{name: "few runs far apart", base: 0, done: []offsetRange{{1, 3}, {1 << 40, 1<<40 + 9}}, wantKind: 'r'},
		{name: "every other offset", base: 100, done: many(500, 2), wantKind: 'b'},
		{name: "sparse singles", base: 100, done: many(50, 1000), wantKind: 'r'},
		{name: "adjacent to base", base: 7, done: []offsetRange{{7, 8}, {9, 10}}, wantKind: 'b'},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			meta, left := encodeDone(tt.base, tt.done, DefaultMetadataMax)
			if left != 0 {
				t.Fatalf("left out %d offsets, want 0 (metadata %d bytes)", left, len(meta))
			}
			if got := meta[len(metaVersion)]; got != tt.wantKind {
				t.Errorf("kind %c, want %c (%d bytes)", got, tt.wantKind, len(meta))
			}
			got, err := decodeDone(meta, tt.base)
			if err != nil {
				t.Fatalf("decode %q: %v", meta, err)
			}
			if diff := cmp.Diff(tt.done, got, cmp.AllowUnexported(offsetRange{})); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
		})
	}
}

// A done set that does not fit keeps its lowest ranges and says how many
// offsets it left out; what it keeps decodes exactly.
func TestDoneSetTruncated(t *testing.T) {
	var done []offsetRange
	var total int64
	for i := range int64(5000) {
		// Ranges of growing length and gaps: neither encoding fits.
		r := offsetRange{1000 + i*200, 1000 + i*200 + 1 + i%97}
		done = append(done, r)
		total += r.len()
	}
	meta, left := encodeDone(10, done, 600)
	if len(meta) > 600 || len(meta) < 500 {
		t.Fatalf("metadata %d bytes, want at most 600 and most of it used", len(meta))
	}
	got, err := decodeDone(meta, 10)
	if err != nil {
		t.Fatal(err)
	}
	var kept int64
	for _, r := range got {
		kept += r.len()
	}
	if kept+left != total || left == 0 {
		t.Errorf("kept %d + left out %d, want %d with some left out", kept, left, total)
	}
	if diff := cmp.Diff(done[:len(got)], got, cmp.AllowUnexported(offsetRange{})); diff != "" {
		t.Errorf("kept ranges (-want +got):\n%s", diff)
	}
	if meta, left := encodeDone(10, done[:1], 5); meta != "" || left != done[0].len() {
		t.Errorf("nothing fits: got %q, %d left; want empty, %d", meta, left, done[0].len())
	}
}

func TestDecodeDoneIgnoresOthersAndRefusesGarbage(t *testing.T) {
	valid, _ := encodeDone(50, []offsetRange{{52, 60}}, DefaultMetadataMax)
	for _, tt := range []struct {
		name, meta string
		base       int64
		wantErr    bool
	}{
		{name: "empty", meta: ""},
		{name: "another client's", meta: "my app state"},
		{name: "another committed offset", meta: valid, base: 49},
		{name: "bad base64", meta: "gk1r:50:!!!", base: 50, wantErr: true},
		{name: "truncated varint", meta: "gk1r:50:gA", base: 50, wantErr: true},
		{name: "zero-length run", meta: "gk1r:50:AQA", base: 50, wantErr: true},
		{name: "overflowing run", meta: "gk1r:50:" + strings.Repeat("_", 12) + "Bw", base: 50, wantErr: true},
		{name: "unknown kind", meta: "gk1x:50:AQE", base: 50, wantErr: true},
		{name: "no payload", meta: "gk1r:50", base: 50, wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodeDone(tt.meta, tt.base)
			if (err != nil) != tt.wantErr || got != nil {
				t.Errorf("decodeDone(%q, %d) = %v, %v; want nil, error %v", tt.meta, tt.base, got, err, tt.wantErr)
			}
		})
	}
}

// A tracker that inherits a done set skips those offsets when they are
// fetched, and its commits carry what it has not fetched yet.
func TestOffsetTrackerInherits(t *testing.T) {
	var tr offsetTracker
	tr.inherit([]offsetRange{{11, 13}, {15, 16}, {20, 25}})
	var handled []int64
	for _, o := range []int64{10, 11, 12, 13, 14, 15, 16} {
		if tr.add(o) {
			handled = append(handled, o)
		}
	}
	if diff := cmp.Diff([]int64{10, 13, 14, 16}, handled); diff != "" {
		t.Errorf("handled (-want +got):\n%s", diff)
	}
	check := func(wantNext int64, wantDone []offsetRange) {
		t.Helper()
		next, ok := tr.commitPoint()
		if !ok || next != wantNext {
			t.Errorf("commitPoint = %d, %v; want %d", next, ok, wantNext)
		}
		if diff := cmp.Diff(wantDone, tr.doneBeyond(), cmp.AllowUnexported(offsetRange{})); diff != "" {
			t.Errorf("doneBeyond (-want +got):\n%s", diff)
		}
	}
	check(10, []offsetRange{{11, 13}, {15, 16}, {20, 25}})
	tr.done(10, 14)
	check(13, []offsetRange{{14, 16}, {20, 25}})
	tr.done(13, 16)
	check(17, []offsetRange{{20, 25}})
	// Fetching on: 17..19 handled, then 20..24 skipped and the commit point
	// jumps to 25 once 17..19 are done.
	for _, o := range []int64{17, 18, 19, 20, 21, 22, 23, 24} {
		if tr.add(o) != (o < 20) {
			t.Errorf("add(%d) handled = %v", o, o >= 20)
		}
	}
	tr.done(17, 18, 19)
	check(25, nil)
}

// An inherited range right at the commit point moves it even before the
// range is fetched.
func TestOffsetTrackerInheritedAtCommitPoint(t *testing.T) {
	var tr offsetTracker
	tr.inherit([]offsetRange{{6, 9}})
	tr.add(5)
	tr.done(5)
	if next, _ := tr.commitPoint(); next != 9 {
		t.Errorf("commitPoint = %d, want 9", next)
	}
}
