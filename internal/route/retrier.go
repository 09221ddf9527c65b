package route

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// DefaultMaxAttempts is the number of deferrals after which an event is
// dead-lettered when Retrier.MaxAttempts is zero.
const DefaultMaxAttempts = 5

// ReasonMaxAttempts is the dead-letter reason of an event deferred too often.
const ReasonMaxAttempts = "max attempts"

// ErrEarly means a message was handed to the Retrier before its release
// time: a bug in the caller. Nothing of the batch was written.
var ErrEarly = errors.New("released before its time")

// Retrier handles messages released from the retry tiers (Router.Topics).
// It implements consume.Handler.
//
// From a tier with a lower bound L > 0 (released at gk-due - L) a message is
// written, headers unchanged, to the tier of its remaining delay. From the
// first tier (released at gk-due) a message inside its reserved slot
// (before gk-reserved) goes downstream uncounted, gk- headers kept; after the
// slot it is admitted again, at the cost read from it as from a source
// event (an event whose cost cannot be read any more goes to the dead-letter
// topic), and gives its missed slot back (when the Admitter is a
// SlotReleaser): admitted goes downstream, deferred goes back to
// a retry tier with gk-attempt+1 (or to the dead-letter topic with reason
// "max attempts" past MaxAttempts), rejected and failed (a broken counter
// key) go to the dead-letter topic.
// A message whose gk- headers cannot be read goes to the dead-letter topic.
//
// If the Router has a Signer, every message's gk-sig is verified before
// anything else is read from it: a message without one, or whose signature
// does not match, goes to the dead-letter topic with the reason
// "gk-sig missing" or "gk-sig does not match" and is counted in
// gatekeeper_retry_sig_failures_total. Every message written back to a tier
// (moved or deferred again) is signed again with the current key.
//
// Build a Retrier with NewRetrier, which checks its parts once: Handle does
// not check them again. A Retrier is safe for concurrent use once built; do
// not change its fields while Handle may run.
type Retrier struct {
	// Admission holds the Admitter, the Router and what else the Retrier
	// shares with the Gate. Its Clock is also the one the caller releases
	// messages by.
	Admission
	// MaxAttempts is the most deferrals of one event; zero means DefaultMaxAttempts.
	MaxAttempts int
	// Expedited, if set, reports whether a message released before its
	// time was let go early on purpose (its tenant's rules were raised:
	// consume.Expediter), and the tenant's rules before the raise (nil:
	// not known); such a message is checked now (see early.go) instead of
	// failing the batch with ErrEarly.
	Expedited func(m kafka.Message) (before []limit.Rule, ok bool)
	// CheckClaims: an event back inside its slot is checked in Redis (a
	// claim, when the Admitter is a LateAdmitter) before it is forwarded:
	// a late event may have taken its slot. Without it, such an event is
	// forwarded uncounted without asking Redis.
	CheckClaims bool
	// TakeSlots: a late event takes the slot of its tenant's earliest later
	// reservation (limit.Limiter.AdmitLate), so that it keeps its place.
	// Turn it on only once every replica checks claims: one that does not
	// forwards an event whose slot was taken, one over the window's limit.
	TakeSlots bool
	// Takes, if set, bounds the windows in which late events took slots
	// (limit.Limiter.TakesUntil): a claim due after the bound is forwarded
	// uncounted without a claims call, since no take can be in its slot,
	// and a batch with late events raises it before each attempt of the
	// call that may take and after it. Every replica that takes slots must
	// raise it: set it only with TakeSlots, on a fleet that runs it
	// everywhere, and only when claims are checked for takes alone (a
	// capacity's backlog moves need every claim checked).
	Takes TakesBound

	// AdvanceBacklog: Advance (advance.go) moves the bookings of waiting
	// deferred events into idle capacity when the Admitter is a
	// BacklogAdvancer, and Handle forwards those early.
	AdvanceBacklog bool

	// late is the Admitter as a LateAdmitter when CheckClaims is set and
	// it is one (nil otherwise): set once by NewRetrier.
	late LateAdmitter
	// advanced holds the messages whose booking Advance moved until
	// Handle has forwarded them.
	advanced *advanced
}

