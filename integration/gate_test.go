package integration

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/route"
)

// TestGateExactLimitsThreeReplicas runs three gatekeepers in one consumer
// group over a 6-partition source and checks G2 across the fleet: no window
// of any tenant and rule counts more than its limit (read from the Redis
// window keys), downstream holds no more of a tenant than the sum of its
// limits over the windows the run touched, every routed event was counted,
// and every deferred event is due after it was first seen. Tenant bulk is
// limited in bytes (key, value and headers) as well as in events, and its
// byte rule binds first.
func TestGateExactLimitsThreeReplicas(t *testing.T) {
	t.Parallel()
	const parts, n = 6, 3000
	f := newFlow(t, parts)
	env := f.env(t,
		"GATEKEEPER_LIMITS", "*=40/1m;heavy=60/1m,100/1h;bulk=1000/1m,400B/1m",
		"GATEKEEPER_WINDOW", "aligned",
		"GATEKEEPER_TENANT_FROM", "key",
		"GATEKEEPER_ROLES", "gate")
	prefix, group := env["GATEKEEPER_REDIS_KEY_PREFIX"], env["GATEKEEPER_GROUP_ID"]
	var procs []*gkProc
	for i := range 3 {
		procs = append(procs, startGatekeeper(t, fmt.Sprintf("gk%d", i+1), env))
	}
	for _, p := range procs {
		p.waitReady(90 * time.Second)
	}
	owned := waitSharedGeneration(t, group, f.Source, parts, procs...)
	t.Logf("partitions per member: %v", owned)

	gen := newEventGen(parts, []string{"heavy", "alpha", "bravo", "charlie", "bulk"}, []int{4, 2, 2, 2, 2})
	msgs := gen.next(n)
	t0 := time.Now()
	produce(t, f.Source, msgs)
	o := waitAllRouted(t, f, n, 2*time.Minute)
	t1 := time.Now()

	counts := idCounts(o.all())
	missing, dups := missingIDs(counts, n)
	if len(missing) > 0 {
		t.Errorf("events lost: got %d of %d ids in the outputs, missing %v", n-len(missing), n, first10(missing))
	}
	t.Logf("%s; %d duplicates", o, dups)
	if len(o.dlq) != 0 {
		t.Errorf("dead letters: got %d (first reason %q), want 0: every event fits within the 24h horizon",
			len(o.dlq), header(o.dlq[0], "gk-reason"))
	}

	// Every member did part of the work.
	total := 0.0
	for _, p := range procs {
		in := p.metric(t, "gatekeeper_events_in_total", `topic="`+f.Source+`"`)
		if in == 0 {
			t.Errorf("%s: gatekeeper_events_in_total: got 0, want > 0 (it owns %d partitions)", p.Name, len(owned[slices.Index(procs, p)]))
		}
		total += in
	}
	if total < n {
		t.Errorf("events in over the members: got %v, want at least %d", total, n)
	}

	// Downstream per tenant within the sum of the limits of the windows touched.
	minutes := t1.UnixMilli()/60_000 - t0.UnixMilli()/60_000 + 1
	hours := t1.UnixMilli()/3_600_000 - t0.UnixMilli()/3_600_000 + 1
	bound := map[string]int64{"heavy": min(60*minutes, 100*hours), "alpha": 40 * minutes, "bravo": 40 * minutes, "charlie": 40 * minutes,
		"bulk": 1000 * minutes}
	down, deferred := map[string]int64{}, map[string]int64{}
	downBytes, deferredBytes := map[string]int64{}, map[string]int64{}
	for _, m := range o.down {
		down[string(m.Key)]++
		downBytes[string(m.Key)] += route.EventBytes(m)
	}
	for _, m := range o.retry {
		deferred[string(m.Key)]++
		deferredBytes[string(m.Key)] += route.EventBytes(m)
	}
	if downBytes["bulk"] > 400*minutes {
		t.Errorf("tenant bulk downstream: got %d bytes, want at most %d (%d minute windows touched)", downBytes["bulk"], 400*minutes, minutes)
	}
	for _, tenant := range slices.Sorted(maps.Keys(bound)) {
		if down[tenant] > bound[tenant] {
			t.Errorf("tenant %s downstream: got %d, want at most %d (%d minute and %d hour windows touched)",
				tenant, down[tenant], bound[tenant], minutes, hours)
		}
		if down[tenant] == 0 || deferred[tenant] == 0 {
			t.Errorf("tenant %s: got %d admitted and %d deferred, want both > 0", tenant, down[tenant], deferred[tenant])
		}
	}
	t.Logf("admitted %v, deferred %v, bounds %v", down, deferred, bound)

	// Every window of every rule within its limit, in Redis.
	limits := map[string]map[string]int64{ // tenant -> counter -> limit
		"heavy": {"1m": 60, "1h": 100}, "alpha": {"1m": 40}, "bravo": {"1m": 40}, "charlie": {"1m": 40},
		"bulk": {"1m": 1000, "1m/bytes": 400},
	}
	windows := readWindows(t, redisAddr(), prefix)
	sums := map[string]int64{} // tenant + " " + window -> counted events
	nwin := map[string]int{}
	for _, w := range windows {
		limit, ok := limits[w.Tenant][w.Window]
		if !ok {
			t.Errorf("window %s: tenant %q has no %s rule", w.Key, w.Tenant, w.Window)
		}
		if w.Count > limit {
			t.Errorf("window %s: count got %d, want at most %d", w.Key, w.Count, limit)
		}
		if w.Expire <= w.Start {
			t.Errorf("window %s: expire %d not after its start", w.Key, w.Expire)
		}
		sums[w.Tenant+" "+w.Window] += w.Count
		nwin[w.Tenant+" "+w.Window]++
	}
	for tenant, rules := range limits {
		for window := range rules {
			k := tenant + " " + window
			// Each admitted or deferred event was counted (in its window or
			// its reserved one), so the fleet forwarded nothing uncounted.
			routed := down[tenant] + deferred[tenant]
			if strings.HasSuffix(window, "/bytes") {
				routed = downBytes[tenant] + deferredBytes[tenant]
			}
			if sums[k] < routed {
				t.Errorf("tenant %s window %s: counted %d in %d windows, want at least the %d routed", tenant, window, sums[k], nwin[k], routed)
			}
			if nwin[k] < 2 {
				t.Errorf("tenant %s window %s: got %d windows, want several (deferrals reserve future windows)", tenant, window, nwin[k])
			}
		}
	}
	t.Logf("%d windows; counted per tenant and rule %v", len(windows), sums)
	checkBytesPacked(t, windows, "bulk", 400, slices.Concat(o.down, o.retry))

	checkDeferrals(t, f, o.retry, 24*time.Hour)
}

