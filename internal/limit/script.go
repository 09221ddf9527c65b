package limit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gatekeeper-dev/gatekeeper/internal/lua"
)

// descriptors numbers the distinct rules of one script call and holds their
// ARGV descriptions (limit, kind, step, base, retention, boundaries): a description
// depends only on the rule and the time, not on the tenant, so it is sent
// once per call however many tenants share the rule.
type descriptors struct {
	index map[Rule]int // 1-based, as the script counts
	args  []any
}

// describe returns the 1-based descriptor index of r, adding it when new.
func (l *Limiter) describe(d *descriptors, r Rule, now, hend time.Time) int {
	if i, ok := d.index[r]; ok {
		return i
	}
	ret := retention(r, l.opts.Retention).Milliseconds()
	switch {
	case l.opts.WindowKind == TTL:
		d.args = append(d.args, r.Limit, "t", r.Length().Milliseconds(), 0, ret, 0)
	case r.Unit == Second || r.Unit == Minute:
		s, _ := WindowBounds(r, now, l.opts.Location)
		d.args = append(d.args, r.Limit, "a", r.Length().Milliseconds(), s.UnixMilli(), ret, 0)
	default:
		b := boundaries(r, now, hend, l.opts.Location)
		d.args = append(d.args, r.Limit, "e", 0, 0, ret, len(b))
		for _, t := range b {
			d.args = append(d.args, t.UnixMilli())
		}
	}
	d.index[r] = len(d.index) + 1
	return len(d.index)
}

// script returns the KEYS and ARGV of one admit.lua call over groups (the
// keys as strings boxed in interface values, mostly the tenants' states'
// own: see admitCmd). The tenants' records go in one argument, a JSON array
// of numbers (see admit.lua), followed by the costs of the tenants whose
// rules count bytes or units.
//
// The keys, the records and the offsets are built in b's buffers (nil: new
// ones), which the call's command holds until it returns.
func (l *Limiter) script(groups []*group, now, hend time.Time, src positions, budget int, b *callBufs) ([]any, []any) {
	if b == nil {
		b = &callBufs{}
	}
	d := descriptors{index: map[Rule]int{}}
	ks := b.ks[:0]
	recs := b.recs[:0]
	recs = append(recs, '[')
	nums := 0
	num := func(n int64) {
		if len(recs) > 1 {
			recs = append(recs, ',')
		}
		recs = strconv.AppendInt(recs, n, 10)
		nums++
	}
	// Most tenants share one rule list (the "*" rules, or an override's):
	// its descriptors are looked up once for a run of such tenants.
	var last []Rule
	descOf := b.descOf[:0]
	for _, g := range groups {
		ks = append(ks, g.st.keys...)
		num(int64(len(g.rules)))
		num(int64(len(g.idx)))
		if len(g.rules) == 0 || len(last) != len(g.rules) || &last[0] != &g.rules[0] {
			last, descOf = g.rules, descOf[:0]
			for _, r := range g.rules {
				descOf = append(descOf, int64(l.describe(&d, r, now, hend)))
			}
		}
		for i := range g.rules {
			num(descOf[i])
			c := g.chainOf(i)
			num(c.start)
			num(c.end)
		}
	}
	capFirst := len(ks) + 1
	ks = l.capacityKeys(ks)
	if costsAt := nums + 1; anyCosts(groups) {
		for i, g := range groups {
			if g.costs != nil {
				appendCosts(num, i+1, g, l.opts.Capacity)
			}
		}
		num(int64(-costsAt))
	}
	recs = append(recs, ']')
	av := b.av[:0]
	ntenants := len(groups)
	if l.fullReply {
		ntenants = -ntenants // (see admit.lua's Reply)
	}
	av = append(av, now.UnixMilli(), hend.UnixMilli(), budget, len(d.index), ntenants)
	av = append(av, d.args...)
	av = append(av, recs)
	ks, av = l.replayArgs(ks, av, groups, src, b)
	if src.late != nil {
		av = append(av, lateArg(groups, src.late))
	} else if src.advance != nil {
		av = append(av, advanceArg(groups, src.advance))
	}
	av = l.capacityArgs(av, groups, now, capFirst)
	b.ks, b.recs, b.av, b.descOf = ks, recs, av, descOf
	return ks, av
}

