package limit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Source says where a batch's events were consumed from, so that an event
// decided a second time (a script call retried after a timeout, a batch
// redelivered after a crash or a rebalance, whatever its boundaries) gets
// its first decision back and is not counted again (G9). It is a value type.
//
// A decision is known by the position it was consumed from: (Topic,
// TopicID, Partition, offset), within the deployment (Options.ReplayScope).
// admit.lua keeps, atomically with the counts, a record
// of the decisions of each partition's offsets from Low on (see
// ReplayRecordTTL). Decisions not made by Redis are not recorded, since they
// count nothing: events of tenants without rules, events decided from the
// local "known full" cache, and Fail decisions.
type Source struct {
	// Topic and Partition name the partition the events were read from.
	// An empty Topic means no source: nothing is recorded or looked up.
	Topic     string
	Partition int
	// TopicID is Kafka's ID of the topic (consume.Batch.TopicID): a topic
	// deleted and created again under the same name has a new one, so its
	// events never match the old topic's decisions. Empty: the record is
	// known by the name alone, as before topic IDs were read.
	TopicID string
	// Low is the partition's committed offset as the caller knows it: no
	// replay reaches below it (the next owner starts at the last commit),
	// so the record forgets the decisions of lower offsets.
	Low int64
	// Assignment names the caller's ownership of the partition
	// (consume.Batch.Assignment): it changes each time the partition starts
	// being consumed in this process. Under a new one, another owner may
	// have decided any offset since, so the Limiter asks Redis about every
	// event of the partition until a reply tells how far the replay record
	// goes (even a tenant's it knows full, whose events it would otherwise
	// reject without a call).
	Assignment uint64
}

// positions is a Source with the offsets of a call's events (Event.Offset),
// index-aligned with them; without a Source, no offsets.
type positions struct {
	Source
	offsets []int64
	// late: the batch was read back from the first retry tier (AdmitLate);
	// nil for AdmitFrom.
	late *lateCall
	// advance: the batch is a retry tier's waiting events to move
	// (Advance); nil otherwise.
	advance *advanceCall
}

// ReplayRecordTTL is how long a partition's replay record lives after its
// last write. Every decision of the partition rewrites it, so it expires
// only when nobody decides the partition's events any more (an owner that
// never comes back); a replay after that long a pause is counted as new.
const ReplayRecordTTL = 10 * time.Minute

// ReplayRecordBytes bounds a replay record: once the decisions it keeps at
// or above the source's Low hold that many bytes, a call that would add new
// decisions to it is refused with ErrReplayFull and counts nothing (see
// Bound in admit/60_replay.lua). Commits move Low and free the record; in
// steady operation it holds the two or three batches since the last commit,
// a few KiB each. 256 KiB is some hundred batches of 500 events whose
// commits failed. Every call reads and rewrites at most this plus its own
// decisions.
const ReplayRecordBytes = 256 << 10

// ErrReplayFull is the error (wrapped) of a call refused because its
// source's replay record is at its bound (ReplayRecordBytes): the record
// holds the decisions of every batch since the source's last commit, and
// forgetting any of them could count it twice. Nothing was decided or
// counted: the caller retries the batch once its commits move Low on
// (consume retries a failed batch, and retries its last commit meanwhile).
var ErrReplayFull = errors.New("replay record full: commits are behind")

