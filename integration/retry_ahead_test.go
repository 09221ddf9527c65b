package integration

import (
	"fmt"
	"slices"
	"strconv"
	"testing"

	"github.com/segmentio/kafka-go"
)

// aheadBytes estimates what a first-tier retry event costs the look-ahead
// (consume's messageBytes: key, value and headers plus 192 bytes per
// message and 48 per header).
func aheadBytes(m kafka.Message) int {
	n := 192 + len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += 48 + len(h.Key) + len(h.Value)
	}
	return n
}

// logRetryAhead reports, for the events forwarded downstream from the first
// retry tier that pick selects, how far after gk-due they went downstream
// (p50, p99, max), and for the late ones (over late seconds) and the others
// what sat before them in their retry partition and was still waiting at
// their due time: the events at lower offsets of the same partition with a
// later gk-due, by count and by look-ahead bytes. A retry partition pauses
// its fetching at RETRY_LOOKAHEAD_BYTES (512 KiB by default) of waiting events, so an
// event behind more than that is read only as those are released.
func logRetryAhead(t *testing.T, f flow, o outputs, pick func(kafka.Message) bool, late float64) {
	t.Helper()
	type pos struct {
		part int
		off  int64
	}
	type rec struct {
		due  int64
		size int
	}
	// The first tier's events by partition and offset, and where each
	// (origin, due) trip sits.
	byPart := map[int][]kafka.Message{}
	where := map[string]pos{}
	for _, m := range o.retry {
		if m.Topic != f.Retry {
			continue
		}
		byPart[m.Partition] = append(byPart[m.Partition], m)
		where[tripKey(m)] = pos{m.Partition, m.Offset}
	}
	for _, ms := range byPart {
		slices.SortFunc(ms, func(a, b kafka.Message) int { return int(a.Offset - b.Offset) })
	}
	var afterDue []float64
	var lateAhead, okAhead []float64
	for _, m := range o.down {
		due := header(m, "gk-due")
		if due == "" || !pick(m) {
			continue
		}
		d, _ := strconv.ParseInt(due, 10, 64)
		a := float64(m.Time.UnixMilli()-d) / 1000
		afterDue = append(afterDue, a)
		p, ok := where[tripKey(m)]
		if !ok {
			continue
		}
		bytes := 0
		for _, r := range byPart[p.part] {
			if r.Offset >= p.off {
				break
			}
			if rd, _ := strconv.ParseInt(header(r, "gk-due"), 10, 64); rd > d {
				bytes += aheadBytes(r)
			}
		}
		if a > late {
			lateAhead = append(lateAhead, float64(bytes))
		} else {
			okAhead = append(okAhead, float64(bytes))
		}
	}
	if len(afterDue) == 0 {
		t.Logf("retry ahead: no deferred event picked")
		return
	}
	kib := func(v []float64, q float64) string {
		if len(v) == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f", percentile(v, q)/1024)
	}
	t.Logf("picked deferred events after their due time: p50 %.3fs p99 %.3fs max %.3fs over %d; "+
		"waiting before them in their retry partition at their due time (KiB, p10/p50/max): %d over %.1fs late %s/%s/%s, the %d others %s/%s/%s",
		percentile(afterDue, 0.5), percentile(afterDue, 0.99), slices.Max(afterDue), len(afterDue),
		len(lateAhead), late, kib(lateAhead, 0.1), kib(lateAhead, 0.5), kib(lateAhead, 1),
		len(okAhead), kib(okAhead, 0.1), kib(okAhead, 0.5), kib(okAhead, 1))
}

// tripKey names one trip of an event through the retry tiers: its origin
// and its due time.
func tripKey(m kafka.Message) string {
	return header(m, "gk-origin-topic") + "/" + header(m, "gk-origin-partition") + "/" +
		header(m, "gk-origin-offset") + "@" + header(m, "gk-due")
}

// logPeakRSS logs the peak resident memory of each process, and how many
// deferred events its retry partitions passed over and how many of its
// retry commits left done offsets out of their metadata.
func logPeakRSS(t *testing.T, procs ...*gkProc) {
	t.Helper()
	for _, p := range procs {
		if _, peak, err := p.RSS(); err == nil {
			passed, _ := p.metricValue("gatekeeper_retry_passed_over_total")
			truncated, _ := p.metricValue("gatekeeper_handover_truncated_commits_total")
			t.Logf("%s: peak RSS %.0f MB; retry events passed over %.0f, commits truncated %.0f", p.Name, float64(peak)/1e6, passed, truncated)
		}
	}
}