// callBufs are the buffers one script call's KEYS and ARGV are built in
// (script, replayArgs, admitCmd), kept in a scratch from call to call: a
// batch within its limits allocated about 40 KB of them (issue 23). The
// command holds them until it returns; scratch.release clears what they
// point at.
type callBufs struct {
	ks, av, args []any
	recs, offs   []byte
	descOf       []int64 // the descriptor of each rule of a rule list
}

// clear drops what b's buffers point at (the tenants' keys), keeping their
// arrays.
func (b *callBufs) clear() {
	clear(b.ks[:cap(b.ks)])
	clear(b.av[:cap(b.av)])
	clear(b.args[:cap(b.args)])
}

// call runs admit.lua: one call for the batch on a single node; on Redis
// Cluster one call per tenant (each tenant's keys share a slot), pipelined so
// that go-redis sends one round trip per node, the nodes in parallel.
func (l *Limiter) call(ctx context.Context, s *scratch, now time.Time, calls []*group, src positions, hend time.Time) ([]reply, error) {
	ctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	start := time.Now()
	op := "admit"
	if src.advance != nil {
		op = "advance" // not a batch's decision (Advance)
	}
	defer func() { l.metrics.redisSeconds.WithLabelValues(op).Observe(time.Since(start).Seconds()) }()
	if !l.cluster {
		ks, av := l.script(calls, now, hend, src, l.scanBudget(1), &s.call)
		res, err := l.runAdmit(ctx, ks, av, &s.call).Result()
		if err != nil {
			l.metrics.redisErrors.Inc()
			return nil, fmt.Errorf("admit batch: %w", replayFull(err))
		}
		return l.parseReplies(res, calls, s)
	}
	cmds := make([]*redis.Cmd, len(calls))
	_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range calls {
			ks, av := l.script(calls[i:i+1], now, hend, src, l.scanBudget(len(calls)), nil)
			cmds[i] = l.admitCmd(ctx, ks, av, false, nil)
			_ = p.Process(ctx, cmds[i])
		}
		return nil
	})
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		// A node lost its script cache (restart, failover): send the source.
		// Scripts that did run are not run again: only NOSCRIPT ones failed.
		_, err = l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range calls {
				if cmds[i].Err() != nil && redis.HasErrorPrefix(cmds[i].Err(), "NOSCRIPT") {
					ks, av := l.script(calls[i:i+1], now, hend, src, l.scanBudget(len(calls)), nil)
					cmds[i] = l.admitCmd(ctx, ks, av, true, nil)
					_ = p.Process(ctx, cmds[i])
				}
			}
			return nil
		})
	}
	if err != nil {
		l.metrics.redisErrors.Inc()
		return nil, fmt.Errorf("admit batch: %w", replayFull(err))
	}
	out := make([]reply, len(calls))
	for i, c := range cmds {
		r, err := l.parseReplies(c.Val(), calls[i:i+1], nil)
		if err != nil {
			return nil, err
		}
		out[i] = r[0]
	}
	return out, nil
}

// admitCmd returns the command that runs admit.lua with KEYS ks and ARGV
// av: EVALSHA, or EVAL with the source when eval. It is what
// redis.Script's EvalSha and Eval build, but for the keys: they come boxed,
// most of them once per tenant state rather than once per call (about 300
// allocations per 500-event batch of 10,000 tenants; issue 23). The
// command's arguments are built in b's buffer (nil: a new one).
func (l *Limiter) admitCmd(ctx context.Context, ks, av []any, eval bool, b *callBufs) *redis.Cmd {
	var args []any
	if b != nil {
		args = b.args[:0]
	}
	if cap(args) < 3+len(ks)+len(av) {
		args = make([]any, 0, 3+len(ks)+len(av))
	}
	if eval {
		args = append(args, "eval", lua.Admit)
	} else {
		args = append(args, "evalsha", l.admit.Hash())
	}
	args = append(args, len(ks))
	args = append(args, ks...)
	args = append(args, av...)
	if b != nil {
		b.args = args
	}
	return redis.NewCmd(ctx, args...)
}

