package consume

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	fetchAPI "github.com/segmentio/kafka-go/protocol/fetch"
	"github.com/segmentio/kafka-go/protocol/offsetfetch"
)

// countingTransport counts CloseIdleConnections; it answers no request.
type countingTransport struct{ dropped atomic.Int32 }

func (c *countingTransport) RoundTrip(context.Context, net.Addr, kafka.Request) (kafka.Response, error) {
	return nil, errors.New("not used")
}

func (c *countingTransport) CloseIdleConnections() { c.dropped.Add(1) }

// A fetch that fails because the transport's cached metadata names no leader
// (read while the restarted broker was electing them) drops that metadata,
// so that the next fetch reads it afresh rather than failing until
// MetadataTTL; once per routeRefreshEvery, however many partitions fail.
// Other failures (the broker away) keep it.
func TestStaleRoutesRefreshMetadata(t *testing.T) {
	tr := &countingTransport{}
	m, err := newMember(Config{Brokers: []string{"127.0.0.1:1"}, GroupID: "g", Topics: []string{"t"},
		Transport: tr, BackoffMin: time.Millisecond, BackoffMax: time.Millisecond},
		HandlerFunc(func(context.Context, Batch) error { return nil }), func(*partition, context.Context, context.Context) {})
	if err != nil {
		t.Fatal(err)
	}
	p := &partition{topic: "t", id: 1, cfg: &m.cfg, log: m.log, staleRoutes: m.refreshRoutes}
	noLeader := fmt.Errorf("fetch t/1 at 5: %w", fetchAPI.NewError(protocol.NewErrNoLeader("t", 1)))
	noTopic := fmt.Errorf("fetch t/1 at 5: %w", fetchAPI.NewError(protocol.NewErrNoTopic("t")))
	for _, tc := range []struct {
		name string
		err  error
		want int32
	}{
		{"connection refused", fmt.Errorf("fetch t/1 at 5: %w", syscall.ECONNREFUSED), 0},
		{"no leader in the cached metadata", noLeader, 1},
		{"again within a second (another partition)", noLeader, 1},
		{"broker not available (list offsets)", fmt.Errorf("list offsets: %w", kafka.BrokerNotAvailable), 1},
	} {
		p.fetchFailed(context.Background(), 0, tc.err)
		if got := tr.dropped.Load(); got != tc.want {
			t.Errorf("%s: metadata dropped %d times, want %d", tc.name, got, tc.want)
		}
	}
	m.routesRefreshed.Store(time.Now().Add(-routeRefreshEvery).UnixNano())
	p.fetchFailed(context.Background(), 0, fmt.Errorf("fetch t/1: %w", kafka.NotLeaderForPartition))
	if got := tr.dropped.Load(); got != 2 {
		t.Errorf("not leader, a second later: metadata dropped %d times in all, want 2", got)
	}
	// Metadata read as the broker first answered may lack the topic.
	m.routesRefreshed.Store(time.Now().Add(-routeRefreshEvery).UnixNano())
	p.fetchFailed(context.Background(), 0, noTopic)
	if got := tr.dropped.Load(); got != 3 {
		t.Errorf("topic not in the cached metadata: metadata dropped %d times in all, want 3", got)
	}
}

// After a stale route the request is tried again within routeRefreshEvery,
// however far the backoff has grown while the broker was away; other
// failures keep the backoff.
func TestStaleRouteRetrySoon(t *testing.T) {
	c := &Config{BackoffMin: 4 * time.Second, BackoffMax: 8 * time.Second}
	noTopic := fmt.Errorf("fetch t/1 at 5: %w", fetchAPI.NewError(protocol.NewErrNoTopic("t")))
	for attempt := range 6 {
		if d := c.retryWait(attempt, noTopic); d > routeRefreshEvery {
			t.Errorf("attempt %d after a stale route: wait %v, want at most %v", attempt, d, routeRefreshEvery)
		}
		if d := c.retryWait(attempt, syscall.ECONNREFUSED); d < 2*time.Second {
			t.Errorf("attempt %d after a refused connection: wait %v, want the backoff (at least 2s)", attempt, d)
		}
	}
}

// offsetFetchTransport fails the first failures OffsetFetch requests with
// BROKER_NOT_AVAILABLE (the coordinator not in the cached metadata), then
// answers with no offsets; it counts CloseIdleConnections.
type offsetFetchTransport struct {
	countingTransport
	failures int32
	calls    atomic.Int32
}

func (o *offsetFetchTransport) RoundTrip(_ context.Context, _ net.Addr, req kafka.Request) (kafka.Response, error) {
	if _, ok := req.(*offsetfetch.Request); !ok {
		return nil, errors.New("not used")
	}
	if o.calls.Add(1) <= o.failures {
		return nil, kafka.BrokerNotAvailable
	}
	return &offsetfetch.Response{}, nil
}

// Reading the retry partitions' commit metadata through metadata that does
// not name the coordinator drops that metadata and tries again within
// routeRefreshEvery: with the backoff grown to seconds it gave up before,
// and handled again the events the commit metadata says are done.
func TestFetchMetadataRefreshesStaleRoutes(t *testing.T) {
	tr := &offsetFetchTransport{failures: 1}
	m, err := newMember(Config{Brokers: []string{"127.0.0.1:1"}, GroupID: "g", Topics: []string{"t"},
		Transport: tr, BackoffMin: 10 * time.Second, BackoffMax: 10 * time.Second, SessionTimeout: 3 * time.Second},
		HandlerFunc(func(context.Context, Batch) error { return nil }), func(*partition, context.Context, context.Context) {})
	if err != nil {
		t.Fatal(err)
	}
	gen := &kafka.Generation{ID: 1, GroupID: "g", MemberID: "m",
		Assignments: map[string][]kafka.PartitionAssignment{"t": {{ID: 0, Offset: 5}}}}
	start := time.Now()
	m.fetchMetadata(context.Background(), gen)
	if got := tr.calls.Load(); got != 2 {
		t.Errorf("offset fetches: %d, want 2 (one failed, one answered)", got)
	}
	if got := tr.dropped.Load(); got != 1 {
		t.Errorf("metadata dropped %d times, want 1", got)
	}
	if took := time.Since(start); took > routeRefreshEvery+time.Second {
		t.Errorf("took %v, want within about routeRefreshEvery", took)
	}
}
