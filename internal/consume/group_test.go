package consume

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/segmentio/kafka-go"
)

func TestFetchBatchBounds(t *testing.T) {
	tests := []struct {
		name       string
		available  int
		batchSize  int
		batchBytes int
		valueSize  int
		want       []int // batch sizes
	}{
		{name: "bytes bound", available: 10, batchSize: 500, batchBytes: 3000, valueSize: 1000, want: []int{3, 3, 3, 1}},
		{name: "one message over the bytes bound", available: 2, batchSize: 500, batchBytes: 100, valueSize: 1000, want: []int{1, 1}},
		{name: "size bound", available: 1200, batchSize: 500, want: []int{500, 500, 200}},
		{name: "wait bound", available: 3, batchSize: 500, want: []int{3}},
		{name: "batch of one", available: 3, batchSize: 1, want: []int{1, 1, 1}},
		{name: "exact", available: 10, batchSize: 5, want: []int{5, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &chanFetcher{ch: make(chan kafka.Message, tt.available)}
			for _, m := range msgs(0, int64(tt.available)) {
				if tt.valueSize > 0 {
					m.Value = make([]byte, tt.valueSize)
				}
				f.ch <- m
			}
			// Every message is queued before the first fetch: the wait bound must end only
			// a batch that has taken all there is, however slowly a loaded machine reads the
			// channel (at 5 ms, "size bound" got [92 500 ...] under load).
			p := testPartition(f, nil, &commits{}, func(c *Config) {
				c.BatchSize, c.BatchBytes, c.BatchWait = tt.batchSize, tt.batchBytes, time.Second
			})
			var got []int
			var next int64
			for range tt.want {
				batch, err := p.fetchBatch(context.Background(), context.Background())
				if err != nil {
					t.Fatalf("fetchBatch: %v", err)
				}
				for _, m := range batch {
					if m.Offset != next {
						t.Fatalf("got offset %d, want %d", m.Offset, next)
					}
					next++
				}
				got = append(got, len(batch))
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("batch sizes (-want +got):\n%s", diff)
			}
		})
	}
}

// A batch is handed over once BatchWait has passed since its first message,
// even though more messages arrive later.
func TestFetchBatchWaitStartsAtFirstMessage(t *testing.T) {
	f := &chanFetcher{ch: make(chan kafka.Message)}
	p := testPartition(f, nil, &commits{}, func(c *Config) { c.BatchWait = 20 * time.Millisecond })
	go func() {
		f.ch <- kafka.Message{Offset: 0}
		f.ch <- kafka.Message{Offset: 1}
	}()
	batch, err := p.fetchBatch(context.Background(), context.Background())
	if err != nil {
		t.Fatalf("fetchBatch: %v", err)
	}
	if got := offsetsOf(batch); !cmp.Equal(got, []int64{0, 1}) {
		t.Errorf("batch offsets = %v, want [0 1]", got)
	}
}

func TestFetchBatchStop(t *testing.T) {
	f := &chanFetcher{ch: make(chan kafka.Message)}
	p := testPartition(f, nil, &commits{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.fetchBatch(ctx, ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("fetchBatch after stop: err = %v, want context.Canceled", err)
	}
}

// recordingHandler records each batch and fails the first failures calls.
type recordingHandler struct {
	mu       sync.Mutex
	failures int
	calls    [][]int64
	ok       [][]int64
}

func (h *recordingHandler) Handle(_ context.Context, b Batch) error {
	msgs := b.Messages
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, offsetsOf(msgs))
	if h.failures > 0 {
		h.failures--
		return errors.New("downstream unavailable")
	}
	h.ok = append(h.ok, offsetsOf(msgs))
	return nil
}

func (h *recordingHandler) handled() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, b := range h.ok {
		n += len(b)
	}
	return n
}

