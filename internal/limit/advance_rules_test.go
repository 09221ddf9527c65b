package limit

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestAdvanceAfterRuleChange: b floods under its rule and
// CAPACITY=100/1s, and its backlog waits in the retry tier; then the
// operator changes b's rule and b floods again, and Advance offers b's
// waiting events (those deferred under the old rule first). Every window of
// the new rule must count exactly b's events forwarded in it that it
// counted (admitted, forwarded in their slot, or moved: counted now).
//
// When the new rule counts in other windows (30/2s to 60/1s: another
// counter, other keys), an event deferred under the old rule must not move:
// its slot's window under the new rule never counted it, and taking it out
// of that window let it admit more than its limit (before the check: 80
// events forwarded in second 4 of a 60/1s rule that counted 60, 210 moves,
// 60 of them of events deferred under the old rule). When only the limit
// changes (30/1s to 60/1s), the windows are the same and the old backlog
// moves as before.
func TestAdvanceAfterRuleChange(t *testing.T) {
	for _, tc := range []struct {
		name, before, after string
		oldMoves            bool // events deferred under the old rule may move
	}{
		{"other windows", "b=30/2s", "b=60/1s", false},
		{"the same windows, another limit", "b=30/1s", "b=60/1s", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			moves, oldMoves := advanceAfterRuleChange(t, tc.before, tc.after)
			t.Logf("%s to %s: %d moves, %d of them of events deferred under the old rule", tc.before, tc.after, moves, oldMoves)
			if moves == 0 {
				t.Error("nothing moved: the test does not reach Advance")
			}
			if (oldMoves > 0) != tc.oldMoves {
				t.Errorf("%d events deferred under the old rule moved, want moves: %v", oldMoves, tc.oldMoves)
			}
		})
	}
}

// advanceAfterRuleChange runs TestAdvanceAfterRuleChange's flood under the
// rules before, then after, and checks the windows of the rule after. It
// returns the moves and those of events deferred under the rule before.
func advanceAfterRuleChange(t *testing.T, before, after string) (moves, oldMoves int) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, err := ParseCapacity("100/1s")
	if err != nil {
		t.Fatal(err)
	}
	rdb := privateRedis(t)
	l := newTestLimiter(t, rdb, before, Options{Clock: clk.Now, Capacity: c, Horizon: 2 * time.Minute})
	l.advanceEvery = 0
	ctx := context.Background()
	start := clk.Now()
	retry := Source{Topic: "retry", Partition: 0}
	old := l.Rules().For("b")[0]
	type waiting struct {
		off        int64
		due, until time.Time
		newRule    bool
		windows    string
	}
	var queue []waiting
	var next int64
	fwd := map[int]int64{} // per second, b's events forwarded in it that the rule after counts there
	sec := func() int { return int(clk.Now().Sub(start) / time.Second) }
	var counts func(newRule bool) bool // the rule after counts an event in the windows it was decided in
	flood := func(n int, newRule bool) {
		ds, err := l.Admit(ctx, repeat("b", n))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			switch d.Kind {
			case Admit:
				if counts(newRule) {
					fwd[sec()]++
				}
			case Defer:
				queue = append(queue, waiting{off: next, due: d.Due, until: d.Until, newRule: newRule, windows: d.Windows})
				next++
			default:
				t.Fatalf("%+v", d)
			}
		}
	}
	counts = func(bool) bool { return false }
	flood(300, false)
	clk.Set(start.Add(time.Second))
	if err := l.SetRules(mustRules(t, after)); err != nil {
		t.Fatal(err)
	}
	rule := l.Rules().For("b")[0]
	counts = func(newRule bool) bool { return newRule || rule.Counter() == old.Counter() }
	// The admissions of second 0 are in the rule after's windows too when
	// they are the same.
	if counts(false) {
		n, err := rdb.HGet(ctx, l.keys.window("b", rule, start), "count").Int64()
		if err != nil {
			t.Fatal(err)
		}
		fwd[0] = n
	}
	flood(300, true)
	for k := 21; k < 60*20 && len(queue) > 0; k++ {
		now := start.Add(time.Duration(k) * 50 * time.Millisecond)
		clk.Set(now)
		queue = slices.DeleteFunc(queue, func(w waiting) bool {
			if w.due.After(now) {
				return false
			}
			if !now.Before(w.until) {
				t.Errorf("event %d due %v forwarded at %v, after its slot", w.off, w.due, now)
			}
			if counts(w.newRule) {
				fwd[sec()]++
			}
			return true
		})
		slices.SortFunc(queue, func(a, b waiting) int {
			if c := a.due.Compare(b.due); c != 0 {
				return c
			}
			return cmp.Compare(a.off, b.off)
		})
		head := queue[:min(100, len(queue))]
		ws := make([]Waiting, len(head))
		for i, w := range head {
			ws[i] = Waiting{Tenant: "b", Offset: w.off, Due: w.due, Windows: w.windows}
		}
		moved, _, err := l.Advance(ctx, retry, ws)
		if err != nil {
			t.Fatal(err)
		}
		gone := map[int64]bool{}
		for i, mv := range moved {
			if mv {
				gone[head[i].off] = true
				fwd[sec()]++ // counted now, under the rule in force
				moves++
				if !head[i].newRule {
					oldMoves++
				}
			}
		}
		queue = slices.DeleteFunc(queue, func(w waiting) bool { return gone[w.off] })
	}
	if len(queue) > 0 {
		t.Fatalf("%d events still waiting after a minute", len(queue))
	}
	for s := 0; s < 130; s++ {
		ws := start.Add(time.Duration(s) * time.Second)
		o, err := rdb.HGet(ctx, l.keys.window("b", rule, ws), "count").Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("second %d: b's window: %v", s, err)
		}
		if s > 0 && (o != fwd[s] || o > rule.Limit) {
			t.Errorf("second %d: b's window of %s counts %d, %d of the events it counts forwarded in it (limit %d)",
				s, after, o, fwd[s], rule.Limit)
		}
	}
	return moves, oldMoves
}