// runAdmit runs admit.lua on the single node with KEYS ks and ARGV av, as
// redis.Script.Run does: EVALSHA, then EVAL when the node lacks the script
// (a restart, a failover).
func (l *Limiter) runAdmit(ctx context.Context, ks, av []any, b *callBufs) *redis.Cmd {
	cmd := l.admitCmd(ctx, ks, av, false, b)
	_ = l.rdb.Process(ctx, cmd)
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		cmd = l.admitCmd(ctx, ks, av, true, b)
		_ = l.rdb.Process(ctx, cmd)
	}
	return cmd
}

var errReply = errors.New("admit: unexpected script reply")

// reply is one tenant's part of admit.lua's reply: its numbers, or, when a
// broken key failed the tenant, the reason, or, when the compact reply left
// it out, cached; and its events found in the replay record, which the
// numbers are not about.
type reply struct {
	n      []int64
	failed string
	// cached: the compact reply left the tenant out (see admit.lua's
	// Reply): every event not replayed was admitted, and its ttl chains are
	// the ones the call sent (group.chains).
	cached   bool
	replayed []replayed
	// recordHi is the highest offset of the call's replay record once the
	// call was done (-1: none, or no source).
	recordHi int64
}

// chainNumbers is how many numbers a tenant's reply ends with: the ttl chain
// (start, end) of each of its rules when the window is ttl, else none.
func (l *Limiter) chainNumbers(g *group) int {
	if l.opts.WindowKind == TTL {
		return 2 * len(g.rules)
	}
	return 0
}

// parseReplies splits admit.lua's reply into one reply per group (see
// Reply there). The compact reply (the default) starts with the number of
// tenants it lists and the sum of the new events of the others, which it
// left out (cached), then lists each by its number (1-based) and its full
// part; the full reply (Limiter.fullReply) has every tenant's full part, in
// order. A full part is admitted, reservations, 3 numbers per reservation,
// rejected, full_until, then the ttl chain (start, end) of each rule when
// the window is ttl; or, for a tenant that failed, -1, the broken key and
// what is wrong with it. Then come the events found in the replay record
// (see parseReplayed). The replies and their numbers are in s's slices
// (nil: new ones).
func (l *Limiter) parseReplies(res any, groups []*group, s *scratch) ([]reply, error) {
	arr, ok := res.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: %T", errReply, res)
	}
	if s == nil {
		s = &scratch{}
	}
	if cap(s.flat) < len(arr) {
		s.flat = make([]int64, 0, len(arr))
	}
	flat := s.flat[:0] // never grows past len(arr): the replies' n share it
	s.replies = grow(s.replies, len(groups))
	out := s.replies
	clear(out)
	var err error
	if l.fullReply {
		for i, g := range groups {
			if arr, flat, err = l.parsePart(arr, i, g, &out[i], flat); err != nil {
				return nil, err
			}
		}
		if err := l.parseReplayed(arr, groups, out); err != nil {
			return nil, err
		}
		return out, nil
	}
	if len(arr) < 2 {
		return nil, fmt.Errorf("%w: %v", errReply, arr)
	}
	m, mok := arr[0].(int64)
	sum, sok := arr[1].(int64)
	if !mok || !sok || m < 0 || m > int64(len(groups)) {
		return nil, fmt.Errorf("%w: compact head %v", errReply, arr[:2])
	}
	arr = arr[2:]
	next := 0 // the first group not yet listed or left out
	for range m {
		if len(arr) == 0 {
			return nil, fmt.Errorf("%w: compact: %d tenants listed, the reply ends after %d", errReply, m, next)
		}
		ti, ok := arr[0].(int64)
		if !ok || ti <= int64(next) || ti > int64(len(groups)) {
			return nil, fmt.Errorf("%w: compact: tenant %v after %d of %d", errReply, arr[0], next, len(groups))
		}
		for ; next < int(ti)-1; next++ {
			out[next].cached = true
		}
		i := int(ti) - 1
		if arr, flat, err = l.parsePart(arr[1:], i, groups[i], &out[i], flat); err != nil {
			return nil, err
		}
		next = i + 1
	}
	for ; next < len(groups); next++ {
		out[next].cached = true
	}
	if err := l.parseReplayed(arr, groups, out); err != nil {
		return nil, err
	}
	// The tenants left out had every new event admitted: as many as the
	// script says.
	left := 0
	for i, g := range groups {
		if out[i].cached {
			left += len(g.idx) - len(out[i].replayed)
		}
	}
	if int64(left) != sum {
		return nil, fmt.Errorf("%w: compact: %d new events of the tenants left out, %d in the reply", errReply, left, sum)
	}
	return out, nil
}

