package consume

import (
	"context"
	"testing"
	"time"
)

// A jump over offsets Kafka deleted is reported once per check, with what
// was lost; a gap that is still in the log (compaction, transaction
// markers) is not, and checks are spaced out.
func TestGapCheck(t *testing.T) {
	type lost struct{ partition, n int64 }
	var got []lost
	p := testPartition(nil, nil, &commits{}, func(c *Config) {
		c.OnOffsetsLost = func(_ string, partition int, n int64) { got = append(got, lost{int64(partition), n}) }
	})
	first, calls := int64(0), 0
	g := &gapCheck{p: p, next: 100, firstOffset: func(context.Context) (int64, error) { calls++; return first, nil }}
	ctx := context.Background()

	g.fetched(ctx, 100) // as expected
	g.fetched(ctx, 101)
	first = 90
	g.fetched(ctx, 105) // a gap that is still in the log
	if len(got) != 0 || calls != 1 {
		t.Fatalf("gap in the log: reported %v after %d checks, want nothing after 1", got, calls)
	}
	g.lastCheck = time.Time{}
	first = 200
	g.fetched(ctx, 200) // 106..199 deleted
	if len(got) != 1 || got[0].n != 94 {
		t.Fatalf("deleted offsets: reported %v, want 94 lost", got)
	}
	first = 400
	g.fetched(ctx, 400) // within gapCheckEvery of the last check: not asked
	if calls != 2 || len(got) != 1 {
		t.Errorf("checks %d, reports %v: want the second gap unchecked so soon", calls, got)
	}
	// A partition without a committed offset knows nothing to compare.
	g = &gapCheck{p: p, next: -1, firstOffset: g.firstOffset}
	g.fetched(ctx, 1000)
	if calls != 2 {
		t.Errorf("checked with no expected offset")
	}
}
