package limit

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// MissedSlot is the slot of a deferred event that came back after the slot
// had ended (a crash or a broker restart held it up): the event is checked
// again as new, and its first slot, which no event used, is given back with
// Release so that the window counts stay equal to the events. It is a value
// type.
type MissedSlot struct {
	Tenant string
	// Due is the event's gk-due: the time its slot was reserved at, which
	// every rule's window holding it counted.
	Due time.Time
	// Cost is what the event counted (as for AdmitCosts).
	Cost Cost
	// Trip names this deferral of the event uniquely and for good (its
	// origin partition and offset, and its attempt): Release takes a trip's
	// slot back once, however often it is called for it.
	Trip string
	// Rules, if set, are the rules whose windows counted the slot (the
	// tenant's rules when it was reserved, e.g. before a raise); nil: the
	// tenant's rules in force.
	Rules []Rule
}

// releaseMarkerTTL is how long Release remembers a trip it took back: as
// long as a replay record, the longest a redelivered batch is recognised.
const releaseMarkerTTL = ReplayRecordTTL

// Release gives back the missed slots, each once (a marker per trip, kept
// releaseMarkerTTL): every rule of the slot (MissedSlot.Rules, else the
// tenant's rules now in force), in the aligned window that holds Due,
// counts the event's cost less; but a slot that a late event took (the
// tenant's record of takes holds some under Due: AdmitLate) is not the
// event's to give back, since the late event was forwarded in it
// uncounted: the event gives it up instead, using up its cost of the take
// (as a claim that finds its slot taken), and no window counts less. A
// slot given back before its Due (an event admitted or moved early) uses up
// no take, since takes may still come to its window and would take the
// slot again; beside a take it is not given back either (given back, the
// window could count fewer than its takes hold): the window is stricter by
// one. It
// returns how many slots it took back (not those given up to a take). Slots of TTL windows are not taken back (their window
// depends on the chain's anchor at the time of the deferral): Release
// returns 0 for them without error. One round trip per Redis node; an
// error means Redis trouble and the caller retries (nothing is taken back
// twice).
func (l *Limiter) Release(ctx context.Context, slots []MissedSlot) (int, error) {
	if l.opts.WindowKind != Aligned || len(slots) == 0 {
		return 0, nil
	}
	rules := l.Rules()
	type call struct {
		keys []string
		args []any
	}
	var calls []call
	now := l.opts.Clock()
	for _, s := range slots {
		rs := rules.For(s.Tenant)
		if s.Rules != nil {
			rs = s.Rules
		}
		if len(rs) == 0 || s.Trip == "" {
			continue
		}
		early := 0
		if s.Due.After(now) {
			early = 1
		}
		c := call{keys: []string{l.keys.tenant(s.Tenant) + ":released:" + s.Trip, l.keys.taken(s.Tenant)},
			args: []any{releaseMarkerTTL.Milliseconds(), s.Due.UnixMilli(), s.Cost.Bytes, s.Cost.Units, early}}
		for _, r := range rs {
			c.keys = append(c.keys, l.keys.window(s.Tenant, r, alignedStart(r, s.Due, l.opts.Location)))
			c.args = append(c.args, s.Cost.of(r.Measure))
		}
		calls = append(calls, c)
	}
	if len(calls) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	run := func(eval func(p redis.Pipeliner, c call) *redis.Cmd) ([]*redis.Cmd, error) {
		cmds := make([]*redis.Cmd, len(calls))
		_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, c := range calls {
				cmds[i] = eval(p, c)
			}
			return nil
		})
		return cmds, err
	}
	cmds, err := run(func(p redis.Pipeliner, c call) *redis.Cmd { return l.release.EvalSha(ctx, p, c.keys, c.args...) })
	if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		cmds, err = run(func(p redis.Pipeliner, c call) *redis.Cmd { return l.release.Eval(ctx, p, c.keys, c.args...) })
	}
	if err != nil {
		return 0, fmt.Errorf("release missed slots: %w", err)
	}
	n := 0
	for _, c := range cmds {
		if v, _ := c.Int(); v == 1 {
			n++
		}
	}
	return n, nil
}
