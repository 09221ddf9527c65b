package integration

import (
	"fmt"
	"testing"
	"time"
)

// TestGateHardKill checks G1 under a crash: one of three gatekeepers is
// killed with SIGKILL (no drain, no commit, no leave) while a stream is being
// produced, and a replacement joins. Every produced event is still found at
// least once across downstream, the retry tiers and the dead-letter topic
// (duplicates are allowed: at least once), the group ends up committing
// everything, and no window holds more than its limit despite redeliveries.
func TestGateHardKill(t *testing.T) {
	t.Parallel()
	const parts, n, chunks = 6, 5000, 10
	f := newFlow(t, parts)
	env := f.env(t,
		"GATEKEEPER_LIMITS", "*=200/1m",
		"GATEKEEPER_BATCH_SIZE", "50",
		"GATEKEEPER_ROLES", "gate",
		// The killed member's partitions move when its session expires.
		"GATEKEEPER_KAFKA_SESSION_TIMEOUT", "8s")
	group, prefix := env["GATEKEEPER_GROUP_ID"], env["GATEKEEPER_REDIS_KEY_PREFIX"]
	procs := []*gkProc{
		startGatekeeper(t, "gk1", env),
		startGatekeeper(t, "gk2", env),
		startGatekeeper(t, "gk3", env),
	}
	for _, p := range procs {
		p.waitReady(90 * time.Second)
	}
	waitSharedGeneration(t, group, f.Source, parts, procs...)

	gen := newEventGen(parts, []string{"a", "b", "c", "d", "e"}, []int{1, 1, 1, 1, 1})
	victim := procs[1]
	// The victim owns a third of the partitions: kill it halfway through
	// its share, while it is handling batches.
	killAt := float64(n / 3 / 2)
	killed := make(chan float64, 1)
	go func() {
		for {
			in, err := victim.metricValue("gatekeeper_events_in_total", `topic="`+f.Source+`"`)
			if err == nil && in >= killAt {
				victim.Kill()
				killed <- in
				return
			}
			select {
			case <-victim.Done():
				killed <- -1
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	var replacement *gkProc
	startReplacement := func(in float64) {
		t.Logf("killed %s after it had taken in %v events (%v)", victim.Name, in, victim.Err())
		if in < 0 {
			t.Fatalf("%s exited before the kill", victim.Name)
		}
		replacement = startGatekeeper(t, "gk4", env)
	}
	for range chunks {
		produce(t, f.Source, gen.next(n/chunks))
		select {
		case in := <-killed:
			startReplacement(in)
		default:
		}
		time.Sleep(100 * time.Millisecond)
	}
	if replacement == nil {
		select {
		case in := <-killed:
			startReplacement(in)
		case <-time.After(60 * time.Second):
			t.Fatalf("%s never took in %v events", victim.Name, killAt)
		}
	}
	// The victim's partitions move once the broker drops its session.
	o := waitAllRouted(t, f, n, 2*time.Minute)
	counts := idCounts(o.all())
	missing, dups := missingIDs(counts, n)
	if len(missing) > 0 {
		t.Errorf("events lost after SIGKILL: %d of %d missing (%v)", len(missing), n, first10(missing))
	}
	if counts[-1] > 0 {
		t.Errorf("foreign events in the outputs: got %d, want 0", counts[-1])
	}
	if len(o.dlq) > 0 {
		t.Errorf("dead letters: got %d (first reason %q), want 0", len(o.dlq), header(o.dlq[0], "gk-reason"))
	}
	t.Logf("%s; %d duplicates (redelivered after the kill)", o, dups)

	// The group recovered: the survivors and the replacement own every
	// partition and have committed everything.
	owned := waitSharedGeneration(t, group, f.Source, parts, procs[0], procs[2], replacement)
	t.Logf("partitions after the kill: %v", owned)
	end := endOffsets(t, f.Source, parts)
	waitFor(t, 60*time.Second, "group committed every source offset", func() (bool, string) {
		c := committed(t, group, f.Source, parts)
		for p := range parts {
			if c[p] != end[p] {
				return false, fmt.Sprintf("committed %v, end %v", c, end)
			}
		}
		return true, ""
	})
	windows := readWindows(t, redisAddr(), prefix)
	if len(windows) == 0 {
		t.Errorf("no counter windows under %s in Redis", prefix)
	}
	for _, w := range windows {
		if w.Window != "1m" || w.Count > 200 {
			t.Errorf("window %s: count got %d, want at most 200 (rule 200/1m)", w.Key, w.Count)
		}
	}
}