// parsePart parses the full part of group g (the i-th) at the start of arr
// into r, its numbers appended to flat, and returns what follows it and flat.
func (l *Limiter) parsePart(arr []any, i int, g *group, r *reply, flat []int64) ([]any, []int64, error) {
	if len(arr) >= 3 && arr[0] == int64(-1) {
		key, kok := arr[1].(string)
		why, wok := arr[2].(string)
		if !kok || !wok {
			return nil, nil, fmt.Errorf("%w: tenant %d: failure %v", errReply, i, arr[:3])
		}
		r.failed = "counter key " + key + " " + why
		return arr[3:], flat, nil
	}
	var nres int64
	if len(arr) >= 2 {
		nres, _ = arr[1].(int64)
	}
	chains := l.chainNumbers(g)
	if nres < 0 || int64(len(arr)-4-chains) < 3*nres {
		return nil, nil, fmt.Errorf("%w: tenant %d: %v", errReply, i, arr)
	}
	n := 4 + chains + 3*int(nres)
	start := len(flat)
	for j, x := range arr[:n] {
		v, ok := x.(int64)
		if !ok {
			return nil, nil, fmt.Errorf("%w: tenant %d: field %d: %T", errReply, i, j, x)
		}
		flat = append(flat, v)
	}
	r.n = flat[start:len(flat):len(flat)]
	return arr[n:], flat, nil
}

// apply turns one tenant's reply into decisions, in the tenant's event order:
// its replayed events get their recorded decisions, the others the reply's.
// nowOnly: the call reached short of the horizon (AdmitNow, AdmitBefore), so
// its rejections say nothing of the horizon.
func (l *Limiter) apply(g *group, rep reply, now time.Time, out []Decision, nowOnly bool) error {
	idx := l.applyReplayed(g, rep.replayed, out)
	if rep.failed != "" {
		for _, i := range idx {
			out[i] = Decision{Kind: Fail, Reason: rep.failed}
		}
		return nil
	}
	if rep.cached {
		for _, i := range idx {
			out[i] = Decision{Kind: Admit}
		}
		return nil
	}
	// The ttl chain (start, end) of each rule follows the fixed fields.
	r := rep.n
	chains := l.chainNumbers(g)
	if len(r) < 4+chains || int64(len(r)) != int64(4+chains)+3*r[1] {
		return fmt.Errorf("%w: %v", errReply, r)
	}
	r = r[:len(r)-chains]
	next := 0
	give := func(n int64, d Decision) {
		for ; n > 0 && next < len(idx); n-- {
			out[idx[next]] = d
			next++
		}
	}
	give(r[0], Decision{Kind: Admit})
	for i := int64(0); i < r[1]; i++ {
		due, cnt, until := r[2+3*i], r[3+3*i], r[4+3*i]
		give(cnt, deferral(due, until))
	}
	reason := scanReason
	if nowOnly {
		reason = NowReason
	}
	if full := r[len(r)-1]; full > 0 && next < len(idx) && !nowOnly {
		reason = l.fullReason
		l.markFull(g, time.UnixMilli(full).Add(-l.opts.Horizon), idx[next])
	}
	give(r[len(r)-2], Decision{Kind: Reject, Reason: reason})
	if next != len(idx) {
		return fmt.Errorf("%w: %d decisions for %d events of tenant %q", errReply, next, len(idx), g.tenant)
	}
	return nil
}
