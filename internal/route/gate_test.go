package route

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

var errRedis = errors.New("redis: connection refused")

// srcMsg is a source event at offset off with tenant key (nil key if key is "").
func srcMsg(off int64, key string) kafka.Message {
	m := kafka.Message{Topic: "events", Partition: 1, Offset: off, Value: []byte("v" + strconv.FormatInt(off, 10)),
		Headers: hdr("trace", "t"+strconv.FormatInt(off, 10)), Time: t0.Add(-time.Second)}
	if key != "" {
		m.Key = []byte(key)
	}
	return m
}

func srcOut(topic string, off int64, key string, extra ...string) out {
	offs := strconv.FormatInt(off, 10)
	return out{Topic: topic, Key: key, Value: "v" + offs, Headers: append([]string{"trace=t" + offs}, extra...), Time: t0.Add(-time.Second)}
}

func origin(off int64) []string {
	return []string{"gk-origin-topic=events", "gk-origin-partition=1", "gk-origin-offset=" + strconv.FormatInt(off, 10)}
}

type gateFixture struct {
	gate     *Gate
	writer   *fakeWriter
	admitter *fakeAdmitter
	metrics  *Metrics
	ready    *readyLog
}

// testAdmission is the Admission of the Gate and Retrier fixtures: a Router
// writing to w, the clock fixed at t0, fast backoff, readiness logged to ready.
func testAdmission(w *fakeWriter, a *fakeAdmitter, m *Metrics, ready *readyLog) Admission {
	fast := consume.Backoff{Min: time.Millisecond, Max: 2 * time.Millisecond}
	return Admission{
		Admitter: a,
		Router: &Router{Writer: w, Topics: testTopics, Clock: fixedClock(t0), Backoff: fast,
			Logger: testenv.DiscardLogger(), Metrics: m},
		Clock:    fixedClock(t0),
		Logger:   testenv.DiscardLogger(),
		Metrics:  m,
		SetReady: ready.set,
		Backoff:  fast,
	}
}

type readyLog struct {
	mu  sync.Mutex
	got []bool
}

func (r *readyLog) set(ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, ok)
}

func (r *readyLog) Got() []bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]bool(nil), r.got...)
}

func newGate(t *testing.T, decide func(int, []string) ([]limit.Decision, error)) gateFixture {
	t.Helper()
	ex, err := ParseTenantFrom("key")
	if err != nil {
		t.Fatal(err)
	}
	f := gateFixture{
		writer:   &fakeWriter{},
		admitter: &fakeAdmitter{decide: decide},
		metrics:  newTestMetrics(t),
		ready:    &readyLog{},
	}
	f.gate = mustGate(t, Gate{Extractor: ex, Admission: testAdmission(f.writer, f.admitter, f.metrics, f.ready)})
	return f
}

var gateDecisions = map[string]limit.Decision{
	"ok":    {Kind: limit.Admit},
	"later": {Kind: limit.Defer, Due: t0.Add(30 * time.Second), Until: t0.Add(time.Minute)},
	"much":  {Kind: limit.Defer, Due: t0.Add(3 * time.Hour), Until: t0.Add(4 * time.Hour), Windows: "w1"}, // under a capacity
	"full":  {Kind: limit.Reject, Reason: "no room within 24h"},
	"bare":  {Kind: limit.Reject},
}

func mixedBatch() []kafka.Message {
	return []kafka.Message{
		srcMsg(10, "ok"),
		srcMsg(11, "later"),
		srcMsg(12, ""),
		srcMsg(13, "full"),
		srcMsg(14, "ok"),
		srcMsg(15, "much"),
		srcMsg(16, "bare"),
	}
}

func deferHeaders(attempt int, d limit.Decision, tenant string, firstSeen time.Time, off int64) []string {
	hs := append([]string{
		"gk-attempt=" + strconv.Itoa(attempt), "gk-due=" + ms(d.Due), "gk-reserved=" + ms(d.Until), "gk-tenant=" + tenant,
	}, append(origin(off), "gk-first-seen="+ms(firstSeen))...)
	if d.Windows != "" {
		hs = append(hs, "gk-windows="+d.Windows)
	}
	return hs
}

// admitted is what an admitted event carries: its tenant and its origin,
// the stable identity a downstream consumer deduplicates by.
func admitted(tenant string, off int64) []string {
	return append([]string{"gk-tenant=" + tenant}, origin(off)...)
}

