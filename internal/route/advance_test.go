package route

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// advancingAdmitter is a fakeAdmitter that moves the waiting events that
// move says may go (BacklogAdvancer), recording each call.
type advancingAdmitter struct {
	*fakeAdmitter
	move func(limit.Waiting) bool
	at   time.Time // what Advance says the moves were counted at
	mu   sync.Mutex
	got  [][]limit.Waiting
	src  []limit.Source
}

func (a *advancingAdmitter) Advance(_ context.Context, src limit.Source, events []limit.Waiting) ([]bool, time.Time, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.got = append(a.got, slices.Clone(events))
	a.src = append(a.src, src)
	out := make([]bool, len(events))
	for i, e := range events {
		out[i] = a.move(e)
	}
	return out, a.at, nil
}

// TestRetrierAdvance: the Retrier offers the waiting events of a retry
// tier partition that hold a reserved slot still ahead (not unreserved or
// due ones) to the Admitter in one call naming the tier partition as its
// source; Handle forwards those moved, before their gk-due (from the
// first tier or a later one), with gk-due rewritten to the time the
// Admitter counted the moves at (not the later time Handle runs at, which
// may be in the next window) and counted as advanced, and still fails on the others as early. Without
// AdvanceBacklog nothing is offered.
func TestRetrierAdvance(t *testing.T) {
	named := deferral("b", 1, t0.Add(5*time.Second), t0.Add(6*time.Second))
	named.Windows = "w1" // gk-windows: offered with the event
	moved := retryMsg("down.retry", 1, named)
	kept := retryMsg("down.retry", 2, deferral("b", 1, t0.Add(6*time.Second), t0.Add(7*time.Second)))
	unreserved := retryMsg("down.retry", 3, deferral("b", 1, t0.Add(7*time.Second), t0.Add(7*time.Second)))
	due := retryMsg("down.retry", 4, deferral("b", 1, t0.Add(-time.Second), t0.Add(time.Second)))
	later := retryMsg(testTopics.Tiers()[1].Topic, 5, deferral("c", 1, t0.Add(2*time.Minute), t0.Add(2*time.Minute+time.Second)))
	msgs := []kafka.Message{moved, kept, unreserved, due}

	f := newRetrier(t, byTenant(nil))
	counted := t0.Add(-300 * time.Millisecond)
	adv := &advancingAdmitter{fakeAdmitter: f.admitter, move: func(w limit.Waiting) bool { return w.Offset == 1 || w.Offset == 5 }, at: counted}
	spec := Retrier{Admission: testAdmission(f.writer, f.admitter, f.metrics, f.ready), MaxAttempts: 3}
	spec.Admitter = adv
	if got := mustRetrier(t, spec).Advance(context.Background(), consumed(0, msgs)); got != nil || len(adv.got) != 0 {
		t.Fatalf("without AdvanceBacklog: %v, %d calls", got, len(adv.got))
	}
	spec.AdvanceBacklog = true
	r := mustRetrier(t, spec)
	got := r.Advance(context.Background(), consumed(0, msgs))
	if !slices.Equal(got, []bool{true, false, false, false}) {
		t.Fatalf("Advance: %v, want the first alone", got)
	}
	// Each with the cost the Gate counted: key "k1", value "v" and header
	// trace=x are 9 bytes; its gk- headers do not count.
	want := []limit.Waiting{{Tenant: "b", Offset: 1, Due: t0.Add(5 * time.Second), Cost: limit.Cost{Bytes: 9}, Windows: "w1"},
		{Tenant: "b", Offset: 2, Due: t0.Add(6 * time.Second), Cost: limit.Cost{Bytes: 9}}}
	if len(adv.got) != 1 || !slices.Equal(adv.got[0], want) || adv.src[0].Topic != "down.retry" {
		t.Fatalf("offered %v from %v, want one call of %v from down.retry", adv.got, adv.src, want)
	}

	if err := r.Handle(context.Background(), consumed(0, []kafka.Message{moved})); err != nil {
		t.Fatal(err)
	}
	out := f.writer.last(t)
	if len(out) != 1 || out[0].Topic != "down" {
		t.Fatalf("wrote %v, want the moved event downstream", view(out))
	}
	if d, ok := lastHeader(out[0].Headers, HeaderDue); !ok || d != ms(counted) {
		t.Errorf("gk-due %q, want the time the move was counted at %s (Handle ran at %s)", d, ms(counted), ms(t0))
	}
	if v := counterValue(t, f.metrics.Decisions.WithLabelValues(DecisionAdvanced)); v != 1 {
		t.Errorf("advanced decisions %v, want 1", v)
	}
	if err := r.Handle(context.Background(), consumed(0, []kafka.Message{kept})); !errors.Is(err, ErrEarly) {
		t.Errorf("the event kept handed over early: %v, want ErrEarly", err)
	}
	// A later tier's event moved goes downstream too, not to a lower tier.
	if got := r.Advance(context.Background(), consumed(0, []kafka.Message{later})); !slices.Equal(got, []bool{true}) {
		t.Fatalf("Advance of a later tier's event: %v", got)
	}
	if err := r.Handle(context.Background(), consumed(0, []kafka.Message{later})); err != nil {
		t.Fatal(err)
	}
	if out := f.writer.last(t); len(out) != 1 || out[0].Topic != "down" {
		t.Fatalf("wrote %v, want the later tier's moved event downstream", view(out))
	}
	var _ consume.Advancer = r
}

