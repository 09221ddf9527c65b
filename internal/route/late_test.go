package route

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// lateAdmitter is a fakeAdmitter that is also a LateAdmitter: it records
// the events and take of each AdmitLate call and answers with answer.
type lateAdmitter struct {
	*fakeAdmitter
	events [][]limit.Event
	takes  []bool
	answer func(events []limit.Event) []limit.Decision
	// fail, if set, makes the call fail when it returns an error (given
	// the number of calls so far, this one included).
	fail func(calls int) error
}

func (a *lateAdmitter) AdmitLate(_ context.Context, _ limit.Source, events []limit.Event, take bool) ([]limit.Decision, error) {
	a.events = append(a.events, events)
	a.takes = append(a.takes, take)
	if a.fail != nil {
		if err := a.fail(len(a.events)); err != nil {
			return nil, err
		}
	}
	return a.answer(events), nil
}

// With a LateAdmitter, an event back inside its slot is a claim checked in
// the batch's one call: kept, it goes downstream uncounted; taken, it is
// placed again (here: a slot it takes in turn, marked gk-took, with its
// attempt unchanged). An event marked gk-took keeps its slot without a
// call, and a late event's decision carries Took into its headers.
func TestRetrierClaims(t *testing.T) {
	past := t0.Add(-10 * time.Second)
	kept := retryMsg("down.retry", 1, deferral("acme", 1, past, t0.Add(time.Minute)))
	taken := retryMsg("down.retry", 2, deferral("acme", 2, past, t0.Add(time.Minute)))
	tookD := deferral("acme", 1, past, t0.Add(time.Minute))
	tookD.Took = true
	took := retryMsg("down.retry", 3, tookD)
	late := retryMsg("down.retry", 4, deferral("acme", 1, past.Add(-time.Minute), past))
	next := limit.Decision{Kind: limit.Defer, Due: t0.Add(time.Minute), Until: t0.Add(2 * time.Minute), Took: true}

	w, m := &fakeWriter{}, newTestMetrics(t)
	la := &lateAdmitter{fakeAdmitter: &fakeAdmitter{}, answer: func(evs []limit.Event) []limit.Decision {
		ds := make([]limit.Decision, len(evs))
		for i, e := range evs {
			switch {
			case e.Offset == 1:
				ds[i] = limit.Decision{Kind: limit.Keep}
			default:
				ds[i] = next
			}
		}
		return ds
	}}
	adm := testAdmission(w, la.fakeAdmitter, m, &readyLog{})
	adm.Admitter = la
	r := mustRetrier(t, Retrier{Admission: adm, MaxAttempts: 2, CheckClaims: true, TakeSlots: true})
	if err := r.Handle(context.Background(), batchOf([]kafka.Message{kept, taken, took, late})); err != nil {
		t.Fatal(err)
	}
	if len(la.events) != 1 || !la.takes[0] {
		t.Fatalf("AdmitLate calls %d (takes %v), want 1 with take", len(la.events), la.takes)
	}
	var claims, lates []int64
	for _, e := range la.events[0] {
		if e.InSlot {
			claims = append(claims, e.Offset)
			if !e.Due.Equal(past) { // the slot it claims, whose takes it reads
				t.Errorf("claim %d: due %s, want its gk-due %s", e.Offset, e.Due, past)
			}
		} else {
			lates = append(lates, e.Offset)
		}
	}
	if len(claims) != 2 || claims[0] != 1 || claims[1] != 2 || len(lates) != 1 || lates[0] != 4 {
		t.Fatalf("claims %v and late events %v, want claims [1 2] (not the gk-took one) and late [4]", claims, lates)
	}
	for label, want := range map[string]float64{DecisionReserved: 2, DecisionSlotTaken: 1, DecisionTookSlot: 1, "defer": 0} {
		if n := counterValue(t, m.Decisions.WithLabelValues(label)); n != want {
			t.Errorf("decisions %s: %v, want %v", label, n, want)
		}
	}
	got := map[string]kafka.Message{}
	for _, o := range w.last(t) {
		got[string(o.Key)] = o
	}
	for _, c := range []struct {
		off     int64
		topic   string
		attempt string
		took    bool
	}{
		{1, "down", "1", false},
		{2, "down.retry", "2", true}, // attempt 2 of MaxAttempts 2: a taken slot is no new attempt
		{3, "down", "1", true},
		{4, "down.retry", "2", true},
	} {
		o, ok := got["k"+strconv.FormatInt(c.off, 10)]
		if !ok {
			t.Errorf("offset %d: not written", c.off)
			continue
		}
		a, _ := LastHeader(o, HeaderAttempt)
		_, tk := LastHeader(o, HeaderTook)
		if o.Topic != c.topic || a != c.attempt || tk != c.took {
			t.Errorf("offset %d: got topic %s attempt %s took %v, want %s %s %v", c.off, o.Topic, a, tk, c.topic, c.attempt, c.took)
		}
	}
}

