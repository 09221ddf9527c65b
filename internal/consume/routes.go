package consume

import (
	"errors"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
)

// Stale routes after a broker restart.
//
// kafka-go's Transport routes each request by the metadata it cached, and
// refreshes that cache only every MetadataTTL (15s in Gatekeeper). Metadata
// read while a restarted broker was still electing its partitions' leaders
// says they have none, and every fetch of those partitions then fails in the
// client ("topic partition has no leader", or BROKER_NOT_AVAILABLE for the
// offsets) without being sent, until the cache is refreshed: a retry
// partition fetched nothing for 4.7 s after its assignment, while the
// broker led it (TestBrokerRestart on Kafka 4.4, 2026-12-02). Metadata read
// in the moment the broker first answers may even lack the topics: fetches
// then fail with "topic not found", and a member's source partitions fetched
// nothing for 9 s after their assignment (their retries 4 s apart by then),
// and its retry group's generation started 6 s after the others'
// (TestBrokerRestart, Kafka 4.4, 2026-12-02: the deferrals those partitions
// decided again came back 10.5 s after the broker's first answer). A request
// to a coordinator the metadata does not name fails alike
// (BROKER_NOT_AVAILABLE), as the read of the retry partitions' commit
// metadata may. So such a failure drops the transport's pools
// (CloseIdleConnections: requests in flight finish on theirs), and the next
// request reads the metadata afresh; at most once per routeRefreshEvery per
// member, since every partition fails alike. The failed request is tried
// again within routeRefreshEvery, not after a backoff grown while the broker
// was away.

// routeRefreshEvery is the least time between two refreshes of one member.
const routeRefreshEvery = time.Second

// staleRoute reports whether a failed request says the client's metadata
// named no leader, or a leader that is not one, or lacked the topic or
// partition.
func staleRoute(err error) bool {
	return errors.Is(err, protocol.ErrNoLeader) || errors.Is(err, kafka.BrokerNotAvailable) ||
		errors.Is(err, kafka.LeaderNotAvailable) || errors.Is(err, kafka.NotLeaderForPartition) ||
		errors.Is(err, protocol.ErrNoTopic) || errors.Is(err, protocol.ErrNoPartition)
}

// retryWait is the wait before retry number attempt of a request that
// failed with err: the member's backoff, at most routeRefreshEvery after a
// stale route (the metadata has just been dropped, or will be at the next
// try).
func (c *Config) retryWait(attempt int, err error) time.Duration {
	d := c.backoff(attempt)
	if staleRoute(err) {
		d = min(d, routeRefreshEvery)
	}
	return d
}

// refreshRoutes drops the cached metadata and connections of the member's
// transport (when it can: a *kafka.Transport can), at most once per
// routeRefreshEvery. Safe for concurrent use.
func (m *member) refreshRoutes() {
	t, ok := m.cfg.Transport.(interface{ CloseIdleConnections() })
	if !ok {
		return
	}
	now := time.Now().UnixNano()
	last := m.routesRefreshed.Load()
	if now-last < int64(routeRefreshEvery) || !m.routesRefreshed.CompareAndSwap(last, now) {
		return
	}
	t.CloseIdleConnections()
	m.log.Info("a request found no leader or topic in the cached metadata: dropped the transport's metadata and connections, so that the next request reads them afresh")
}
