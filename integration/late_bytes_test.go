package integration

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/route"
)

// TestLateKeepsPlaceBytes runs the built binary with a tenant limited in
// bytes, a backlog deferred over 13 full windows, and a pause of the
// process (SIGSTOP for 5s, as a long GC pause or a starved CPU would) while
// deferred events are due, so that those due during it miss their slot.
// Back, they take the slots of the tenant's later reservations, in bytes
// (LATE_TAKES_SLOTS=on, the default), ahead of what it deferred after them,
// and the reservations' own events, finding their slots taken, go to the
// end of the backlog. Every event arrives once, none before its gk-due,
// Redis counts no window over the limit, and the bytes it counts exceed the
// events' by less than one event per take (a claim gives up at least what
// was taken of its slot).
func TestLateKeepsPlaceBytes(t *testing.T) {
	t.Parallel()
	testLateKeepsPlaceCosts(t, "acme=1000B/2s", map[string]int64{"2s/bytes": 1000})
}

// TestLateKeepsPlaceMixedRules is TestLateKeepsPlaceBytes with rules of
// events in 2s windows and of bytes in 4s windows, both filled by the
// backlog: the bytes reserved in a 2s window are known only from what each
// reservation records in it (85_late.lua, Reserved). The bytes and events
// Redis counts exceed the events' by less than one event per displaced
// claim (the last claims of a window may give up more than was taken).
func TestLateKeepsPlaceMixedRules(t *testing.T) {
	t.Parallel()
	testLateKeepsPlaceCosts(t, "acme=7/2s,2000B/4s", map[string]int64{"2s": 7, "4s/bytes": 2000})
}

// TestLateKeepsPlaceRulesNotNested is TestLateKeepsPlaceBytes with rules of
// events in 2s windows and of bytes in 3s windows, which do not nest: a
// slot is then the time between two bounds of either rule, and what each
// holds reserved is known only from what each reservation records
// (85_late.lua, Segments).
func TestLateKeepsPlaceRulesNotNested(t *testing.T) {
	t.Parallel()
	testLateKeepsPlaceCosts(t, "acme=7/2s,1500B/3s", map[string]int64{"2s": 7, "3s/bytes": 1500})
}

// testLateKeepsPlaceCosts runs TestLateKeepsPlaceBytes under limits, whose
// windows (by readWindows' name) each count at most limits[window].
func testLateKeepsPlaceCosts(t *testing.T, limits string, windows map[string]int64) {
	const (
		n   = 98
		win = 2 * time.Second
	)
	f := newFlow(t, 1)
	prefix := keyPrefix(t)
	env := f.env(t, "GATEKEEPER_LIMITS", limits, "GATEKEEPER_REDIS_KEY_PREFIX", prefix)
	gk := startGatekeeper(t, "gk", env)
	gk.waitReady(90 * time.Second)
	rtWaitAssigned(t, rtGroups(f, 1), gk)

	// Events of 200 and 100 bytes with the key "acme", seven to a window
	// that they fill exactly (200 100 200 100 200 100 100): 14 windows, 13 of
	// backlog, none with room for a late event, so late events take slots.
	pattern := []int{200, 100, 200, 100, 200, 100, 100}
	msgs := make([]kafka.Message, n)
	var total int64
	most := int64(0)
	for i := range msgs {
		v := []byte(fmt.Sprintf("ev %d 0 %d ", i, i))
		v = append(v, strings.Repeat("x", pattern[i%len(pattern)]-len("acme")-len(v))...)
		msgs[i] = kafka.Message{Partition: 0, Key: []byte("acme"), Value: v}
		b := route.EventBytes(msgs[i])
		total, most = total+b, max(most, b)
	}
	// Pause it while the third to fifth windows' events are due.
	r := pausedLate(t, gk, f, msgs, 5*time.Second, 5*time.Second)
	tookSlot, slotTaken := r.checkTook(t, gk, true, "the pause made events miss their slot while later windows held reservations")
	appended := map[int64]int64{} // bytes appended downstream per window
	for _, m := range r.o.down {
		appended[m.Time.UnixMilli()/win.Milliseconds()] += route.EventBytes(kafka.Message{Key: m.Key, Value: m.Value, Headers: m.Headers})
	}

	// Redis: no window over its limit, and the bytes (events) counted
	// within one event per take (per displaced claim, with rules of two
	// measures) of the events' (missed slots are given back).
	counted := map[string]int64{}
	var over []string
	for _, w := range readWindows(t, redisAddr(), prefix) {
		lim, ok := windows[w.Window]
		if w.Tenant != "acme" || !ok {
			continue
		}
		counted[w.Window] += w.Count
		if w.Count > lim {
			over = append(over, fmt.Sprintf("%s: %d over %d", w.Key, w.Count, lim))
		}
	}
	if len(over) > 0 {
		t.Errorf("windows over their limit in Redis: %v (G2)", over)
	}
	extra := tookSlot
	if len(windows) > 1 {
		extra = slotTaken
	}
	for w := range windows {
		want, per := total, most
		if !strings.HasSuffix(w, "/bytes") {
			want, per = n, 1
		}
		if c := counted[w]; c < want || c-want > int64(extra)*per {
			t.Errorf("%s windows counted %d, the events %d: want at least as many and at most %v times %d more",
				w, c, want, extra, per)
		}
	}
	maxAppended := slices.Max(mapValues(appended))
	t.Logf("%d events (%d bytes, %s); paused 5s, resumed %v after the load; %v took a slot, %v found theirs "+
		"taken; Redis counted %v; most bytes appended in one 2s window %d (reported: appends may lag into the "+
		"next window); the last took-slot event appended %v before the backlog's last due time",
		n, total, limits, r.resumed.Sub(r.start).Round(100*time.Millisecond), tookSlot, slotTaken, counted,
		maxAppended, r.lastDue.Sub(r.tookAt).Round(100*time.Millisecond))
}

// evName names a test event by its id.
func evName(m kafka.Message) string {
	e, _ := parseEv(m)
	return fmt.Sprintf("event %d", e.ID)
}

// mapValues returns m's values.
func mapValues[K comparable, V any](m map[K]V) []V {
	out := make([]V, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
