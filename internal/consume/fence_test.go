package consume

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	offsetfetchAPI "github.com/segmentio/kafka-go/protocol/offsetfetch"
)

// fakeHeartbeater answers heartbeats with err (a request error) or code (the
// response's error), as set; it counts the heartbeats. Safe for concurrent use.
type fakeHeartbeater struct {
	mu    sync.Mutex
	err   error
	code  error
	beats int
}

func (h *fakeHeartbeater) set(err, code error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.err, h.code = err, code
}

func (h *fakeHeartbeater) Heartbeat(ctx context.Context, _ *kafka.HeartbeatRequest) (*kafka.HeartbeatResponse, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.beats++
	if h.err != nil {
		return nil, h.err
	}
	return &kafka.HeartbeatResponse{Error: h.code}, nil
}

// testKeeper returns a keeper whose fence is open for every and which has
// sent its first heartbeat, as newFenceKeeper does.
func testKeeper(hb heartbeater, session, every time.Duration) *fenceKeeper {
	k := &fenceKeeper{hb: hb, gen: &kafka.Generation{ID: 7, GroupID: "g", MemberID: "m"},
		session: session, every: every, timeout: every, fence: newWriteFence(time.Now().Add(every))}
	k.beat(context.Background())
	return k
}

// failingFirst is a heartbeater whose first fails heartbeats get no answer
// (a connection the broker's restart left dead); the later ones are
// answered. Safe for concurrent use.
type failingFirst struct {
	mu          sync.Mutex
	fails, sent int
}

func (h *failingFirst) Heartbeat(context.Context, *kafka.HeartbeatRequest) (*kafka.HeartbeatResponse, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sent++
	if h.sent <= h.fails {
		return nil, io.ErrUnexpectedEOF
	}
	return &kafka.HeartbeatResponse{}, nil
}

// A generation's first heartbeat that gets no answer is sent again while the
// fence is open: the keeper's next one would go out only as the fence ends,
// which ends the generation (seen once after a broker restart: the member
// rejoined and its partitions started about 0.5 s later). A heartbeat that
// says the generation is over is not sent again.
func TestFirstHeartbeatRetriedWhileTheFenceIsOpen(t *testing.T) {
	session, every := 6*time.Second, 300*time.Millisecond
	wait := func(int, error) time.Duration { return 20 * time.Millisecond }
	hb := &failingFirst{fails: 2}
	k := &fenceKeeper{hb: hb, gen: &kafka.Generation{ID: 7, GroupID: "g", MemberID: "m"},
		session: session, every: every, timeout: every, fence: newWriteFence(time.Now().Add(every))}
	k.first(context.Background(), wait, func() {})
	time.Sleep(2 * every)
	if err := k.fence.Err(); err != nil {
		t.Errorf("after %d heartbeats, the last answered: got %v, want the fence open", hb.sent, err)
	}
	if hb.sent != 3 {
		t.Errorf("sent %d heartbeats, want 3", hb.sent)
	}

	never := &failingFirst{fails: 1 << 30}
	k = &fenceKeeper{hb: never, gen: k.gen, session: session, every: every, timeout: every,
		fence: newWriteFence(time.Now().Add(every))}
	k.first(context.Background(), wait, func() {})
	if err := k.fence.Err(); !errors.Is(err, ErrFenced) || never.sent < 2 {
		t.Errorf("with no heartbeat answered: sent %d, fence %v; want more than one, and ErrFenced once first returns", never.sent, err)
	}

	gone := &fakeHeartbeater{code: kafka.UnknownMemberId}
	k = &fenceKeeper{hb: gone, gen: k.gen, session: session, every: every, timeout: every,
		fence: newWriteFence(time.Now().Add(every))}
	k.first(context.Background(), wait, func() {})
	if gone.beats != 1 || k.fence.Err() == nil {
		t.Errorf("the generation over: sent %d heartbeats, fence %v; want 1 and ended", gone.beats, k.fence.Err())
	}
}

