//go:build fault

package fault

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// Recovery: how long the pipeline takes to be healthy again after a fault,
// measured from outside (readiness polls and event latencies).

// faultMark is the start of one fault, as the scenario caused it.
type faultMark struct {
	name string
	at   time.Time
}

// readySample is one poll of the readiness of every live gatekeeper.
type readySample struct {
	at  time.Time
	ok  bool
	why string // what was not ready
}

// recovery is how long the pipeline took to be healthy again after a fault.
type recovery struct {
	fault string
	took  time.Duration
	ok    bool   // false: not healthy again before the next fault or the end of the load
	note  string // why not
}

// healthyLatency is the most a directly admitted event may take from its
// produce time to its downstream append time in a healthy pipeline.
const healthyLatency = time.Second

// recoveries measures, from outside, the recovery after each fault.
//
// The pipeline is healthy at time R if from R until the next fault (or the
// end of the load) every poll of every live gatekeeper's /readyz answered
// 200, and every event produced in that time that was admitted directly (no
// gk-due) reached downstream less than healthyLatency after it was produced.
// recover = R - the fault's start, R being the earliest such time: right
// after the last failed poll and the last slow event of the phase. Events
// produced in the last healthyLatency before the next fault are left out
// (the next fault may slow them).
func recoveries(marks []faultMark, end time.Time, samples []readySample, points []latencyPoint) []recovery {
	var out []recovery
	for i, m := range marks {
		to := end
		if i+1 < len(marks) {
			to = marks[i+1].at
		}
		in := func(t time.Time) bool { return !t.Before(m.at) && t.Before(to) }
		r := recovery{fault: m.name, ok: true}
		readyAt, latAt := m.at, m.at

		var ss []readySample
		for _, s := range samples {
			if in(s.at) {
				ss = append(ss, s)
			}
		}
		if last := lastIndex(ss, func(s readySample) bool { return !s.ok }); last >= 0 {
			if last == len(ss)-1 {
				r.ok, r.note = false, "not ready at the end of the phase: "+ss[last].why
			} else {
				readyAt = ss[last+1].at
			}
		}

		// An event produced just before the next fault may be slowed by
		// that fault: it is not evidence about this one.
		latTo := to
		if i+1 < len(marks) {
			latTo = to.Add(-healthyLatency)
		}
		var ps []latencyPoint
		for _, p := range points {
			if !p.produced.Before(m.at) && p.produced.Before(latTo) {
				ps = append(ps, p)
			}
		}
		if slow := lastIndex(ps, func(p latencyPoint) bool { return p.latency >= healthyLatency }); slow >= 0 {
			if slow == len(ps)-1 {
				r.ok = false
				r.note = strings.TrimPrefix(r.note+fmt.Sprintf("; events produced until the end of the phase took %v", ps[slow].latency.Round(time.Millisecond)), "; ")
			} else {
				latAt = ps[slow+1].produced
			}
		}
		if readyAt.After(latAt) {
			r.took = readyAt.Sub(m.at)
		} else {
			r.took = latAt.Sub(m.at)
		}
		out = append(out, r)
	}
	return out
}

// lastIndex returns the index of the last element of s that satisfies f, or -1.
func lastIndex[T any](s []T, f func(T) bool) int {
	for i := len(s) - 1; i >= 0; i-- {
		if f(s[i]) {
			return i
		}
	}
	return -1
}

// TestRecoveries checks the recovery measure on made-up polls and events.
func TestRecoveries(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	ok := func(s float64) readySample { return readySample{at: at(s), ok: true} }
	bad := func(s float64) readySample { return readySample{at: at(s), why: "gk1: 503"} }
	ev := func(s, lat float64) latencyPoint {
		return latencyPoint{produced: at(s), latency: time.Duration(lat * float64(time.Second))}
	}
	one := []faultMark{{"f", at(10)}}
	for _, tc := range []struct {
		name    string
		marks   []faultMark
		samples []readySample
		points  []latencyPoint
		want    []recovery
	}{
		{"healthy throughout", one,
			[]readySample{ok(10), ok(11), ok(12)}, []latencyPoint{ev(10.5, 0.03), ev(11, 0.03)},
			[]recovery{{fault: "f", took: 0, ok: true}}},
		{"not ready, then ready", one,
			[]readySample{ok(10), bad(11), bad(12), ok(13), ok(14)}, []latencyPoint{ev(11, 0.2), ev(14, 0.03)},
			[]recovery{{fault: "f", took: 3 * time.Second, ok: true}}},
		{"slow events after ready", one,
			[]readySample{ok(10), ok(11), ok(12)}, []latencyPoint{ev(10, 5), ev(14, 1.5), ev(15, 0.05), ev(16, 0.05)},
			[]recovery{{fault: "f", took: 5 * time.Second, ok: true}}},
		{"still slow at the end", one,
			[]readySample{ok(10)}, []latencyPoint{ev(11, 0.05), ev(12, 2)},
			[]recovery{{fault: "f", ok: false, note: "events produced until the end of the phase took 2s"}}},
		{"the next fault's slow events are not this one's",
			[]faultMark{{"f", at(10)}, {"g", at(20)}},
			[]readySample{ok(10), ok(15), ok(20), bad(21), ok(22)},
			[]latencyPoint{ev(12, 0.05), ev(19.5, 1.2), ev(21, 1.5), ev(23, 0.05), ev(24, 0.05)},
			[]recovery{{fault: "f", took: 0, ok: true}, {fault: "g", took: 3 * time.Second, ok: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := recoveries(tc.marks, at(30), tc.samples, tc.points)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d recoveries, want %d: %+v", len(got), len(tc.want), got)
			}
			for i, w := range tc.want {
				g := got[i]
				if g.fault != w.fault || g.ok != w.ok || (w.ok && g.took != w.took) || (!w.ok && !strings.Contains(g.note, w.note)) {
					t.Errorf("recovery %d: got %+v, want %+v", i, g, w)
				}
			}
		})
	}
}