func TestGateHandle(t *testing.T) {
	f := newGate(t, byTenant(gateDecisions))
	if err := f.gate.Handle(context.Background(), batchOf(mixedBatch())); err != nil {
		t.Fatalf("Handle: %v", err)
	}

	if diff := cmp.Diff([][]string{{"ok", "later", "full", "ok", "much", "bare"}}, f.admitter.Calls()); diff != "" {
		t.Errorf("Admit calls mismatch (-want +got):\n%s", diff)
	}
	calls := f.writer.Calls()
	if len(calls) != 1 {
		t.Fatalf("got %d WriteMessages calls, want 1", len(calls))
	}
	want := []out{
		srcOut("down", 10, "ok", admitted("ok", 10)...),
		srcOut("down.retry", 11, "later", deferHeaders(1, gateDecisions["later"], "later", t0, 11)...),
		srcOut("down.dlq", 12, "", append(origin(12), "gk-reason=no key")...),
		srcOut("down.dlq", 13, "full", append(append([]string{"gk-tenant=full"}, origin(13)...), "gk-reason=no room within 24h")...),
		srcOut("down", 14, "ok", admitted("ok", 14)...),
		srcOut("down.retry.long", 15, "much", deferHeaders(1, gateDecisions["much"], "much", t0, 15)...),
		srcOut("down.dlq", 16, "bare", append(append([]string{"gk-tenant=bare"}, origin(16)...), "gk-reason=over limit")...),
	}
	diffOut(t, want, calls[0])

	for label, want := range map[string]float64{"admit": 2, "defer": 2, "reject": 2, "invalid": 1} {
		if got := counterValue(t, f.metrics.Decisions.WithLabelValues(label)); got != want {
			t.Errorf("decisions_total{decision=%q}: got %v, want %v", label, got, want)
		}
	}
	if got := counterValue(t, f.metrics.EventsIn.WithLabelValues("events")); got != 7 {
		t.Errorf("events_in_total: got %v, want 7", got)
	}
	for topic, want := range map[string]float64{"down": 2, "down.retry": 1, "down.retry.long": 1, "down.dlq": 3} {
		if got := counterValue(t, f.metrics.EventsOut.WithLabelValues(topic)); got != want {
			t.Errorf("events_out_total{topic=%q}: got %v, want %v", topic, got, want)
		}
	}
	if got := f.ready.Got(); len(got) != 0 {
		t.Errorf("got SetReady calls %v, want none", got)
	}
}

// An admitted event's origin headers are Gatekeeper's own: whatever gk-
// headers the producer wrote are dropped, so a consumer can trust the origin
// (and the tenant) it deduplicates by.
func TestGateAdmittedOriginNotForged(t *testing.T) {
	f := newGate(t, byTenant(gateDecisions))
	m := srcMsg(10, "ok")
	m.Headers = append(m.Headers, hdr("gk-origin-offset", "99")...)
	m.Headers = append(m.Headers, hdr("gk-tenant", "victim")...)
	if err := f.gate.Handle(context.Background(), batchOf([]kafka.Message{m})); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	diffOut(t, []out{srcOut("down", 10, "ok", admitted("ok", 10)...)}, f.writer.last(t))
}

func TestGateShadow(t *testing.T) {
	f := newGate(t, byTenant(gateDecisions))
	f.gate.Shadow = true
	batch := mixedBatch()
	if err := f.gate.Handle(context.Background(), batchOf(batch)); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	var want []out
	for _, m := range batch {
		hs := origin(m.Offset) // an invalid event has no tenant
		if len(m.Key) > 0 {
			hs = admitted(string(m.Key), m.Offset)
		}
		want = append(want, srcOut("down", m.Offset, string(m.Key), hs...))
	}
	diffOut(t, want, f.writer.last(t))
	if got := len(f.admitter.Calls()); got != 1 {
		t.Errorf("got %d Admit calls, want 1", got)
	}
	for label, want := range map[string]float64{"admit": 2, "defer": 2, "reject": 2, "invalid": 1} {
		if got := counterValue(t, f.metrics.Decisions.WithLabelValues(label)); got != want {
			t.Errorf("decisions_total{decision=%q}: got %v, want %v", label, got, want)
		}
	}
}

