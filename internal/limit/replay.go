package limit

import (
	"fmt"
	"strconv"
	"time"
)

// Source says where a batch's events were consumed from, so that an event
// decided a second time (a script call retried after a timeout, a batch
// redelivered after a crash or a rebalance, whatever its boundaries) gets
// its first decision back and is not counted again (G9). It is a value type.
//
// A decision is known by the position it was consumed from: (Topic,
// Partition, offset). admit.lua keeps, atomically with the counts, a record
// of the decisions of each partition's offsets from Low on (see
// ReplayRecordTTL). Decisions not made by Redis are not recorded, since they
// count nothing: events of tenants without rules, events decided from the
// local "known full" cache, and Fail decisions.
type Source struct {
	// Topic and Partition name the partition the events were read from.
	// An empty Topic means no source: nothing is recorded or looked up.
	Topic     string
	Partition int
	// Low is the partition's committed offset as the caller knows it: no
	// replay reaches below it (the next owner starts at the last commit),
	// so the record forgets the decisions of lower offsets.
	Low int64
}

// positions is a Source with the offsets of a call's events (Event.Offset),
// index-aligned with them; without a Source, no offsets.
type positions struct {
	Source
	offsets []int64
}

// ReplayRecordTTL is how long a partition's replay record lives after its
// last write. Every decision of the partition rewrites it, so it expires
// only when nobody decides the partition's events any more (an owner that
// never comes back); a replay after that long a pause is counted as new.
const ReplayRecordTTL = 10 * time.Minute

// Codes of replayed decisions in admit.lua's reply.
const (
	replayAdmit      = 1
	replayDefer      = 2
	replayRejectFull = 3
	replayRejectScan = 4
)

// scanReason is the reason of events rejected when the deferral search
// reached Options.MaxScan windows.
const scanReason = "no room found within the scan limit"

// replayed is an event that admit.lua found in the replay record: its
// position among its group's events and the decision recorded for it.
type replayed struct {
	pos int
	d   Decision
}

// replayArgs appends the replay record's key and arguments of one script
// call over groups to ks and av (see "Replay record" in admit.lua): with no
// source, the one argument "".
func (l *Limiter) replayArgs(ks []string, av []any, groups []*group, src positions) ([]string, []any) {
	if src.Topic == "" {
		return ks, append(av, "")
	}
	if l.cluster {
		ks = append(ks, l.keys.tenantReplay(groups[0].tenant, src.Topic, src.Partition))
	} else {
		ks = append(ks, l.keys.replay(src.Topic, src.Partition))
	}
	lo, hi := int64(-1), int64(-1)
	n := 0
	for _, g := range groups {
		n += len(g.idx)
		for _, i := range g.idx {
			o := src.offsets[i]
			if lo < 0 || o < lo {
				lo = o
			}
			hi = max(hi, o)
		}
	}
	// Offsets minus lo, one array per tenant: short numbers, and the
	// script finds each tenant's without the tenants' records.
	offs := make([]byte, 0, 4*n+3*len(groups)+2)
	offs = append(offs, '[')
	for gi, g := range groups {
		if gi > 0 {
			offs = append(offs, ',')
		}
		offs = append(offs, '[')
		for j, i := range g.idx {
			if j > 0 {
				offs = append(offs, ',')
			}
			offs = strconv.AppendInt(offs, src.offsets[i]-lo, 10)
		}
		offs = append(offs, ']')
	}
	offs = append(offs, ']')
	return ks, append(av, src.Low, ReplayRecordTTL.Milliseconds(), lo, hi, offs)
}

// checkSource reports a source with a negative offset.
func checkSource(src positions) error {
	if src.Topic == "" {
		return nil
	}
	for _, o := range src.offsets {
		if o < 0 {
			return fmt.Errorf("source %s/%d: offset %d is negative", src.Topic, src.Partition, o)
		}
	}
	return nil
}

