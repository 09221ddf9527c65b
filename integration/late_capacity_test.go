package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
)

// TestLateKeepsPlaceCapacity runs the built binary with one tenant under a
// capacity of 8 events a second (CAPACITY=8/1s, its own rule of 1000/1m far
// from full): of 200 events, the capacity defers most over about 48 seconds
// ahead (a future capacity window holds half the tenant's share), and the
// retry tier moves them into idle capacity as it goes (CAPACITY_ADVANCE,
// the default). The process is paused (SIGSTOP, 10s) while deferred events
// are due. Back, the events that missed their slot take the slots of the
// tenant's later reservations in the capacity's windows (LATE_TAKES_SLOTS=on,
// the default), ahead of what it deferred after them. Every event arrives
// once, none before its gk-due, no capacity window books more than the
// capacity, and the tenant's own windows count each event once.
func TestLateKeepsPlaceCapacity(t *testing.T) { lateKeepsPlaceCapacity(t, false, "1s", 8, "1m") }

// TestLateKeepsPlaceCapacityBytes is TestLateKeepsPlaceCapacity under a
// capacity of bytes (eight of the largest events a second) beside the
// tenant's rule of events: a capacity window's events are then known only
// to be at least one where the tenant booked any bytes, and each window
// gives one late event a slot (85_late.lua, "Lower bound").
func TestLateKeepsPlaceCapacityBytes(t *testing.T) { lateKeepsPlaceCapacity(t, true, "1s", 8, "1m") }

// TestLateKeepsPlaceCapacityNotNested is TestLateKeepsPlaceCapacity under
// a capacity whose windows and the tenant's do not nest (CAPACITY=16/2s
// beside acme=1000/3s): a slot is then the time between two bounds of
// either, and what each holds reserved is known only from what each
// reservation records (85_late.lua, Segments).
func TestLateKeepsPlaceCapacityNotNested(t *testing.T) {
	lateKeepsPlaceCapacity(t, false, "2s", 16, "3s")
}

// lateKeepsPlaceCapacity runs TestLateKeepsPlaceCapacity under a capacity
// of perWin events (or as many of the largest events' bytes) a window of
// capWin, beside acme=1000/ownWin.
func lateKeepsPlaceCapacity(t *testing.T, bytes bool, capWin string, perWin int64, ownWin string) {
	t.Parallel()
	const (
		n     = 200
		pause = 10 * time.Second
	)
	msgs := make([]kafka.Message, n)
	var size, total int64 // the largest event's bytes (key and value), and all of them
	for i := range msgs {
		msgs[i] = kafka.Message{Partition: 0, Key: []byte("acme"), Value: ev{ID: i, Part: 0, Seq: i}.value()}
		b := int64(len(msgs[i].Key) + len(msgs[i].Value))
		size, total = max(size, b), total+b
	}
	capacity, counter, want := perWin, capWin, int64(n)
	spec := fmt.Sprintf("%d/%s", capacity, capWin)
	if bytes {
		capacity, counter, want = perWin*size, capWin+"/bytes", total
		spec = fmt.Sprintf("%dB/%s", capacity, capWin)
	}
	f := newFlow(t, 1)
	prefix := keyPrefix(t)
	env := f.env(t, "GATEKEEPER_LIMITS", "acme=1000/"+ownWin, "GATEKEEPER_CAPACITY", spec,
		"GATEKEEPER_REDIS_KEY_PREFIX", prefix)
	gk := startGatekeeper(t, "gk", env)
	gk.waitReady(90 * time.Second)
	rtWaitAssigned(t, rtGroups(f, 1), gk)

	// Pause it while the backlog's head is due.
	r := pausedLate(t, gk, f, msgs, 3*time.Second, pause)
	tookSlot, slotTaken := r.checkTook(t, gk, false,
		"the pause made events miss their slot while later capacity windows held the tenant's reservations")
	advanced := gk.metric(t, "gatekeeper_decisions_total", `decision="advanced"`)

	// Redis, once the retry tier has nothing left: no capacity window over
	// the capacity, and the tenant's own windows count each event once
	// (missed slots are given back there; a capacity keeps them booked).
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer rdb.Close()
	var booked, fullest int64
	var over []string
	for _, w := range readCapWindows(t, rdb, prefix, counter) {
		booked += w.count
		fullest = max(fullest, w.count)
		if w.count > capacity {
			over = append(over, fmt.Sprintf("%d: %d", w.start, w.count))
		}
	}
	if len(over) > 0 {
		t.Errorf("capacity windows over %d: %v (G12)", capacity, over)
	}
	if booked < want {
		t.Errorf("the capacity's windows booked %d, want at least the events' %d", booked, want)
	}
	var counted int64
	for _, w := range readWindows(t, redisAddr(), prefix) {
		if w.Tenant == "acme" && w.Window == ownWin {
			counted += w.Count
		}
	}
	if counted != n {
		t.Errorf("acme's own windows counted %d, want the %d events once", counted, n)
	}
	t.Logf("%d events (%d bytes), capacity %s; paused %v, resumed %v after the load; %v took a slot, %v found theirs taken, "+
		"%v advanced; the capacity booked %d (+%d: missed slots stay booked there), the fullest window %d; acme's "+
		"windows counted %d; the last took-slot event appended %v before the backlog's last due time",
		n, total, spec, pause, r.resumed.Sub(r.start).Round(100*time.Millisecond), tookSlot, slotTaken, advanced, booked, booked-want,
		fullest, counted, r.lastDue.Sub(r.tookAt).Round(100*time.Millisecond))
}
