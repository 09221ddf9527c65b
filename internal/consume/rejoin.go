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
// trying every staleLeaveEvery for up to a session timeout (after which the
// coordinator has removed it anyway).
//
// After a broker restart the coordinator loads the group with the members of
// its last generation, and a join under a new ID starts a rebalance that
// waits for them: for their sessions to expire, since they never come back
// under those IDs (kafka-go drops its member ID after a failed join). Every
// member's rejoin then waits for a whole session after the broker's return,
// and deferred events due meanwhile come back that late (5 to 11 s in the
// fault suite). Leaving under the old ID as soon as the coordinator answers
// lets the rebalance complete as soon as the members have joined again.
func (m *member) leaveStale(ctx context.Context, l groupLeaver, memberID string) {
	until := time.Now().Add(m.cfg.sessionOrDefault())
	for time.Now().Before(until) {
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