// replayFull wraps err with ErrReplayFull when it is the script's refusal.
func replayFull(err error) error {
	if redis.HasErrorPrefix(err, "GKREPLAYFULL") {
		return fmt.Errorf("%w: %w", ErrReplayFull, err)
	}
	return err
}

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
func (l *Limiter) replayArgs(ks, av []any, groups []*group, src positions, b *callBufs) ([]any, []any) {
	if src.Topic == "" {
		return ks, append(av, "")
	}
	if l.cluster {
		ks = append(ks, l.keys.tenantReplay(groups[0].tenant, src.Source))
	} else {
		ks = append(ks, l.keys.replay(src.Source))
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
	offs := appendPerGroup(b.offs[:0], groups, func(i int) int64 { return src.offsets[i] - lo })
	b.offs = offs
	return ks, append(av, src.Low, ReplayRecordTTL.Milliseconds(), lo, hi, offs, l.replayBound)
}

// appendPerGroup appends to b a JSON array with one array per group: v(i)
// of each of the group's events i, in the group's order.
func appendPerGroup(b []byte, groups []*group, v func(i int) int64) []byte {
	b = append(b, '[')
	for gi, g := range groups {
		if gi > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		for j, i := range g.idx {
			if j > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, v(i), 10)
		}
		b = append(b, ']')
	}
	return append(b, ']')
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
// events, then position, code, due and until each, then the record's
// highest offset) and gives each replayed event to its group, whose events
// are, in order, the call's positions, and the highest offset to every
// group.
func (l *Limiter) parseReplayed(tail []any, groups []*group, out []reply) error {
	if len(tail) < 2 {
		return fmt.Errorf("%w: no replay count", errReply)
	}
	n, ok := tail[0].(int64)
	if !ok || n < 0 || int64(len(tail)) != 2+4*n {
		return fmt.Errorf("%w: replayed %v", errReply, tail)
	}
	hi, ok := tail[len(tail)-1].(int64)
	if !ok {
		return fmt.Errorf("%w: record's highest offset %v", errReply, tail[len(tail)-1])
	}
	for i := range out {
		out[i].recordHi = hi
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
		return deferral(due, until), nil
	case replayRejectFull:
		return Decision{Kind: Reject, Reason: l.fullReason}, nil
	case replayRejectScan:
		return Decision{Kind: Reject, Reason: scanReason}, nil
	case replayKeep:
		return Decision{Kind: Keep}, nil
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
	n := 0
	for _, r := range rs {
		if r.d.Kind != Keep { // a claim that keeps its slot is no replay
			n++
		}
	}
	l.metrics.replayed.Add(float64(n))
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

// sentOffsets remembers, per source partition, up to which offset an event
// may have been decided by Redis before: by this Limiter (the offsets it
// sent) or, since this process took the partition over, by any owner (the
// highest offset of the replay record, which each reply carries). An event
// at or below it may be in the replay record, so it goes to Redis even when
// its tenant is known to be full (a local decision would not give back the
// recorded one). A partition this Limiter has not heard back from Redis
// about under the batch's assignment (Source.Assignment: a new owner, or
// this process owning it again) is unknown: all its events go to Redis,
// since another owner may have decided any of them, until a reply says how
// far the record goes. On Redis Cluster (perTenant) each tenant has a
// record of its own, so that is known tenant by tenant: a tenant absent
// from the calls heard so far under the assignment is unknown. It is
// guarded by Limiter.mu; the zero value is ready (one record per
// partition).
type sentOffsets struct {
	hi        map[sourceKey]sentState
	perTenant bool
	tenants   int // tenants remembered over all partitions (perTenant), at most maxSentTenants
}

// sentState is what sentOffsets knows of one partition.
type sentState struct {
	assignment uint64 // the Source.Assignment it is about
	hi         int64  // highest offset that may have been decided, -1: none
	known      bool   // a reply under assignment gave the record's highest offset
	// tenants holds, on Redis Cluster, the highest offset of each tenant's
	// record as the replies under assignment gave it: the tenants known.
	tenants map[string]int64
}

// sourceKey names a source partition.
type sourceKey struct {
	topic, topicID string
	partition      int
}

func keyOf(src Source) sourceKey { return sourceKey{src.Topic, src.TopicID, src.Partition} }

// mayReplay reports whether one of g's events of src may have been
// decided by Redis before: all of them, while the partition (on Redis
// Cluster, g's tenant there) is unknown under src's assignment.
func (s *sentOffsets) mayReplay(src positions, g *group) bool {
	if src.Topic == "" {
		return false
	}
	st, ok := s.hi[keyOf(src.Source)]
	if !ok || st.assignment != src.Assignment || !st.known {
		return true
	}
	hi := st.hi
	if s.perTenant {
		th, ok := st.tenants[g.tenant]
		if !ok {
			return true
		}
		hi = max(hi, th)
	}
	for _, i := range g.idx {
		if src.offsets[i] <= hi {
			return true
		}
	}
	return false
}

// maxSentPartitions bounds the partitions sentOffsets remembers: far more
// than one process consumes; maxSentTenants, the tenants it remembers over
// all partitions on Redis Cluster. Past either it forgets them all: their
// known-full tenants' events go to Redis once more.
const (
	maxSentPartitions = 100000
	maxSentTenants    = 200000
)

// state returns src's partition's state under src's assignment (a new one
// when the assignment changed), for mark and heard to update. Past
// maxSentPartitions partitions it forgets them all: each is then unknown.
func (s *sentOffsets) state(src Source) (sourceKey, sentState) {
	if s.hi == nil || len(s.hi) >= maxSentPartitions || s.tenants >= maxSentTenants {
		s.hi, s.tenants = map[sourceKey]sentState{}, 0
	}
	k := keyOf(src)
	st, ok := s.hi[k]
	if !ok || st.assignment != src.Assignment {
		s.tenants -= len(st.tenants) // the caller stores the new state in their place
		st = sentState{assignment: src.Assignment, hi: -1}
	}
	return k, st
}

// mark notes the offsets of the events of calls, about to be sent to Redis
// (a call may run there even when its reply is lost).
func (s *sentOffsets) mark(src positions, calls []*group) {
	if src.Topic == "" || len(calls) == 0 {
		return
	}
	k, st := s.state(src.Source)
	for _, g := range calls {
		for _, i := range g.idx {
			st.hi = max(st.hi, src.offsets[i])
		}
	}
	s.hi[k] = st
}

// heard notes the replies of the calls of src, index-aligned with them: the
// highest offset of the replay records they read. On one Redis the
// partition has one record, so from then on an event above it was decided
// by nobody; on Redis Cluster each tenant has a record of its own, and each
// reply makes its tenant known.
func (s *sentOffsets) heard(src Source, calls []*group, replies []reply) {
	if src.Topic == "" || len(replies) == 0 {
		return
	}
	k, st := s.state(src)
	st.known = true
	if !s.perTenant {
		for _, r := range replies {
			st.hi = max(st.hi, r.recordHi)
		}
		s.hi[k] = st
		return
	}
	if st.tenants == nil {
		st.tenants = map[string]int64{}
	}
	for i, r := range replies {
		t := calls[i].tenant
		old, ok := st.tenants[t]
		if !ok {
			s.tenants++
			old = -1
		}
		st.tenants[t] = max(old, r.recordHi)
	}
	s.hi[k] = st
}

// replaySweep remembers, on Redis Cluster, the replay records that calls
// left behind and the highest offset each holds (the script's reply ends
// with it), per source partition. There each tenant has a record per
// partition (tenantReplay): a tenant seen once (a made-up name) would leave
// its record for ReplayRecordTTL, since no later call of its own drops its
// chunks. Once a call of the partition names a Low above a record's highest
// offset, no replay reaches the record any more and it is deleted
// (replay_drop.lua, which checks that again in Redis: a record another
// owner has written to since is kept). It is safe for concurrent use; the
// zero value is ready.
type replaySweep struct {
	mu   sync.Mutex
	recs map[sourceKey]map[string]int64
	n    int // records remembered, at most maxSweepRecords
}

// maxSweepRecords bounds the records a Limiter remembers for deletion; past
// it, new ones are left to expire with their lifetime. sweepPerCall bounds
// the deletions a call sends (one small script call each, pipelined).
const (
	maxSweepRecords = 100000
	sweepPerCall    = 1000
)

// note remembers the record key of partition k, whose highest offset is
// hi (-1: the record is gone).
func (s *replaySweep) note(k sourceKey, key string, hi int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.recs[k]
	if _, ok := m[key]; ok {
		if hi < 0 {
			delete(m, key)
			s.n--
		} else {
			m[key] = hi
		}
		return
	}
	if hi < 0 || s.n >= maxSweepRecords {
		return
	}
	if s.recs == nil {
		s.recs = map[sourceKey]map[string]int64{}
	}
	if m == nil {
		m = map[string]int64{}
		s.recs[k] = m
	}
	m[key] = hi
	s.n++
}

// due takes out of the sweep at most max records of partition k whose
// highest offset is below low.
func (s *replaySweep) due(k sourceKey, low int64, max int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.recs[k]
	var out []string
	for key, hi := range m {
		if len(out) == max {
			break
		}
		if hi < low {
			out = append(out, key)
			delete(m, key)
			s.n--
		}
	}
	if len(m) == 0 {
		delete(s.recs, k)
	}
	return out
}

// passed takes out of the sweep at most max records of the partition of
// topic (whatever its topic ID) whose highest offset is below low.
func (s *replaySweep) passed(topic string, partition int, low int64, max int) []string {
	s.mu.Lock()
	var ks []sourceKey
	for k := range s.recs {
		if k.topic == topic && k.partition == partition {
			ks = append(ks, k)
		}
	}
	s.mu.Unlock()
	var out []string
	for _, k := range ks {
		out = append(out, s.due(k, low, max-len(out))...)
	}
	return out
}

// sweepReplays notes the records of a Cluster call's tenants and deletes
// the records of src's partition that its Low has passed. A deletion that
// fails is left to the record's lifetime: nothing is counted wrongly.
func (l *Limiter) sweepReplays(ctx context.Context, src Source, calls []*group, replies []reply) {
	if src.Topic == "" {
		return
	}
	k := keyOf(src)
	for i, g := range calls {
		l.sweep.note(k, l.keys.tenantReplay(g.tenant, src), replies[i].recordHi)
	}
	l.dropReplays(ctx, l.sweep.due(k, src.Low, sweepPerCall), src.Low)
}

// Committed tells the Limiter that the offsets of a source partition below
// next are committed. On Redis Cluster it deletes the replay records that
// commit has passed (at most sweepPerCall, one pipelined round trip, within
// Options.Timeout): a partition that receives nothing after a batch of
// made-up tenants would otherwise keep their records for ReplayRecordTTL,
// since only a later call of the partition sweeps them. Elsewhere it finds
// nothing to do. It is safe for concurrent use; a deletion that fails is
// left to the record's lifetime.
func (l *Limiter) Committed(topic string, partition int, next int64) {
	keys := l.sweep.passed(topic, partition, next, sweepPerCall)
	if len(keys) == 0 {
		return
	}
	l.dropReplays(context.Background(), keys, next)
}

// dropReplays deletes the replay records keys whose decisions are all
// below low (replay_drop.lua checks that again), in one pipeline.
func (l *Limiter) dropReplays(ctx context.Context, keys []string, low int64) {
	if len(keys) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	cmds := make([]*redis.Cmd, len(keys))
	_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, key := range keys {
			cmds[i] = l.drop.EvalSha(ctx, p, []string{key}, low)
		}
		return nil
	})
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		_, err = l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, key := range keys {
				if redis.HasErrorPrefix(cmds[i].Err(), "NOSCRIPT") {
					cmds[i] = l.drop.Eval(ctx, p, []string{key}, low)
				}
			}
			return nil
		})
	}
	if err != nil {
		l.metrics.redisErrors.Inc()
	}
}
