package route

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// Stage and Finish do what Handle does: the same call, the same writes,
// the same metrics; nothing is written before Finish.
func TestGateStageFinishIsHandle(t *testing.T) {
	f := newGate(t, byTenant(gateDecisions))
	s, err := f.gate.Stage(context.Background(), batchOf(mixedBatch()))
	if err != nil {
		t.Fatalf("Stage: %v", err)
	}
	if got := len(f.writer.Calls()); got != 0 {
		t.Fatalf("%d writes before Finish, want none", got)
	}
	if got := counterValue(t, f.metrics.EventsIn.WithLabelValues("events")); got != 0 {
		t.Errorf("events_in_total before Finish: got %v, want 0", got)
	}
	if err := s.Finish(context.Background()); err != nil {
		t.Fatalf("Finish: %v", err)
	}

	h := newGate(t, byTenant(gateDecisions))
	if err := h.gate.Handle(context.Background(), batchOf(mixedBatch())); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if diff := cmp.Diff(h.admitter.Calls(), f.admitter.Calls()); diff != "" {
		t.Errorf("Admit calls, Handle against Stage (-handle +stage):\n%s", diff)
	}
	if len(f.writer.Calls()) != 1 || len(h.writer.Calls()) != 1 {
		t.Fatalf("writes: %d by Stage and Finish, %d by Handle, want 1 each", len(f.writer.Calls()), len(h.writer.Calls()))
	}
	if diff := cmp.Diff(view(h.writer.Calls()[0]), view(f.writer.Calls()[0])); diff != "" {
		t.Errorf("written, Handle against Stage (-handle +stage):\n%s", diff)
	}
	for _, label := range []string{"admit", "defer", "reject", "invalid"} {
		if got, want := counterValue(t, f.metrics.Decisions.WithLabelValues(label)), counterValue(t, h.metrics.Decisions.WithLabelValues(label)); got != want {
			t.Errorf("decisions_total{decision=%q}: %v after Finish, %v after Handle", label, got, want)
		}
	}
}

// Stage calls the limiter once: Redis trouble or a full replay record is
// returned at once, without the pause (readiness untouched), and Handle
// then pauses as ever.
func TestGateStageFailsFast(t *testing.T) {
	for _, fail := range []error{errRedis, limit.ErrReplayFull} {
		t.Run(fail.Error(), func(t *testing.T) {
			f := newGate(t, func(n int, tenants []string) ([]limit.Decision, error) {
				if n < 2 {
					return nil, fail
				}
				return byTenant(gateDecisions)(n, tenants)
			})
			f.gate.OnRedisError = RedisPause
			batch := batchOf([]kafka.Message{srcMsg(1, "ok"), srcMsg(2, "")})
			if _, err := f.gate.Stage(context.Background(), batch); !errors.Is(err, fail) {
				t.Fatalf("Stage: err = %v, want %v", err, fail)
			}
			if got := len(f.admitter.Calls()); got != 1 {
				t.Errorf("Stage made %d Admit calls, want 1", got)
			}
			if got := f.ready.Got(); len(got) != 0 {
				t.Errorf("Stage: SetReady calls %v, want none", got)
			}
			if got := len(f.writer.Calls()); got != 0 {
				t.Errorf("%d writes after a failed Stage, want none", got)
			}
			if errors.Is(fail, limit.ErrReplayFull) {
				return // Handle fails such a batch too (TestGateReplayFullFailsBatch)
			}
			if err := f.gate.Handle(context.Background(), batch); err != nil {
				t.Fatalf("Handle: %v", err)
			}
			if diff := cmp.Diff([]bool{false, true}, f.ready.Got()); diff != "" {
				t.Errorf("Handle's SetReady calls (-want +got):\n%s", diff)
			}
			if got := len(f.writer.Calls()); got != 1 {
				t.Errorf("%d writes after Handle, want 1", got)
			}
		})
	}
}

// A staged batch that is dropped writes nothing and counts nothing.
func TestGateStageDrop(t *testing.T) {
	f := newGate(t, byTenant(gateDecisions))
	s, err := f.gate.Stage(context.Background(), batchOf(mixedBatch()))
	if err != nil {
		t.Fatalf("Stage: %v", err)
	}
	s.Drop()
	if got := len(f.writer.Calls()); got != 0 {
		t.Errorf("%d writes after Drop, want none", got)
	}
	if got := counterValue(t, f.metrics.Decisions.WithLabelValues("admit")); got != 0 {
		t.Errorf("decisions_total{decision=admit} after Drop: got %v, want 0", got)
	}
}
