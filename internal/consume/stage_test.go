package consume

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/segmentio/kafka-go"
)

// stagingHandler is a Stager that logs, in order, what it is asked to do
// with each batch (named by its first offset): "stage N", "finish N",
// "drop N", "handle N"; a failed step gets "!" after it.
type stagingHandler struct {
	mu             sync.Mutex
	log            []string
	ok             [][]int64 // the batches durably handled, in order
	stageFailures  int
	finishFailures int
	// overlap: a batch's Finish waits for the next batch to be staged (when
	// one comes after it, below last), and fails when it does not come.
	overlap bool
	last    int64
	// release: when not nil, every Finish waits for it.
	release chan struct{}
}

func (h *stagingHandler) note(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.log = append(h.log, fmt.Sprintf(format, args...))
}

func (h *stagingHandler) logged() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.log...)
}

func (h *stagingHandler) handled() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, b := range h.ok {
		n += len(b)
	}
	return n
}

func (h *stagingHandler) Handle(_ context.Context, b Batch) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.log = append(h.log, fmt.Sprintf("handle %d", b.Messages[0].Offset))
	h.ok = append(h.ok, offsetsOf(b.Messages))
	return nil
}

func (h *stagingHandler) Stage(_ context.Context, b Batch) (Staged, error) {
	first := b.Messages[0].Offset
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stageFailures > 0 {
		h.stageFailures--
		h.log = append(h.log, fmt.Sprintf("stage %d!", first))
		return nil, errors.New("redis unavailable")
	}
	h.log = append(h.log, fmt.Sprintf("stage %d", first))
	// The Batch's slice is the consumer's: a Staged keeps the messages.
	return &stagedBatch{h: h, msgs: append([]kafka.Message(nil), b.Messages...)}, nil
}

type stagedBatch struct {
	h    *stagingHandler
	msgs []kafka.Message
}