// checkBytesPacked checks that a tenant's byte windows hold the most that
// fits in order: each window but the last holds more than limit less the
// largest of the tenant's events (an event goes to a later window only when
// it does not fit, in order, in the room left).
func checkBytesPacked(t *testing.T, windows []counterWindow, tenant string, limit int64, routed []kafka.Message) {
	t.Helper()
	var largest int64
	for _, m := range routed {
		if string(m.Key) == tenant {
			largest = max(largest, route.EventBytes(m))
		}
	}
	var ws []counterWindow
	for _, w := range windows {
		if w.Tenant == tenant && strings.HasSuffix(w.Window, "/bytes") {
			ws = append(ws, w)
		}
	}
	slices.SortFunc(ws, func(a, b counterWindow) int { return int(a.Start - b.Start) })
	for i, w := range ws {
		if i < len(ws)-1 && w.Count <= limit-largest {
			t.Errorf("window %s: holds %d bytes, want more than %d (limit %d less the largest event, %d bytes)",
				w.Key, w.Count, limit-largest, limit, largest)
		}
	}
}

// checkDeferrals checks the gk- headers of deferred events: due after first
// seen, on a minute boundary, within the horizon, before the end of the
// reserved slot, in a tier that fits the delay, and naming the tenant and the
// source.
func checkDeferrals(t *testing.T, f flow, retry []kafka.Message, horizon time.Duration) {
	t.Helper()
	bad := 0
	for _, m := range retry {
		due, first, reserved := headerInt(t, m, "gk-due"), headerInt(t, m, "gk-first-seen"), headerInt(t, m, "gk-reserved")
		var problems []string
		if due <= first {
			problems = append(problems, fmt.Sprintf("gk-due %d not after gk-first-seen %d", due, first))
		}
		if due%60_000 != 0 {
			problems = append(problems, fmt.Sprintf("gk-due %d not a window start", due))
		}
		if due > first+(horizon+time.Minute).Milliseconds() {
			problems = append(problems, fmt.Sprintf("gk-due %d beyond the horizon from %d", due, first))
		}
		if reserved <= due {
			problems = append(problems, fmt.Sprintf("gk-reserved %d not after gk-due %d", reserved, due))
		}
		delay := time.Duration(due-first) * time.Millisecond
		if (m.Topic == f.Retry+".1h" && delay <= time.Minute) || (m.Topic == f.Retry+".long" && delay <= time.Hour) {
			problems = append(problems, fmt.Sprintf("delay %v too short for tier %s", delay, m.Topic))
		}
		if header(m, "gk-tenant") != string(m.Key) || header(m, "gk-origin-topic") != f.Source || header(m, "gk-attempt") != "1" {
			problems = append(problems, fmt.Sprintf("gk-tenant %q gk-origin-topic %q gk-attempt %q, want %q %q \"1\"",
				header(m, "gk-tenant"), header(m, "gk-origin-topic"), header(m, "gk-attempt"), m.Key, f.Source))
		}
		if len(problems) > 0 {
			bad++
			if bad <= 5 {
				t.Errorf("deferred event %s/%d@%d: %s", m.Topic, m.Partition, m.Offset, strings.Join(problems, "; "))
			}
		}
	}
	if bad > 5 {
		t.Errorf("... %d deferred events in all with bad headers", bad)
	}
}

