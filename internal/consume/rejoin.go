package consume

import (
	"context"
	"errors"
	"time"

	"github.com/segmentio/kafka-go"
)

// groupLeaver removes a member from a group; *kafka.Client implements it.
type groupLeaver interface {
	LeaveGroup(ctx context.Context, req *kafka.LeaveGroupRequest) (*kafka.LeaveGroupResponse, error)
}

// staleLeaveEvery is how often leaveStale tries again.
const staleLeaveEvery = 250 * time.Millisecond

// leaveStale removes this member's ID of before a failed join from the group,
// trying every staleLeaveEvery until the coordinator has done so or no longer
// knows the ID, ctx is done, or gone reports true.
//
// After a broker restart the coordinator loads the group with the members of
// its last generation, each with a fresh session, and a join under a new ID
// starts a rebalance that waits for them: for their sessions to expire, since
// they never come back under those IDs (kafka-go drops its member ID after a
// failed join, and its own leave under the old ID fails while the broker is
// away). Every member's rejoin then waits a whole session after the broker's
// return, and deferred events due meanwhile come back that late (5 to 11 s in
// the fault suite). Leaving under the old ID as soon as the coordinator answers
// lets the rebalance complete once the members have joined again. The tries
// go on through an outage of any length: the coordinator only starts the old
// ID's session again when it loads the group.
func (m *member) leaveStale(ctx context.Context, l groupLeaver, memberID string, gone func() bool) {
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
		switch {
		case err == nil:
			m.log.Info("left the group under this member's ID of before the failed join, so that the rejoin need not wait for its session to expire",
				"member", memberID)
			return
		case errors.Is(err, kafka.UnknownMemberId):
			return // gone already
		}
		if !sleep(ctx, staleLeaveEvery) {
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