func TestGateRedisPause(t *testing.T) {
	f := newGate(t, func(n int, tenants []string) ([]limit.Decision, error) {
		if n < 3 {
			return nil, errRedis
		}
		return byTenant(gateDecisions)(n, tenants)
	})
	f.gate.OnRedisError = RedisPause
	if err := f.gate.Handle(context.Background(), batchOf([]kafka.Message{srcMsg(1, "ok"), srcMsg(2, "")})); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if got := len(f.admitter.Calls()); got != 4 {
		t.Errorf("got %d Admit calls, want 4", got)
	}
	if diff := cmp.Diff([]bool{false, true}, f.ready.Got()); diff != "" {
		t.Errorf("SetReady calls mismatch (-want +got):\n%s", diff)
	}
	calls := f.writer.Calls()
	if len(calls) != 1 {
		t.Fatalf("got %d WriteMessages calls, want 1", len(calls))
	}
	diffOut(t, []out{srcOut("down", 1, "ok", admitted("ok", 1)...), srcOut("down.dlq", 2, "", append(origin(2), "gk-reason=no key")...)}, calls[0])
	if got := counterValue(t, f.metrics.RedisUnchecked); got != 0 {
		t.Errorf("redis_unchecked_total: got %v, want 0", got)
	}
}

func TestGateRedisPauseUntilContextEnds(t *testing.T) {
	for _, policy := range []string{"", RedisPause} {
		t.Run(fmt.Sprintf("policy %q", policy), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			f := newGate(t, func(n int, _ []string) ([]limit.Decision, error) {
				if n == 5 {
					cancel()
				}
				return nil, errRedis
			})
			f.gate.OnRedisError = policy
			err := f.gate.Handle(ctx, batchOf([]kafka.Message{srcMsg(1, "ok"), srcMsg(2, "")}))
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("got error %v, want context.Canceled", err)
			}
			if got := len(f.writer.Calls()); got != 0 {
				t.Errorf("got %d WriteMessages calls, want none", got)
			}
			if diff := cmp.Diff([]bool{false}, f.ready.Got()); diff != "" {
				t.Errorf("SetReady calls mismatch (-want +got):\n%s", diff)
			}
			if got := counterValue(t, f.metrics.EventsIn); got != 0 {
				t.Errorf("events_in_total: got %v, want 0 for a failed batch", got)
			}
		})
	}
}

func TestGateRedisForward(t *testing.T) {
	f := newGate(t, func(int, []string) ([]limit.Decision, error) { return nil, errRedis })
	f.gate.OnRedisError = RedisForward
	batch := []kafka.Message{srcMsg(1, "full"), srcMsg(2, ""), srcMsg(3, "later")}
	if err := f.gate.Handle(context.Background(), batchOf(batch)); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	// Unchecked events were counted against no tenant: origin only.
	want := []out{
		srcOut("down", 1, "full", origin(1)...),
		srcOut("down.dlq", 2, "", append(origin(2), "gk-reason=no key")...),
		srcOut("down", 3, "later", origin(3)...),
	}
	diffOut(t, want, f.writer.last(t))
	if got := counterValue(t, f.metrics.RedisUnchecked); got != 2 {
		t.Errorf("redis_unchecked_total: got %v, want 2", got)
	}
	if got := len(f.admitter.Calls()); got != 1 {
		t.Errorf("got %d Admit calls, want 1", got)
	}
	if got := f.ready.Got(); len(got) != 0 {
		t.Errorf("got SetReady calls %v, want none", got)
	}
}

func TestGateWriteRetried(t *testing.T) {
	f := newGate(t, byTenant(gateDecisions))
	f.writer.fail = func(n int, _ []kafka.Message) error {
		if n < 2 {
			return errors.New("not enough replicas")
		}
		return nil
	}
	if err := f.gate.Handle(context.Background(), batchOf(mixedBatch())); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if got := len(f.writer.Calls()); got != 3 {
		t.Errorf("got %d WriteMessages calls, want 3", got)
	}
	if got := len(f.admitter.Calls()); got != 1 {
		t.Errorf("got %d Admit calls, want 1 (a write retry must not count again)", got)
	}
	if got := counterValue(t, f.metrics.EventsIn); got != 7 {
		t.Errorf("events_in_total: got %v, want 7", got)
	}
}

func TestGateErrors(t *testing.T) {
	tests := []struct {
		name   string
		decide func(int, []string) ([]limit.Decision, error)
	}{
		{name: "too few decisions", decide: func(int, []string) ([]limit.Decision, error) {
			return []limit.Decision{{Kind: limit.Admit}}, nil
		}},
		{name: "unknown kind", decide: func(_ int, ts []string) ([]limit.Decision, error) {
			return make([]limit.Decision, len(ts)), nil
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newGate(t, tt.decide)
			if err := f.gate.Handle(context.Background(), batchOf([]kafka.Message{srcMsg(1, "a"), srcMsg(2, "b")})); err == nil {
				t.Fatal("got no error, want one")
			}
			if got := len(f.writer.Calls()); got != 0 {
				t.Errorf("got %d WriteMessages calls, want none", got)
			}
		})
	}
}

