package route

import (
	"context"
	"fmt"
	"strconv"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// SlotReleaser gives back the slots of deferred events that came back after
// their slot ended (see limit.MissedSlot); *limit.Limiter implements it. An
// Admitter that also implements it has the Retrier give back the slot of
// every late event it checks again, so that each event is counted in one
// window only. Release must take a trip's slot back at most once however
// often it is called for it, and be safe for concurrent use.
type SlotReleaser interface {
	Release(ctx context.Context, slots []limit.MissedSlot) (int, error)
}

// missedSlot returns the slot of d, a deferral checked again after its slot.
// The trip names the deferral for good: its origin position, its attempt and
// its due time.
func missedSlot(d Deferral, cost limit.Cost) limit.MissedSlot {
	return limit.MissedSlot{Tenant: d.Tenant, Due: d.Due, Cost: cost,
		Trip: d.OriginTopic + ":" + strconv.Itoa(d.OriginPartition) + ":" + strconv.FormatInt(d.OriginOffset, 10) +
			":" + strconv.Itoa(d.Attempt) + ":" + strconv.FormatInt(d.Due.UnixMilli(), 10)}
}

// releaseMissed gives back the missed slots of the batch's late events once
// they are decided (checked by Redis: the slots are only given back when
// the events were counted again).
func (r *Retrier) releaseMissed(ctx context.Context, slots []limit.MissedSlot) error {
	rel, ok := r.Admitter.(SlotReleaser)
	if !ok || len(slots) == 0 {
		return nil
	}
	n, err := rel.Release(ctx, slots)
	if err != nil {
		return fmt.Errorf("give back missed slots: %w", err)
	}
	r.Metrics.released(n)
	return nil
}