// first10 returns at most the first 10 elements of s, for messages.
func first10[T any](s []T) []T { return s[:min(len(s), 10)] }

// TestGateNoLossExactlyOnce checks G1 without failures: with every outcome in
// play (admitted, deferred, rejected beyond a short horizon, invalid), each
// produced event is found exactly once across downstream, the retry tiers and
// the dead-letter topic, and the gatekeeper keeps running.
func TestGateNoLossExactlyOnce(t *testing.T) {
	t.Parallel()
	const parts, n = 4, 2000
	f := newFlow(t, parts)
	gk := startGatekeeper(t, "gk", f.env(t,
		"GATEKEEPER_LIMITS", "*=20/1m;big=30/1m",
		"GATEKEEPER_DEFER_HORIZON", "3m",
		"GATEKEEPER_ROLES", "gate"))
	gk.waitReady(90 * time.Second)

	gen := newEventGen(parts, []string{"big", "small", "other"}, []int{2, 1, 1})
	msgs := gen.next(n)
	invalid := map[int]bool{}
	for i := 0; i < n; i += 97 { // some events without a key: invalid
		msgs[i].Key = nil
		invalid[i] = true
	}
	produce(t, f.Source, msgs)
	o := waitAllRouted(t, f, n, 90*time.Second)
	// Anything still in flight would show up as a duplicate: look again a little later.
	time.Sleep(time.Second)
	o = readOutputs(t, f)

	counts := idCounts(o.all())
	missing, dups := missingIDs(counts, n)
	if len(missing) > 0 || dups > 0 || counts[-1] > 0 {
		t.Errorf("got %d ids missing (%v), %d duplicates, %d foreign events; want every event exactly once",
			len(missing), first10(missing), dups, counts[-1])
	}
	var rejected, invalidSeen int
	for _, m := range o.dlq {
		e, _ := parseEv(m)
		reason := header(m, "gk-reason")
		switch {
		case invalid[e.ID]:
			invalidSeen++
			if reason != "no key" {
				t.Errorf("dead letter %d (no key): gk-reason got %q, want \"no key\"", e.ID, reason)
			}
		case reason == "":
			t.Errorf("dead letter %d: no gk-reason", e.ID)
		default:
			rejected++
			if header(m, "gk-tenant") != string(m.Key) {
				t.Errorf("rejected %d: gk-tenant got %q, want %q", e.ID, header(m, "gk-tenant"), m.Key)
			}
		}
	}
	for _, m := range o.down {
		if e, _ := parseEv(m); invalid[e.ID] {
			t.Errorf("invalid event %d went downstream", e.ID)
		}
	}
	if len(o.down) == 0 || len(o.retry) == 0 || rejected == 0 || invalidSeen != len(invalid) {
		t.Errorf("outcomes: got %d admitted, %d deferred, %d rejected, %d invalid; want all > 0 and %d invalid",
			len(o.down), len(o.retry), rejected, invalidSeen, len(invalid))
	}
	t.Logf("%s (%d rejected, %d invalid)", o, rejected, invalidSeen)
	select {
	case <-gk.Done():
		t.Fatalf("gatekeeper exited: %v", gk.Err())
	default:
	}
}

