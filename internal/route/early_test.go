package route

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// earlyAdmitter is a fakeAdmitter that also admits now (room: the tenants
// that fit now) and gives back slots (recorded).
type earlyAdmitter struct {
	*fakeAdmitter
	room     map[string]bool
	mu       sync.Mutex
	released []limit.MissedSlot
}

func (a *earlyAdmitter) AdmitNow(ctx context.Context, src limit.Source, events []limit.Event) ([]limit.Decision, error) {
	out := make([]limit.Decision, len(events))
	for i, e := range events {
		out[i] = limit.Decision{Kind: limit.Reject, Reason: limit.NowReason}
		if a.room[e.Tenant] {
			out[i] = limit.Decision{Kind: limit.Admit}
		}
	}
	return out, nil
}

func (a *earlyAdmitter) Release(ctx context.Context, slots []limit.MissedSlot) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.released = append(a.released, slots...)
	return len(slots), nil
}

// TestRetrierEarly: events released before their due time after a raise
// are admitted now where the current window has room, and their slots are
// given back in the windows of the rules before the raise; the others go
// back to their tier with gk-checked, their other headers unchanged.
func TestRetrierEarly(t *testing.T) {
	w := &fakeWriter{}
	a := &earlyAdmitter{fakeAdmitter: &fakeAdmitter{decide: func(int, []string) ([]limit.Decision, error) {
		t.Fatal("no late event: AdmitFrom must not be called")
		return nil, nil
	}}, room: map[string]bool{"up": true}}
	before, _ := limit.ParseRuleList([]string{"5/1m"})
	r := mustRetrier(t, Retrier{Admission: testAdmission(w, a.fakeAdmitter, newTestMetrics(t), &readyLog{}),
		Expedited: func(m kafka.Message) ([]limit.Rule, bool) {
			tenant, _ := LastHeader(m, HeaderTenant)
			return before, tenant == "up" || tenant == "full"
		}})
	r.Admitter = a
	due := t0.Add(30 * time.Second)
	up := retryMsg(testTopics.Retry, 1, deferral("up", 1, due, due.Add(time.Minute)))
	full := retryMsg(testTopics.Retry, 2, deferral("full", 1, due, due.Add(time.Minute)))
	if err := r.Handle(context.Background(), batchOf([]kafka.Message{up, full})); err != nil {
		t.Fatal(err)
	}
	got := w.last(t)
	if len(got) != 2 || got[0].Topic != testTopics.Downstream || got[1].Topic != testTopics.Retry {
		t.Fatalf("got %v, want up downstream and full back to its tier", view(got))
	}
	if v, ok := LastHeader(got[1], HeaderChecked); !ok || v != strconv.FormatInt(t0.UnixMilli(), 10) {
		t.Errorf("full: gk-checked %q %v, want the check's time %d", v, ok, t0.UnixMilli())
	}
	if d, err := ParseDeferral(got[1]); err != nil || !d.Due.Equal(due) || d.Attempt != 1 {
		t.Errorf("full: deferral %+v %v, want it unchanged", d, err)
	}
	if _, ok := LastHeader(got[0], HeaderChecked); ok {
		t.Error("up: gk-checked on an event admitted early")
	}
	if len(a.released) != 1 || a.released[0].Tenant != "up" || !a.released[0].Due.Equal(due) || !slices.Equal(a.released[0].Rules, before) {
		t.Errorf("released %+v, want up's slot at %v in the windows of the rules before the raise", a.released, due)
	}
	if since, ok := CheckedSince(got[1]); !ok || !since.Equal(t0.Truncate(time.Millisecond)) {
		t.Errorf("CheckedSince(full) = %v %v, want %v", since, ok, t0)
	}
	if since, ok := CheckedSince(up); !ok || !since.Equal(t0.Add(-time.Hour).Truncate(time.Millisecond)) {
		t.Errorf("CheckedSince(up) = %v %v, want its first deferral", since, ok)
	}
}

// beforeAdmitter is an earlyAdmitter that also reserves before a time: the
// tenant's slot in slot (none: rejected), and records the calls.
type beforeAdmitter struct {
	*earlyAdmitter
	slot   map[string]time.Time
	before []time.Time
}

