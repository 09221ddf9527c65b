package route

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// takesBound is a TakesBound in memory: it records the raises, and fails
// the first one when fail is set.
type takesBound struct {
	until  time.Time
	reads  int
	raises []time.Time
	fail   bool
}

func (b *takesBound) TakesUntil(_ context.Context, at time.Time) (time.Time, error) {
	if at.IsZero() {
		b.reads++
		return b.until, nil
	}
	if b.fail {
		b.fail = false
		return time.Time{}, errors.New("redis down")
	}
	b.raises = append(b.raises, at)
	if at.After(b.until) {
		b.until = at
	}
	return b.until, nil
}

// With Retrier.Takes, a claim due after the fleet's bound on the slots
// taken goes downstream uncounted without a claims call; one due at or
// before it is checked as before. A batch with late events raises the bound
// before its call (to now plus the replay record's lifetime) and after it
// (to the end of the latest window a slot was taken in); when the first
// raise fails, its late events take no slot.
func TestRetrierTakesBound(t *testing.T) {
	past := t0.Add(-10 * time.Second)
	claim := func(off int64) kafka.Message {
		return retryMsg("down.retry", off, deferral("acme", int(off), past, t0.Add(time.Minute)))
	}
	late := retryMsg("down.retry", 9, deferral("acme", 1, past.Add(-time.Minute), past))
	took := limit.Decision{Kind: limit.Defer, Due: t0.Add(time.Minute), Until: t0.Add(2 * time.Minute), Took: true}
	cases := []struct {
		name      string
		bound     time.Time
		fail      bool
		msgs      []kafka.Message
		calls     int         // AdmitLate calls
		checked   int         // claims in them
		take      bool        // the call's take
		raises    []time.Time // the bound's raises
		forwarded float64     // claims forwarded uncounted without a call
	}{
		{name: "claims due after the bound", bound: past.Add(-time.Second), msgs: []kafka.Message{claim(1), claim(2)},
			forwarded: 2},
		{name: "claims due at the bound", bound: past, msgs: []kafka.Message{claim(1), claim(2)},
			calls: 1, checked: 2, take: true},
		{name: "late event and a claim", bound: past.Add(-time.Second), msgs: []kafka.Message{claim(1), late},
			calls: 1, take: true, raises: []time.Time{t0.Add(limit.ReplayRecordTTL), took.Until}, forwarded: 1},
		{name: "raise fails", bound: past.Add(-time.Second), fail: true, msgs: []kafka.Message{claim(1), late},
			calls: 1, forwarded: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, m := &fakeWriter{}, newTestMetrics(t)
			la := &lateAdmitter{fakeAdmitter: &fakeAdmitter{}}
			la.answer = func(evs []limit.Event) []limit.Decision {
				ds := make([]limit.Decision, len(evs))
				for i, e := range evs {
					switch {
					case e.InSlot:
						ds[i] = limit.Decision{Kind: limit.Keep}
					case la.takes[len(la.takes)-1]:
						ds[i] = took
					default:
						ds[i] = limit.Decision{Kind: limit.Defer, Due: took.Due, Until: took.Until}
					}
				}
				return ds
			}
			adm := testAdmission(w, la.fakeAdmitter, m, &readyLog{})
			adm.Admitter = la
			bound := &takesBound{until: tc.bound, fail: tc.fail}
			r := mustRetrier(t, Retrier{Admission: adm, MaxAttempts: 3, CheckClaims: true, TakeSlots: true, Takes: bound})
			if err := r.Handle(context.Background(), batchOf(tc.msgs)); err != nil {
				t.Fatal(err)
			}
			if len(la.events) != tc.calls {
				t.Fatalf("AdmitLate calls %d, want %d", len(la.events), tc.calls)
			}
			checked := 0
			for i, evs := range la.events {
				for _, e := range evs {
					if e.InSlot {
						checked++
					}
				}
				if la.takes[i] != tc.take {
					t.Errorf("call %d: take %v, want %v", i, la.takes[i], tc.take)
				}
			}
			if checked != tc.checked {
				t.Errorf("claims checked %d, want %d", checked, tc.checked)
			}
			if bound.reads != 1 {
				t.Errorf("bound read %d times, want once per batch", bound.reads)
			}
			if len(bound.raises) != len(tc.raises) {
				t.Fatalf("raises %v, want %v", bound.raises, tc.raises)
			}
			for i := range tc.raises {
				if !bound.raises[i].Equal(tc.raises[i]) {
					t.Errorf("raise %d: %s, want %s", i, bound.raises[i], tc.raises[i])
				}
			}
			reserved := counterValue(t, m.Decisions.WithLabelValues(DecisionReserved))
			if want := tc.forwarded + float64(tc.checked); reserved != want {
				t.Errorf("reserved %v, want %v", reserved, want)
			}
			if got := len(w.last(t)); got != len(tc.msgs) {
				t.Errorf("written %d, want %d", got, len(tc.msgs))
			}
		})
	}
}

