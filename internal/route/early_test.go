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
