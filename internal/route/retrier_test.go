package route

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// deferral returns the deferral of an event of tenant first deferred an hour before t0.
func deferral(tenant string, attempt int, due, reserved time.Time) Deferral {
	return Deferral{Attempt: attempt, Due: due, Reserved: reserved, FirstSeen: t0.Add(-time.Hour),
		Tenant: tenant, OriginTopic: "events", OriginPartition: 1, OriginOffset: 77}
}

// retryMsg is a message read from a retry tier topic at offset off.
func retryMsg(topic string, off int64, d Deferral) kafka.Message {
	m := kafka.Message{Topic: topic, Partition: 0, Offset: off, Key: []byte("k" + strconv.FormatInt(off, 10)),
		Value: []byte("v"), Headers: hdr("trace", "x"), Time: t0.Add(-2 * time.Hour)}
	return WithDeferral(m, d)
}

// outOf is the expected output of m written to topic, with extra headers appended.
func outOf(m kafka.Message, topic string, extra ...string) out {
	o := view([]kafka.Message{m})[0]
	o.Topic = topic
	o.Headers = append(o.Headers, extra...)
	return o
}

type retrierFixture struct {
	retrier  *Retrier
	writer   *fakeWriter
	admitter *fakeAdmitter
	metrics  *Metrics
	ready    *readyLog
}

func newRetrier(t *testing.T, decide func(int, []string) ([]limit.Decision, error)) retrierFixture {
	t.Helper()
	f := retrierFixture{
		writer:   &fakeWriter{},
		admitter: &fakeAdmitter{decide: decide},
		metrics:  newTestMetrics(t),
		ready:    &readyLog{},
	}
	f.retrier = mustRetrier(t, Retrier{Admission: testAdmission(f.writer, f.admitter, f.metrics, f.ready), MaxAttempts: 3})
	return f
}

func TestRetrierHandle(t *testing.T) {
	past := t0.Add(-10 * time.Second)
	decisions := map[string]limit.Decision{
		"ok":     {Kind: limit.Admit},
		"again":  {Kind: limit.Defer, Due: t0.Add(20 * time.Minute), Until: t0.Add(21 * time.Minute), Windows: "w2"},
		"full":   {Kind: limit.Reject, Reason: "no room within 24h"},
		"broken": {Kind: limit.Fail, Reason: brokenReason},
	}

	requeue1h := retryMsg("down.retry.1h", 1, deferral("ok", 1, t0.Add(time.Minute), t0.Add(2*time.Minute)))
	requeueLong := retryMsg("down.retry.long", 2, deferral("ok", 1, t0.Add(time.Hour), t0.Add(2*time.Hour)))
	requeueLate := retryMsg("down.retry.long", 3, deferral("ok", 1, t0.Add(30*time.Second), t0.Add(2*time.Hour)))
	badDueTier := kafka.Message{Topic: "down.retry.1h", Offset: 4, Key: []byte("k4"), Headers: hdr("gk-due", "x")}
	reserved := retryMsg("down.retry", 5, deferral("full", 2, past, t0.Add(time.Second)))
	reservedEdge := retryMsg("down.retry", 6, deferral("full", 2, t0, t0.Add(time.Millisecond)))
	admitted := retryMsg("down.retry", 7, deferral("ok", 1, past, t0))
	deferred := retryMsg("down.retry", 8, deferral("again", 2, past, past))
	maxed := retryMsg("down.retry", 9, deferral("again", 3, past, past))
	rejected := retryMsg("down.retry", 10, deferral("full", 1, past, past))
	noHeaders := kafka.Message{Topic: "down.retry", Offset: 11, Key: []byte("k11"), Headers: hdr("trace", "x")}
	failed := retryMsg("down.retry", 12, deferral("broken", 1, past, past))

	batch := []kafka.Message{requeue1h, requeueLong, requeueLate, badDueTier, reserved, reservedEdge,
		admitted, deferred, maxed, rejected, noHeaders, failed}

	f := newRetrier(t, byTenant(decisions))
	if err := f.retrier.Handle(context.Background(), batchOf(batch)); err != nil {
		t.Fatalf("Handle: %v", err)
	}

	if diff := cmp.Diff([][]string{{"ok", "again", "again", "full", "broken"}}, f.admitter.Calls()); diff != "" {
		t.Errorf("Admit calls mismatch (-want +got):\n%s", diff)
	}
	next := deferral("again", 3, decisions["again"].Due, decisions["again"].Until)
	next.Windows = "w2" // the windows of the new reservation
	want := []out{
		outOf(requeue1h, "down.retry"),
		outOf(requeueLong, "down.retry.1h"),
		outOf(requeueLate, "down.retry"),
		outOf(badDueTier, "down.dlq", `gk-reason=header gk-due: "x" is not an integer`),
		outOf(reserved, "down"),
		outOf(reservedEdge, "down"),
		outOf(admitted, "down"),
		outOf(retryMsg("", 8, next), "down.retry.1h"),
		outOf(maxed, "down.dlq", "gk-reason=max attempts"),
		outOf(rejected, "down.dlq", "gk-reason=no room within 24h"),
		outOf(noHeaders, "down.dlq", "gk-reason=no header gk-attempt"),
		outOf(failed, "down.dlq", "gk-reason="+brokenReason),
	}
	calls := f.writer.Calls()
	if len(calls) != 1 {
		t.Fatalf("got %d WriteMessages calls, want 1", len(calls))
	}
	diffOut(t, want, calls[0])

	for label, want := range map[string]float64{"admit": 1, "defer": 1, "reject": 1, "fail": 1, "invalid": 2, "reserved": 2, "max_attempts": 1} {
		if got := counterValue(t, f.metrics.Decisions.WithLabelValues(label)); got != want {
			t.Errorf("decisions_total{decision=%q}: got %v, want %v", label, got, want)
		}
	}
	if got := counterValue(t, f.metrics.EventsIn); got != float64(len(batch)) {
		t.Errorf("events_in_total: got %v, want %d", got, len(batch))
	}
}