func (s *stagedBatch) Finish(context.Context) error {
	h, first := s.h, s.msgs[0].Offset
	if h.release != nil {
		<-h.release
	}
	if next := s.msgs[len(s.msgs)-1].Offset + 1; h.overlap && next < h.last {
		deadline := time.Now().Add(5 * time.Second)
		for !contains(h.logged(), fmt.Sprintf("stage %d", next)) {
			if time.Now().After(deadline) {
				h.note("finish %d!", first)
				return fmt.Errorf("batch %d was not staged while %d was finished", next, first)
			}
			time.Sleep(time.Millisecond)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.finishFailures > 0 {
		h.finishFailures--
		h.log = append(h.log, fmt.Sprintf("finish %d!", first))
		return errors.New("write failed")
	}
	h.log = append(h.log, fmt.Sprintf("finish %d", first))
	h.ok = append(h.ok, offsetsOf(s.msgs))
	return nil
}

func (s *stagedBatch) Drop() { s.h.note("drop %d", s.msgs[0].Offset) }

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// runStagedPartition runs a partition of msgs 0..n-1 (batches of 4) with h
// until want messages are handled, then stops it; it returns the commits.
func runStagedPartition(t *testing.T, h *stagingHandler, n, want int) []int64 {
	t.Helper()
	f := &chanFetcher{ch: make(chan kafka.Message, n)}
	for _, m := range msgs(0, int64(n)) {
		f.ch <- m
	}
	c := &commits{}
	p := testPartition(f, h, c, func(cfg *Config) { cfg.BatchSize, cfg.DecideAhead = 4, true })
	stop := runInBackground(t, loop(p))
	eventually(t, 5*time.Second, fmt.Sprintf("%d messages handled", want), func() bool { return h.handled() == want })
	eventually(t, 5*time.Second, "the last batch committed", func() bool {
		cs := c.get()
		return len(cs) > 0 && cs[len(cs)-1] == int64(want)
	})
	_ = stop()
	return c.get()
}

// checkTenHandled checks that messages 0..9 were handled in batches of 4,
// in order, each committed once.
func checkTenHandled(t *testing.T, h *stagingHandler, commits []int64) {
	t.Helper()
	if diff := cmp.Diff([][]int64{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}}, h.ok); diff != "" {
		t.Errorf("batches handled (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{4, 8, 10}, commits); diff != "" {
		t.Errorf("commits (-want +got):\n%s", diff)
	}
}

// loop is p's loop as runInBackground runs it.
func loop(p *partition) func(context.Context) error {
	return func(stop context.Context) error {
		p.runBatches(stop, context.Background())
		return nil
	}
}

// A batch is staged while the one before it is finished; batches are
// finished in order, each committed after its Finish.
func TestRunStagedOverlaps(t *testing.T) {
	h := &stagingHandler{overlap: true, last: 10}
	commits := runStagedPartition(t, h, 10, 10)
	want := []string{"stage 0", "stage 4", "finish 0", "stage 8", "finish 4", "finish 8"}
	if diff := cmp.Diff(want, h.logged()); diff != "" {
		t.Errorf("steps (-want +got):\n%s", diff)
	}
	checkTenHandled(t, h, commits)
}

// A Finish that fails hands its batch over again with Handle; the batch
// staged meanwhile is finished after it, so the order holds.
func TestRunStagedFinishFails(t *testing.T) {
	// overlap: batch 0's Finish fails only once batch 4 is staged, so that
	// the steps come in one order.
	h := &stagingHandler{finishFailures: 1, overlap: true, last: 10}
	commits := runStagedPartition(t, h, 10, 10)
	want := []string{"stage 0", "stage 4", "finish 0!", "handle 0", "finish 4", "stage 8", "finish 8"}
	got := h.logged()
	// Batch 8 may be staged before or after batch 4's Finish.
	if len(got) == len(want) && got[4] == "stage 8" && got[5] == "finish 4" {
		got[4], got[5] = got[5], got[4]
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("steps (-want +got):\n%s", diff)
	}
	checkTenHandled(t, h, commits)
}

// A batch that cannot be staged is handled with Handle once the one before
// it is done.
func TestRunStagedStageFails(t *testing.T) {
	h := &stagingHandler{stageFailures: 1}
	commits := runStagedPartition(t, h, 10, 10)
	got := h.logged()
	if len(got) < 2 || got[0] != "stage 0!" || got[1] != "handle 0" {
		t.Errorf("steps %q: want batch 0 handled with Handle after its Stage failed", got)
	}
	checkTenHandled(t, h, commits)
}

// The last batch is committed while the partition waits for more messages:
// its commit does not wait for a next batch.
func TestRunStagedCommitsWhileIdle(t *testing.T) {
	h := &stagingHandler{}
	if diff := cmp.Diff([]int64{4, 6}, runStagedPartition(t, h, 6, 6)); diff != "" {
		t.Errorf("commits (-want +got):\n%s", diff)
	}
}

// On stop, the batch being finished is finished and committed, and so is the
// batch staged after it: it is decided, and its next owner may not find its
// decisions again (a tenant its limiter knows full is rejected there without
// a look at the replay record: the limiter's sentOffsets knows only what its
// own process sent). When the batch being finished fails, the staged one is
// dropped: it must not be written before the one before it.
func TestRunStagedStop(t *testing.T) {
	for _, tt := range []struct {
		name           string
		finishFailures int
		steps          []string
		commits        []int64
	}{
		{"finished", 0, []string{"stage 0", "stage 4", "finish 0", "finish 4"}, []int64{4, 8}},
		{"after a failed finish", 1, []string{"stage 0", "stage 4", "finish 0!", "drop 4"}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := &chanFetcher{ch: make(chan kafka.Message, 8)}
			for _, m := range msgs(0, 8) {
				f.ch <- m
			}
			h := &stagingHandler{release: make(chan struct{}), finishFailures: tt.finishFailures}
			c := &commits{}
			p := testPartition(f, h, c, func(cfg *Config) { cfg.BatchSize, cfg.DecideAhead = 4, true })
			stop, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				p.runBatches(stop, context.Background())
			}()
			eventually(t, 5*time.Second, "batch 4 staged", func() bool { return contains(h.logged(), "stage 4") })
			cancel()
			close(h.release)
			<-done
			if diff := cmp.Diff(tt.steps, h.logged()); diff != "" {
				t.Errorf("steps (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.commits, c.get(), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("commits (-want +got):\n%s", diff)
			}
		})
	}
}

// Without DecideAhead a Stager is called through Handle alone.
func TestRunBatchesWithoutDecideAhead(t *testing.T) {
	f := &chanFetcher{ch: make(chan kafka.Message, 6)}
	for _, m := range msgs(0, 6) {
		f.ch <- m
	}
	h := &stagingHandler{}
	p := testPartition(f, h, &commits{}, func(cfg *Config) { cfg.BatchSize = 4 })
	stop := runInBackground(t, loop(p))
	eventually(t, 5*time.Second, "6 messages handled", func() bool { return h.handled() == 6 })
	_ = stop()
	if diff := cmp.Diff([]string{"handle 0", "handle 4"}, h.logged()); diff != "" {
		t.Errorf("steps (-want +got):\n%s", diff)
	}
}
