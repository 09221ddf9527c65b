package consume

import (
	"errors"
	"io"
	"net"
	"syscall"
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
// consume waits the rest of JoinGroupBackoff itself only after a join the
// broker refused for another reason (a denied group, a bad configuration:
// trying sooner mends nothing). While the broker is away (refused or broken
// connections) or its coordinator says it is on its way, a join is tried
// again within CoordinatorJoinBackoff plus its round trips: a dial every 0.1 s
// that a stopped broker refuses at once.
//
// The wait cannot come before kafka-go's attempt, only before consume takes
// its result: kafka-go tries again CoordinatorJoinBackoff after a failure was
// taken, so a result taken after a wait is up to the wait old. So no wait
// follows the errors of a broker's return: with one after connection errors,
// two members of TestFaultMix took a COORDINATOR_LOAD_IN_PROGRESS 0.4 s after
// the group had loaded, and the group rebalanced twice.

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

// brokerAway reports whether a failed join found no broker to answer it: a
// refused, broken or timed-out connection (a broker stopped or restarting).
func brokerAway(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// joinRetryWait is how long consume waits, after the join failure err,
// before it takes kafka-go's next attempt: nothing beyond kafka-go's own wait
// while the broker is away or its coordinator loads, the rest of
// JoinGroupBackoff after any other answer.
func (c *Config) joinRetryWait(err error) time.Duration {
	if !c.fastJoin() || coordinatorNotReady(err) || brokerAway(err) {
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