// The fence of a generation stays open while the coordinator answers its
// heartbeats and ends three quarters of a session after the last heartbeat
// answered once the coordinator is out of reach (a member cut off from
// Kafka); kafka-go's own heartbeat, bounded by Config.Timeout, may notice only
// after the session has timed out and the partitions have moved.
func TestWriteFenceEndsWithoutHeartbeats(t *testing.T) {
	hb := &fakeHeartbeater{}
	session, every := 800*time.Millisecond, 50*time.Millisecond
	k := testKeeper(hb, session, every)
	gctx, gcancel := context.WithCancel(context.Background())
	defer gcancel()
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		k.run(gctx, make(chan struct{}), slog.New(slog.DiscardHandler), nil)
	}()
	time.Sleep(session) // longer than the fence would last without heartbeats
	if err := k.fence.Err(); err != nil {
		t.Fatalf("with heartbeats answered: got %v, want the fence open", err)
	}
	hb.set(errors.New("i/o timeout"), nil)
	cut := time.Now()
	select {
	case <-k.fence.Done():
	case <-time.After(2 * session):
		t.Fatal("the fence is still open two sessions after the coordinator went out of reach")
	}
	if took, most := time.Since(cut), session-session/4+every; took > most+100*time.Millisecond {
		t.Errorf("the fence ended %v after the cut, want within %v (3/4 session after the last heartbeat answered)", took, most)
	}
	if err := k.fence.Err(); !errors.Is(err, ErrFenced) {
		t.Errorf("got %v, want ErrFenced", err)
	}
	select {
	case <-ran:
	case <-time.After(time.Second):
		t.Fatal("the keeper goes on after its fence ended; it must return so that kafka-go ends the generation")
	}
}