// parseReplayed parses the end of admit.lua's reply (the number of replayed
// events, then position, code, due and until each) and gives each replayed
// event to its group, whose events are, in order, the call's positions.
func (l *Limiter) parseReplayed(tail []any, groups []*group, out []reply) error {
	if len(tail) < 1 {
		return fmt.Errorf("%w: no replay count", errReply)
	}
	n, ok := tail[0].(int64)
	if !ok || n < 0 || int64(len(tail)) != 1+4*n {
		return fmt.Errorf("%w: replayed %v", errReply, tail)
	}
	gi, base := 0, 0
	for i := int64(0); i < n; i++ {
		var v [4]int64
		for j := range v {
			if v[j], ok = tail[1+4*i+int64(j)].(int64); !ok {
				return fmt.Errorf("%w: replayed field %T", errReply, tail[1+4*i+int64(j)])
			}
		}
		pos := int(v[0])
		for gi < len(groups) && pos >= base+len(groups[gi].idx) {
			base += len(groups[gi].idx)
			gi++
		}
		if gi == len(groups) || pos < base {
			return fmt.Errorf("%w: replayed position %d", errReply, pos)
		}
		d, err := l.replayDecision(v[1], v[2], v[3])
		if err != nil {
			return err
		}
		out[gi].replayed = append(out[gi].replayed, replayed{pos: pos - base, d: d})
	}
	return nil
}

// replayDecision is the Decision of a replayed event's code, due and until.
func (l *Limiter) replayDecision(code, due, until int64) (Decision, error) {
	switch code {
	case replayAdmit:
		return Decision{Kind: Admit}, nil
	case replayDefer:
		return Decision{Kind: Defer, Due: time.UnixMilli(due), Until: time.UnixMilli(until)}, nil
	case replayRejectFull:
		return Decision{Kind: Reject, Reason: l.fullReason}, nil
	case replayRejectScan:
		return Decision{Kind: Reject, Reason: scanReason}, nil
	}
	return Decision{}, fmt.Errorf("%w: replayed decision %d", errReply, code)
}

// applyReplayed gives g's replayed events their recorded decisions and
// returns the indexes of its other events, in order: those the reply's
// counts are about.
func (l *Limiter) applyReplayed(g *group, rs []replayed, out []Decision) []int {
	if len(rs) == 0 {
		return g.idx
	}
	l.metrics.replayed.Add(float64(len(rs)))
	fresh := make([]int, 0, len(g.idx)-len(rs))
	next := 0
	for pos, i := range g.idx {
		if next < len(rs) && rs[next].pos == pos {
			out[i] = rs[next].d
			next++
			continue
		}
		fresh = append(fresh, i)
	}
	return fresh
}

// sentOffsets remembers, per source partition, the highest offset a
// Limiter has sent to Redis: an event at or below it may be in the replay
// record, so it goes to Redis even when its tenant is known to be full (a
// local decision would not give back the recorded one). It is guarded by
// Limiter.mu; the zero value is ready.
type sentOffsets struct {
	hi map[sourceKey]int64
}

// sourceKey names a source partition.
type sourceKey struct {
	topic     string
	partition int
}

// mayReplay reports whether one of the events idx of src may have been
// decided by Redis before.
func (s *sentOffsets) mayReplay(src positions, idx []int) bool {
	if src.Topic == "" {
		return false
	}
	hi, ok := s.hi[sourceKey{src.Topic, src.Partition}]
	if !ok {
		return false
	}
	for _, i := range idx {
		if src.offsets[i] <= hi {
			return true
		}
	}
	return false
}

// maxSentPartitions bounds the partitions sentOffsets remembers: far more
// than one process consumes.
const maxSentPartitions = 100000

// mark notes the offsets of the events of calls, about to be sent to Redis
// (a call may run there even when its reply is lost). Past
// maxSentPartitions partitions it forgets them all.
func (s *sentOffsets) mark(src positions, calls []*group) {
	if src.Topic == "" || len(calls) == 0 {
		return
	}
	if s.hi == nil || len(s.hi) >= maxSentPartitions {
		s.hi = map[sourceKey]int64{}
	}
	k := sourceKey{src.Topic, src.Partition}
	hi, ok := s.hi[k]
	if !ok {
		hi = -1
	}
	for _, g := range calls {
		for _, i := range g.idx {
			hi = max(hi, src.offsets[i])
		}
	}
	s.hi[k] = hi
}
