package override

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

func testStore(t *testing.T, opts StoreOptions) *Store {
	t.Helper()
	rdb, _ := testenv.Redis(t)
	if opts.Prefix == "" {
		opts.Prefix = fmt.Sprintf("gktest:%d:%s", time.Now().UnixNano(), t.Name())
	}
	s, err := NewStore(context.Background(), rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestStoreCompareAndSetAndAudit(t *testing.T) {
	ctx := context.Background()
	s := testStore(t, StoreOptions{})
	rec := Record{Tenant: "acme", Rules: []string{"50/1m"}, Reason: "escalation 123", By: "alice"}
	v1, err := s.Set(ctx, rec, 0)
	if err != nil || v1.Version != 1 {
		t.Fatalf("first set: %v %v, want version 1", v1, err)
	}
	// A write that names version 0 again (it read before the first write)
	// is refused, and nothing changes.
	_, err = s.Set(ctx, Record{Tenant: "acme", Rules: []string{"5/1m"}, Reason: "stale", By: "bob"}, 0)
	var stale *StaleError
	if !errors.As(err, &stale) || stale.Current != 1 {
		t.Fatalf("stale set: got %v, want a StaleError at version 1", err)
	}
	got, err := s.Get(ctx, "acme")
	if err != nil || got.Rules[0] != "50/1m" || got.By != "alice" || got.Version != 1 {
		t.Fatalf("after the stale write: %+v %v", got, err)
	}
	v2, err := s.Set(ctx, Record{Tenant: "acme", Rules: []string{"80/1m"}, Reason: "more", By: "bob"}, 1)
	if err != nil || v2.Version != 2 {
		t.Fatalf("second set: %v %v", v2, err)
	}
	if _, err := s.Delete(ctx, "acme", 1, "carol", "done"); !errors.As(err, &stale) {
		t.Fatalf("stale delete: got %v", err)
	}
	if v, err := s.Delete(ctx, "acme", 2, "carol", "done"); err != nil || v != 3 {
		t.Fatalf("delete: %d %v", v, err)
	}
	if _, err := s.Delete(ctx, "acme", 0, "carol", "again"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete of none: got %v, want ErrNotFound", err)
	}
	es, err := s.Audit(ctx, "acme", 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		op, by, why, before, after string
		v                          int64
	}{
		{"delete", "carol", "done", "80/1m", "", 3},
		{"set", "bob", "more", "50/1m", "80/1m", 2},
		{"set", "alice", "escalation 123", "", "50/1m", 1},
	}
	if len(es) != len(want) {
		t.Fatalf("audit: %d entries, want %d: %+v", len(es), len(want), es)
	}
	for i, w := range want {
		e := es[i]
		rules := func(r *Record) string {
			if r == nil {
				return ""
			}
			return r.Rules[0]
		}
		if e.Op != w.op || e.By != w.by || e.Reason != w.why || rules(e.Before) != w.before || rules(e.After) != w.after || e.Version != w.v {
			t.Errorf("audit %d: got %s by %s (%s) %s -> %s v%d, want %+v", i, e.Op, e.By, e.Reason, rules(e.Before), rules(e.After), e.Version, w)
		}
	}
}

// Of many concurrent writers naming the same version, exactly one wins.
func TestStoreConcurrentWritersOneWins(t *testing.T) {
	ctx := context.Background()
	s := testStore(t, StoreOptions{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	won, refused := 0, 0
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Set(ctx, Record{Tenant: "t", Rules: []string{fmt.Sprintf("%d/1m", i)}, Reason: "race", By: "w"}, 0)
			mu.Lock()
			defer mu.Unlock()
			var stale *StaleError
			switch {
			case err == nil:
				won++
			case errors.As(err, &stale):
				refused++
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if won != 1 || refused != 19 {
		t.Fatalf("won %d, refused %d; want 1 and 19", won, refused)
	}
}

func TestWatcherFollowsChangesAndExpiry(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clock := testenv.NewClock(time.Now())
	s := testStore(t, StoreOptions{Clock: clock.Now})
	if _, err := s.Set(ctx, Record{Tenant: "before", Rules: []string{"1/1s"}, Reason: "r", By: "a"}, 0); err != nil {
		t.Fatal(err)
	}
	snaps := make(chan *Snapshot, 100)
	w, err := NewWatcher(s, func(sn *Snapshot) { snaps <- sn }, WatcherOptions{PollInterval: 10 * time.Millisecond, Clock: clock.Now, PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if sn := <-snaps; !sn.All || sn.Enforced["before"].Version != 1 {
		t.Fatalf("loaded: %+v", sn)
	}
	go w.Run(ctx)
	exp := clock.Now().Add(time.Minute)
	if _, err := s.Set(ctx, Record{Tenant: "acme", Rules: []string{"9/1m"}, Reason: "r", By: "a", Expires: &exp}, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Set(ctx, Record{Tenant: "shadowy", Rules: []string{"2/1m"}, Shadow: true, Reason: "r", By: "a"}, 0); err != nil {
		t.Fatal(err)
	}
	wait := func(what string, ok func(*Snapshot) bool) *Snapshot {
		t.Helper()
		deadline := time.After(5 * time.Second)
		for {
			select {
			case sn := <-snaps:
				if ok(sn) {
					return sn
				}
			case <-deadline:
				t.Fatalf("no snapshot with %s", what)
			}
		}
	}
	sn := wait("acme and shadowy", func(sn *Snapshot) bool { return sn.Version == 3 })
	if r := sn.Enforced["acme"].Rules; len(r) != 1 || r[0].Limit != 9 {
		t.Errorf("acme: %v", r)
	}
	if _, ok := sn.Enforced["shadowy"]; ok || sn.Shadow["shadowy"].Version != 3 {
		t.Errorf("shadow override enforced or missing: %+v %+v", sn.Enforced, sn.Shadow)
	}
	// Expiry: applied locally, then deleted by the sweep with an audit entry.
	clock.Add(time.Minute)
	wait("acme expired", func(sn *Snapshot) bool { _, ok := sn.Enforced["acme"]; return !ok })
	wait("the expiry's deletion", func(sn *Snapshot) bool { return sn.Version == 4 })
	es, err := s.Audit(ctx, "acme", 1)
	if err != nil || len(es) != 1 || es[0].Op != "expire" || es[0].By != ExpiryActor || es[0].Before == nil {
		t.Fatalf("audit of the expiry: %+v %v", es, err)
	}
}

func TestRecordCheck(t *testing.T) {
	now := time.Now()
	past := now.Add(-time.Second)
	for _, c := range []struct {
		rec  Record
		want string
	}{
		{Record{Tenant: "a", Rules: []string{"5/1m"}, Reason: "ok"}, ""},
		{Record{Tenant: "a", Rules: []string{}, Reason: "unlimited"}, ""},
		{Record{Tenant: "", Rules: []string{"5/1m"}, Reason: "x"}, "tenant"},
		{Record{Tenant: "*", Rules: []string{"5/1m"}, Reason: "x"}, "one tenant"},
		{Record{Tenant: "a", Rules: []string{"5/7s"}, Reason: "x"}, "rules"},
		{Record{Tenant: "a", Rules: []string{"5/1m"}, Reason: " "}, "reason: required"},
		{Record{Tenant: "a", Rules: []string{"5/1m"}, Reason: "x", Expires: &past}, "expires"},
		{Record{Tenant: "a", Rules: []string{"5/1m"}, Reason: "x", Weight: 2, Floors: []string{"10/1s"}}, ""},
		{Record{Tenant: "a", Rules: []string{}, KeepRules: true, Reason: "x", Weight: 2}, ""},
		{Record{Tenant: "a", Rules: []string{"5/1m"}, Reason: "x", Weight: 1001}, "weight: 1001"},
		{Record{Tenant: "a", Rules: []string{"5/1m"}, Reason: "x", Floors: []string{"5MiB/1s"}}, ""}, // checked against the capacity (CheckCapacity)
		{Record{Tenant: "a", Rules: []string{"5/1m"}, Reason: "x", Floors: []string{"5MiB/1s", "5/1s"}}, "floors:"},
		{Record{Tenant: "a", Rules: []string{"5/1m"}, Reason: "x", Floors: []string{"1/1s", "2/1s"}}, "floors:"},
		{Record{Tenant: "a", Rules: []string{"5/1m"}, KeepRules: true, Reason: "x", Weight: 2}, "keep_rules"},
		{Record{Tenant: "a", Rules: []string{}, KeepRules: true, Reason: "x"}, "keep_rules"},
	} {
		_, err := c.rec.Check(now, limit.Aligned)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.rec, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: got %v, want %q", c.rec, err, c.want)
		}
	}
}

// TestRecordShareText: the CLI's RULES with weight: and floor: items, as
// in LIMITS, and back; and a share checked against the capacity and the
// floors of the rules in force.
func TestRecordShareText(t *testing.T) {
	for _, c := range []struct{ text, want, err string }{
		{"5000/1m,weight:3,floor:200/1s", "5000/1m,weight:3,floor:200/1s", ""},
		{"weight:3", "(its rules),weight:3", ""},
		{"none", "none", ""},
		{"none,floor:5/1s", "none,floor:5/1s", ""},
		{"none,5/1m", "", "none may be followed only"},
		{"weight:x", "", "whole number"},
		{"weight:2,weight:3", "", "twice"},
	} {
		var r Record
		err := r.SetRulesText(c.text)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%q: got %v, want %q", c.text, err, c.err)
		case c.err == "" && err != nil:
			t.Errorf("%q: %v", c.text, err)
		case c.err == "" && r.RulesText() != c.want:
			t.Errorf("%q: got %q, want %q", c.text, r.RulesText(), c.want)
		}
	}
	c, _ := limit.ParseCapacity("100/1s")
	bytesCap, _ := limit.ParseCapacity("10KiB/1s")
	inForce, err := limit.ParseRules("*=10/1s;b=floor:60/1s")
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		rec  Record
		c    limit.Capacity
		want string
	}{
		{Record{Tenant: "a", Weight: 3, Floors: []string{"40/1s"}}, c, ""},
		{Record{Tenant: "a", Floors: []string{"41/1s"}}, c, "sum to 101"},
		{Record{Tenant: "b", Floors: []string{"100/1s"}}, c, ""},
		{Record{Tenant: "a", Floors: []string{"1/1m"}}, c, "no capacity rule of window 1m"},
		{Record{Tenant: "a", Floors: []string{"1KiB/1s"}}, c, "counts bytes, the capacity 100/1s counts events"},
		{Record{Tenant: "a", Floors: []string{"1KiB/1s"}}, bytesCap, ""},
		{Record{Tenant: "a", Floors: []string{"10/1s"}}, bytesCap, "counts events, the capacity 10KiB/1s counts bytes"},
		{Record{Tenant: "a", Weight: 2}, nil, "no GATEKEEPER_CAPACITY"},
		{Record{Tenant: "a"}, nil, ""},
	} {
		err := x.rec.CheckCapacity(x.c, inForce)
		switch {
		case x.want == "" && err != nil:
			t.Errorf("%+v: %v", x.rec, err)
		case x.want != "" && (err == nil || !strings.Contains(err.Error(), x.want)):
			t.Errorf("%+v: got %v, want %q", x.rec, err, x.want)
		}
	}
}