// A claim whose cost cannot be read any more (COST_FROM changed) is
// checked at cost zero: it keeps its slot when nobody took it, and when its
// slot was taken it is decided as a late event, and goes to the dead-letter
// topic as a late event without a cost does (placed at cost zero, it would
// pass a rule of units uncounted).
func TestRetrierClaimWithoutCost(t *testing.T) {
	past := t0.Add(-10 * time.Second)
	kept := retryMsg("down.retry", 1, deferral("acme", 1, past, t0.Add(time.Minute)))
	taken := retryMsg("down.retry", 2, deferral("acme", 2, past, t0.Add(time.Minute)))
	w, m := &fakeWriter{}, newTestMetrics(t)
	la := &lateAdmitter{fakeAdmitter: &fakeAdmitter{}, answer: func(evs []limit.Event) []limit.Decision {
		ds := make([]limit.Decision, len(evs))
		for i, e := range evs {
			if e.Cost != (limit.Cost{}) {
				t.Errorf("event %d: cost %+v, want zero (none readable)", e.Offset, e.Cost)
			}
			ds[i] = limit.Decision{Kind: limit.Keep}
			if e.Offset == 2 {
				ds[i] = limit.Decision{Kind: limit.Defer, Due: t0.Add(time.Minute), Until: t0.Add(2 * time.Minute)}
			}
		}
		return ds
	}}
	costs, err := ParseCostFrom("header:units")
	if err != nil {
		t.Fatal(err)
	}
	adm := testAdmission(w, la.fakeAdmitter, m, &readyLog{})
	adm.Admitter, adm.CostFrom = la, costs
	r := mustRetrier(t, Retrier{Admission: adm, MaxAttempts: 2, CheckClaims: true, TakeSlots: true})
	if err := r.Handle(context.Background(), batchOf([]kafka.Message{kept, taken})); err != nil {
		t.Fatal(err)
	}
	got := map[string]kafka.Message{}
	for _, call := range w.Calls() {
		for _, o := range call {
			got[string(o.Key)] = o
		}
	}
	if o := got["k1"]; o.Topic != "down" {
		t.Errorf("claim kept: topic %q, want down", o.Topic)
	}
	o := got["k2"]
	reason, _ := LastHeader(o, HeaderReason)
	if o.Topic != "down.dlq" || !strings.Contains(reason, "units") {
		t.Errorf("claim whose slot was taken: topic %q reason %q, want down.dlq and the cost's error", o.Topic, reason)
	}
	if n := counterValue(t, m.Decisions.WithLabelValues(DecisionInvalid)); n != 1 {
		t.Errorf("decisions invalid: %v, want 1", n)
	}
}

// releaser is a lateAdmitter that is also a SlotReleaser: it records the
// slots given back.
type releaser struct {
	*lateAdmitter
	slots []limit.MissedSlot
}

func (r *releaser) Release(_ context.Context, slots []limit.MissedSlot) (int, error) {
	r.slots = append(r.slots, slots...)
	return len(slots), nil
}

// A late event gives its missed slot back, but one deferred unreserved
// (gk-reserved = gk-due: the search's budget ran out) counted nothing and
// gives nothing back: taking a count off its window would let that window
// admit one more than its limit.
func TestRetrierUnreservedGivesNothingBack(t *testing.T) {
	past := t0.Add(-time.Minute)
	missed := retryMsg("down.retry", 1, deferral("acme", 1, past, past.Add(time.Second)))
	ud := deferral("acme", 1, past, past)
	ud.OriginOffset = 78
	unreserved := retryMsg("down.retry", 2, ud)
	w, m := &fakeWriter{}, newTestMetrics(t)
	admitAll := func(_ int, _ limit.Source, evs []limit.Event) ([]limit.Decision, error) {
		ds := make([]limit.Decision, len(evs))
		for i := range ds {
			ds[i] = limit.Decision{Kind: limit.Admit}
		}
		return ds, nil
	}
	rel := &releaser{lateAdmitter: &lateAdmitter{fakeAdmitter: &fakeAdmitter{from: admitAll}, answer: func(evs []limit.Event) []limit.Decision {
		ds, _ := admitAll(0, limit.Source{}, evs)
		return ds
	}}}
	adm := testAdmission(w, rel.fakeAdmitter, m, &readyLog{})
	adm.Admitter = rel
	r := mustRetrier(t, Retrier{Admission: adm})
	if err := r.Handle(context.Background(), batchOf([]kafka.Message{missed, unreserved})); err != nil {
		t.Fatal(err)
	}
	if len(rel.slots) != 1 || !rel.slots[0].Due.Equal(past) {
		t.Fatalf("slots given back: got %+v, want one (the reserved event's)", rel.slots)
	}
}

// Taking slots without checking claims would forward the slots this
// replica takes: refused.
func TestRetrierTakeSlotsNeedsClaims(t *testing.T) {
	adm := testAdmission(&fakeWriter{}, &fakeAdmitter{}, newTestMetrics(t), &readyLog{})
	if _, err := NewRetrier(Retrier{Admission: adm, TakeSlots: true}); err == nil || !strings.Contains(err.Error(), "CheckClaims") {
		t.Errorf("TakeSlots without CheckClaims: got %v, want an error naming CheckClaims", err)
	}
	if _, err := NewRetrier(Retrier{Admission: adm, CheckClaims: true, TakeSlots: true}); err != nil {
		t.Errorf("TakeSlots with CheckClaims: %v", err)
	}
}