// LateAdmitter decides a batch of the first retry tier: late events and
// claims (limit.Event.InSlot); *limit.Limiter implements it. When the
// Retrier's Admitter is one and CheckClaims is set, every event back
// inside its slot is checked
// with it (a claim: kept, limit.Keep, unless a late event took its slot),
// in the one call that decides the batch's late events. It must be safe
// for concurrent use.
type LateAdmitter interface {
	AdmitLate(ctx context.Context, src limit.Source, events []limit.Event, take bool) ([]limit.Decision, error)
}

// TakesBound reads and raises the bound on the windows in which late
// events took slots; *limit.Limiter implements it (TakesUntil). It must be safe
// for concurrent use.
type TakesBound interface {
	TakesUntil(ctx context.Context, at time.Time) (time.Time, error)
}

// NewRetrier returns a Retrier with r's parts once Validate accepts them.
func NewRetrier(r Retrier) (*Retrier, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	if la, ok := r.Admitter.(LateAdmitter); ok && r.CheckClaims {
		r.late = la
	}
	r.advanced = &advanced{}
	return &r, nil
}

// Validate reports a missing part or a bad setting.
func (r *Retrier) Validate() error {
	if err := r.Admission.Validate(); err != nil {
		return fmt.Errorf("retrier: %w", err)
	}
	if r.MaxAttempts < 0 {
		return fmt.Errorf("retrier: max attempts %d is negative", r.MaxAttempts)
	}
	if r.TakeSlots && !r.CheckClaims {
		return errors.New("retrier: TakeSlots without CheckClaims: this replica would forward the slots it takes")
	}
	if r.Takes != nil && !r.TakeSlots {
		return errors.New("retrier: Takes without TakeSlots: this replica would trust a bound it does not keep")
	}
	return nil
}

// ReleaseAt is the Retrier's release clock (consume.DelayedConfig.ReleaseAt):
// when a message read from a retry tier may be handed to Handle (see
// checked.releaseAt): with a Signer a message whose gk-sig does not verify
// is released at once (the zero time), so that Handle
// dead-letters it rather than hold it, and the partition's commits, until a
// gk-due that anyone could have written. What it checked travels with the
// message as the Release's Note (a *checked), so that Handle verifies and
// parses none of it again.
func (r *Retrier) ReleaseAt(m kafka.Message) consume.Release {
	c := r.check(m)
	return consume.Release{At: c.releaseAt(), Note: c}
}

// checked is what the Retrier's release clock read of a message from a retry
// tier, once: its tier, its gk-sig's verdict and its gk-due.
type checked struct {
	tier   Tier
	inTier bool
	sigErr error // nil without a Signer
	// lenient: the gk-sig was accepted only while RETRY_ACCEPT_UNSIGNED_UNTIL
	// lasts, which may end before Handle: it is verified again there.
	lenient bool
	due     time.Time
	dueErr  error
}

// check reads m's tier, verifies its gk-sig (with a Signer) and parses its
// gk-due.
func (r *Retrier) check(m kafka.Message) *checked {
	c := &checked{}
	c.tier, c.inTier = r.Router.Topics.Tier(m.Topic)
	if s := r.Router.Signer; s != nil {
		if err := s.verify(m, sigDomain); err != nil {
			c.sigErr = s.Verify(m)
			c.lenient = c.sigErr == nil
		}
	}
	c.due, c.dueErr = parseDue(m)
	return c
}

