package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// Write fences: a member writes only while it may still own its partitions.
//
// A member cut off from Kafka still owns its partitions in its own eyes until
// one of kafka-go's heartbeats fails (Config.Timeout, 10s in Gatekeeper, may
// be longer than the session), but the group coordinator gives them to
// another member once the session times out, counted from the last heartbeat
// it received. The writes the cut member queued meanwhile would land when the
// network returns, after the new owner handled the same messages again:
// kafka-go's Writer retries a produce request on its own, long after
// WriteMessages has returned, and a Handler's own retries go on until its
// context ends. Those late copies crowd the windows they land in, past the
// limit the counters in Redis kept.
//
// So each generation has a WriteFence, carried by the context of every Handle
// call ([FenceOf]). The member sends heartbeats of its own for the generation
// (every HeartbeatInterval); each one answered without error extends the fence
// to the time it was sent plus the session timeout minus a quarter of it: the
// coordinator cannot remove the member before the time it was sent plus the
// session timeout, and the quarter leaves time for a write sent just before
// the fence ends to land before a new owner, which must first rejoin, can
// write. A heartbeat that says the generation is over (illegal generation,
// unknown member) closes the fence at once; one that finds a rebalance in
// progress does not extend it (the coordinator may give the partitions away
// at the end of the rebalance). Once the fence has ended, the generation is
// ended too (kafka-go then rejoins), and once the generation's partitions have
// drained, the fence is closed: nothing more is written in its name.
//
// A writer that honours fences (route.FencedWriter) sends no produce request
// for a fence that has ended and cancels those in flight shortly after it
// ends (an answer already on its way is read: the write landed), so that
// none of a zombie's writes is sent after a new owner may have started.
// What a fence cannot stop is a request the network delays by more than the
// quarter session: Kafka's own fencing (transactions, producer epochs) would,
// and kafka-go has none.

// ErrFenced is returned (wrapped) by writes whose generation's fence has ended.
var ErrFenced = errors.New("write fenced: this member may no longer own the partition")

// WriteFence is one generation's right to write. It is safe for concurrent use.
type WriteFence struct {
	ctx    context.Context // done when the fence has ended; its cause says why
	cancel context.CancelCauseFunc

	mu    sync.Mutex
	until time.Time // by the heartbeats answered
	// lease, when set, is a second end, by the member's lease renewals
	// (extendLease): the fence ends at the earlier of the two; byLease says
	// that it ended there.
	lease   time.Time
	byLease bool
	timer   *time.Timer
}

// newWriteFence returns a fence open until until.
func newWriteFence(until time.Time) *WriteFence {
	ctx, cancel := context.WithCancelCause(context.Background())
	f := &WriteFence{ctx: ctx, cancel: cancel, until: until}
	f.timer = time.AfterFunc(time.Until(until), f.expire)
	return f
}

// NewOpenWriteFence returns a fence that stays open until Close is called,
// for Handlers called outside a consumer (tests, tools).
func NewOpenWriteFence() *WriteFence {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &WriteFence{ctx: ctx, cancel: cancel}
}

// Done is closed when the fence has ended.
func (f *WriteFence) Done() <-chan struct{} { return f.ctx.Done() }

// Context returns a context that is done when the fence has ended.
func (f *WriteFence) Context() context.Context { return f.ctx }

// Err is nil while the fence is open, and an error wrapping ErrFenced, saying
// why, once it has ended. It reads the clock too: a fence whose end has
// passed ends now, although its timer has not run yet (a process stopped
// and resumed past the end finds every timer overdue, and a write may be
// sent before the timer's goroutine runs).
func (f *WriteFence) Err() error {
	if f.ctx.Err() == nil {
		f.mu.Lock()
		due := f.timer != nil && !time.Now().Before(f.end())
		f.mu.Unlock()
		if !due {
			return nil
		}
		f.expire()
		if f.ctx.Err() == nil {
			return nil
		}
	}
	return context.Cause(f.ctx)
}

