package consume

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// While the broker is away (refused or broken connections) and, right after
// its restart, while the coordinator answers joins with NOT_COORDINATOR,
// COORDINATOR_NOT_AVAILABLE or COORDINATOR_LOAD_IN_PROGRESS until it has
// loaded the group, the next join goes out after CoordinatorJoinBackoff, so
// that it reaches the coordinator soon after the load. A join the broker
// refuses for another reason (a denied group) still waits JoinGroupBackoff in
// all: kafka-go's wait plus consume's.
func TestJoinRetryWait(t *testing.T) {
	const slow, fast = 500 * time.Millisecond, 100 * time.Millisecond
	refused := fmt.Errorf("failed to dial: %w", syscall.ECONNREFUSED)
	for _, tc := range []struct {
		name      string
		fast      time.Duration
		err       error
		wantKafka time.Duration // kafka-go's JoinGroupBackoff
		want      time.Duration // kafka-go's wait plus consume's
	}{
		{"not coordinator (loading)", fast, kafka.NotCoordinatorForGroup, fast, fast},
		{"coordinator not available", fast, kafka.GroupCoordinatorNotAvailable, fast, fast},
		{"load in progress", fast, kafka.GroupLoadInProgress, fast, fast},
		{"load in progress, wrapped", fast, fmt.Errorf("join group: %w", kafka.GroupLoadInProgress), fast, fast},
		{"connection refused", fast, refused, fast, fast},
		{"connection refused (the dial's own error)", fast, fmt.Errorf("failed to dial: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}), fast, fast},
		{"connection broken", fast, fmt.Errorf("join: %w", io.ErrUnexpectedEOF), fast, fast},
		{"invalid session timeout", fast, kafka.InvalidSessionTimeout, fast, slow},
		{"another error", fast, errors.New("tls: handshake failure"), fast, slow},
		{"group authorization failed", fast, kafka.GroupAuthorizationFailed, fast, slow},
		{"no coordinator backoff: as before", 0, kafka.GroupLoadInProgress, slow, slow},
		{"coordinator backoff not below the join backoff: ignored", slow + time.Millisecond, kafka.GroupLoadInProgress, slow, slow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := newMember(Config{Brokers: []string{"127.0.0.1:1"}, GroupID: "g", Topics: []string{"t"},
				JoinGroupBackoff: slow, CoordinatorJoinBackoff: tc.fast},
				HandlerFunc(func(context.Context, Batch) error { return nil }), func(*partition, context.Context, context.Context) {})
			if err != nil {
				t.Fatal(err)
			}
			if got := m.groupConfig().JoinGroupBackoff; got != tc.wantKafka {
				t.Errorf("kafka-go's join backoff: got %v, want %v", got, tc.wantKafka)
			}
			if got := m.groupConfig().JoinGroupBackoff + m.cfg.joinRetryWait(tc.err); got != tc.want {
				t.Errorf("wait before the next join after %v: got %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestCoordinatorJoinBackoffValidated(t *testing.T) {
	c := Config{Brokers: []string{"b"}, GroupID: "g", Topics: []string{"t"}, CoordinatorJoinBackoff: -time.Second}
	if err := c.Validate(); err == nil {
		t.Error("a negative coordinator join backoff was accepted")
	}
}

// recordLog records the levels joinFailures logs at.
type recordLog struct{ levels []string }

func (l *recordLog) Warn(string, ...any)  { l.levels = append(l.levels, "warn") }
func (l *recordLog) Debug(string, ...any) { l.levels = append(l.levels, "debug") }

// A join tried ten times a second while the coordinator loads is not logged
// as a warning each time: the first failure, and each change of error, are.
func TestJoinFailuresLog(t *testing.T) {
	var j joinFailures
	l := &recordLog{}
	refused := errors.New("dial tcp: connection refused")
	for _, err := range []error{refused, refused, refused, kafka.NotCoordinatorForGroup, kafka.NotCoordinatorForGroup, kafka.GroupLoadInProgress} {
		j.failed(l, err)
	}
	want := []string{"warn", "debug", "debug", "warn", "debug", "warn"}
	if fmt.Sprint(l.levels) != fmt.Sprint(want) {
		t.Errorf("levels: got %v, want %v", l.levels, want)
	}
	j.logged = time.Now().Add(-joinFailLogEvery)
	j.failed(l, kafka.GroupLoadInProgress)
	if last := l.levels[len(l.levels)-1]; last != "warn" {
		t.Errorf("the same failure %v later: logged at %s, want warn", joinFailLogEvery, last)
	}
}
