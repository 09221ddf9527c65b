package limit

import (
	"context"
	"testing"
	"time"
)

// TestAdmitBefore: AdmitBefore admits what fits now and reserves only in
// windows that start before its bound, the earliest first; what does not
// fit before it is rejected and counted nowhere.
func TestAdmitBefore(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)
	w0 := now.Truncate(time.Minute)
	l := newTestLimiter(t, testRedis(t), "*=2/1m", Options{Clock: func() time.Time { return now }})
	// 2 now, then 2 in each of the next two windows.
	if _, err := l.Admit(ctx, []string{"a", "a", "a", "a", "a", "a"}); err != nil {
		t.Fatal(err)
	}
	rs, err := ParseRules("*=4/1m")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetRules(rs); err != nil {
		t.Fatal(err)
	}
	ev := []Event{{Tenant: "a"}, {Tenant: "a"}, {Tenant: "a"}, {Tenant: "a"}, {Tenant: "a"}}
	// Before the third window: 2 now, 2 in the second, 1 left over.
	ds, err := l.AdmitBefore(ctx, Source{}, ev, w0.Add(2*time.Minute-time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		kind Kind
		due  time.Time
	}{{Admit, time.Time{}}, {Admit, time.Time{}}, {Defer, w0.Add(time.Minute)}, {Defer, w0.Add(time.Minute)}, {Reject, time.Time{}}}
	for i, d := range ds {
		if d.Kind != want[i].kind || !d.Due.Equal(want[i].due) {
			t.Errorf("event %d: %v due %v, want %v due %v", i, d.Kind, d.Due, want[i].kind, want[i].due)
		}
	}
	if ds[4].Reason != NowReason {
		t.Errorf("the event left over: reason %q, want %q (nothing said of the horizon)", ds[4].Reason, NowReason)
	}
	// Counted: 4 now, 4 in the second window, 2 in the third (nothing for the rejected one).
	us, err := l.UsageUnder(ctx, "a", rs.For("a"))
	if err != nil {
		t.Fatal(err)
	}
	if us[0].Count != 4 {
		t.Errorf("current window counts %d, want 4", us[0].Count)
	}
	// The next call before the second window finds nothing: rejected, not
	// reserved later, and the tenant is not taken as full to the horizon.
	ds, err = l.AdmitBefore(ctx, Source{}, ev[:1], w0.Add(time.Minute-time.Millisecond))
	if err != nil || ds[0].Kind != Reject {
		t.Fatalf("before the second window: %+v %v, want rejected", ds, err)
	}
	ds, err = l.AdmitFrom(ctx, Source{}, ev[:1])
	if err != nil || ds[0].Kind != Defer || !ds[0].Due.Equal(w0.Add(2*time.Minute)) {
		t.Fatalf("AdmitFrom after: %+v %v, want deferred to the third window", ds, err)
	}
}