// releaseAt returns when the message checked may be released to the
// Retrier: its gk-due minus its tier's lower bound. A message without a
// readable gk-due, from a topic that is not a tier, or whose gk-sig does not
// verify is released at once (the zero time), so that Handle dead-letters it
// or reports it.
func (c *checked) releaseAt() time.Time {
	if c.sigErr != nil || !c.inTier || c.dueErr != nil {
		return time.Time{}
	}
	return c.due.Add(-c.tier.LowerBound)
}

// dueOf returns the gk-due read, or nil when it could not be read (then
// parseDeferral reads it again, for its own error).
func (c *checked) dueOf() *time.Time {
	if c.dueErr != nil {
		return nil
	}
	return &c.due
}

// checkedOf returns the release clock's note of the batch's i-th message,
// or checks it now when it has none (a batch not handed over by a Delayed
// consumer with this Retrier's clock).
func (r *Retrier) checkedOf(batch consume.Batch, i int) *checked {
	if i < len(batch.Notes) {
		if c, ok := batch.Notes[i].(*checked); ok && c != nil {
			return c
		}
	}
	return r.check(batch.Messages[i])
}

// Handle routes a batch of released messages of one retry tier partition and
// returns nil only when every one has been written and acknowledged. A
// message released before its time makes Handle return an error wrapping
// ErrEarly before anything is written; a message from a topic that is not a
// retry tier also fails the batch. On error the caller retries the batch.
func (r *Retrier) Handle(ctx context.Context, batch consume.Batch) error {
	msgs := batch.Messages
	if len(msgs) == 0 {
		return nil
	}
	b := retryBatch{items: make([]Item, len(msgs)), counts: map[string]int{}, sigFailures: map[string]int{}}
	now := r.now()
	for i, m := range msgs {
		if err := r.classify(ctx, &b, i, m, r.checkedOf(batch, i), now); err != nil {
			return fmt.Errorf("retrier: %w", err)
		}
	}

	// A re-check's identity is its position in the retry tier, unique per
	// trip: deferred again and late again, it is a new decision.
	src := source(batch)
	ds, unchecked, err := r.admitWith(ctx, src, b.events, msgs[0], r.callFor(len(b.events) > b.claims))
	if err == nil && !unchecked {
		if err = r.raiseTakes(ctx, ds); err == nil {
			ds, err = r.redoEnded(ctx, &b, msgs, src, ds)
		}
	}
	if err != nil {
		return fmt.Errorf("retrier: %w", err)
	}
	if err := r.decide(&b, msgs, ds, unchecked); err != nil {
		return fmt.Errorf("retrier: %w", err)
	}
	if !unchecked {
		if err := r.releaseMissed(ctx, b.missed); err != nil {
			return fmt.Errorf("retrier: %w", err)
		}
	}
	r.checkEarly(ctx, &b, msgs)
	if err := r.Router.Route(ctx, b.items); err != nil {
		return fmt.Errorf("retrier: %w", err)
	}
	if b.counts[DecisionAdvanced] > 0 {
		r.advanced.done(msgs)
	}
	warnFailed(r.logger(), msgs[0], ds, b.counts)

	r.Metrics.batchIn(msgs)
	for label, n := range b.counts {
		r.Metrics.decision(label, n)
	}
	for reason, n := range b.sigFailures {
		r.Metrics.sigFailure(reason, n)
	}
	if unchecked {
		r.Metrics.unchecked(len(b.readmit))
	}
	r.Metrics.late(len(b.events) - b.claims + b.late)
	return nil
}

// retryBatch is what Handle has worked out about a batch so far.
type retryBatch struct {
	items       []Item             // index-aligned with the batch
	readmit     []pendingRetry     // events to admit again, in batch order
	events      []limit.Event      // the distinct trips among them, in order, at their first copies' offsets
	missed      []limit.MissedSlot // the slots they missed, one per trip
	trips       map[trip]int       // the index in events of each trip
	claims      int                // how many of events are claims (back inside their slot)
	inSlot      []pendingRetry     // events forwarded inside their slot without a call (j: -1)
	late        int                // events decided again as late because their slot ended (redoEnded)
	takesUntil  time.Time          // Retrier.Takes's bound, read for the batch's first claim
	takesRead   bool               // takesUntil was read (zero when the read failed: every claim is checked)
	counts      map[string]int     // gatekeeper_decisions_total by label
	sigFailures map[string]int     // gatekeeper_retry_sig_failures_total by reason
	early       []earlyCheck       // events released early after a raise
}