func (a *beforeAdmitter) AdmitBefore(ctx context.Context, src limit.Source, events []limit.Event, before time.Time) ([]limit.Decision, error) {
	a.before = append(a.before, before)
	out, _ := a.AdmitNow(ctx, src, events)
	for i, e := range events {
		if s, ok := a.slot[e.Tenant]; ok && out[i].Kind != limit.Admit {
			out[i] = limit.Decision{Kind: limit.Defer, Due: s, Until: s.Add(time.Minute), Windows: "w3"}
		}
	}
	return out, nil
}

// TestRetrierEarlyMovesForward: an event released early after a raise that
// finds no room now takes the earliest slot the rules in force allow before
// its old one: it goes back to the tier of its new due with the new
// deferral and gk-checked, and its old slot is given back; one call per
// distinct old due, the earliest first, each reaching only before it; a
// slot reserved no earlier than the old one is given back and the event
// keeps its old slot.
func TestRetrierEarlyMovesForward(t *testing.T) {
	w := &fakeWriter{}
	due := t0.Add(3 * time.Minute)
	sooner := t0.Add(time.Minute)
	a := &beforeAdmitter{earlyAdmitter: &earlyAdmitter{fakeAdmitter: &fakeAdmitter{decide: func(int, []string) ([]limit.Decision, error) {
		t.Fatal("no late event: AdmitFrom must not be called")
		return nil, nil
	}}, room: map[string]bool{"up": true}}, slot: map[string]time.Time{"mv": sooner, "odd": due.Add(time.Minute)}}
	before, _ := limit.ParseRuleList([]string{"5/1m"})
	r := mustRetrier(t, Retrier{Admission: testAdmission(w, a.fakeAdmitter, newTestMetrics(t), &readyLog{}),
		Expedited: func(m kafka.Message) ([]limit.Rule, bool) { return before, true }})
	r.Admitter = a
	msgs := []kafka.Message{
		retryMsg(testTopics.Retry, 1, deferral("up", 1, due, due.Add(time.Minute))),
		retryMsg(testTopics.Retry, 2, deferral("mv", 2, due, due.Add(time.Minute))),
		retryMsg(testTopics.Retry, 3, deferral("full", 1, due.Add(time.Minute), due.Add(2*time.Minute))),
		retryMsg(testTopics.Retry, 4, deferral("odd", 1, due, due.Add(time.Minute))),
	}
	if err := r.Handle(context.Background(), batchOf(msgs)); err != nil {
		t.Fatal(err)
	}
	got := w.last(t)
	if len(got) != 4 || got[0].Topic != testTopics.Downstream {
		t.Fatalf("got %v, want up downstream, the others back to a tier", view(got))
	}
	mv, err := ParseDeferral(got[1])
	if err != nil || !mv.Due.Equal(sooner) || !mv.Reserved.Equal(sooner.Add(time.Minute)) || mv.Attempt != 2 || mv.Tenant != "mv" || mv.Windows != "w3" {
		t.Errorf("mv: deferral %+v %v, want moved to %v, attempt 2 kept", mv, err, sooner)
	}
	if v, ok := LastHeader(got[1], HeaderChecked); !ok || v != strconv.FormatInt(t0.UnixMilli(), 10) {
		t.Errorf("mv: gk-checked %q %v, want the check's time", v, ok)
	}
	for i, name := range map[int]string{2: "full", 3: "odd"} {
		d, err := ParseDeferral(got[i])
		old, _ := ParseDeferral(msgs[i])
		if _, ok := LastHeader(got[i], HeaderChecked); err != nil || !ok || !d.Due.Equal(old.Due) {
			t.Errorf("%s: %+v %v, want its old slot with gk-checked", name, d, err)
		}
	}
	// Calls: one per old due, the earliest first, each just before it.
	if want := []time.Time{due.Add(-time.Millisecond), due.Add(time.Minute - time.Millisecond)}; !slices.EqualFunc(a.before, want, time.Time.Equal) {
		t.Errorf("AdmitBefore calls before %v, want %v", a.before, want)
	}
	// Given back: up's and mv's old slots (the rules before the raise), and
	// odd's new slot, which was no earlier than its old one.
	var rel []string
	for _, s := range a.released {
		rel = append(rel, s.Tenant+"@"+s.Due.Sub(t0).String())
	}
	if want := []string{"up@3m0s", "mv@3m0s", "odd@4m0s"}; !slices.Equal(rel, want) {
		t.Errorf("released %v, want %v", rel, want)
	}
	if n := counterValue(t, r.Metrics.Decisions.WithLabelValues(DecisionMoved)); n != 1 {
		t.Errorf("moved_forward counted %v, want 1", n)
	}
}
