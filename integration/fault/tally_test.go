//go:build fault

package fault

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The tally: what reached the final destinations (downstream and the dead
// letter topic; the retry tiers are intermediate), counted.

// figures are the results of one scenario.
type figures struct {
	Produced   int // distinct ids acknowledged to the producer or found in the source
	Downstream int // downstream records of test events, copies included
	DLQ        int // dead-letter records of test events, copies included
	Lost       int // produced ids found neither downstream nor in the dead-letter topic
	Duplicated int // copies beyond the source's, downstream plus dead letter
	Early      int // downstream events appended before their gk-due
	MaxWindow  int // most downstream events of one tenant in one window, copies counted
	MaxAt      string
	MaxTenant  string // the tenant and window index of MaxWindow
	MaxIdx     int64
	Deferred   int // downstream records that went through the retry path (with gk-due)
	Late       int // of those, appended after their reserved slot (checked again as new)
	SourceDups int // extra copies in the source topic (a producer write retried after it landed)
	Foreign    int // records without a test event value
	// Counts is what the limiter must have counted for the events read back
	// (the first copy of each, see countsOf): one per event downstream, its
	// missed slots given back.
	// RedisCounted is the sum of the window counts in Redis: more means
	// events counted twice (a replayed call or a redelivered batch decided
	// again, G9), less means events forwarded without being counted.
	Counts, RedisCounted int
	// CountsByTenant and RedisByTenant split Counts and RedisCounted by
	// tenant (G9 is checked per tenant: one tenant's phantom counts must
	// not hide behind another's missing ones).
	CountsByTenant, RedisByTenant map[string]int
	// RedisMost is the largest count of one tenant's window in Redis (at
	// key RedisMostKey): what the limiter counted there, G2's own figure.
	// MaxWindow places events by append time, so an event decided at a
	// window's end and appended in the next is in the next there.
	RedisMost    int
	RedisMostKey string
	// SourceDupCounts is what the extra source copies (SourceDups) count:
	// each is a position of its own, decided and counted again, estimated
	// as what its first copy counted (included in Counts and CountsByTenant).
	SourceDupCounts int
	// RetryDups counts the extra copies of a trip (id, gk-attempt, gk-due)
	// in the first retry tier: a write retried after the broker appended
	// it. The Retrier checks the copies of a trip in one batch once; copies
	// in two batches that come back after their slot are two positions,
	// each checked (and counted) as new: at most one count each.
	RetryDups int
	Reasons   map[string]int
	// NormalDeferred counts the events of normal tenants (well under the
	// limit) that went through the retry path, by produce time since the
	// load started (4 s buckets): none in a steady state.
	NormalDeferred map[time.Duration]int
	// RetryLateness is, for the first downstream copy of each event that
	// went through the retry path, how long after its gk-due it was
	// appended; Backs are the times a fault's cause went away (the broker
	// serving again), set by the run.
	RetryLateness []time.Duration
	Backs         []faultMark
	// Once is what the window counts would be if every event were counted
	// once, in the window it was forwarded in or kept a slot in: one per
	// event downstream and per event dead-lettered for max attempts (its last
	// deferral's slot), extra source copies included. A deferred event that
	// misses its slot and gives it back is counted once.
	Once    int
	LostIDs []int
	DupIDs  []int
	Latency []latencyPoint // directly admitted events, by produce time
}

// latencyPoint is one directly admitted event: when it was produced and how
// long until its first copy was appended downstream.
type latencyPoint struct {
	produced time.Time
	latency  time.Duration
}

// countsOf returns how many window counts the limiter made for the record e
// and kept: a deferred event that came back after its slot gave the slot
// back (limit.Release) when it was checked again as new, so every event
// downstream counts once, however many trips it made (one reservation kept
// per trip in its slot, or the admission after the last missed one); an
// event dead-lettered for max attempts counts the deferral that went over;
// an event dead-lettered otherwise counts its reservations (gk-attempt:
// none for a direct reject).
func countsOf(e outEvent, downstream string) int {
	attempts, _ := strconv.Atoi(e.attempt)
	switch {
	case e.topic != downstream && e.reason == "max attempts":
		return 1
	case e.topic != downstream:
		return attempts
	default:
		return 1
	}
}

// retryDups returns the extra copies of a trip in retry, the records of the
// first retry tier (see figures.RetryDups).
func retryDups(retry []outEvent) int {
	type tripKey struct {
		id      int
		attempt string
		due     int64
	}
	seen, n := map[tripKey]bool{}, 0
	for _, e := range retry {
		k := tripKey{e.id, e.attempt, e.due.UnixMilli()}
		if seen[k] {
			n++
		}
		seen[k] = true
	}
	return n
}

// windowOf returns the limit window (index of an epoch-aligned window of
// length win; GATEKEEPER_WINDOW=aligned, the default) a downstream event was
// counted in:
//   - forwarded from the retry path inside its reserved slot (appended before
//     gk-reserved): the window that starts at gk-due, where its slot was reserved;
//   - with gk-due but appended after its slot ended: it was checked again as
//     new when it came back (Retrier), so the window of its append time;
//   - admitted directly: the window of its append time.
//
// The append time is a few milliseconds after the decision: an event decided
// at the very end of a window can be placed in the next one.
func windowOf(e outEvent, win time.Duration) int64 {
	if !e.due.IsZero() && e.at.Before(e.reserved) {
		return e.due.UnixMilli() / win.Milliseconds()
	}
	return e.at.UnixMilli() / win.Milliseconds()
}

// tally computes the figures from the producer's record, the source topic
// and the two final destinations.
func tally(res loadResult, source, out []outEvent, downstream string, win time.Duration) figures {
	var f figures
	f.Reasons = map[string]int{}
	srcCopies := map[int]int{}
	for _, e := range source {
		srcCopies[e.id]++
	}
	produced := map[int]bool{}
	for id, s := range res.Events {
		if !s.produced.IsZero() || srcCopies[id] > 0 {
			produced[id] = true
		}
	}
	for _, n := range srcCopies {
		f.SourceDups += max(n-1, 0)
	}
	f.Produced = len(produced)

	outCopies := map[int]int{}
	first := map[int]outEvent{} // first downstream copy
	perWindow := map[string]int{}
	f.CountsByTenant = map[string]int{}
	for _, e := range out {
		outCopies[e.id]++
		if outCopies[e.id] == 1 {
			if e.topic == downstream || e.reason == "max attempts" {
				f.Once += max(srcCopies[e.id], 1)
			}
			n := countsOf(e, downstream)
			extra := max(srcCopies[e.id]-1, 0) * n
			f.Counts += n + extra
			f.SourceDupCounts += extra
			f.CountsByTenant[e.tenant] += n + extra
		}
		if e.topic != downstream {
			f.DLQ++
			f.Reasons[e.reason]++
			continue
		}
		f.Downstream++
		if !e.due.IsZero() {
			f.Deferred++
			if e.at.Before(e.due) {
				f.Early++
			}
			if !e.at.Before(e.reserved) {
				f.Late++
			}
		}
		if fe, ok := first[e.id]; !ok || e.at.Before(fe.at) {
			first[e.id] = e
		}
		w := windowOf(e, win)
		k := e.tenant + "@" + strconv.FormatInt(w, 10)
		perWindow[k]++
		if perWindow[k] > f.MaxWindow {
			f.MaxWindow, f.MaxTenant, f.MaxIdx = perWindow[k], e.tenant, w
			f.MaxAt = fmt.Sprintf("%s in the window from %s", e.tenant,
				time.UnixMilli(w*win.Milliseconds()).UTC().Format("15:04:05"))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(produced)) {
		if outCopies[id] == 0 {
			f.Lost++
			f.LostIDs = append(f.LostIDs, id)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(outCopies)) {
		if extra := outCopies[id] - max(srcCopies[id], 1); extra > 0 {
			f.Duplicated += extra
			f.DupIDs = append(f.DupIDs, id)
		}
	}
	f.NormalDeferred = map[time.Duration]int{}
	for id, e := range first {
		if id >= len(res.Events) || res.Events[id].produced.IsZero() {
			continue
		}
		s := res.Events[id]
		if !e.due.IsZero() {
			f.RetryLateness = append(f.RetryLateness, max(e.at.Sub(e.due), 0))
			if !res.Tenants[s.tenant].hot {
				f.NormalDeferred[s.produced.Sub(res.Start).Truncate(4*time.Second)]++
			}
			continue
		}
		f.Latency = append(f.Latency, latencyPoint{produced: s.produced, latency: e.at.Sub(s.produced)})
	}
	slices.SortFunc(f.Latency, func(a, b latencyPoint) int { return a.produced.Compare(b.produced) })
	return f
}

// strayCopies returns the downstream copies of events that a crash cannot
// explain (G8), how many copies it explained as an extra record deferred
// again (below), and the most downstream events of one tenant in one window
// without the stray ones. A crash may redeliver what was acknowledged before it and
// not yet committed: copies of events whose first copy was appended
// downstream before since (just after the start of the first fault), and, for an event
// that went through the retry path, as many extra copies as the first retry
// tier (retry) holds extra records of that trip (a source batch acknowledged
// before the fault and decided again by its partition's next owner: the
// replay gives the same deferral, and each record is forwarded in its slot,
// or, when the next owner wrote it or it was read after its slot, checked
// again as new and deferred again: a copy of a later due and attempt, which
// an extra record of an earlier trip of the event explains).
// Any other copy is stray: a zombie's write landing late, or a handover that
// forgets what the last owner finished.
func strayCopies(out, retry []outEvent, downstream string, win time.Duration, since time.Time) (stray []outEvent, again, most int, where string) {
	type trip struct {
		id  int
		due int64
	}
	records, trips := map[trip]int{}, map[int][]trip{}
	for _, e := range retry {
		k := trip{e.id, e.due.UnixMilli()}
		if records[k]++; records[k] == 1 {
			trips[e.id] = append(trips[e.id], k)
		}
	}
	// earlierExtra returns a trip of e's event due before e whose extra
	// records are not all used yet.
	extraUsed := map[trip]int{}
	earlierExtra := func(e outEvent) (trip, bool) {
		for _, k := range trips[e.id] {
			if k.due < e.due.UnixMilli() && extraUsed[k] < records[k]-1 {
				return k, true
			}
		}
		return trip{}, false
	}
	firstAt := map[int]time.Time{}
	for _, e := range out {
		if e.topic != downstream {
			continue
		}
		if at, ok := firstAt[e.id]; !ok || e.at.Before(at) {
			firstAt[e.id] = e.at
		}
	}
	perWindow, firstTaken := map[string]int{}, map[int]bool{}
	for _, e := range out {
		if e.topic != downstream {
			continue
		}
		if e.at.Equal(firstAt[e.id]) && !firstTaken[e.id] {
			firstTaken[e.id] = true
		} else if firstAt[e.id].Before(since) {
			continue // a redelivered copy of an event appended before the fault
		} else if k := (trip{e.id, e.due.UnixMilli()}); !e.due.IsZero() && extraUsed[k] < records[k]-1 {
			extraUsed[k]++
			continue // the forward of a redelivered deferral's record
		} else if k, ok := earlierExtra(e); ok && e.attempt != "" && e.attempt != "1" {
			extraUsed[k]++
			again++
			continue // a redelivered deferral's record handled after its slot, deferred again
		} else {
			stray = append(stray, e)
		}
		w := windowOf(e, win)
		k := e.tenant + "@" + strconv.FormatInt(w, 10)
		perWindow[k]++
		if perWindow[k] > most {
			most = perWindow[k]
			where = fmt.Sprintf("%s in the window from %s", e.tenant, time.UnixMilli(w*win.Milliseconds()).UTC().Format("15:04:05"))
		}
	}
	return stray, again, most, where
}

// lateness returns the p99 and the maximum of ls, and how many are over
// over.
func lateness(ls []time.Duration, over time.Duration) (p99, worst time.Duration, n int) {
	if len(ls) == 0 {
		return 0, 0, 0
	}
	ls = slices.Sorted(slices.Values(ls))
	for _, l := range ls {
		if l > over {
			n++
		}
	}
	return ls[min(int(0.99*float64(len(ls))), len(ls)-1)], ls[len(ls)-1], n
}

// quantile returns the q-quantile of ls (0: the least), or 0 when ls is empty.
func quantile(ls []time.Duration, q float64) time.Duration {
	if len(ls) == 0 {
		return 0
	}
	ls = slices.Sorted(slices.Values(ls))
	return ls[min(int(q*float64(len(ls))), len(ls)-1)]
}

// latenessAfter returns, for the deferred events due before back and
// appended after it, how long after back they were appended: a deferred
// event due while the broker was down should be back within two seconds of
// its return.
func latenessAfter(out []outEvent, downstream string, back time.Time) []time.Duration {
	var ls []time.Duration
	seen := map[int]bool{}
	for _, e := range out {
		if e.topic != downstream || e.due.IsZero() || seen[e.id] {
			continue
		}
		seen[e.id] = true
		if e.due.Before(back) && e.at.After(back) {
			ls = append(ls, e.at.Sub(back))
		}
	}
	return ls
}

// latenessDue returns how late the deferred events due in [from, to) were
// appended downstream (first copies).
func latenessDue(out []outEvent, downstream string, from, to time.Time) []time.Duration {
	var ls []time.Duration
	seen := map[int]bool{}
	for _, e := range out {
		if e.topic != downstream || e.due.IsZero() || seen[e.id] {
			continue
		}
		seen[e.id] = true
		if !e.due.Before(from) && e.due.Before(to) {
			ls = append(ls, max(e.at.Sub(e.due), 0))
		}
	}
	return ls
}

// windowDetail describes the downstream events of tenant placed in window
// idx by windowOf: how many were forwarded in their reserved slot, admitted
// directly, or admitted again after their slot, and when they were appended.
func windowDetail(out []outEvent, res loadResult, downstream, tenant string, idx int64, win time.Duration) string {
	type kind struct {
		n           int
		first, last time.Time
		dueWindows  map[int64]int
		before      int // produced before the window started
	}
	start := time.UnixMilli(idx * win.Milliseconds())
	kinds := map[string]*kind{}
	for _, e := range out {
		if e.topic != downstream || e.tenant != tenant || windowOf(e, win) != idx {
			continue
		}
		name := "direct"
		switch {
		case !e.due.IsZero() && e.at.Before(e.reserved):
			name = "in-slot"
		case !e.due.IsZero():
			name = "after-slot"
		}
		k := kinds[name]
		if k == nil {
			k = &kind{first: e.at, last: e.at, dueWindows: map[int64]int{}}
			kinds[name] = k
		}
		k.n++
		if e.at.Before(k.first) {
			k.first = e.at
		}
		if e.at.After(k.last) {
			k.last = e.at
		}
		if !e.due.IsZero() {
			k.dueWindows[e.due.UnixMilli()/win.Milliseconds()-idx]++
		}
		if e.id < len(res.Events) && res.Events[e.id].produced.Before(start) {
			k.before++
		}
	}
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(kinds)) {
		k := kinds[name]
		s := fmt.Sprintf("%s %d (appended +%v..+%v of the window", name, k.n,
			k.first.Sub(start).Round(time.Millisecond), k.last.Sub(start).Round(time.Millisecond))
		if k.before > 0 {
			s += fmt.Sprintf("; %d produced before the window started", k.before)
		}
		if len(k.dueWindows) > 0 {
			s += fmt.Sprintf("; gk-due in window offset:count %v", k.dueWindows)
		}
		parts = append(parts, s+")")
	}
	return strings.Join(parts, ", ")
}

// copiesOf returns the records of id in out, for a report.
func copiesOf(out []outEvent, id int) []string {
	var s []string
	for _, e := range out {
		if e.id == id {
			s = append(s, e.String())
		}
	}
	return s
}

// latencyQuantiles returns the p50, p99 and maximum latency of points.
func latencyQuantiles(points []latencyPoint) (p50, p99, worst time.Duration) {
	if len(points) == 0 {
		return 0, 0, 0
	}
	ls := make([]time.Duration, len(points))
	for i, p := range points {
		ls[i] = p.latency
	}
	slices.Sort(ls)
	at := func(q float64) time.Duration { return ls[min(int(q*float64(len(ls))), len(ls)-1)] }
	return at(0.50), at(0.99), ls[len(ls)-1]
}

// latencyTimeline describes points by produce time, in buckets of every
// since start: "+0s p50 30ms max 95ms, +4s ...".
func latencyTimeline(points []latencyPoint, start time.Time, every time.Duration) string {
	buckets := map[int][]latencyPoint{}
	for _, p := range points {
		i := int(p.produced.Sub(start) / every)
		buckets[i] = append(buckets[i], p)
	}
	var parts []string
	for _, i := range slices.Sorted(maps.Keys(buckets)) {
		p50, _, worst := latencyQuantiles(buckets[i])
		parts = append(parts, fmt.Sprintf("+%v p50 %v max %v", time.Duration(i)*every,
			p50.Round(time.Millisecond), worst.Round(time.Millisecond)))
	}
	return strings.Join(parts, ", ")
}