// Close ends the fence for reason.
func (f *WriteFence) Close(reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.timer != nil {
		f.timer.Stop()
	}
	f.cancel(fmt.Errorf("%w (%s)", ErrFenced, reason))
}

// extend moves the heartbeats' end of the fence to until, if that is later
// and the fence is still open.
func (f *WriteFence) extend(until time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ctx.Err() != nil || !until.After(f.until) {
		return
	}
	f.until = until
	f.timer.Reset(time.Until(f.end()))
}

// extendLease moves the lease's end of the fence to until, if that is later
// and the fence is still open; the first call sets it (see leaseWatch).
func (f *WriteFence) extendLease(until time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ctx.Err() != nil || f.timer == nil || !until.After(f.lease) {
		return
	}
	f.lease = until
	f.timer.Reset(time.Until(f.end()))
}

// endedByLease reports whether the fence ended because the member's lease
// was not renewed in time.
func (f *WriteFence) endedByLease() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.byLease
}

// end is when the fence ends: the earlier of its two ends. Called with mu held.
func (f *WriteFence) end() time.Time {
	if !f.lease.IsZero() && f.lease.Before(f.until) {
		return f.lease
	}
	return f.until
}

// expire ends the fence if its time has come (the timer may have been reset
// while it fired).
func (f *WriteFence) expire() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ctx.Err() != nil {
		return
	}
	if d := time.Until(f.end()); d > 0 {
		f.timer.Reset(d)
		return
	}
	why := "no heartbeat of the generation answered in time"
	if f.end().Equal(f.lease) && f.lease.Before(f.until) {
		why = "no renewal of the member's lease went through in time: the other members may remove it from the group"
		f.byLease = true
	}
	f.cancel(fmt.Errorf("%w (%s)", ErrFenced, why))
}

// fenceKey is the context key of the WriteFence of a batch.
type fenceKey struct{}

// FenceOf returns the WriteFence of the generation that handed over the batch
// of ctx, a context given to Handle by a consumer of this package; ok is false
// for other contexts.
func FenceOf(ctx context.Context) (f *WriteFence, ok bool) {
	f, ok = ctx.Value(fenceKey{}).(*WriteFence)
	return f, ok
}

// WithFence returns ctx carrying f as FenceOf gives it.
func WithFence(ctx context.Context, f *WriteFence) context.Context {
	return context.WithValue(ctx, fenceKey{}, f)
}

// heartbeater sends one heartbeat of a generation; *kafka.Client implements it.
type heartbeater interface {
	Heartbeat(ctx context.Context, req *kafka.HeartbeatRequest) (*kafka.HeartbeatResponse, error)
}

// fenceKeeper keeps one generation's WriteFence.
type fenceKeeper struct {
	hb      heartbeater
	gen     *kafka.Generation
	session time.Duration // the group's session timeout
	every   time.Duration // between heartbeats
	timeout time.Duration // of one heartbeat
	fence   *WriteFence
}

// sessionOrDefault and heartbeatOrDefault are the session timeout and the
// heartbeat interval kafka-go uses for c.
func (c *Config) sessionOrDefault() time.Duration {
	if c.SessionTimeout > 0 {
		return c.SessionTimeout
	}
	return 30 * time.Second
}

func (c *Config) heartbeatOrDefault() time.Duration {
	if c.HeartbeatInterval > 0 {
		return c.HeartbeatInterval
	}
	return 3 * time.Second
}

// newFenceKeeper sends a first heartbeat and returns the keeper of a fence
// open for three quarters of the session from then (see beat), or for one
// heartbeat interval from the keeper's start if no heartbeat was answered
// (the join that made the generation has just reset the session). A first heartbeat that fails without an answer (a connection
// a broker restart left dead) is sent again within that interval, with
// backoff: the keeper's next one would go out only as the fence ends.
func (m *member) newFenceKeeper(ctx context.Context, gen *kafka.Generation) *fenceKeeper {
	k := &fenceKeeper{hb: m.client, gen: gen, session: m.cfg.sessionOrDefault(),
		every: m.cfg.heartbeatOrDefault(), timeout: min(m.cfg.Timeout, m.cfg.heartbeatOrDefault())}
	k.fence = newWriteFence(time.Now().Add(k.every))
	k.first(ctx, m.cfg.retryWait, m.refreshRoutes)
	return k
}

