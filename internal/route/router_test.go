package route

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

func TestRetryTier(t *testing.T) {
	tests := []struct {
		delay     time.Duration
		wantTopic string
		wantLower time.Duration
	}{
		{delay: -time.Hour, wantTopic: "down.retry"},
		{delay: 0, wantTopic: "down.retry"},
		{delay: time.Second, wantTopic: "down.retry"},
		{delay: time.Minute, wantTopic: "down.retry"},
		{delay: time.Minute + time.Nanosecond, wantTopic: "down.retry.1h", wantLower: time.Minute},
		{delay: 30 * time.Minute, wantTopic: "down.retry.1h", wantLower: time.Minute},
		{delay: time.Hour, wantTopic: "down.retry.1h", wantLower: time.Minute},
		{delay: time.Hour + time.Nanosecond, wantTopic: "down.retry.long", wantLower: time.Hour},
		{delay: 24 * time.Hour, wantTopic: "down.retry.long", wantLower: time.Hour},
	}
	for _, tt := range tests {
		topic, lower := testTopics.RetryTier(tt.delay)
		if topic != tt.wantTopic || lower != tt.wantLower {
			t.Errorf("RetryTier(%v): got %s, %v, want %s, %v", tt.delay, topic, lower, tt.wantTopic, tt.wantLower)
		}
	}
}

func TestTiers(t *testing.T) {
	want := []Tier{
		{Topic: "down.retry", LowerBound: 0, UpperBound: time.Minute},
		{Topic: "down.retry.1h", LowerBound: time.Minute, UpperBound: time.Hour},
		{Topic: "down.retry.long", LowerBound: time.Hour},
	}
	if diff := cmp.Diff(want, testTopics.Tiers()); diff != "" {
		t.Errorf("tiers mismatch (-want +got):\n%s", diff)
	}
	for _, topic := range []string{"down", "down.retry.2h", "down.retryx", "down.retry.1hx", ""} {
		if tr, ok := testTopics.Tier(topic); ok {
			t.Errorf("Tier(%q): got %+v, want no tier", topic, tr)
		}
	}
	for _, w := range want {
		if got, ok := testTopics.Tier(w.Topic); !ok || got != w {
			t.Errorf("Tier(%q): got %+v, %v; want %+v", w.Topic, got, ok, w)
		}
	}
	// A message released from a tier with lower bound L, at due - L, goes
	// to a strictly lower tier.
	for i, tr := range testTopics.Tiers()[1:] {
		topic, _ := testTopics.RetryTier(tr.LowerBound)
		if want := testTopics.Tiers()[i].Topic; topic != want {
			t.Errorf("remaining delay %v from %s: got tier %s, want %s", tr.LowerBound, tr.Topic, topic, want)
		}
	}
}