// A failing batch is retried as it is, then committed once; the partition
// does not move on meanwhile.
func TestRunBatchesRetriesSameBatch(t *testing.T) {
	f := &chanFetcher{ch: make(chan kafka.Message, 10)}
	for _, m := range msgs(0, 10) {
		f.ch <- m
	}
	h := &recordingHandler{failures: 2}
	c := &commits{}
	var lags, committed []int64
	p := testPartition(f, h, c, func(cfg *Config) {
		cfg.BatchSize = 4
		cfg.OnLag = func(_ string, _ int, lag int64) { lags = append(lags, lag) }
		cfg.OnCommitted = func(_ string, _ int, next int64) { committed = append(committed, next) }
	})

	stop, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.runBatches(stop, context.Background())
	}()
	eventually(t, 5*time.Second, "all messages handled", func() bool { return h.handled() == 10 })
	cancel()
	<-done

	wantCalls := [][]int64{{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}}
	if diff := cmp.Diff(wantCalls, h.calls); diff != "" {
		t.Errorf("handler calls (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{4, 8, 10}, c.get()); diff != "" {
		t.Errorf("commits (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{6, 2, 0}, lags); diff != "" {
		t.Errorf("lags (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{4, 8, 10}, committed); diff != "" {
		t.Errorf("OnCommitted (-want +got):\n%s", diff)
	}
}

// The commit of the last batch, and the lag it reports, do not wait for a
// next batch: both are done while the partition waits for more messages.
func TestRunBatchesCommitsLastBatchWhileIdle(t *testing.T) {
	f := &chanFetcher{ch: make(chan kafka.Message, 10)}
	for _, m := range msgs(0, 6) {
		f.ch <- m
	}
	c := &commits{}
	var lag atomic.Int64
	lag.Store(-1)
	p := testPartition(f, &recordingHandler{}, c, func(cfg *Config) {
		cfg.BatchSize = 4
		cfg.OnLag = func(_ string, _ int, l int64) { lag.Store(l) }
	})
	stop, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.runBatches(stop, context.Background())
	}()
	eventually(t, 5*time.Second, "offset 6 committed and lag 0 reported before stop", func() bool {
		cs := c.get()
		return len(cs) > 0 && cs[len(cs)-1] == 6 && lag.Load() == 0
	})
	cancel()
	<-done
	if diff := cmp.Diff([]int64{4, 6}, c.get()); diff != "" {
		t.Errorf("commits (-want +got):\n%s", diff)
	}
}

// On shutdown, a batch whose Handle is in flight still finishes, with a
// context that the shutdown did not cancel, and is committed; a failing
// batch is not retried after stop and not committed.
func TestRunBatchesDrainOnStop(t *testing.T) {
	tests := []struct {
		name       string
		result     error
		wantCommit []int64
	}{
		{name: "in-flight batch succeeds", result: nil, wantCommit: []int64{3}},
		{name: "in-flight batch fails", result: errors.New("write failed"), wantCommit: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &chanFetcher{ch: make(chan kafka.Message, 3)}
			for _, m := range msgs(0, 3) {
				f.ch <- m
			}
			entered := make(chan struct{})
			release := make(chan struct{})
			calls := 0
			h := onMessages(func(ctx context.Context, _ []kafka.Message) error {
				calls++
				close(entered)
				<-release
				if ctx.Err() != nil {
					t.Errorf("handler context cancelled by shutdown: %v", ctx.Err())
				}
				return tt.result
			})
			c := &commits{}
			p := testPartition(f, h, c, nil)

			root, cancel := context.WithCancel(context.Background())
			hctx, hcancel := drainContext(root, root, time.Minute)
			defer hcancel()
			done := make(chan struct{})
			go func() {
				defer close(done)
				p.runBatches(root, hctx)
			}()
			<-entered
			cancel()
			close(release)
			<-done
			if calls != 1 {
				t.Errorf("handler called %d times, want 1", calls)
			}
			if diff := cmp.Diff(tt.wantCommit, c.get()); diff != "" {
				t.Errorf("commits (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDrainContext(t *testing.T) {
	parent, cancelParent := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	stop, cancelStop := context.WithCancel(parent)
	ctx, cancel := drainContext(parent, stop, 30*time.Millisecond)
	defer cancel()

	if got := ctx.Value(ctxKey{}); got != "v" {
		t.Errorf("value = %v, want v", got)
	}
	cancelParent()
	cancelStop()
	if err := ctx.Err(); err != nil {
		t.Fatalf("drain context cancelled at stop: %v", err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("drain context not cancelled after the grace period")
	}
	if cause := context.Cause(ctx); cause == nil || cause == context.Canceled {
		t.Errorf("cause = %v, want the drain timeout", cause)
	}
}

type ctxKey struct{}

func TestBackoff(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	tests := []struct {
		attempt int
		ceiling time.Duration
	}{
		{0, 100 * time.Millisecond},
		{1, 200 * time.Millisecond},
		{2, 400 * time.Millisecond},
		{3, 800 * time.Millisecond},
		{6, 5 * time.Second},
		{40, 5 * time.Second},
		{1000, 5 * time.Second},
	}
	for _, tt := range tests {
		for range 50 {
			if got := b.Delay(tt.attempt); got < tt.ceiling/2 || got > tt.ceiling {
				t.Fatalf("Delay(%d): got %v, want in [%v, %v]", tt.attempt, got, tt.ceiling/2, tt.ceiling)
			}
		}
	}
	if got := (Backoff{}).Delay(100); got > 5*time.Second || got < 2500*time.Millisecond {
		t.Errorf("zero Backoff at attempt 100: got %v, want in [2.5s, 5s]", got)
	}
}

func TestConfigValidate(t *testing.T) {
	valid := func() Config {
		return Config{Brokers: []string{"localhost:9092"}, GroupID: "g", Topics: []string{"t"}}
	}
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr bool
	}{
		{name: "defaults", mutate: func(*Config) {}},
		{name: "no brokers", mutate: func(c *Config) { c.Brokers = nil }, wantErr: true},
		{name: "empty broker", mutate: func(c *Config) { c.Brokers = []string{""} }, wantErr: true},
		{name: "no group", mutate: func(c *Config) { c.GroupID = "" }, wantErr: true},
		{name: "no topics", mutate: func(c *Config) { c.Topics = nil }, wantErr: true},
		{name: "empty topic", mutate: func(c *Config) { c.Topics = []string{"a", ""} }, wantErr: true},
		{name: "negative batch", mutate: func(c *Config) { c.BatchSize = -1 }, wantErr: true},
		{name: "negative wait", mutate: func(c *Config) { c.BatchWait = -time.Second }, wantErr: true},
		{name: "backoff inverted", mutate: func(c *Config) { c.BackoffMin = time.Minute }, wantErr: true},
		{name: "drain beyond default rebalance", mutate: func(c *Config) { c.DrainTimeout = time.Minute }, wantErr: true},
		{name: "drain beyond rebalance", mutate: func(c *Config) { c.RebalanceTimeout = 5 * time.Second }, wantErr: true},
		{name: "drain below rebalance", mutate: func(c *Config) {
			c.RebalanceTimeout = 5 * time.Second
			c.DrainTimeout = 2 * time.Second
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid()
			tt.mutate(&c)
			if err := c.Validate(); (err != nil) != tt.wantErr {
				t.Errorf("Validate() = %v, want error: %v", err, tt.wantErr)
			}
		})
	}

	d := DelayedConfig{Config: valid()}
	if err := d.Validate(); err == nil {
		t.Error("DelayedConfig without ReleaseAt: Validate() = nil, want error")
	}
	d.ReleaseAt = func(kafka.Message) Release { return Release{} }
	if err := d.Validate(); err != nil {
		t.Errorf("DelayedConfig.Validate() = %v, want nil", err)
	}
	if got := d.withDefaults(); got.LookAhead != DefaultLookAhead || got.BatchSize != DefaultBatchSize {
		t.Errorf("defaults: look-ahead %d, batch size %d; want %d, %d", got.LookAhead, got.BatchSize, DefaultLookAhead, DefaultBatchSize)
	}
}

// A batch that fails because the commits are behind (a Handler whose
// limiter refuses new decisions until they move: limit.ErrReplayFull) is
// not stuck: while it fails, the commit of the batches before it, which
// failed, is sent again, and once it is accepted the batch goes through.
// Before, a failed commit was covered only by the next one, which never
// came.
func TestRunBatchesRetriesCommitWhileBatchFails(t *testing.T) {
	f := &chanFetcher{ch: make(chan kafka.Message, 10)}
	for _, m := range msgs(0, 8) {
		f.ch <- m
	}
	c := &commits{}
	var failCommits atomic.Int64
	failCommits.Store(1) // the commit of the first batch fails once
	var committed atomic.Int64
	p := testPartition(f, nil, c, func(cfg *Config) { cfg.BatchSize = 4 })
	p.commit = func(oc offsetCommit) error {
		if failCommits.Add(-1) >= 0 {
			return errors.New("coordinator unavailable")
		}
		committed.Store(oc.next)
		return c.commit(oc)
	}
	var handled atomic.Int64
	p.handler = HandlerFunc(func(_ context.Context, b Batch) error {
		first := b.Messages[0].Offset
		if first > 0 && committed.Load() < first {
			return errors.New("replay record full: commits are behind")
		}
		handled.Add(int64(len(b.Messages)))
		return nil
	})
	stop, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.runBatches(stop, context.Background())
	}()
	eventually(t, 5*time.Second, "both batches handled", func() bool { return handled.Load() == 8 })
	cancel()
	<-done
	if diff := cmp.Diff([]int64{4, 8}, c.get()); diff != "" {
		t.Errorf("accepted commits (-want +got):\n%s", diff)
	}
}
