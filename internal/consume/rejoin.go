package consume

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
)

// groupLeaver removes a member from a group; *kafka.Client implements it.
type groupLeaver interface {
	LeaveGroup(ctx context.Context, req *kafka.LeaveGroupRequest) (*kafka.LeaveGroupResponse, error)
}

// staleLeaver is leaveStale's client: one of its own, whose connections are
// dropped after every failure that is not an answer of Kafka's, so that the
// next try dials afresh. Right after a broker restart a pooled connection from
// before it fails once used ("unexpected EOF"), and a transport that has many
// (the writers' share Config.Transport) handed one to try after try: a leave
// failed six times in a row for 1.3 s after the group was loaded, and the
// rebalance waited for it (TestBrokerRestart on Kafka 4.4, 2026-12-02).
type staleLeaver struct {
	c *kafka.Client
	t interface{ CloseIdleConnections() }
}

// newStaleLeaver returns a staleLeaver with a transport of its own, built
// from the Dialer's TLS, SASL and client ID as Config's default is.
func (m *member) newStaleLeaver() *staleLeaver {
	d := m.cfg.Dialer
	t := &kafka.Transport{ClientID: d.ClientID, DialTimeout: m.cfg.Timeout, TLS: d.TLS, SASL: d.SASLMechanism}
	return &staleLeaver{c: &kafka.Client{Addr: m.client.Addr, Timeout: m.cfg.Timeout, Transport: t}, t: t}
}

// LeaveGroup sends req; after a failure other than Kafka's answer it drops
// the transport's connections.
func (l *staleLeaver) LeaveGroup(ctx context.Context, req *kafka.LeaveGroupRequest) (*kafka.LeaveGroupResponse, error) {
	res, err := l.c.LeaveGroup(ctx, req)
	if err != nil && !errors.As(err, new(kafka.Error)) {
		l.t.CloseIdleConnections()
	}
	return res, err
}

// close drops the transport's connections.
func (l *staleLeaver) close() { l.t.CloseIdleConnections() }

// staleLeaveEvery is how often leaveStale tries again (in ns; a variable
// for tests, atomic since a leaveStale of an earlier test may still read it).
var staleLeaveEvery atomic.Int64

func init() { staleLeaveEvery.Store(int64(250 * time.Millisecond)) }

// leaveStale removes this member's ID of before a failed join from the group,
// trying every staleLeaveEvery until gone reports true or ctx is done.
//
// After a broker restart the coordinator loads the group with the members of
// its last generation, each with a fresh session, and a join under a new ID
// starts a rebalance that waits for them: for their sessions to expire, since
// they never come back under those IDs (kafka-go drops its member ID after a
// failed join, and its own leave under the old ID fails while the broker is
// away). Every member's rejoin then waits a whole session after the broker's
// return, and deferred events due meanwhile come back that late (5 to 11 s in
// the fault suite). Leaving under the old ID once the group is loaded lets
// the rebalance complete as soon as the members have joined again.
//
// A leave that succeeds does not end the tries: Kafka 4.4 answered leaves
// without an error about five seconds before it had loaded the group (joins
// still got NOT_COORDINATOR, then GROUP_LOAD_IN_PROGRESS), and the group then
// loaded with the old ID, whose session the rejoin waited out (TestBrokerRestart,
// 2026-12-02). Nor does UNKNOWN_MEMBER_ID: a coordinator that has not loaded the
// group does not know the ID yet. So the leave is repeated until a generation
// after the failure has lasted a session (gone): leaving under an ID that the
// group does not hold changes nothing, and kafka-go never joins under an old
// ID again.
func (m *member) leaveStale(ctx context.Context, l groupLeaver, memberID string, gone func() bool) {
	left := false
	for !gone() {
		lctx, cancel := context.WithTimeout(ctx, min(m.cfg.Timeout, time.Second))
		res, err := l.LeaveGroup(lctx, &kafka.LeaveGroupRequest{GroupID: m.cfg.GroupID,
			Members: []kafka.LeaveGroupRequestMember{{ID: memberID}}})
		cancel()
		if err == nil && res.Error != nil {
			err = res.Error
		}
		if err == nil && len(res.Members) == 1 && res.Members[0].Error != nil {
			err = res.Members[0].Error
		}
		if err == nil && !left {
			left = true
			m.log.Info("left the group under this member's ID of before the failed join, so that the rejoin need not wait for its session to expire; repeating until a new generation has lasted a session",
				"member", memberID)
		} else if err != nil && !errors.Is(err, kafka.UnknownMemberId) {
			m.log.Debug("leaving under the member's ID of before the failed join failed; retrying", "member", memberID, "err", err)
		}
		if !sleep(ctx, time.Duration(staleLeaveEvery.Load())) {
			return
		}
	}
}

// staleGone returns the gone function of leaveStale: true once a generation
// that started after now has lasted a session timeout (the coordinator has
// dropped the old ID by then).
func (m *member) staleGone(now time.Time) func() bool {
	return func() bool {
		at := m.lastGenStart.Load()
		return at > now.UnixNano() && time.Since(time.Unix(0, at)) > m.cfg.sessionOrDefault()
	}
}