// Takes without TakeSlots is refused: the replica would trust a bound its
// own takes do not raise.
func TestRetrierTakesNeedsTakeSlots(t *testing.T) {
	w, m := &fakeWriter{}, newTestMetrics(t)
	adm := testAdmission(w, &fakeAdmitter{}, m, &readyLog{})
	if _, err := NewRetrier(Retrier{Admission: adm, CheckClaims: true, Takes: &takesBound{}}); err == nil {
		t.Fatal("NewRetrier with Takes and no TakeSlots: no error")
	}
}

// An event that was to go downstream inside its slot, but whose slot
// ended while the batch's call waited (through a Redis outage), is not
// forwarded as if in its slot, where it would land in the next window on
// top of that window's own events: it is decided again as late, in a
// second call of the same batch, and gives its slot back. That holds for a
// claim the call kept and for one forwarded without a call (its slot past
// the bound on slots taken); a claim whose slot was taken was placed again
// by the first call and keeps that decision, and gives nothing back (its
// slot is the late event's that took it).
func TestRetrierSlotEndsDuringCall(t *testing.T) {
	past := t0.Add(-10 * time.Second)
	end := t0.Add(time.Second)
	claimAt := func(off int64, attempt int) kafka.Message {
		d := deferral("acme", attempt, past, end)
		d.OriginOffset = off
		return retryMsg("down.retry", off, d)
	}
	late := func(off int64) kafka.Message {
		d := deferral("acme", 1, past.Add(-time.Minute), past)
		d.OriginOffset = off
		return retryMsg("down.retry", off, d)
	}
	placed := limit.Decision{Kind: limit.Defer, Due: t0.Add(time.Minute), Until: t0.Add(2 * time.Minute)}
	copyOf := func(m kafka.Message, off int64) kafka.Message {
		m.Offset, m.Key = off, []byte("k"+strconv.FormatInt(off, 10))
		return m
	}
	end2 := t0.Add(2 * time.Second)
	second := func(off int64) kafka.Message { // a claim whose slot ends a second later
		d := deferral("acme", 1, past, end2)
		d.OriginOffset = off
		return retryMsg("down.retry", off, d)
	}
	cases := []struct {
		name      string
		bound     time.Time // Retrier.Takes's bound; zero: no Takes
		costFrom  string    // COST_FROM (the messages carry no such header)
		forward   bool      // ON_REDIS_ERROR=forward, and the calls after the first fail
		msgs      []kafka.Message
		displaced int64            // the offset of a claim whose slot was taken (0: none)
		clocks    []time.Time      // the clock after each call (default: end)
		calls     int              // AdmitLate calls
		redone    []int64          // offsets of the last call's events, none in their slot
		released  []int64          // origin offsets whose slots were given back
		topics    map[int64]string // where each offset went
		reserved  float64          // events downstream as inside their slot
	}{
		{name: "a kept claim", msgs: []kafka.Message{claimAt(1, 1)},
			calls: 2, redone: []int64{1}, released: []int64{1}, topics: map[int64]string{1: "down"}},
		{name: "a claim past the bound, beside a late event", bound: past.Add(-time.Second), msgs: []kafka.Message{claimAt(1, 1), late(2)},
			calls: 2, redone: []int64{1}, released: []int64{2, 1}, topics: map[int64]string{1: "down", 2: "down"}},
		{name: "two copies of a trip past the bound", bound: past.Add(-time.Second), msgs: []kafka.Message{claimAt(1, 1), late(2), copyOf(claimAt(1, 1), 3)},
			calls: 2, redone: []int64{1}, released: []int64{2, 1}, topics: map[int64]string{1: "down", 2: "down", 3: "down"}},
		{name: "a displaced claim beside a kept one", msgs: []kafka.Message{claimAt(1, 1), claimAt(2, 2)}, displaced: 2,
			calls: 2, redone: []int64{1}, released: []int64{1}, topics: map[int64]string{1: "down", 2: "down.retry"}},
		{name: "a slot ending during the second call", msgs: []kafka.Message{claimAt(1, 1), second(2)}, clocks: []time.Time{end, end2},
			calls: 3, redone: []int64{2}, released: []int64{1, 2}, topics: map[int64]string{1: "down", 2: "down"}},
		{name: "a cost no longer readable", costFrom: "header:x-units", msgs: []kafka.Message{claimAt(1, 1)},
			calls: 1, topics: map[int64]string{1: "down.dlq"}},
		{name: "the second call unchecked", forward: true, msgs: []kafka.Message{claimAt(1, 1)},
			calls: 2, redone: []int64{1}, topics: map[int64]string{1: "down"}, reserved: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, m := &fakeWriter{}, newTestMetrics(t)
			clock := t0
			la := &lateAdmitter{fakeAdmitter: &fakeAdmitter{}}
			if tc.forward {
				la.fail = func(n int) error {
					if n > 1 {
						return errors.New("redis down")
					}
					return nil
				}
			}
			la.answer = func(evs []limit.Event) []limit.Decision {
				clock = end // the call returns as the slots end
				if n := len(la.events) - 1; n < len(tc.clocks) {
					clock = tc.clocks[n]
				}
				ds := make([]limit.Decision, len(evs))
				for i, e := range evs {
					switch {
					case e.InSlot && e.Offset == tc.displaced:
						ds[i] = placed
					case e.InSlot:
						ds[i] = limit.Decision{Kind: limit.Keep}
					default:
						ds[i] = limit.Decision{Kind: limit.Admit}
					}
				}
				return ds
			}
			rel := &releaser{lateAdmitter: la}
			adm := testAdmission(w, la.fakeAdmitter, m, &readyLog{})
			adm.Admitter = rel
			adm.Clock = func() time.Time { return clock }
			adm.Router.Clock = adm.Clock
			if tc.forward {
				adm.OnRedisError = RedisForward
			}
			if tc.costFrom != "" {
				cf, err := ParseCostFrom(tc.costFrom)
				if err != nil {
					t.Fatal(err)
				}
				adm.CostFrom = cf
			}
			spec := Retrier{Admission: adm, MaxAttempts: 3, CheckClaims: true, TakeSlots: true}
			if !tc.bound.IsZero() {
				spec.Takes = &takesBound{until: tc.bound}
			}
			r := mustRetrier(t, spec)
			if err := r.Handle(context.Background(), batchOf(tc.msgs)); err != nil {
				t.Fatal(err)
			}
			if len(la.events) != tc.calls {
				t.Fatalf("AdmitLate calls %d, want %d", len(la.events), tc.calls)
			}
			var redone []int64
			for _, e := range la.events[len(la.events)-1] {
				if len(la.events) > 1 && e.InSlot {
					t.Errorf("last call: offset %d sent as in its slot", e.Offset)
				}
				if len(la.events) > 1 {
					redone = append(redone, e.Offset)
				}
			}
			if !slices.Equal(redone, tc.redone) {
				t.Errorf("second call's events %v, want %v", redone, tc.redone)
			}
			var released []int64
			for _, sl := range rel.slots {
				off, _ := strconv.ParseInt(strings.Split(sl.Trip, ":")[2], 10, 64)
				released = append(released, off)
			}
			if !slices.Equal(released, tc.released) {
				t.Errorf("slots given back of origin offsets %v, want %v", released, tc.released)
			}
			got := map[int64]string{}
			for _, o := range w.last(t) {
				off, _ := strconv.ParseInt(strings.TrimPrefix(string(o.Key), "k"), 10, 64)
				got[off] = o.Topic
			}
			if !maps.Equal(got, tc.topics) {
				t.Errorf("written %v, want %v", got, tc.topics)
			}
			if n := counterValue(t, m.Decisions.WithLabelValues(DecisionReserved)); n != tc.reserved {
				t.Errorf("decisions reserved: %v, want %v", n, tc.reserved)
			}
		})
	}
}
