package route

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// The Gate names the batch's source to the Admitter: the partition, the
// offsets of the events with a tenant, and the committed offset the consumer
// put in the batch. A batch that names no partition names no source.
func TestGateSource(t *testing.T) {
	batch := []kafka.Message{srcMsg(10, "ok"), srcMsg(11, ""), srcMsg(12, "later")}
	for name, tc := range map[string]struct {
		batch consume.Batch
		want  sourceAt
	}{
		"from a consumer": {consumed(8, batch),
			sourceAt{limit.Source{Topic: "events", Partition: 1, Low: 8}, []int64{10, 12}}},
		"no committed offset": {batchOf(batch), sourceAt{}},
	} {
		t.Run(name, func(t *testing.T) {
			f := newGate(t, byTenant(gateDecisions))
			if err := f.gate.Handle(context.Background(), tc.batch); err != nil {
				t.Fatalf("Handle: %v", err)
			}
			if diff := cmp.Diff([]sourceAt{tc.want}, f.admitter.Sources()); diff != "" {
				t.Errorf("sources (-want +got):\n%s", diff)
			}
		})
	}
}

// The Retrier names, for the events it checks again, their positions in
// the retry tier (unique per trip), and counts them as late reservations.
func TestRetrierSourceAndLate(t *testing.T) {
	past := t0.Add(-10 * time.Second)
	batch := []kafka.Message{
		retryMsg("down.retry", 5, deferral("ok", 1, past, t0.Add(time.Second))), // in its slot: not checked
		retryMsg("down.retry", 6, deferral("ok", 1, past, past)),
		retryMsg("down.retry", 9, deferral("again", 2, past, past)),
	}
	f := newRetrier(t, byTenant(map[string]limit.Decision{
		"ok":    {Kind: limit.Admit},
		"again": {Kind: limit.Defer, Due: t0.Add(time.Minute), Until: t0.Add(2 * time.Minute)},
	}))
	if err := f.retrier.Handle(context.Background(), consumed(4, batch)); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	want := []sourceAt{{limit.Source{Topic: "down.retry", Partition: 0, Low: 4}, []int64{6, 9}}}
	if diff := cmp.Diff(want, f.admitter.Sources()); diff != "" {
		t.Errorf("sources (-want +got):\n%s", diff)
	}
	if got := counterValue(t, f.metrics.LateReservations); got != 2 {
		t.Errorf("late_reservations_total: got %v, want 2", got)
	}
}

// An Admit call that ran in Redis but whose reply was lost (a timeout) is
// retried by the Admission with the same source: the retry gets the
// recorded decisions and counts nothing more (real Redis and Cluster).
func TestAdmissionRetryAfterLostReplyRedis(t *testing.T) {
	for name, rdb := range testRedisClients(t) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			now := time.Date(2026, 11, 30, 10, 0, 10, 0, time.UTC)
			lim, _ := redisLimiter(t, ctx, rdb, "*=2/1m", func() time.Time { return now })
			f := newGate(t, nil)
			f.admitter.from = func(n int, src limit.Source, events []limit.Event) ([]limit.Decision, error) {
				ds, err := lim.AdmitFrom(ctx, src, events)
				if n == 0 && err == nil {
					return nil, context.DeadlineExceeded // it ran; the reply is lost
				}
				return ds, err
			}
			batch := []kafka.Message{srcMsg(1, "a"), srcMsg(2, "a"), srcMsg(3, "a"), srcMsg(4, "b")}
			if err := f.gate.Handle(ctx, consumed(1, batch)); err != nil {
				t.Fatalf("Handle: %v", err)
			}
			if got := len(f.admitter.Calls()); got != 2 {
				t.Errorf("got %d Admit calls, want 2 (the lost one, the retry)", got)
			}
			var topics []string
			for _, m := range f.writer.last(t) {
				if strings.HasPrefix(m.Topic, "down.retry") {
					m.Topic = "retry" // the tier depends on the Router's clock, not the limiter's
				}
				topics = append(topics, m.Topic)
			}
			if got, want := strings.Join(topics, " "), "down down retry down"; got != want {
				t.Errorf("destinations: got %s, want %s", got, want)
			}
			for tenant, want := range map[string]int64{"a": 2, "b": 1} {
				if us, err := lim.Usage(ctx, tenant); err != nil || us[0].Count != want {
					t.Errorf("%s's usage: got %+v %v, want count %d", tenant, us, err, want)
				}
			}
			now = now.Add(time.Minute) // a's reserved slot is in the next window
			if us, err := lim.Usage(ctx, "a"); err != nil || us[0].Count != 1 {
				t.Errorf("a's usage of the next window: got %+v %v, want count 1", us, err)
			}
		})
	}
}

// Two copies of one trip (a retry-tier write retried after the broker
// appended it) that come back late in one batch are checked once: one
// decision, given to both, one late reservation.
func TestRetrierOneCheckPerTrip(t *testing.T) {
	past := t0.Add(-10 * time.Second)
	d := deferral("again", 1, past, past)
	batch := []kafka.Message{retryMsg("down.retry", 6, d), retryMsg("down.retry", 7, d),
		retryMsg("down.retry", 8, deferral("again", 2, past, past))} // another trip
	f := newRetrier(t, byTenant(map[string]limit.Decision{
		"again": {Kind: limit.Defer, Due: t0.Add(time.Minute), Until: t0.Add(2 * time.Minute)},
	}))
	if err := f.retrier.Handle(context.Background(), consumed(6, batch)); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	want := []sourceAt{{limit.Source{Topic: "down.retry", Partition: 0, Low: 6}, []int64{6, 8}}}
	if diff := cmp.Diff(want, f.admitter.Sources()); diff != "" {
		t.Errorf("sources (-want +got):\n%s", diff)
	}
	var dues []string
	for _, m := range f.writer.last(t) {
		due, _ := LastHeader(m, HeaderDue)
		attempt, _ := LastHeader(m, HeaderAttempt)
		dues = append(dues, attempt+"@"+due)
	}
	next := ms(t0.Add(time.Minute))
	if diff := cmp.Diff([]string{"2@" + next, "2@" + next, "3@" + next}, dues); diff != "" {
		t.Errorf("attempt@due written (-want +got):\n%s", diff)
	}
	if got := counterValue(t, f.metrics.LateReservations); got != 2 {
		t.Errorf("late_reservations_total: got %v, want 2 (two trips)", got)
	}
}