// pendingRetry is an event to admit again: msgs[i], deferred as d, whose
// decision is the j-th of the Admit call.
type pendingRetry struct {
	i, j  int
	d     Deferral
	claim bool // back inside its slot (limit.Event.InSlot)
	// costErr is why a claim's cost could not be read: it is checked at
	// cost zero, and dead-lettered with this reason unless it keeps its
	// slot (a claim whose slot was taken is decided as a late event).
	costErr string
}

// trip names one trip of a deferred event through the retry tiers: its
// origin, attempt, tenant and due time (copies of a trip share all their gk-
// headers). A write to a retry tier retried after the broker appended it
// leaves two copies of a trip at two positions; when both come back after
// their slot in one batch they are checked (and counted) once.
type trip struct {
	topic     string
	partition int
	offset    int64
	attempt   int
	tenant    string
	due       int64
}

// classify sets b.items[i] for m, read from a retry tier, unless m is to be
// admitted again: then it is added to b.readmit. c is what the release clock
// checked of m. With a Signer, m is dead-lettered if its gk-sig does not
// verify, before anything else is read. The error is the batch's: a message
// released early, or from a topic that is not a retry tier.
func (r *Retrier) classify(ctx context.Context, b *retryBatch, i int, m kafka.Message, c *checked, now time.Time) error {
	tier, ok := c.tier, c.inTier
	if !ok {
		return fmt.Errorf("topic %q (partition %d offset %d) is not a retry tier of %q",
			m.Topic, m.Partition, m.Offset, r.Router.Topics.Retry)
	}
	if s := r.Router.Signer; s != nil {
		err := c.sigErr
		if c.lenient {
			err = s.Verify(m)
		}
		if err != nil {
			reason := "mismatch"
			if errors.Is(err, ErrSigMissing) {
				reason = "missing"
			}
			b.sigFailures[reason]++
			b.counts[DecisionInvalid]++
			b.items[i] = r.deadLetter(m, err.Error())
			return nil
		}
	}
	if tier.LowerBound > 0 {
		due, err := c.due, c.dueErr
		if err != nil {
			b.counts[DecisionInvalid]++
			b.items[i] = r.deadLetter(m, err.Error())
			return nil
		}
		if release := due.Add(-tier.LowerBound); now.Before(release) {
			if r.forwardAdvanced(b, i, m) {
				return nil
			}
			if r.early(b, i, m, c) {
				return nil
			}
			return fmt.Errorf("topic %s partition %d offset %d: %w: now %s, release at %s",
				m.Topic, m.Partition, m.Offset, ErrEarly, now.Format(time.RFC3339Nano), release.Format(time.RFC3339Nano))
		}
		b.items[i] = Item{Msg: m, Outcome: Requeue, Deferral: Deferral{Due: due}}
		return nil
	}

	d, err := parseDeferral(m, c.dueOf())
	if err != nil {
		b.counts[DecisionInvalid]++
		b.items[i] = r.deadLetter(m, err.Error())
		return nil
	}
	if now.Before(d.Due) {
		if r.forwardAdvanced(b, i, m) {
			return nil
		}
		if r.early(b, i, m, c) {
			return nil
		}
		return fmt.Errorf("topic %s partition %d offset %d: %w: now %s, due %s",
			m.Topic, m.Partition, m.Offset, ErrEarly, now.Format(time.RFC3339Nano), d.Due.Format(time.RFC3339Nano))
	}
	claim := now.Before(d.Reserved)
	if claim && (r.late == nil || d.Took || r.untaken(ctx, b, d.Due)) {
		// Inside its slot, and the slot is its own: it took it, or claims
		// are not checked (no replica takes slots, or the Admitter cannot),
		// or no take is due as late as its slot.
		b.counts[DecisionReserved]++
		b.items[i] = Item{Msg: m, Outcome: Forward}
		b.inSlot = append(b.inSlot, pendingRetry{i: i, j: -1, d: d, claim: true})
		return nil
	}
	// The cost is read again from the event as the source had it (its
	// gk- headers are not counted); a changed COST_FROM may find none.
	cost, err := r.CostFrom.Cost(m)
	costErr := ""
	if err != nil && claim {
		// Needed only if its slot was taken (pools of bytes or units give
		// up what it costs; at zero, a pool holding any gives it up).
		cost, costErr = limit.Cost{}, err.Error()
	} else if err != nil {
		b.counts[DecisionInvalid]++
		b.items[i] = r.deadLetter(m, err.Error())
		return nil
	}
	k := trip{d.OriginTopic, d.OriginPartition, d.OriginOffset, d.Attempt, d.Tenant, d.Due.UnixMilli()}
	j, ok := b.trips[k]
	if !ok {
		if b.trips == nil {
			b.trips = map[trip]int{}
		}
		j = len(b.events)
		b.trips[k] = j
		ev := limit.Event{Tenant: d.Tenant, Cost: cost, Offset: m.Offset, InSlot: claim}
		if claim {
			ev.Due = d.Due // the slot it claims (its takes are recorded by due time)
		}
		b.events = append(b.events, ev)
		switch {
		case claim:
			b.claims++
		case d.Reserved.After(d.Due):
			b.missed = append(b.missed, missedSlot(d, cost))
		default:
			// Deferred unreserved (the search's budget ran out: gk-reserved =
			// gk-due): it counted nothing, so it has no slot to give back.
		}
	}
	b.readmit = append(b.readmit, pendingRetry{i: i, j: j, d: d, claim: claim, costErr: costErr})
	return nil
}

