package consume

import (
	"errors"
	"time"

	"github.com/segmentio/kafka-go"
)

// Joining while the coordinator loads the group.
//
// After a broker restart the coordinator answers joins with
// NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE or COORDINATOR_LOAD_IN_PROGRESS
// until it has loaded the group: 0.3 to 4.7 s after the broker was listening
// again, on Kafka 3.9 and 4.4 alike (TestBrokerRestart on a loaded machine,
// 2026-12-02). The first joins after the load decide when the group
// rebalances: with kafka-go's one JoinGroupBackoff between attempts (plus the
// join's own round trips to a busy broker, 0.2 to 0.8 s), the members' joins
// arrived 0.5 to 1.3 s after the load and far apart, so that on 3.9 the group
// rebalanced twice (one member, then three). So with
// Config.CoordinatorJoinBackoff set, kafka-go is given that shorter wait, and
// consume waits the rest of JoinGroupBackoff itself after any other failed
// join: a join is tried again within CoordinatorJoinBackoff (plus its round
// trips) while the coordinator says it is on its way, and no more often than
// before otherwise (a broker that refuses connections, a denied group).
//
// The wait delays kafka-go's next attempt only through consume taking its
// result later: kafka-go tries again CoordinatorJoinBackoff after a failure
// was taken, so a result taken after the wait can be up to the wait old. Right
// after the broker's return that costs up to JoinGroupBackoff minus
// CoordinatorJoinBackoff: in TestFaultMix two members took a
// COORDINATOR_LOAD_IN_PROGRESS 0.4 s after the group had loaded, and the group
// rebalanced twice. Waiting only after errors that no retry mends (a denied
// group) would remove it, at the price of a dial every CoordinatorJoinBackoff
// while the broker is away.

// coordinatorNotReady reports whether a failed join says the coordinator is
// there but has not loaded the group yet (or is moving): worth trying again
// at once.
func coordinatorNotReady(err error) bool {
	return errors.Is(err, kafka.GroupLoadInProgress) || errors.Is(err, kafka.GroupCoordinatorNotAvailable) ||
		errors.Is(err, kafka.NotCoordinatorForGroup)
}

// kafkaJoinBackoff is the JoinGroupBackoff kafka-go is given.
func (c *Config) kafkaJoinBackoff() time.Duration {
	if c.fastJoin() {
		return c.CoordinatorJoinBackoff
	}
	return c.JoinGroupBackoff
}

// fastJoin reports whether joins are retried sooner while the coordinator
// loads (CoordinatorJoinBackoff set and below JoinGroupBackoff).
func (c *Config) fastJoin() bool {
	return c.CoordinatorJoinBackoff > 0 && c.CoordinatorJoinBackoff < c.JoinGroupBackoff
}

// joinRetryWait is how long consume waits, after the join failure err,
// before it takes kafka-go's next attempt: nothing beyond kafka-go's own wait
// while the coordinator loads, the rest of JoinGroupBackoff otherwise.
func (c *Config) joinRetryWait(err error) time.Duration {
	if !c.fastJoin() || coordinatorNotReady(err) {
		return 0
	}
	return c.JoinGroupBackoff - c.CoordinatorJoinBackoff
}

// joinFailLogEvery is how often a join failing in the same way is logged
// again at warning level (it may be tried ten times a second).
const joinFailLogEvery = 5 * time.Second

// joinFailures logs the failed joins of one outage: a warning at the first
// failure, whenever the error changes and every joinFailLogEvery, the rest
// at debug level. The zero value is ready; reset it after a join.
type joinFailures struct {
	last   string
	logged time.Time
	n      int // failures since the last warning
}

// failed logs the failed join err.
func (j *joinFailures) failed(log interface {
	Warn(string, ...any)
	Debug(string, ...any)
}, err error) {
	j.n++
	if msg := err.Error(); msg != j.last || time.Since(j.logged) >= joinFailLogEvery {
		log.Warn("join consumer group failed; retrying", "err", err, "failed_since_last_warning", j.n)
		j.last, j.logged, j.n = msg, time.Now(), 0
		return
	}
	log.Debug("join consumer group failed; retrying", "err", err)
}