func TestGateNoValidTenants(t *testing.T) {
	f := newGate(t, byTenant(nil))
	if err := f.gate.Handle(context.Background(), batchOf([]kafka.Message{srcMsg(1, ""), srcMsg(2, "")})); err != nil {
		t.Fatal(err)
	}
	if got := len(f.admitter.Calls()); got != 0 {
		t.Errorf("got %d Admit calls, want none", got)
	}
	if got := len(f.writer.last(t)); got != 2 {
		t.Errorf("got %d messages written, want 2", got)
	}
	if err := f.gate.Handle(context.Background(), batchOf(nil)); err != nil {
		t.Errorf("empty batch: got %v, want nil", err)
	}
}

func TestGateValidate(t *testing.T) {
	ex, _ := ParseTenantFrom("key")
	r := &Router{Writer: &fakeWriter{}}
	a := &fakeAdmitter{}
	tests := []struct {
		name string
		gate Gate
		ok   bool
	}{
		{name: "complete", gate: Gate{Extractor: ex, Admission: Admission{Admitter: a, Router: r}}, ok: true},
		{name: "forward", gate: Gate{Extractor: ex, Admission: Admission{Admitter: a, Router: r, OnRedisError: "forward"}}, ok: true},
		{name: "bad policy", gate: Gate{Extractor: ex, Admission: Admission{Admitter: a, Router: r, OnRedisError: "ignore"}}},
		{name: "no extractor", gate: Gate{Admission: Admission{Admitter: a, Router: r}}},
		{name: "no admitter", gate: Gate{Extractor: ex, Admission: Admission{Router: r}}},
		{name: "no writer", gate: Gate{Extractor: ex, Admission: Admission{Admitter: a, Router: &Router{}}}},
	}
	for _, tt := range tests {
		_, err := NewGate(tt.gate)
		if (err == nil) != tt.ok {
			t.Errorf("%s: got error %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}

// TestGateConcurrent runs partitions in parallel, as the consumer does; run with -race.
func TestGateConcurrent(t *testing.T) {
	var mu sync.Mutex
	failed := 0
	f := newGate(t, func(n int, ts []string) ([]limit.Decision, error) {
		mu.Lock()
		defer mu.Unlock()
		if n%3 == 0 && failed < 10 {
			failed++
			return nil, errRedis
		}
		return byTenant(gateDecisions)(n, ts)
	})
	var wg sync.WaitGroup
	for p := range 8 {
		wg.Go(func() {
			for b := range 5 {
				batch := mixedBatch()
				for i := range batch {
					batch[i].Partition = p
					batch[i].Offset += int64(b * 100)
				}
				if err := f.gate.Handle(context.Background(), batchOf(batch)); err != nil {
					t.Errorf("Handle: %v", err)
				}
			}
		})
	}
	wg.Wait()
	total := 0
	for _, c := range f.writer.Calls() {
		total += len(c)
	}
	if want := 8 * 5 * len(mixedBatch()); total != want {
		t.Errorf("got %d messages written, want %d", total, want)
	}
}

// A batch refused because its partition's replay record is full (the
// commits are behind: limit.ErrReplayFull) fails under either policy, so
// that the consumer retries it and its commit: it is neither forwarded
// unchecked nor retried here, where no commit could end the wait.
func TestGateReplayFullFailsBatch(t *testing.T) {
	for _, policy := range []string{RedisPause, RedisForward} {
		t.Run(policy, func(t *testing.T) {
			f := newGate(t, func(int, []string) ([]limit.Decision, error) {
				return nil, fmt.Errorf("admit batch: %w", limit.ErrReplayFull)
			})
			f.gate.OnRedisError = policy
			err := f.gate.Handle(context.Background(), batchOf([]kafka.Message{srcMsg(1, "ok"), srcMsg(2, "later")}))
			if !errors.Is(err, limit.ErrReplayFull) {
				t.Fatalf("Handle: got %v, want limit.ErrReplayFull", err)
			}
			if got := len(f.admitter.Calls()); got != 1 {
				t.Errorf("got %d Admit calls, want 1", got)
			}
			if got := len(f.writer.Calls()); got != 0 {
				t.Errorf("got %d WriteMessages calls, want none", got)
			}
			if got := counterValue(t, f.metrics.RedisUnchecked); got != 0 {
				t.Errorf("redis_unchecked_total: got %v, want 0", got)
			}
		})
	}
}
