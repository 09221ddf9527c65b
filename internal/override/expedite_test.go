package override

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// TestExpediter: an event is let go early once per raise of its tenant
// after it was deferred or last checked (its headers), by an override or
// by a change of the base rules that raised its rules; and the rules
// before the raise come with it.
func TestExpediter(t *testing.T) {
	msg := func(tenant string, checked time.Time) kafka.Message {
		return kafka.Message{Headers: []kafka.Header{{Key: "t", Value: []byte(tenant)},
			{Key: "c", Value: []byte(strconv.FormatInt(checked.UnixMilli(), 10))}}}
	}
	get := func(m kafka.Message, k string) (string, bool) {
		for _, h := range m.Headers {
			if h.Key == k {
				return string(h.Value), true
			}
		}
		return "", false
	}
	e := &Expediter{TenantOf: func(m kafka.Message) (string, bool) { return get(m, "t") },
		CheckedSince: func(m kafka.Message) (time.Time, bool) {
			v, ok := get(m, "c")
			n, _ := strconv.ParseInt(v, 10, 64)
			return time.UnixMilli(n), ok
		}}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if e.Early(msg("a", t0), t0) {
		t.Fatal("early before any raise")
	}
	changed := e.Changed()
	old, _ := limit.ParseRuleList([]string{"5/1m"})
	e.Raise([]string{"a"}, func(string) []limit.Rule { return old }, t0.Add(time.Minute))
	select {
	case <-changed:
	default:
		t.Fatal("Changed not closed by Raise")
	}
	for _, c := range []struct {
		m    kafka.Message
		want bool
	}{
		{msg("a", t0), true},                     // deferred before the raise
		{msg("a", t0.Add(2*time.Minute)), false}, // deferred or checked after it
		{msg("b", t0), false},                    // another tenant
		{kafka.Message{Headers: []kafka.Header{{Key: "t", Value: []byte("a")}}}, false}, // no header: since (t0+1h) stands in
	} {
		if got := e.Early(c.m, t0.Add(time.Hour)); got != c.want {
			t.Errorf("Early(%v) = %v, want %v", c.m.Headers, got, c.want)
		}
	}
	if before, ok := e.Expedited(msg("a", t0)); !ok || !slices.Equal(before, old) {
		t.Errorf("Expedited: %v %v, want the rules before (5/1m)", before, ok)
	}
	// A reload of the base rules that raises "*" from 5/1m to 15/1m, but
	// not b's own rules.
	before, _ := limit.ParseRules("*=5/1m;b=3/1m")
	after, _ := limit.ParseRules("*=15/1m;b=3/1m")
	e.RaiseBase(before, after, t0.Add(3*time.Minute))
	if !e.Early(msg("c", t0), t0) || e.Early(msg("b", t0), t0) {
		t.Error("a raise of * lets c's events go early, not b's (its own rules did not change)")
	}
	if r, ok := e.Expedited(msg("c", t0)); !ok || len(r) != 1 || r[0].String() != "5/1m" {
		t.Errorf("Expedited(c) = %v %v, want the rules of * before (5/1m)", r, ok)
	}
	// a: its override raise (t0+1m) is older than the base raise, which
	// raised its rules too ("*"): the newest wins.
	if !e.Early(msg("a", t0.Add(2*time.Minute)), t0) {
		t.Error("a, checked after its own raise but before the base raise: want early again")
	}
}