// TestGateOrder checks G4: admitted events of one tenant from one source
// partition reach downstream in their source order, while several source
// partitions of the same tenant are handled concurrently in small batches and
// part of each tenant's events is deferred.
func TestGateOrder(t *testing.T) {
	t.Parallel()
	const parts, n = 6, 1500
	f := newFlow(t, parts)
	gk := startGatekeeper(t, "gk", f.env(t,
		"GATEKEEPER_LIMITS", "*=150/1m",
		"GATEKEEPER_BATCH_SIZE", "7",
		"GATEKEEPER_ROLES", "gate"))
	gk.waitReady(90 * time.Second)
	gen := newEventGen(parts, []string{"t0", "t1", "t2", "t3"}, []int{1, 1, 1, 1})
	produce(t, f.Source, gen.next(n))
	o := waitAllRouted(t, f, n, 90*time.Second)

	type key struct {
		tenant string
		part   int
	}
	last := map[key]int{}
	downPart := map[string]int{}
	pairs, violations := 0, 0
	// readTopic returns each partition in offset order.
	for _, m := range o.down {
		e, ok := parseEv(m)
		if !ok {
			t.Fatalf("downstream %d@%d: foreign value %q", m.Partition, m.Offset, m.Value)
		}
		tenant := string(m.Key)
		if p, seen := downPart[tenant]; seen && p != m.Partition {
			t.Errorf("tenant %s downstream in partitions %d and %d, want one", tenant, p, m.Partition)
		}
		downPart[tenant] = m.Partition
		k := key{tenant, e.Part}
		if prev, seen := last[k]; seen {
			pairs++
			if e.Seq <= prev {
				violations++
				if violations <= 10 {
					t.Errorf("tenant %s source partition %d: seq %d downstream after seq %d, want increasing", tenant, e.Part, e.Seq, prev)
				}
			}
		}
		last[k] = e.Seq
	}
	if violations > 10 {
		t.Errorf("%d order violations in all", violations)
	}
	// 4 tenants x 6 partitions, about 150 admitted per tenant: most pairs are real comparisons.
	if pairs < 300 {
		t.Errorf("order checked on %d consecutive pairs, want at least 300 (%s)", pairs, o)
	}
	t.Logf("%s; %d ordered pairs checked over %d (tenant, partition) streams", o, pairs, len(last))
}