// first sends the first heartbeat, and again after wait while it gets no
// answer and the fence is open; refresh drops the routes after a stale one.
// Each try is bounded by a third of the interval, but by no less than a
// second (nor more than the interval): one that hangs on a connection a
// broker restart left dead is cut, and sent again on a new connection
// while the fence is still open; bounded by the interval, it was cut as
// the fence ended.
func (k *fenceKeeper) first(ctx context.Context, wait func(attempt int, err error) time.Duration, refresh func()) {
	timeout := min(k.timeout, k.every, max(k.every/3, time.Second))
	for attempt := 0; ; attempt++ {
		err := k.beatWithin(ctx, timeout)
		if err == nil || ctx.Err() != nil {
			return
		}
		if staleRoute(err) {
			refresh()
		}
		if !sleep(k.fence.Context(), wait(attempt, err)) {
			return // the fence ended
		}
	}
}

// beat sends one heartbeat and extends or closes the fence by its answer.
// It returns the error of a heartbeat that got no answer about the
// generation, nil otherwise.
func (k *fenceKeeper) beat(ctx context.Context) error {
	return k.beatWithin(ctx, k.timeout)
}

// beatWithin is beat with its own timeout.
func (k *fenceKeeper) beatWithin(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sent := time.Now()
	res, err := k.hb.Heartbeat(ctx, &kafka.HeartbeatRequest{GroupID: k.gen.GroupID,
		GenerationID: k.gen.ID, MemberID: k.gen.MemberID})
	if err == nil {
		err = res.Error
	}
	switch {
	case err == nil:
		k.fence.extend(sent.Add(k.session - k.session/4))
	case errors.Is(err, kafka.IllegalGeneration), errors.Is(err, kafka.UnknownMemberId),
		errors.Is(err, kafka.FencedInstanceID):
		k.fence.Close("the coordinator ended the generation: " + err.Error())
	case errors.Is(err, kafka.RebalanceInProgress):
		// The generation is ending: the fence ends at its time.
	default:
		// No answer about the generation (a network error, a coordinator
		// moved or loading): the fence ends at its time.
		return err
	}
	return nil
}

// run heartbeats every interval until the generation has ended (gctx) and
// its partitions have drained (drained is closed), then closes the fence. If
// the fence ends first, run returns at once, so that kafka-go ends the
// generation: when run is started with gen.Start, that is what its return
// does; if the fence ended with the member's lease, onLease (if set) is
// called first.
//
// The heartbeats go out from a goroutine of their own, so that one that hangs
// (a dial through a cut network outlasts its context) delays neither the end
// of the fence nor the end of the generation.
func (k *fenceKeeper) run(gctx context.Context, drained <-chan struct{}, log *slog.Logger, onLease func()) {
	bctx, stopBeats := context.WithCancel(context.Background())
	defer stopBeats()
	go k.beatEvery(bctx)
	genDone, partsDone := gctx.Done(), drained
	for genDone != nil || partsDone != nil {
		select {
		case <-k.fence.Done():
			if genDone != nil {
				log.Warn("write fence ended: ending the generation; its writes not yet sent are dropped and its batches handled again by the partitions' next owner",
					"generation", k.gen.ID, "err", k.fence.Err())
				if onLease != nil && k.fence.endedByLease() {
					onLease()
				}
			}
			return
		case <-genDone:
			genDone = nil
		case <-partsDone:
			partsDone = nil
		}
	}
	k.fence.Close("the generation ended and its partitions drained")
}

// beatEvery sends a heartbeat every interval until ctx is done.
func (k *fenceKeeper) beatEvery(ctx context.Context) {
	tick := time.NewTicker(k.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			k.beat(ctx)
		}
	}
}
