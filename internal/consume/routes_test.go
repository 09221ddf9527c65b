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
}