func TestRetrierDefaultMaxAttempts(t *testing.T) {
	past := t0.Add(-time.Second)
	f := newRetrier(t, byTenant(map[string]limit.Decision{
		"again": {Kind: limit.Defer, Due: t0.Add(time.Second), Until: t0.Add(2 * time.Second)},
	}))
	f.retrier.MaxAttempts = 0
	at4 := retryMsg("down.retry", 1, deferral("again", 4, past, past))
	at5 := retryMsg("down.retry", 2, deferral("again", 5, past, past))
	if err := f.retrier.Handle(context.Background(), batchOf([]kafka.Message{at4, at5})); err != nil {
		t.Fatal(err)
	}
	got := f.writer.last(t)
	if got[0].Topic != "down.retry" || got[1].Topic != "down.dlq" {
		t.Errorf("got topics %s, %s, want down.retry, down.dlq (default max attempts %d)", got[0].Topic, got[1].Topic, DefaultMaxAttempts)
	}
}

func TestRetrierRefuses(t *testing.T) {
	ok := retryMsg("down.retry", 1, deferral("ok", 1, t0.Add(-time.Second), t0))
	tests := []struct {
		name      string
		msg       kafka.Message
		wantEarly bool
	}{
		{name: "first tier before due", msg: retryMsg("down.retry", 2, deferral("ok", 1, t0.Add(time.Millisecond), t0.Add(time.Minute))), wantEarly: true},
		{name: "1h tier before due-1m", msg: retryMsg("down.retry.1h", 2, deferral("ok", 1, t0.Add(time.Minute+time.Millisecond), t0.Add(time.Hour))), wantEarly: true},
		{name: "long tier before due-1h", msg: retryMsg("down.retry.long", 2, deferral("ok", 1, t0.Add(time.Hour+time.Millisecond), t0.Add(2*time.Hour))), wantEarly: true},
		{name: "not a retry tier", msg: retryMsg("down", 2, deferral("ok", 1, t0, t0))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newRetrier(t, byTenant(nil))
			err := f.retrier.Handle(context.Background(), batchOf([]kafka.Message{ok, tt.msg}))
			if err == nil {
				t.Fatal("got no error, want one")
			}
			if got := errors.Is(err, ErrEarly); got != tt.wantEarly {
				t.Errorf("got errors.Is(err, ErrEarly) %v, want %v (err %v)", got, tt.wantEarly, err)
			}
			if got := len(f.writer.Calls()); got != 0 {
				t.Errorf("got %d WriteMessages calls, want none", got)
			}
			if got := len(f.admitter.Calls()); got != 0 {
				t.Errorf("got %d Admit calls, want none", got)
			}
		})
	}
}

