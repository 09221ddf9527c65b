package consume

import (
	"context"
	"errors"
	"time"

	"github.com/segmentio/kafka-go"
)

// Leases: a crashed member's partitions move within a lease, not a session.
//
// Kafka moves the partitions of a member that crashed (SIGKILL, a node lost)
// only once its session times out: Kafka's group.min.session.timeout.ms is 6s
// by default, and the retry tiers' events whose slot runs out meanwhile are
// late. With Config.Leases set, every member renews a short lease of its own
// (LeaseTTL) while it takes part in a generation, and watches its peers'
// leases: a peer whose lease it has seen held and which then ends is removed
// from the group on its behalf (LeaveGroup with the peer's member ID, which
// the coordinator accepts from any member), so the group rebalances at once
// and the partitions move after about a lease plus a heartbeat.
//
// A peer is never removed on a lease it has not been seen to hold (a member
// of an older version that renews none; a member that just joined), and a
// member removes nobody unless its own renewals have gone through without a
// gap for a whole LeaseTTL: when the lease store itself stalls (a Redis
// freeze), every lease ends at once, and the members wait until the live
// ones have renewed again. Removing a live member by mistake (a process
// paused longer than LeaseTTL) costs a rebalance and, at worst, the batch it
// was handling handled again: at least once, as after a crash.
//
// A member's lease also bounds its write fence (fence.go). A member cut off
// from Redis (not from Kafka) is removed by its peers once its lease ends,
// and its partitions' next owner may write as soon as the group has
// rebalanced, while the removed member learns it only from its next
// heartbeat: meanwhile it would forward what it holds a second time. So each
// renewal that goes through extends the generation's fence to the time it
// was sent plus three quarters of LeaseTTL: the lease it set cannot end
// before the time it was sent plus LeaseTTL, and no peer removes the member
// before that. Once renewals fail for that long, the fence ends, and with it
// the generation: the member commits what it finished and rejoins, before a
// peer may remove it. The bound starts with the generation's first renewal
// that goes through: a peer checks leases only after a whole LeaseTTL of its
// own renewals in the generation, so a lease not renewed in it cannot have
// been seen held, and a member that rejoins while Redis is still out of reach
// goes on writing (no one removes it). A removal that a peer decided in the
// old generation cannot end the next one: kafka-go rejoins only once every
// routine of a generation has returned, the peer's lease watch included, so
// the peer's LeaveGroup has been answered (or cancelled) before its own
// JoinGroup goes out, and the removed member's pending join is refused (it
// joins again under a new ID; TestCutRedis shows it). The price: when the
// lease store stalls for three quarters of LeaseTTL (a Redis freeze), every
// member ends its generation once, and the group rebalances.

// Leases keeps the members' leases of consumer groups. Implementations must
// be safe for concurrent use.
type Leases interface {
	// Renew sets member's lease of group to end ttl from now.
	Renew(ctx context.Context, group, member string, ttl time.Duration) error
	// Held reports, index-aligned with members, whose lease of group has
	// not ended.
	Held(ctx context.Context, group string, members []string) ([]bool, error)
}

// DefaultLeaseTTL is the default of Config.LeaseTTL.
const DefaultLeaseTTL = 2 * time.Second

// leaseWatch is one member's renewal and watch of a generation's leases.
type leaseWatch struct {
	m   *member
	gen *kafka.Generation
	// streak is when the current run of gap-free renewals began (zero:
	// the last renewal failed); last is the last renewal that went through.
	streak, last time.Time
	// seen are the peers whose lease this member saw held.
	seen map[string]bool
	// fence is the generation's write fence, which each renewal extends.
	fence *WriteFence
}

// watchLeases renews this member's lease and removes peers whose lease
// ended, every LeaseTTL/5, until gctx is done (the generation ended).
func (m *member) watchLeases(gctx context.Context, gen *kafka.Generation, fence *WriteFence) {
	w := &leaseWatch{m: m, gen: gen, seen: map[string]bool{}, fence: fence}
	tick := time.NewTicker(m.cfg.LeaseTTL / 5)
	defer tick.Stop()
	for {
		w.round(gctx, time.Now())
		select {
		case <-gctx.Done():
			return
		case <-tick.C:
		}
	}
}

// round renews once and, when the renewals have gone through for a whole
// LeaseTTL, checks the peers.
func (w *leaseWatch) round(ctx context.Context, now time.Time) {
	c := w.m.cfg
	ctx, cancel := context.WithTimeout(ctx, c.LeaseTTL/2)
	defer cancel()
	if err := c.Leases.Renew(ctx, w.gen.GroupID, w.gen.MemberID, c.LeaseTTL); err != nil {
		if !w.streak.IsZero() {
			w.m.log.Warn("renewing the member's lease failed", "err", err)
		}
		w.streak = time.Time{}
		return
	}
	w.fence.extendLease(now.Add(c.LeaseTTL - c.LeaseTTL/4))
	if w.streak.IsZero() || now.Sub(w.last) > c.LeaseTTL/2 {
		w.streak = now
	}
	w.last = now
	if now.Sub(w.streak) < c.LeaseTTL {
		return
	}
	peers, err := w.peers(ctx)
	if err != nil {
		w.m.log.Debug("listing the group's members failed", "err", err)
		return
	}
	held, err := c.Leases.Held(ctx, w.gen.GroupID, peers)
	if err != nil || len(held) != len(peers) {
		w.m.log.Debug("reading the members' leases failed", "err", err)
		return
	}
	present := map[string]bool{}
	var ended []string
	for i, p := range peers {
		present[p] = true
		switch {
		case held[i]:
			w.seen[p] = true
		case w.seen[p]:
			ended = append(ended, p)
		}
	}
	for p := range w.seen {
		if !present[p] {
			delete(w.seen, p) // gone from the group
		}
	}
	for _, p := range ended {
		w.remove(ctx, p)
	}
}

// peers lists the other members of the group.
func (w *leaseWatch) peers(ctx context.Context) ([]string, error) {
	res, err := w.m.client.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{w.gen.GroupID}})
	if err != nil {
		return nil, err
	}
	if len(res.Groups) != 1 {
		return nil, errors.New("no description of the group")
	}
	if err := res.Groups[0].Error; err != nil {
		return nil, err
	}
	var ids []string
	for _, mb := range res.Groups[0].Members {
		if mb.MemberID != w.gen.MemberID {
			ids = append(ids, mb.MemberID)
		}
	}
	return ids, nil
}

// remove removes peer, whose lease ended, from the group.
func (w *leaseWatch) remove(ctx context.Context, peer string) {
	delete(w.seen, peer)
	res, err := w.m.client.LeaveGroup(ctx, &kafka.LeaveGroupRequest{GroupID: w.gen.GroupID,
		Members: []kafka.LeaveGroupRequestMember{{ID: peer}}})
	if err == nil && res.Error != nil {
		err = res.Error
	}
	if err == nil && len(res.Members) == 1 && res.Members[0].Error != nil {
		err = res.Members[0].Error
	}
	if err != nil {
		w.m.log.Debug("removing a member whose lease ended failed", "peer", peer, "err", err)
		return
	}
	w.m.log.Warn("a member's lease ended: removed it from the group so that its partitions move now", "peer", peer)
	if w.m.cfg.OnLeaseEnded != nil {
		w.m.cfg.OnLeaseEnded()
	}
}
