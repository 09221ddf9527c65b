package consume

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/leavegroup"
)

// fakeLeaver fails the first fails LeaveGroup calls as an unreachable broker
// does, then answers with code; it records the member IDs asked to leave.
type fakeLeaver struct {
	mu    sync.Mutex
	fails int
	code  error
	ids   []string
}

func (l *fakeLeaver) LeaveGroup(_ context.Context, req *kafka.LeaveGroupRequest) (*kafka.LeaveGroupResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, mb := range req.Members {
		l.ids = append(l.ids, mb.ID)
	}
	if len(l.ids) <= l.fails {
		return nil, syscall.ECONNREFUSED
	}
	return &kafka.LeaveGroupResponse{Error: l.code}, nil
}

// After a failed join (the broker away, for as long as it takes), the
// member's ID of the last generation is removed from the group as soon as
// the coordinator answers, so that the rejoin under kafka-go's new ID need
// not wait for the old one's session to expire; and again until a new
// generation has lasted a session (gone), since a coordinator that has not
// loaded the group yet answers a leave without an error or with
// UNKNOWN_MEMBER_ID, and then loads the group with the old ID.
func TestLeaveStale(t *testing.T) {
	defer staleLeaveEvery.Store(staleLeaveEvery.Load())
	staleLeaveEvery.Store(int64(time.Millisecond))
	for _, tc := range []struct {
		name  string
		fails int
		code  error
	}{
		{"left once the broker answers, however long it was away, and again until gone", 8, nil},
		{"not known yet: tried again until gone", 0, kafka.UnknownMemberId},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := newMember(Config{Brokers: []string{"127.0.0.1:1"}, GroupID: "g", Topics: []string{"t"}, SessionTimeout: time.Second},
				HandlerFunc(func(context.Context, Batch) error { return nil }), func(*partition, context.Context, context.Context) {})
			if err != nil {
				t.Fatal(err)
			}
			l := &fakeLeaver{fails: tc.fails, code: tc.code}
			const goneAfter = 20 // calls
			m.leaveStale(context.Background(), l, "old-member", func() bool {
				l.mu.Lock()
				defer l.mu.Unlock()
				return len(l.ids) >= goneAfter
			})
			if len(l.ids) != goneAfter {
				t.Errorf("LeaveGroup calls: got %d, want %d (every try until gone)", len(l.ids), goneAfter)
			}
			for _, id := range l.ids {
				if id != "old-member" {
					t.Errorf("left under %q, want old-member", id)
				}
			}
		})
	}
}

// The tries end once a later generation has lasted a session: the
// coordinator has dropped the old ID by then.
func TestLeaveStaleEndsAfterANewGeneration(t *testing.T) {
	m, err := newMember(Config{Brokers: []string{"127.0.0.1:1"}, GroupID: "g", Topics: []string{"t"}, SessionTimeout: 50 * time.Millisecond},
		HandlerFunc(func(context.Context, Batch) error { return nil }), func(*partition, context.Context, context.Context) {})
	if err != nil {
		t.Fatal(err)
	}
	gone := m.staleGone(time.Now())
	if gone() {
		t.Fatal("gone before any generation: got true, want false")
	}
	m.lastGenStart.Store(time.Now().UnixNano())
	if gone() {
		t.Fatal("gone as a generation starts: got true, want false (the old ID may still be in the group)")
	}
	time.Sleep(100 * time.Millisecond)
	if !gone() {
		t.Error("gone a session after a new generation started: got false, want true")
	}
	l := &fakeLeaver{fails: 1 << 30}
	m.leaveStale(context.Background(), l, "old-member", gone)
	if len(l.ids) != 0 {
		t.Errorf("LeaveGroup calls once gone: got %d, want 0", len(l.ids))
	}
}

// fakeLeaveTransport answers LeaveGroup requests with errs in turn (nil: a
// response with code), and counts CloseIdleConnections.
type fakeLeaveTransport struct {
	mu     sync.Mutex
	errs   []error
	code   kafka.Error
	resets []int // the call after which the connections were dropped
	calls  int
}

func (f *fakeLeaveTransport) RoundTrip(_ context.Context, _ net.Addr, _ kafka.Request) (kafka.Response, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if err := f.errs[f.calls-1]; err != nil {
		return nil, err
	}
	return &leavegroup.Response{ErrorCode: int16(f.code)}, nil
}

func (f *fakeLeaveTransport) CloseIdleConnections() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resets = append(f.resets, f.calls)
}

// A leave that fails on the connection (a pooled one from before the broker
// restart: unexpected EOF; a refused dial) drops the leaver's connections,
// so that the next try dials afresh; Kafka's answers (UNKNOWN_MEMBER_ID, or
// none) keep them.
func TestStaleLeaverDropsConnectionsAfterAFailedConnection(t *testing.T) {
	f := &fakeLeaveTransport{errs: []error{io.ErrUnexpectedEOF, syscall.ECONNREFUSED, nil, nil}, code: kafka.UnknownMemberId}
	l := &staleLeaver{c: &kafka.Client{Addr: kafka.TCP("127.0.0.1:1"), Transport: f}, t: f}
	req := &kafka.LeaveGroupRequest{GroupID: "g", Members: []kafka.LeaveGroupRequestMember{{ID: "old"}}}
	for i := range 3 {
		_, err := l.LeaveGroup(context.Background(), req)
		if (err != nil) != (i < 2) {
			t.Fatalf("call %d: err %v", i+1, err)
		}
	}
	f.code = 0
	if res, err := l.LeaveGroup(context.Background(), req); err != nil || res.Error != nil {
		t.Fatalf("call 4: %v, %v", res, err)
	}
	if fmt.Sprint(f.resets) != "[1 2]" {
		t.Errorf("connections dropped after calls %v, want [1 2] (after each failed connection, not after Kafka's answers)", f.resets)
	}
}