func TestRetrierRedis(t *testing.T) {
	past := t0.Add(-time.Second)
	batch := []kafka.Message{
		retryMsg("down.retry", 1, deferral("full", 1, past, past)),
		retryMsg("down.retry", 2, deferral("full", 1, past, t0.Add(time.Second))),
	}
	t.Run("forward", func(t *testing.T) {
		f := newRetrier(t, func(int, []string) ([]limit.Decision, error) { return nil, errRedis })
		f.retrier.OnRedisError = RedisForward
		if err := f.retrier.Handle(context.Background(), batchOf(batch)); err != nil {
			t.Fatal(err)
		}
		diffOut(t, []out{outOf(batch[0], "down"), outOf(batch[1], "down")}, f.writer.last(t))
		if got := counterValue(t, f.metrics.RedisUnchecked); got != 1 {
			t.Errorf("redis_unchecked_total: got %v, want 1", got)
		}
	})
	t.Run("pause", func(t *testing.T) {
		f := newRetrier(t, func(n int, ts []string) ([]limit.Decision, error) {
			if n < 2 {
				return nil, errRedis
			}
			return byTenant(map[string]limit.Decision{"full": {Kind: limit.Reject}})(n, ts)
		})
		if err := f.retrier.Handle(context.Background(), batchOf(batch)); err != nil {
			t.Fatal(err)
		}
		diffOut(t, []out{outOf(batch[0], "down.dlq", "gk-reason=over limit"), outOf(batch[1], "down")}, f.writer.last(t))
		if diff := cmp.Diff([]bool{false, true}, f.ready.Got()); diff != "" {
			t.Errorf("SetReady calls mismatch (-want +got):\n%s", diff)
		}
	})
	t.Run("pause until context ends", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		f := newRetrier(t, func(int, []string) ([]limit.Decision, error) { return nil, errRedis })
		err := f.retrier.Handle(ctx, batchOf(batch))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got error %v, want context.DeadlineExceeded", err)
		}
		if got := len(f.writer.Calls()); got != 0 {
			t.Errorf("got %d WriteMessages calls, want none", got)
		}
	})
}