// TestGateInvalidEvents checks that events whose tenant cannot be derived go
// to the dead-letter topic with the reason in gk-reason, whatever the tenant
// source, and that the gatekeeper keeps running: valid events in the same
// batches and produced afterwards still go downstream.
func TestGateInvalidEvents(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 300)
	type tc struct {
		key, value []byte
		reason     string // substring of gk-reason; "" for a valid event
	}
	cases := map[string][]tc{
		"key": {
			{key: nil, value: []byte("v"), reason: "no key"},
			{key: []byte("acme"), value: []byte("v")},
			{key: []byte(long), value: []byte("v"), reason: "tenant over 256 bytes"},
			{key: []byte("acme"), value: nil},
			{key: []byte(strings.Repeat("y", 256)), value: []byte("v")}, // 256 bytes is fine
			{key: []byte("ac\xffme"), value: []byte("v"), reason: "tenant is not valid UTF-8"},
		},
		"json:tenant.id": {
			{value: []byte(`{"tenant":`), reason: "bad json"},
			{value: []byte(`{"tenant":{"id":acme}}`), reason: "bad json"},
			{value: []byte(`{"tenant":{"id":"acme"},"n":1}`)},
			{value: []byte(`not json`), reason: "bad json"},
			{value: []byte(`{"other":1}`), reason: `json path "tenant.id" not found`},
			{value: []byte(`{"tenant":{"name":"acme"}}`), reason: `json path "tenant.id" not found`},
			{value: []byte(`{"tenant":{"id":"` + long + `"}}`), reason: "tenant over 256 bytes"},
			{value: []byte{}, reason: "bad json"},
			{value: nil, reason: "bad json"},
			{value: []byte(`{"tenant":{"id":""}}`), reason: "tenant is empty"},
			{value: []byte(`{"tenant":{"id":true}}`), reason: "not a string or number"},
			{key: []byte("k"), value: []byte(`{"tenant":{"id":42}}`)},
			// Readers that would see another tenant than the gate counts.
			{value: []byte(`{"tenant":{"id":"cheap"},"tenant":{"id":"victim"}}`), reason: `key "tenant" appears twice`},
			{value: []byte(`{"tenant":{"id":"cheap","ID":"victim"}}`), reason: `key "ID" differs from "id" only in case`},
			{value: []byte(`{"tenant":{"id":1e2}}`), reason: "not a string or an integer in plain decimal"},
			{value: []byte("{\"tenant\":{\"id\":\"ac\xffme\"}}"), reason: "tenant is not valid UTF-8"},
		},
	}
	for spec, events := range cases {
		t.Run(spec, func(t *testing.T) {
			t.Parallel()
			f := newFlow(t, 2)
			gk := startGatekeeper(t, "gk", f.env(t,
				"GATEKEEPER_LIMITS", "*=1000/1m",
				"GATEKEEPER_TENANT_FROM", spec,
				"GATEKEEPER_ROLES", "gate"))
			gk.waitReady(90 * time.Second)

			var msgs []kafka.Message
			wantDLQ := map[string]string{}
			wantDown := map[string]bool{}
			// Each case twice, once per partition, valid ones between invalid ones.
			for rep := range 2 {
				for i, c := range events {
					id := fmt.Sprintf("%d-%d", rep, i)
					msgs = append(msgs, kafka.Message{Partition: rep, Key: c.key, Value: c.value,
						Headers: []kafka.Header{{Key: "test-id", Value: []byte(id)}}})
					if c.reason != "" {
						wantDLQ[id] = c.reason
					} else {
						wantDown[id] = true
					}
				}
			}
			produce(t, f.Source, msgs)
			var o outputs
			waitFor(t, 60*time.Second, "first events routed", func() (bool, string) {
				o = readOutputs(t, f)
				return len(o.all()) >= len(msgs), fmt.Sprintf("%s of %d", o, len(msgs))
			})
			for _, m := range o.dlq {
				id, reason := header(m, "test-id"), header(m, "gk-reason")
				want, ok := wantDLQ[id]
				switch {
				case !ok:
					t.Errorf("event %s dead-lettered (gk-reason %q), want it downstream", id, reason)
				case !strings.Contains(reason, want):
					t.Errorf("event %s: gk-reason got %q, want it to contain %q", id, reason, want)
				}
				if header(m, "gk-origin-topic") != f.Source || header(m, "gk-origin-offset") == "" {
					t.Errorf("event %s: gk-origin-topic %q gk-origin-offset %q, want %q and an offset",
						id, header(m, "gk-origin-topic"), header(m, "gk-origin-offset"), f.Source)
				}
				delete(wantDLQ, id)
			}
			if len(wantDLQ) > 0 {
				t.Errorf("not dead-lettered: %v", wantDLQ)
			}
			for _, m := range o.down {
				delete(wantDown, header(m, "test-id"))
			}
			if len(wantDown) > 0 || len(o.retry) > 0 {
				t.Errorf("valid events missing downstream: %v; deferred: %d (want 0)", slices.Sorted(maps.Keys(wantDown)), len(o.retry))
			}

			// Still running: valid events produced afterwards flow downstream.
			valid := events[slices.IndexFunc(events, func(c tc) bool { return c.reason == "" })]
			var after []kafka.Message
			for i := range 20 {
				after = append(after, kafka.Message{Partition: i % 2, Key: valid.key, Value: valid.value,
					Headers: []kafka.Header{{Key: "test-id", Value: []byte("after-" + strconv.Itoa(i))}}})
			}
			before := len(o.down)
			produce(t, f.Source, after)
			waitFor(t, 60*time.Second, "events after the invalid ones routed", func() (bool, string) {
				n := len(readTopic(t, f.Downstream))
				return n >= before+len(after), fmt.Sprintf("%d downstream, want %d", n, before+len(after))
			})
			if code, body, err := gk.Get("/readyz"); code != 200 {
				t.Errorf("/readyz after invalid events: got %d %v\n%s, want 200", code, err, body)
			}
		})
	}
}