// TestRetrierAdvanceCosts: with GATEKEEPER_COST_FROM the Retrier offers each
// waiting event with its cost, read as the Gate and Handle read it (bytes
// without the gk- headers, and units); an event whose cost cannot be read
// is not offered, nor are its tenant's events due at or after it, whatever
// their offsets (they must not move before it), while its tenant's events
// due before it and other tenants' are.
func TestRetrierAdvanceCosts(t *testing.T) {
	withUnits := func(m kafka.Message, units string) kafka.Message {
		if units != "" {
			m.Headers = append(m.Headers, kafka.Header{Key: "units", Value: []byte(units)})
		}
		return m
	}
	msgs := []kafka.Message{
		withUnits(retryMsg("down.retry", 0, deferral("b", 1, t0.Add(8*time.Second), t0.Add(9*time.Second))), "2"),
		withUnits(retryMsg("down.retry", 1, deferral("b", 1, t0.Add(5*time.Second), t0.Add(6*time.Second))), "40"),
		withUnits(retryMsg("down.retry", 2, deferral("b", 1, t0.Add(6*time.Second), t0.Add(7*time.Second))), ""),
		withUnits(retryMsg("down.retry", 3, deferral("b", 1, t0.Add(7*time.Second), t0.Add(8*time.Second))), "7"),
		withUnits(retryMsg("down.retry", 4, deferral("c", 1, t0.Add(7*time.Second), t0.Add(8*time.Second))), "3"),
		withUnits(retryMsg("down.retry", 5, deferral("b", 1, t0.Add(5500*time.Millisecond), t0.Add(6*time.Second))), "1"),
	}
	f := newRetrier(t, byTenant(nil))
	adv := &advancingAdmitter{fakeAdmitter: f.admitter, move: func(limit.Waiting) bool { return false }, at: t0}
	costs, err := ParseCostFrom("header:units")
	if err != nil {
		t.Fatal(err)
	}
	spec := Retrier{Admission: testAdmission(f.writer, f.admitter, f.metrics, f.ready), MaxAttempts: 3, AdvanceBacklog: true}
	spec.Admitter, spec.CostFrom = adv, costs
	mustRetrier(t, spec).Advance(context.Background(), consumed(0, msgs))
	// 9 bytes of key, value and trace=x, and the header units=40 (7) or
	// units=3 (6).
	want := []limit.Waiting{
		{Tenant: "b", Offset: 1, Due: t0.Add(5 * time.Second), Cost: limit.Cost{Bytes: 9 + 7, Units: 40}},
		{Tenant: "c", Offset: 4, Due: t0.Add(7 * time.Second), Cost: limit.Cost{Bytes: 9 + 6, Units: 3}},
		{Tenant: "b", Offset: 5, Due: t0.Add(5500 * time.Millisecond), Cost: limit.Cost{Bytes: 9 + 6, Units: 1}},
	}
	if len(adv.got) != 1 || !slices.Equal(adv.got[0], want) {
		t.Fatalf("offered %v, want one call of %v", adv.got, want)
	}
}