func TestReleaseAt(t *testing.T) {
	due := t0.Add(2 * time.Hour)
	withDue := func(topic string) kafka.Message {
		return kafka.Message{Topic: topic, Headers: hdr(HeaderDue, ms(due))}
	}
	tests := []struct {
		name string
		msg  kafka.Message
		want time.Time
	}{
		{name: "first tier", msg: withDue("down.retry"), want: due},
		{name: "1h tier", msg: withDue("down.retry.1h"), want: due.Add(-time.Minute)},
		{name: "long tier", msg: withDue("down.retry.long"), want: due.Add(-time.Hour)},
		{name: "no due", msg: kafka.Message{Topic: "down.retry"}, want: time.Time{}},
		{name: "not a tier", msg: withDue("down"), want: time.Time{}},
	}
	r := &Retrier{Admission: Admission{Router: &Router{Topics: testTopics}}}
	for _, tt := range tests {
		if got := r.ReleaseAt(tt.msg).At; !got.Equal(tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestRouterBuild(t *testing.T) {
	src := kafka.Message{
		Topic: "events", Partition: 4, Offset: 99, HighWaterMark: 200,
		Key: []byte("k"), Value: []byte("v"), Headers: hdr("a", "1", "gk-reason", "stale"), Time: t0.Add(-time.Minute),
		WriterData: "x",
	}
	d := testDeferral()
	d.Due = t0.Add(10 * time.Minute)
	r := &Router{Topics: testTopics, Clock: fixedClock(t0)}
	items := []Item{
		{Msg: src, Outcome: Forward},
		{Msg: src, Outcome: Defer, Deferral: d},
		{Msg: src, Outcome: Requeue, Deferral: Deferral{Due: t0.Add(2 * time.Hour)}},
		{Msg: src, Outcome: Requeue, Deferral: Deferral{Due: t0.Add(-time.Second)}},
		{Msg: src, Outcome: DeadLetter, Reason: "no key"},
	}
	got, err := r.Build(items)
	if err != nil {
		t.Fatal(err)
	}
	base := out{Key: "k", Value: "v", Time: t0.Add(-time.Minute)}
	with := func(topic string, headers ...string) out {
		o := base
		o.Topic, o.Headers = topic, headers
		return o
	}
	want := []out{
		with("down", "a=1", "gk-reason=stale"),
		with("down.retry.1h", "a=1",
			"gk-attempt=2", "gk-due="+ms(d.Due), "gk-reserved="+ms(d.Reserved), "gk-tenant=acme",
			"gk-origin-topic=events", "gk-origin-partition=3", "gk-origin-offset=1234567890123",
			"gk-first-seen="+ms(d.FirstSeen)),
		with("down.retry.long", "a=1", "gk-reason=stale"),
		with("down.retry", "a=1", "gk-reason=stale"),
		with("down.dlq", "a=1", "gk-reason=no key"),
	}
	diffOut(t, want, got)
	for i, m := range got {
		if m.Partition != 0 || m.Offset != 0 || m.HighWaterMark != 0 || m.WriterData != nil {
			t.Errorf("message %d: got partition %d offset %d hwm %d writer data %v, want all zero",
				i, m.Partition, m.Offset, m.HighWaterMark, m.WriterData)
		}
	}

	if _, err := r.Build([]Item{{Msg: src}}); err == nil {
		t.Error("got no error for an item without outcome, want one")
	}
}

// TestRouterBuildSigned checks that with a Signer what goes to a retry tier
// is signed with the current key, for that tier, and that nothing else
// carries a gk-sig.
func TestRouterBuildSigned(t *testing.T) {
	s := newTestSigner(t, testSecret, testPrevious)
	src := kafka.Message{Key: []byte("k"), Value: []byte("v"), Headers: hdr("a", "1", HeaderSig, "forged")}
	oldKey := newTestSigner(t, testPrevious).Sign(WithDeferral(src, testDeferral()))
	r := &Router{Topics: testTopics, Clock: fixedClock(t0), Signer: s}
	items := []Item{
		{Msg: src, Outcome: Defer, Deferral: testDeferral()},
		{Msg: oldKey, Outcome: Requeue, Deferral: Deferral{Due: t0.Add(2 * time.Hour)}},
		{Msg: src, Outcome: Forward},
		{Msg: src, Outcome: DeadLetter, Reason: "no key"},
	}
	got, err := r.Build(items)
	if err != nil {
		t.Fatal(err)
	}
	current := newTestSigner(t, testSecret)
	tests := []struct {
		topic string
		want  error
	}{
		{"down.retry", nil},
		{"down.retry.long", nil},
		{"down", ErrSigMissing}, // the forged gk-sig it came with removed
		{"down.dlq", ErrSigMissing},
	}
	for i, tt := range tests {
		if got[i].Topic != tt.topic {
			t.Errorf("item %d: got topic %s, want %s", i, got[i].Topic, tt.topic)
		}
		if err := current.Verify(got[i]); !errors.Is(err, tt.want) {
			t.Errorf("item %d to %s: Verify got %v, want %v", i, got[i].Topic, err, tt.want)
		}
	}
	requeued := oldKey
	requeued.Topic = "down.retry.long"
	if diff := cmp.Diff(view([]kafka.Message{s.Sign(requeued)})[0].Headers, view(got[1:2])[0].Headers); diff != "" {
		t.Errorf("requeued headers (-want +got):\n%s", diff)
	}
}

func TestRouterRoute(t *testing.T) {
	errBroker := errors.New("broker down")
	msgs := []kafka.Message{
		{Key: []byte("a")}, {Key: []byte("b")}, {Key: []byte("c")},
	}
	items := make([]Item, len(msgs))
	for i, m := range msgs {
		items[i] = Item{Msg: m, Outcome: Forward}
	}
	keys := func(call []kafka.Message) []string {
		var ks []string
		for _, m := range call {
			ks = append(ks, string(m.Key))
		}
		return ks
	}
	tests := []struct {
		name      string
		fail      func(n int, msgs []kafka.Message) error
		wantCalls [][]string
	}{
		{
			name:      "first try",
			wantCalls: [][]string{{"a", "b", "c"}},
		},
		{
			name: "plain error retries all",
			fail: func(n int, _ []kafka.Message) error {
				if n < 2 {
					return errBroker
				}
				return nil
			},
			wantCalls: [][]string{{"a", "b", "c"}, {"a", "b", "c"}, {"a", "b", "c"}},
		},
		{
			name: "write errors retry the failed ones",
			fail: func(n int, msgs []kafka.Message) error {
				switch n {
				case 0:
					return kafka.WriteErrors{nil, errBroker, errBroker}
				case 1:
					return kafka.WriteErrors{nil, kafka.LeaderNotAvailable}
				}
				return nil
			},
			wantCalls: [][]string{{"a", "b", "c"}, {"b", "c"}, {"c"}},
		},
		{
			name: "write errors of the wrong length retry all",
			fail: func(n int, _ []kafka.Message) error {
				if n == 0 {
					return kafka.WriteErrors{errBroker}
				}
				return nil
			},
			wantCalls: [][]string{{"a", "b", "c"}, {"a", "b", "c"}},
		},
		{
			name: "write errors without an error are done",
			fail: func(n int, _ []kafka.Message) error {
				return kafka.WriteErrors{nil, nil, nil}
			},
			wantCalls: [][]string{{"a", "b", "c"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &fakeWriter{fail: tt.fail}
			met := newTestMetrics(t)
			r := &Router{Writer: w, Topics: testTopics, Backoff: consume.Backoff{Min: time.Millisecond, Max: 2 * time.Millisecond},
				Logger: testenv.DiscardLogger(), Metrics: met}
			if err := r.Route(context.Background(), items); err != nil {
				t.Fatalf("Route: %v", err)
			}
			var got [][]string
			for _, c := range w.Calls() {
				got = append(got, keys(c))
			}
			if diff := cmp.Diff(tt.wantCalls, got); diff != "" {
				t.Errorf("WriteMessages calls mismatch (-want +got):\n%s", diff)
			}
			if got := counterValue(t, met.EventsOut); got != 3 {
				t.Errorf("got events_out_total %v, want 3", got)
			}
		})
	}
}

func TestRouterRouteGivesUpOnlyWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	w := &fakeWriter{fail: func(n int, _ []kafka.Message) error {
		if n == 3 {
			cancel()
		}
		return kafka.MessageTooLargeError{}
	}}
	met := newTestMetrics(t)
	r := &Router{Writer: w, Topics: testTopics, Backoff: consume.Backoff{Min: time.Millisecond, Max: time.Millisecond},
		Logger: testenv.DiscardLogger(), Metrics: met}
	err := r.Route(ctx, []Item{{Msg: kafka.Message{Key: []byte("a")}, Outcome: Forward}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got error %v, want context.Canceled", err)
	}
	if got := len(w.Calls()); got != 4 {
		t.Errorf("got %d calls, want 4", got)
	}
	if got := counterValue(t, met.EventsOut); got != 0 {
		t.Errorf("got events_out_total %v, want 0", got)
	}
}

func TestRouterRouteEmpty(t *testing.T) {
	w := &fakeWriter{}
	r := &Router{Writer: w, Topics: testTopics}
	if err := r.Route(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if got := len(w.Calls()); got != 0 {
		t.Errorf("got %d calls, want 0", got)
	}
}

func TestNewKafkaWriter(t *testing.T) {
	w := NewKafkaWriter([]string{"a:9092", "b:9092"}, WriterOptions{})
	defer w.Close()
	if w.RequiredAcks != kafka.RequireAll {
		t.Errorf("got RequiredAcks %v, want RequireAll", w.RequiredAcks)
	}
	if w.Async {
		t.Error("got Async, want sync")
	}
	if _, ok := w.Balancer.(*kafka.Murmur2Balancer); !ok {
		t.Errorf("got balancer %T, want *kafka.Murmur2Balancer", w.Balancer)
	}
	// A consumer batch of 500 over a few partitions fills about one request
	// per partition; a full request goes at once, without the 2ms wait.
	if w.BatchTimeout != 2*time.Millisecond || w.BatchSize < 100 {
		t.Errorf("got BatchTimeout %v BatchSize %d, want 2ms and >= 100", w.BatchTimeout, w.BatchSize)
	}
	// kafka-go allocates BatchSize messages for every batch it starts: a
	// large value costs allocation and GC on every write (see writerBatchSize).
	if w.BatchSize > 1000 {
		t.Errorf("got BatchSize %d, want <= 1000", w.BatchSize)
	}
	if w.WriteTimeout != 10*time.Second || w.ReadTimeout != 10*time.Second {
		t.Errorf("got timeouts %v/%v, want 10s/10s", w.WriteTimeout, w.ReadTimeout)
	}
	if w.AllowAutoTopicCreation {
		t.Error("got AllowAutoTopicCreation, want false")
	}
	if w.Topic != "" {
		t.Errorf("got writer topic %q, want none (messages name theirs)", w.Topic)
	}
	if got := w.Addr.String(); got != "a:9092,b:9092" {
		t.Errorf("got addr %q, want a:9092,b:9092", got)
	}
}