// decide sets the items of the events admitted again from their decisions
// ds (one per distinct trip: p.j); unchecked means Redis failed under
// RedisForward and they go downstream.
func (r *Retrier) decide(b *retryBatch, msgs []kafka.Message, ds []limit.Decision, unchecked bool) error {
	maxAttempts := r.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = DefaultMaxAttempts
	}
	for _, p := range b.readmit {
		m := msgs[p.i]
		if unchecked {
			b.items[p.i] = Item{Msg: m, Outcome: Forward}
			continue
		}
		d := ds[p.j]
		if p.costErr != "" && d.Kind != limit.Keep {
			// A claim whose slot was taken, decided as a late event: one
			// without a cost is invalid.
			b.counts[DecisionInvalid]++
			b.items[p.i] = r.deadLetter(m, p.costErr)
			continue
		}
		switch d.Kind {
		case limit.Keep:
			// A claim whose slot is still its own.
			b.counts[DecisionReserved]++
			b.items[p.i] = Item{Msg: m, Outcome: Forward}
		case limit.Admit:
			b.counts[d.Kind.String()]++
			b.items[p.i] = Item{Msg: m, Outcome: Forward}
		case limit.Defer:
			next := p.d
			if !p.claim { // a claim whose slot was taken did not miss it: no new attempt
				next.Attempt++
			}
			if next.Attempt > maxAttempts {
				b.counts[DecisionMaxAttempts]++
				b.items[p.i] = r.deadLetter(m, ReasonMaxAttempts)
				continue
			}
			switch {
			case p.claim:
				b.counts[DecisionSlotTaken]++
			case d.Took:
				b.counts[DecisionTookSlot]++
			default:
				b.counts[d.Kind.String()]++
			}
			next.Due, next.Reserved, next.Took, next.Windows = d.Due, d.Until, d.Took, d.Windows
			b.items[p.i] = Item{Msg: m, Outcome: Defer, Deferral: next}
			r.logger().Debug("event deferred again", "tenant", next.Tenant, "topic", m.Topic, "partition", m.Partition,
				"offset", m.Offset, "attempt", next.Attempt, "due", next.Due)
		case limit.Reject, limit.Fail:
			b.counts[d.Kind.String()]++
			b.items[p.i] = r.deadLetter(m, rejectReason(d))
		default:
			return fmt.Errorf("decision %d for tenant %q is not valid", d.Kind, p.d.Tenant)
		}
	}
	return nil
}