func TestRetrierValidate(t *testing.T) {
	r := &Router{Writer: &fakeWriter{}}
	a := &fakeAdmitter{}
	tests := []struct {
		name    string
		retrier Retrier
		ok      bool
	}{
		{name: "complete", retrier: Retrier{Admission: Admission{Admitter: a, Router: r}}, ok: true},
		{name: "negative attempts", retrier: Retrier{Admission: Admission{Admitter: a, Router: r}, MaxAttempts: -1}},
		{name: "bad policy", retrier: Retrier{Admission: Admission{Admitter: a, Router: r, OnRedisError: "drop"}}},
		{name: "no admitter", retrier: Retrier{Admission: Admission{Router: r}}},
		{name: "no router", retrier: Retrier{Admission: Admission{Admitter: a}}},
	}
	for _, tt := range tests {
		_, err := NewRetrier(tt.retrier)
		if (err == nil) != tt.ok {
			t.Errorf("%s: got error %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}

// withHeader returns a copy of m with every header named name set to value.
func withHeader(m kafka.Message, name, value string) kafka.Message {
	m.Headers = append([]kafka.Header(nil), m.Headers...)
	for i := range m.Headers {
		if m.Headers[i].Key == name {
			m.Headers[i].Value = []byte(value)
		}
	}
	return m
}

// TestRetrierSigned checks that with a retry secret the Retrier dead-letters
// retry-tier events whose gk- headers Gatekeeper did not sign, before it
// reads them, and that every event it writes back to a tier verifies.
func TestRetrierSigned(t *testing.T) {
	past := t0.Add(-10 * time.Second)
	year := t0.Add(365 * 24 * time.Hour)
	s := newTestSigner(t, testSecret, testPrevious)
	decisions := map[string]limit.Decision{
		"again": {Kind: limit.Defer, Due: t0.Add(20 * time.Minute), Until: t0.Add(21 * time.Minute)},
	}

	inSlot := s.Sign(retryMsg("down.retry", 1, deferral("ok", 1, past, t0.Add(time.Second))))
	readmit := s.Sign(retryMsg("down.retry", 2, deferral("again", 1, past, past)))
	move := s.Sign(retryMsg("down.retry.1h", 3, deferral("ok", 1, t0.Add(time.Minute), t0.Add(2*time.Minute))))
	moveOldKey := newTestSigner(t, testPrevious).Sign(retryMsg("down.retry.long", 4, deferral("ok", 1, t0.Add(time.Hour), t0.Add(2*time.Hour))))
	unsigned := retryMsg("down.retry", 5, deferral("victim", 1, past, year))
	unsignedEarly := retryMsg("down.retry", 6, deferral("ok", 1, year, year))
	unsignedTier := retryMsg("down.retry.long", 7, deferral("ok", 1, t0.Add(time.Hour), year))
	farReserved := withHeader(s.Sign(retryMsg("down.retry", 8, deferral("cheap", 1, past, past))), HeaderReserved, ms(year))
	otherTenant := withHeader(s.Sign(retryMsg("down.retry", 9, deferral("cheap", 1, past, t0.Add(time.Second)))), HeaderTenant, "victim")
	otherEvent := s.Sign(retryMsg("down.retry", 10, deferral("ok", 1, past, t0.Add(time.Second))))
	otherEvent.Value = []byte("another event")
	// Signed for the long tier, written to the first one (or read back from
	// the dead-letter topic into it): bound to its tier, it does not verify.
	otherTier := s.Sign(retryMsg("down.retry.long", 11, deferral("ok", 1, past, t0.Add(time.Second))))
	otherTier.Topic = "down.retry"

	batch := []kafka.Message{inSlot, readmit, move, moveOldKey, unsigned, unsignedEarly, unsignedTier,
		farReserved, otherTenant, otherEvent, otherTier}
	f := newRetrier(t, byTenant(decisions))
	f.retrier.Router.Signer = s
	if err := f.retrier.Handle(context.Background(), batchOf(batch)); err != nil {
		t.Fatalf("Handle: %v", err)
	}

	if diff := cmp.Diff([][]string{{"again"}}, f.admitter.Calls()); diff != "" {
		t.Errorf("Admit calls mismatch (-want +got):\n%s", diff)
	}
	next := deferral("again", 2, decisions["again"].Due, decisions["again"].Until)
	// signedFor is m signed for the tier topic it is written to.
	signedFor := func(m kafka.Message, topic string) kafka.Message {
		m.Topic = topic
		return s.Sign(m)
	}
	// What leaves the retry path carries no gk-sig.
	want := []out{
		outOf(withoutSig(inSlot), "down"),
		outOf(signedFor(retryMsg("", 2, next), "down.retry.1h"), "down.retry.1h"),
		outOf(signedFor(move, "down.retry"), "down.retry"),
		outOf(signedFor(moveOldKey, "down.retry.1h"), "down.retry.1h"),
		outOf(unsigned, "down.dlq", "gk-reason=gk-sig missing"),
		outOf(unsignedEarly, "down.dlq", "gk-reason=gk-sig missing"),
		outOf(unsignedTier, "down.dlq", "gk-reason=gk-sig missing"),
		outOf(withoutSig(farReserved), "down.dlq", "gk-reason=gk-sig does not match"),
		outOf(withoutSig(otherTenant), "down.dlq", "gk-reason=gk-sig does not match"),
		outOf(withoutSig(otherEvent), "down.dlq", "gk-reason=gk-sig does not match"),
		outOf(withoutSig(otherTier), "down.dlq", "gk-reason=gk-sig does not match"),
	}
	got := f.writer.last(t)
	diffOut(t, want, got)
	current := newTestSigner(t, testSecret)
	for i, m := range got {
		if strings.HasPrefix(m.Topic, "down.retry") {
			if err := current.Verify(m); err != nil {
				t.Errorf("message %d to %s: %v, want it signed with the current key", i, m.Topic, err)
			}
		}
	}

	for reason, want := range map[string]float64{"missing": 3, "mismatch": 4} {
		if got := counterValue(t, f.metrics.SigFailures.WithLabelValues(reason)); got != want {
			t.Errorf("retry_sig_failures_total{reason=%q}: got %v, want %v", reason, got, want)
		}
	}
	if got := counterValue(t, f.metrics.Decisions.WithLabelValues(DecisionInvalid)); got != 7 {
		t.Errorf("decisions_total{decision=\"invalid\"}: got %v, want 7", got)
	}
}

// TestRetrierUnsigned checks that without a retry secret gk-sig is neither
// required nor added.
func TestRetrierUnsigned(t *testing.T) {
	past := t0.Add(-time.Second)
	f := newRetrier(t, byTenant(map[string]limit.Decision{
		"again": {Kind: limit.Defer, Due: t0.Add(20 * time.Minute), Until: t0.Add(21 * time.Minute)},
	}))
	batch := []kafka.Message{
		retryMsg("down.retry", 1, deferral("ok", 1, past, t0.Add(time.Second))),
		retryMsg("down.retry", 2, deferral("again", 1, past, past)),
	}
	if err := f.retrier.Handle(context.Background(), batchOf(batch)); err != nil {
		t.Fatal(err)
	}
	for i, m := range f.writer.last(t) {
		if _, ok := LastHeader(m, HeaderSig); ok || m.Topic == "down.dlq" {
			t.Errorf("message %d: got topic %s with gk-sig %v, want no DLQ and no gk-sig", i, m.Topic, ok)
		}
	}
}

func TestRetrierReleaseAtSigned(t *testing.T) {
	s := newTestSigner(t, testSecret)
	d := testDeferral()
	d.Due = t0.Add(2 * time.Hour)
	signed := s.Sign(WithDeferral(kafka.Message{Topic: "down.retry.long", Value: []byte("v")}, d))
	signed.Topic = "down.retry.long"
	forged := withHeader(signed, HeaderDue, ms(t0.Add(1000*time.Hour)))
	unsigned := WithDeferral(kafka.Message{Topic: "down.retry.long"}, d)
	tests := []struct {
		name   string
		signer *Signer
		msg    kafka.Message
		want   time.Time
	}{
		{name: "signed", signer: s, msg: signed, want: d.Due.Add(-time.Hour)},
		{name: "forged due", signer: s, msg: forged, want: time.Time{}},
		{name: "unsigned", signer: s, msg: unsigned, want: time.Time{}},
		{name: "unsigned without signer", msg: unsigned, want: d.Due.Add(-time.Hour)},
	}
	for _, tt := range tests {
		r := &Retrier{Admission: Admission{Router: &Router{Topics: testTopics, Signer: tt.signer}}}
		if got := r.ReleaseAt(tt.msg).At; !got.Equal(tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}

// The release clock's checks travel with the messages (Batch.Notes), and
// Handle reads no gk-sig or gk-due again: a message changed after its check
// is decided by the check. A gk-sig accepted only while unsigned events are
// is the exception: it is verified again once that has ended.
func TestRetrierUsesReleaseNotes(t *testing.T) {
	past := t0.Add(-10 * time.Second)
	now := t0
	s := newTestSigner(t, testSecret).AcceptUnsignedUntil(t0.Add(time.Minute), func() time.Time { return now })
	checked := s.Sign(retryMsg("down.retry", 1, deferral("ok", 1, past, t0.Add(time.Second))))
	unsigned := retryMsg("down.retry", 2, deferral("ok", 1, past, t0.Add(time.Second)))
	f := newRetrier(t, byTenant(nil))
	f.retrier.Router.Signer = s
	notes := []any{f.retrier.ReleaseAt(checked).Note, f.retrier.ReleaseAt(unsigned).Note}

	changed := checked
	changed.Value = []byte("changed after its check") // its gk-sig no longer matches
	now = t0.Add(2 * time.Minute)                     // unsigned events are no longer accepted
	b := batchOf([]kafka.Message{changed, unsigned})
	b.Notes = notes
	if err := f.retrier.Handle(context.Background(), b); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	diffOut(t, []out{
		outOf(withoutSig(changed), "down"),
		outOf(unsigned, "down.dlq", "gk-reason=gk-sig missing"),
	}, f.writer.last(t))

	// Without notes (a batch no Delayed consumer handed over), Handle checks.
	f = newRetrier(t, byTenant(nil))
	f.retrier.Router.Signer = s
	if err := f.retrier.Handle(context.Background(), batchOf([]kafka.Message{changed, unsigned})); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	diffOut(t, []out{
		outOf(withoutSig(changed), "down.dlq", "gk-reason=gk-sig does not match"),
		outOf(unsigned, "down.dlq", "gk-reason=gk-sig missing"),
	}, f.writer.last(t))
}