// A heartbeat the coordinator refuses because the generation is over closes
// the fence at once; a rebalance in progress does not extend it.
func TestWriteFenceClosedByTheCoordinator(t *testing.T) {
	for _, tc := range []struct {
		code      error
		wantEnded bool
	}{
		{kafka.IllegalGeneration, true},
		{kafka.UnknownMemberId, true},
		{kafka.RebalanceInProgress, false},
		{nil, false},
	} {
		t.Run(errString(tc.code), func(t *testing.T) {
			hb := &fakeHeartbeater{code: tc.code}
			k := testKeeper(hb, time.Minute, time.Second)
			if ended := k.fence.Err() != nil; ended != tc.wantEnded {
				t.Errorf("fence ended: got %v, want %v", ended, tc.wantEnded)
			}
			k.fence.mu.Lock()
			left := time.Until(k.fence.until)
			k.fence.mu.Unlock()
			if extended := left > time.Minute/2; extended != (tc.code == nil) {
				t.Errorf("fence extended to %v from now: got extended %v, want %v", left.Round(time.Second), extended, tc.code == nil)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return "answered"
	}
	return err.Error()
}

// At the end of a generation the fence stays open until the partitions have
// drained (their in-flight writes go out), and then closes: nothing more is
// written in the generation's name.
func TestWriteFenceClosesAfterTheDrain(t *testing.T) {
	hb := &fakeHeartbeater{}
	k := testKeeper(hb, time.Minute, 20*time.Millisecond)
	gctx, gcancel := context.WithCancel(context.Background())
	drained := make(chan struct{})
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		k.run(gctx, drained, slog.New(slog.DiscardHandler), nil)
	}()
	gcancel()
	time.Sleep(100 * time.Millisecond)
	if err := k.fence.Err(); err != nil {
		t.Fatalf("generation ended, partitions draining: got %v, want the fence open", err)
	}
	close(drained)
	<-ran
	if err := k.fence.Err(); !errors.Is(err, ErrFenced) {
		t.Errorf("after the drain: got %v, want ErrFenced", err)
	}
}

// flakyOffsetFetch fails the first fails OffsetFetch requests the way a
// connection that lived through a network cut does, then answers with the
// committed offset 10 and the metadata "done" for every partition asked.
type flakyOffsetFetch struct {
	mu    sync.Mutex
	fails int
	asked int
}

func (f *flakyOffsetFetch) RoundTrip(_ context.Context, _ net.Addr, req kafka.Request) (kafka.Response, error) {
	r, ok := req.(*offsetfetchAPI.Request)
	if !ok {
		return nil, fmt.Errorf("unexpected request %T", req)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	if f.asked <= f.fails {
		return nil, io.ErrUnexpectedEOF
	}
	res := &offsetfetchAPI.Response{}
	for _, t := range r.Topics {
		rt := offsetfetchAPI.ResponseTopic{Name: t.Name}
		for _, p := range t.PartitionIndexes {
			rt.Partitions = append(rt.Partitions, offsetfetchAPI.ResponsePartition{PartitionIndex: p, CommittedOffset: 10, Metadata: "done"})
		}
		res.Topics = append(res.Topics, rt)
	}
	return res, nil
}

// A new owner reads its retry partitions' done sets even when the first
// offset fetches fail (the network just came back): without them it would
// hand the previous owner's finished events over again, and in-slot events
// would go downstream twice. (Before: three attempts, then none.)
func TestFetchMetadataOutlastsAHealingNetwork(t *testing.T) {
	tr := &flakyOffsetFetch{fails: 6}
	m, err := newMember(Config{Brokers: []string{"127.0.0.1:1"}, GroupID: "g", Topics: []string{"t"}, Transport: tr,
		SessionTimeout: 5 * time.Second, BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond},
		HandlerFunc(func(context.Context, Batch) error { return nil }), func(*partition, context.Context, context.Context) {})
	if err != nil {
		t.Fatal(err)
	}
	gen := &kafka.Generation{ID: 3, GroupID: "g", MemberID: "m",
		Assignments: map[string][]kafka.PartitionAssignment{"t": {{ID: 0, Offset: 10}}}}
	metas := m.fetchMetadata(context.Background(), gen)
	if got := metas[tp{"t", 0}]; got != "done" {
		t.Errorf("metadata of t/0 after %d failed fetches: got %q, want %q", tr.fails, got, "done")
	}
}

// A batch whose writes failed is not handed over again once the
// generation's write fence has ended: the partition may have a new owner
// whose commit has gone past the batch, and deciding it again there would
// count it twice (the replay record forgets offsets below the commit). It is
// left to the next owner, uncommitted. (Before: retried until the generation
// ended, which a cut-off member learns only when kafka-go's own heartbeat
// times out, seconds after the new owner started.)
func TestHandleStopsOnceFenced(t *testing.T) {
	fence := NewOpenWriteFence()
	var calls int
	h := HandlerFunc(func(ctx context.Context, _ Batch) error {
		calls++
		if calls == 2 {
			fence.Close("test: no heartbeat answered")
		}
		return errors.New("write failed")
	})
	p := testPartition(nil, h, &commits{}, nil)
	stop, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if p.handle(stop, WithFence(context.Background(), fence), msgs(0, 3), nil) {
		t.Fatal("handle: got true (handled), want false")
	}
	if stop.Err() != nil {
		t.Fatalf("handle returned only when stop ended (%d Handle calls); want it to stop once the fence ended", calls)
	}
	if calls != 2 {
		t.Errorf("Handle calls: got %d, want 2 (none after the fence ended)", calls)
	}
}

// hangingFirst is a heartbeater whose first heartbeat hangs until its
// context ends (a connection a broker restart left dead, no RST); the later
// ones are answered. Safe for concurrent use.
type hangingFirst struct {
	mu   sync.Mutex
	sent int
}

func (h *hangingFirst) Heartbeat(ctx context.Context, _ *kafka.HeartbeatRequest) (*kafka.HeartbeatResponse, error) {
	h.mu.Lock()
	h.sent++
	first := h.sent == 1
	h.mu.Unlock()
	if first {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return &kafka.HeartbeatResponse{}, nil
}

// A first heartbeat that hangs is cut after a third of the interval (a
// second at least) and sent again while the fence is open. Before, it was
// bounded by the whole interval, the fence ended with it, and the
// generation too.
func TestFirstHeartbeatThatHangsIsSentAgain(t *testing.T) {
	session, every := 10*time.Second, 3*time.Second
	hb := &hangingFirst{}
	k := &fenceKeeper{hb: hb, gen: &kafka.Generation{ID: 7, GroupID: "g", MemberID: "m"},
		session: session, every: every, timeout: every, fence: newWriteFence(time.Now().Add(every))}
	began := time.Now()
	k.first(context.Background(), func(int, error) time.Duration { return 20 * time.Millisecond }, func() {})
	took := time.Since(began)
	t.Logf("first answered after %v, %d heartbeats", took.Round(time.Millisecond), hb.sent)
	if err := k.fence.Err(); err != nil {
		t.Fatalf("after the first heartbeat hung: fence %v, want open", err)
	}
	if hb.sent != 2 {
		t.Errorf("sent %d heartbeats, want 2", hb.sent)
	}
}

// A fence whose end has passed is ended for Err although its timer has not
// run yet: after a SIGSTOP every timer is overdue, and a writer that checks
// Err first could send a batch before the timer's goroutine ran (seen in
// CI on 2026-12-05: TestLateKeepsPlaceCapacityBytes paused the process
// 10s, and 9 events went downstream twice).
func TestWriteFenceEndedByTheClock(t *testing.T) {
	f := newWriteFence(time.Now().Add(20 * time.Millisecond))
	f.mu.Lock()
	f.timer.Stop() // as if its goroutine had not run yet
	f.mu.Unlock()
	if err := f.Err(); err != nil {
		t.Fatalf("before its end: %v, want open", err)
	}
	time.Sleep(40 * time.Millisecond)
	if err := f.Err(); !errors.Is(err, ErrFenced) {
		t.Fatalf("past its end, its timer not run: %v, want ErrFenced", err)
	}
	select {
	case <-f.Done():
	default:
		t.Error("Done not closed once Err found the fence ended")
	}
	if err := NewOpenWriteFence().Err(); err != nil {
		t.Errorf("an open fence: %v, want nil", err)
	}
}