// TestStrayCopies checks which downstream copies strayCopies calls stray on
// made-up records: a crash's redelivery explains a copy of an event first
// appended before the fault, and one copy per extra record of a trip in the
// first retry tier, forwarded in its slot or deferred again after it.
func TestStrayCopies(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	direct := func(id int, s float64) outEvent {
		return outEvent{topic: "out", id: id, tenant: "t", at: at(s)}
	}
	deferred := func(topic string, id int, s, due float64, attempt string) outEvent {
		return outEvent{topic: topic, id: id, tenant: "t", at: at(s), due: at(due), reserved: at(due + 5), attempt: attempt}
	}
	since := at(10)
	for _, tc := range []struct {
		name       string
		out, retry []outEvent
		wantStray  []int // ids of the stray copies
		wantAgain  int   // copies explained as an extra record deferred again
	}{
		{"one copy each", []outEvent{direct(1, 11), deferred("out", 2, 20, 20, "1")},
			[]outEvent{deferred("retry", 2, 12, 20, "1")}, nil, 0},
		{"copy of an event first out before the fault", []outEvent{direct(1, 9), direct(1, 12)}, nil, nil, 0},
		{"copy of an event first out after the fault", []outEvent{direct(1, 11), direct(1, 12)}, nil, []int{1}, 0},
		{"an extra record forwarded in its slot",
			[]outEvent{deferred("out", 2, 20, 20, "1"), deferred("out", 2, 21, 20, "1")},
			[]outEvent{deferred("retry", 2, 12, 20, "1"), deferred("retry", 2, 16, 20, "1")}, nil, 0},
		{"an extra record read after its slot and deferred again",
			[]outEvent{deferred("out", 2, 20, 20, "1"), deferred("out", 2, 30, 30, "2")},
			[]outEvent{deferred("retry", 2, 12, 20, "1"), deferred("retry", 2, 26, 20, "1"), deferred("retry", 2, 26, 30, "2")}, nil, 1},
		{"deferred again with no extra record", // a handover that forgot the forward
			[]outEvent{deferred("out", 2, 20, 20, "1"), deferred("out", 2, 30, 30, "2")},
			[]outEvent{deferred("retry", 2, 12, 20, "1"), deferred("retry", 2, 26, 30, "2")}, []int{2}, 0},
		{"one extra record explains one copy, not two",
			[]outEvent{deferred("out", 2, 20, 20, "1"), deferred("out", 2, 21, 20, "1"), deferred("out", 2, 30, 30, "2")},
			[]outEvent{deferred("retry", 2, 12, 20, "1"), deferred("retry", 2, 16, 20, "1"), deferred("retry", 2, 26, 30, "2")}, []int{2}, 0},
		{"an extra record of a later trip explains no earlier copy",
			[]outEvent{deferred("out", 2, 20, 20, "1"), deferred("out", 2, 25, 25, "2")},
			[]outEvent{deferred("retry", 2, 12, 20, "1"), deferred("retry", 2, 21, 25, "2"),
				deferred("retry", 2, 26, 30, "3"), deferred("retry", 2, 27, 30, "3")}, []int{2}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stray, again, _, _ := strayCopies(tc.out, tc.retry, "out", 5*time.Second, since)
			var got []int
			for _, e := range stray {
				got = append(got, e.id)
			}
			if !slices.Equal(got, tc.wantStray) {
				t.Errorf("stray ids %v, want %v", got, tc.wantStray)
			}
			if again != tc.wantAgain {
				t.Errorf("deferred again %d, want %d", again, tc.wantAgain)
			}
		})
	}
}