// deadLetter keeps m's gk- headers, which say where the event came from, and adds the reason.
func (r *Retrier) deadLetter(m kafka.Message, reason string) Item {
	tenant, _ := lastHeader(m.Headers, HeaderTenant)
	r.logger().Debug("retried event dead-lettered", "tenant", tenant, "topic", m.Topic, "partition", m.Partition,
		"offset", m.Offset, "reason", reason)
	return Item{Msg: m, Outcome: DeadLetter, Reason: reason}
}

// untaken reports whether no late event can have taken the slot due at due:
// it is after Takes's bound, read once per batch. Without Takes, or when
// the read fails (the claims call that follows meets the same Redis and
// handles its failure), it reports false: the claim is checked.
func (r *Retrier) untaken(ctx context.Context, b *retryBatch, due time.Time) bool {
	if r.Takes == nil || due.IsZero() {
		return false
	}
	if !b.takesRead {
		b.takesRead = true
		until, err := r.Takes.TakesUntil(ctx, time.Time{})
		if err != nil {
			r.logger().Warn("reading the bound of slots taken failed; checking every claim of the batch", "err", err)
			return false
		}
		b.takesUntil = until
	}
	return !b.takesUntil.IsZero() && due.After(b.takesUntil)
}

// callFor returns the admit call of a batch: AdmitLate when claims are
// checked, else AdmitFrom. When late events may take slots (late: the
// batch has some; TakeSlots and Takes set), each attempt of the call first
// raises Takes's bound to now plus limit.ReplayRecordTTL, so that a take
// the call records is covered even when this replica stops before
// raiseTakes, until the partition's next owner replays the batch and
// raises it; when that raise fails, the attempt takes no slot (no claim
// could tell), and the call meets the same Redis and handles its failure.
func (r *Retrier) callFor(late bool) func(context.Context, limit.Source, []limit.Event) ([]limit.Decision, error) {
	if r.late == nil {
		return r.Admitter.AdmitFrom
	}
	return func(ctx context.Context, src limit.Source, evs []limit.Event) ([]limit.Decision, error) {
		take := r.TakeSlots
		if take && late && r.Takes != nil {
			if _, err := r.Takes.TakesUntil(ctx, r.now().Add(limit.ReplayRecordTTL)); err != nil {
				r.logger().Warn("raising the bound of slots taken failed; this call's late events take none", "err", err)
				take = false
			}
		}
		return r.late.AdmitLate(ctx, src, evs, take)
	}
}

// raiseTakes raises Takes's bound after a call to the end of the latest
// window a late event took a slot in (a claim finds a take under its own
// due time or under the start of its tenant's finest window that holds
// now, anywhere in the taken window). Nothing to do without Takes or when
// nothing was taken.
func (r *Retrier) raiseTakes(ctx context.Context, ds []limit.Decision) error {
	if r.Takes == nil {
		return nil
	}
	var at time.Time
	for _, d := range ds {
		if d.Kind == limit.Defer && d.Took && d.Until.After(at) {
			at = d.Until
		}
	}
	if at.IsZero() {
		return nil
	}
	if _, err := r.Takes.TakesUntil(ctx, at); err != nil {
		return fmt.Errorf("raise the bound of slots taken: %w", err)
	}
	return nil
}

// redoEnded decides again, as late, the events that were to go downstream
// inside their slot but whose slot has ended since the batch was classified
// (the batch's call waited through a Redis outage): claims the call kept
// (limit.Keep) and events forwarded without a call (b.inSlot). Forwarded
// now, they would land in the next window on top of that window's own
// events. They are checked as new, one event per trip, in another call,
// like any late event: they give their slot back and count as a new
// attempt; one whose cost cannot be read any more is dead-lettered, as a
// late event is. It goes on until a pass finds none (a slot may end during
// the call too). Under ON_REDIS_ERROR=forward, when that call goes
// unchecked, they go downstream as they were (the batch's other decisions
// stand). It returns ds with the calls' decisions appended (b.readmit
// points at them).
func (r *Retrier) redoEnded(ctx context.Context, b *retryBatch, msgs []kafka.Message, src limit.Source, ds []limit.Decision) ([]limit.Decision, error) {
	for {
		var evs []limit.Event
		base, missed := len(ds), len(b.missed)
		byTrip := map[trip]int{}  // a trip's index in evs
		invalid := map[int]bool{} // readmit entries of trips dead-lettered
		// redo gives p, an event whose slot ended, its index in ds-to-be (one
		// per trip), or reports false when its cost cannot be read.
		redo := func(p *pendingRetry) bool {
			m := msgs[p.i]
			k := trip{p.d.OriginTopic, p.d.OriginPartition, p.d.OriginOffset, p.d.Attempt, p.d.Tenant, p.d.Due.UnixMilli()}
			if j, ok := byTrip[k]; ok {
				p.j, p.claim = base+j, false
				return true
			}
			cost, err := r.CostFrom.Cost(m)
			if err != nil {
				b.counts[DecisionInvalid]++
				b.items[p.i] = r.deadLetter(m, err.Error())
				return false
			}
			byTrip[k] = len(evs)
			evs = append(evs, limit.Event{Tenant: p.d.Tenant, Cost: cost, Offset: m.Offset})
			if p.d.Reserved.After(p.d.Due) {
				b.missed = append(b.missed, missedSlot(p.d, cost))
			}
			p.j, p.claim = base+len(evs)-1, false
			return true
		}
		now := r.now()
		for k := range b.readmit {
			p := &b.readmit[k]
			if p.claim && ds[p.j].Kind == limit.Keep && !now.Before(p.d.Reserved) && !redo(p) {
				invalid[k] = true
			}
		}
		if len(invalid) > 0 { // dead-lettered: no decision of theirs is used
			left := b.readmit[:0]
			for k, p := range b.readmit {
				if !invalid[k] {
					left = append(left, p)
				}
			}
			b.readmit = left
		}
		kept := b.inSlot[:0]
		for _, p := range b.inSlot {
			switch {
			case now.Before(p.d.Reserved):
				kept = append(kept, p)
				continue
			case redo(&p):
				b.readmit = append(b.readmit, p)
			}
			b.counts[DecisionReserved]--
		}
		b.inSlot = kept
		if len(evs) == 0 {
			return ds, nil
		}
		r.logger().Warn("events whose slot ended while the batch waited are decided again as late",
			"topic", msgs[0].Topic, "partition", msgs[0].Partition, "offset", msgs[0].Offset, "events", len(evs))
		more, unchecked, err := r.admitWith(ctx, src, evs, msgs[0], r.callFor(true))
		if err != nil {
			return ds, err
		}
		if unchecked {
			// Forwarded unchecked, as the batch would have been: nothing
			// was counted again, so no slot is given back.
			b.missed = b.missed[:missed]
			for range evs {
				ds = append(ds, limit.Decision{Kind: limit.Keep})
			}
			return ds, nil
		}
		if err := r.raiseTakes(ctx, more); err != nil {
			return ds, err
		}
		b.late += len(evs)
		ds = append(ds, more...)
	}
}
