package consume

// Tests against a real Kafka broker: GATEKEEPER_TEST_KAFKA=host:port.
// Each test creates its own topic and group. The broker should run with
// group.initial.rebalance.delay.ms=0 (deploy/local/kafka.sh does) so that
// joining a group takes well under a second.

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

const testPartitions = 3

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)

// uniqueName returns a topic or group name unique to this test run.
func uniqueName(t *testing.T, kind string) string {
	return fmt.Sprintf("gk-consume-%s-%s-%d-%04d", kind, unsafeName.ReplaceAllString(t.Name(), "_"),
		time.Now().UnixNano(), rand.IntN(10000))
}

// createTopic creates a fresh topic with testPartitions partitions on the
// controller, waits until every partition has a leader, and deletes it when
// the test ends.
func createTopic(t *testing.T, broker string) string {
	t.Helper()
	topic := uniqueName(t, "topic")
	createNamedTopic(t, broker, topic)
	return topic
}

// controllerConn returns a connection to the cluster's controller, closed
// when the test ends, with a 10-second deadline.
func controllerConn(t *testing.T, broker string) *kafka.Conn {
	t.Helper()
	conn, err := kafka.Dial("tcp", broker)
	if err != nil {
		t.Fatalf("dial %s: %v", broker, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	ctrl, err := conn.Controller()
	if err != nil {
		t.Fatalf("find controller: %v", err)
	}
	cc, err := kafka.Dial("tcp", net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port)))
	if err != nil {
		t.Fatalf("dial controller: %v", err)
	}
	t.Cleanup(func() { cc.Close() })
	_ = cc.SetDeadline(time.Now().Add(10 * time.Second))
	return cc
}

// createNamedTopic is createTopic with a given name.
func createNamedTopic(t *testing.T, broker, topic string) {
	t.Helper()
	cc := controllerConn(t, broker)
	if err := cc.CreateTopics(kafka.TopicConfig{Topic: topic, NumPartitions: testPartitions, ReplicationFactor: 1}); err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	t.Cleanup(func() { // runs before controllerConn's close
		_ = cc.SetDeadline(time.Now().Add(10 * time.Second))
		_ = cc.DeleteTopics(topic)
	})
	eventually(t, 10*time.Second, "topic metadata", func() bool {
		_ = cc.SetDeadline(time.Now().Add(5 * time.Second))
		parts, err := cc.ReadPartitions(topic)
		if err != nil || len(parts) != testPartitions {
			return false
		}
		for _, p := range parts {
			if p.Leader.Host == "" {
				return false
			}
		}
		return true
	})
}

// produce writes msgs to topic (round robin over partitions) with acks=all.
// Each call has its own Transport: kafka-go's shared DefaultTransport caches
// cluster metadata and fails writes to a topic created after it was cached
// with UnknownTopicOrPartition.
func produce(t *testing.T, broker, topic string, msgs []kafka.Message) {
	t.Helper()
	produceWith(t, broker, topic, &kafka.RoundRobin{}, msgs)
}

// produceWith is produce with the partitions chosen by balancer.
func produceWith(t *testing.T, broker, topic string, balancer kafka.Balancer, msgs []kafka.Message) {
	t.Helper()
	if err := tryProduce(broker, topic, balancer, msgs); err != nil {
		t.Fatalf("produce %d messages to %s: %v", len(msgs), topic, err)
	}
}

// tryProduce is produceWith returning the write's error.
func tryProduce(broker, topic string, balancer kafka.Balancer, msgs []kafka.Message) error {
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	w := &kafka.Writer{
		Transport:              transport,
		Addr:                   kafka.TCP(broker),
		Topic:                  topic,
		Balancer:               balancer,
		RequiredAcks:           kafka.RequireAll,
		BatchTimeout:           2 * time.Millisecond,
		WriteTimeout:           10 * time.Second,
		AllowAutoTopicCreation: false,
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return w.WriteMessages(ctx, msgs...)
}

func values(n int, prefix string) []kafka.Message {
	out := make([]kafka.Message, n)
	for i := range out {
		out[i] = kafka.Message{Key: []byte(strconv.Itoa(i)), Value: []byte(fmt.Sprintf("%s-%d", prefix, i))}
	}
	return out
}

// endOffsets returns the high watermark of each partition of topic.
func endOffsets(t *testing.T, broker, topic string) map[int]int64 {
	t.Helper()
	c := &kafka.Client{Addr: kafka.TCP(broker), Timeout: 10 * time.Second}
	var reqs []kafka.OffsetRequest
	for p := range testPartitions {
		reqs = append(reqs, kafka.LastOffsetOf(p))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		t.Fatalf("list offsets: %v", err)
	}
	out := map[int]int64{}
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			t.Fatalf("list offsets of partition %d: %v", p.Partition, p.Error)
		}
		out[p.Partition] = p.LastOffset
	}
	return out
}

// committedOffsets returns the group's committed offset of each partition
// (-1 where none).
func committedOffsets(t *testing.T, broker, group, topic string) map[int]int64 {
	t.Helper()
	c := &kafka.Client{Addr: kafka.TCP(broker), Timeout: 10 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: {0, 1, 2}}})
	if err != nil {
		t.Fatalf("fetch committed offsets: %v", err)
	}
	if resp.Error != nil {
		t.Fatalf("fetch committed offsets: %v", resp.Error)
	}
	out := map[int]int64{}
	for _, p := range resp.Topics[topic] {
		out[p.Partition] = p.CommittedOffset
	}
	return out
}

// testConfig returns a Config tuned for quick group joins in tests. The
// session timeout is the broker's default minimum (group.min.session.timeout.ms).
func testConfig(t *testing.T, broker, group, topic string) Config {
	return Config{
		Brokers:           []string{broker},
		GroupID:           group,
		Topics:            []string{topic},
		BatchSize:         50,
		BatchWait:         20 * time.Millisecond,
		DrainTimeout:      2 * time.Second,
		BackoffMin:        20 * time.Millisecond,
		BackoffMax:        200 * time.Millisecond,
		SessionTimeout:    6 * time.Second,
		RebalanceTimeout:  5 * time.Second,
		HeartbeatInterval: 300 * time.Millisecond,
		JoinGroupBackoff:  200 * time.Millisecond,
		Logger:            testLogger(t),
	}
}

// testLogger logs through t.Log (shown on failure or with -v) until the test
// ends; later lines from lingering kafka-go goroutines are dropped.
func testLogger(t *testing.T) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.done = true
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// seen records which (partition, offset) pairs a handler received, and
// checks that each partition's batches come in offset order.
type seen struct {
	mu      sync.Mutex
	t       *testing.T
	offsets map[int]map[int64]int // partition -> offset -> times handled
	last    map[int]int64
}

func newSeen(t *testing.T) *seen {
	return &seen{t: t, offsets: map[int]map[int64]int{}, last: map[int]int64{}}
}

func (s *seen) add(msgs []kafka.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, m := range msgs {
		if i > 0 && m.Offset <= msgs[i-1].Offset {
			s.t.Errorf("partition %d: batch not in offset order: %d after %d", m.Partition, m.Offset, msgs[i-1].Offset)
		}
		if s.offsets[m.Partition] == nil {
			s.offsets[m.Partition] = map[int64]int{}
		}
		s.offsets[m.Partition][m.Offset]++
	}
}

func (s *seen) distinct() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, offs := range s.offsets {
		n += len(offs)
	}
	return n
}

// dups lists the offsets handled more than once, as "partition/offset xN".
func (s *seen) dups() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for p, offs := range s.offsets {
		for o, n := range offs {
			if n > 1 {
				out = append(out, fmt.Sprintf("%d/%d x%d", p, o, n))
			}
		}
	}
	slices.Sort(out)
	return out
}

// covers reports whether every offset below end[p] of every partition was seen.
func (s *seen) covers(end map[int]int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p, e := range end {
		for o := int64(0); o < e; o++ {
			if s.offsets[p][o] == 0 {
				return false
			}
		}
	}
	return true
}

// runInBackground runs run until the returned stop function is called; stop
// returns Run's error and fails the test if shutdown takes too long.
func runInBackground(t *testing.T, run func(context.Context) error) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return within 30s of cancellation")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func wantCommittedAtEnd(t *testing.T, broker, group, topic string) {
	t.Helper()
	end := endOffsets(t, broker, topic)
	if diff := cmp.Diff(end, committedOffsets(t, broker, group, topic)); diff != "" {
		t.Errorf("committed offsets differ from end offsets (-end +committed):\n%s", diff)
	}
}

func TestKafkaGroupHandlesAndCommitsEverything(t *testing.T) {
	broker := testenv.Kafka(t)
	topic, group := createTopic(t, broker), uniqueName(t, "group")
	const n = 300
	produce(t, broker, topic, values(n, "first"))
	end := endOffsets(t, broker, topic)

	s := newSeen(t)
	// The last lag each partition reported: -1 once it stops being consumed.
	var lagMu sync.Mutex
	lastLag := map[int]int64{}
	cfg := testConfig(t, broker, group, topic)
	cfg.OnLag = func(_ string, p int, lag int64) {
		lagMu.Lock()
		defer lagMu.Unlock()
		lastLag[p] = lag
	}
	g, err := NewGroup(cfg, onMessages(func(_ context.Context, msgs []kafka.Message) error {
		s.add(msgs)
		return nil
	}))
	if err != nil {
		t.Fatalf("NewGroup: %v", err)
	}
	start := time.Now()
	stop := runInBackground(t, g.Run)
	eventually(t, 30*time.Second, "every message handled", func() bool { return s.covers(end) })
	t.Logf("%d messages handled %v after Run started", n, time.Since(start).Round(time.Millisecond))
	if !g.Ready() {
		t.Error("Ready() = false while consuming")
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if g.Ready() {
		t.Error("Ready() = true after Run returned")
	}
	lagMu.Lock()
	for p := range end {
		if got := lastLag[p]; got != -1 {
			t.Errorf("partition %d: last lag reported %d after Run returned, want -1 (series dropped)", p, got)
		}
	}
	lagMu.Unlock()
	wantCommittedAtEnd(t, broker, group, topic)

	// A second member of the same group starts from the committed offsets:
	// it sees the new messages and none of the old ones.
	produce(t, broker, topic, values(6, "second"))
	s2 := newSeen(t)
	g2, err := NewGroup(testConfig(t, broker, group, topic), onMessages(func(_ context.Context, msgs []kafka.Message) error {
		s2.add(msgs)
		return nil
	}))
	if err != nil {
		t.Fatalf("NewGroup: %v", err)
	}
	stop2 := runInBackground(t, g2.Run)
	eventually(t, 30*time.Second, "new messages handled", func() bool { return s2.distinct() == 6 })
	if err := stop2(); err != nil {
		t.Fatalf("second Run: %v", err)
	}
	for p, offs := range s2.offsets {
		for o := range offs {
			if o < end[p] {
				t.Errorf("second run handled already committed partition %d offset %d (end was %d)", p, o, end[p])
			}
		}
	}
	wantCommittedAtEnd(t, broker, group, topic)
}

func TestKafkaGroupsSplitPartitions(t *testing.T) {
	broker := testenv.Kafka(t)
	topic, group := createTopic(t, broker), uniqueName(t, "group")

	type assignment struct {
		gen   int32
		parts []int
	}
	var mu sync.Mutex
	latest := make([]assignment, 2)
	all := newSeen(t)
	per := []*seen{newSeen(t), newSeen(t)}
	var stops []func() error
	for i := range 2 {
		g, err := NewGroup(testConfig(t, broker, group, topic), onMessages(func(_ context.Context, msgs []kafka.Message) error {
			per[i].add(msgs)
			all.add(msgs)
			return nil
		}))
		if err != nil {
			t.Fatalf("NewGroup: %v", err)
		}
		g.m.onGeneration = func(gen *kafka.Generation) {
			var parts []int
			for _, pa := range gen.Assignments[topic] {
				parts = append(parts, pa.ID)
			}
			mu.Lock()
			defer mu.Unlock()
			latest[i] = assignment{gen: gen.ID, parts: parts}
		}
		stops = append(stops, runInBackground(t, g.Run))
	}
	eventually(t, 30*time.Second, "both members share one generation", func() bool {
		mu.Lock()
		defer mu.Unlock()
		a, b := latest[0], latest[1]
		return a.gen != 0 && a.gen == b.gen && len(a.parts) > 0 && len(b.parts) > 0 && len(a.parts)+len(b.parts) == testPartitions
	})
	mu.Lock()
	t.Logf("assignments: member 0 %v, member 1 %v (generation %d)", latest[0].parts, latest[1].parts, latest[0].gen)
	mu.Unlock()

	const n = 300
	produce(t, broker, topic, values(n, "split"))
	end := endOffsets(t, broker, topic)
	eventually(t, 30*time.Second, "every message handled", func() bool { return all.covers(end) })
	for i, s := range per {
		if s.distinct() == 0 {
			t.Errorf("member %d handled nothing", i)
		}
	}
	for _, stop := range stops {
		if err := stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	wantCommittedAtEnd(t, broker, group, topic)
}

func TestKafkaHandlerFailuresLoseNothing(t *testing.T) {
	broker := testenv.Kafka(t)
	topic, group := createTopic(t, broker), uniqueName(t, "group")
	const n = 150
	produce(t, broker, topic, values(n, "retry"))
	end := endOffsets(t, broker, topic)

	var mu sync.Mutex
	failures := 2
	failed := map[int]int64{} // partition -> first offset of a failed batch, until retried
	s := newSeen(t)
	g, err := NewGroup(testConfig(t, broker, group, topic), onMessages(func(_ context.Context, msgs []kafka.Message) error {
		mu.Lock()
		defer mu.Unlock()
		p := msgs[0].Partition
		if first, ok := failed[p]; ok {
			if msgs[0].Offset != first {
				t.Errorf("partition %d: batch after a failure starts at %d, want the failed batch again (%d)", p, msgs[0].Offset, first)
			}
			delete(failed, p)
		}
		if failures > 0 {
			failures--
			failed[p] = msgs[0].Offset
			return fmt.Errorf("injected failure")
		}
		s.add(msgs)
		return nil
	}))
	if err != nil {
		t.Fatalf("NewGroup: %v", err)
	}
	stop := runInBackground(t, g.Run)
	eventually(t, 30*time.Second, "every message handled", func() bool { return s.covers(end) })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	if failures != 0 {
		t.Errorf("%d injected failures left unused", failures)
	}
	mu.Unlock()
	wantCommittedAtEnd(t, broker, group, topic)
}

// On shutdown the in-flight batch finishes with a context that shutdown did
// not cancel, and its offsets are committed before the group is left.
func TestKafkaGroupShutdownFinishesInFlightBatch(t *testing.T) {
	broker := testenv.Kafka(t)
	topic, group := createTopic(t, broker), uniqueName(t, "group")
	produce(t, broker, topic, values(30, "drain"))

	entered := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	var inFlight []kafka.Message
	var ctxErr error
	g, err := NewGroup(testConfig(t, broker, group, topic), onMessages(func(ctx context.Context, msgs []kafka.Message) error {
		first := false
		once.Do(func() { first = true })
		if !first {
			return nil
		}
		close(entered)
		time.Sleep(500 * time.Millisecond) // shutdown begins meanwhile
		mu.Lock()
		defer mu.Unlock()
		inFlight, ctxErr = slices.Clone(msgs), ctx.Err() // msgs is reused after Handle
		return nil
	}))
	if err != nil {
		t.Fatalf("NewGroup: %v", err)
	}
	stop := runInBackground(t, g.Run)
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no batch handled within 30s")
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if ctxErr != nil {
		t.Errorf("in-flight Handle saw its context cancelled by shutdown: %v", ctxErr)
	}
	last := inFlight[len(inFlight)-1]
	if got := committedOffsets(t, broker, group, topic)[last.Partition]; got < last.Offset+1 {
		t.Errorf("partition %d committed %d after shutdown, want at least %d (in-flight batch)", last.Partition, got, last.Offset+1)
	}
}

func TestKafkaDelayedReleasesOnTimeAndCommits(t *testing.T) {
	broker := testenv.Kafka(t)
	topic, group := createTopic(t, broker), uniqueName(t, "group")
	const n = 60
	now := time.Now()
	msgs := values(n, "delayed")
	release := map[string]time.Time{}
	for i := range msgs {
		var at time.Time
		switch {
		case i%10 == 0: // already due
			at = now.Add(-time.Minute)
		case i%10 == 5: // unreadable: released at once
			msgs[i].Headers = []kafka.Header{{Key: releaseHeader, Value: []byte("not-a-time")}}
			continue
		default:
			at = now.Add(time.Duration(rand.IntN(2000)) * time.Millisecond)
		}
		msgs[i] = withRelease(msgs[i], at)
		release[string(msgs[i].Value)] = time.UnixMilli(at.UnixMilli())
	}
	produce(t, broker, topic, msgs)
	end := endOffsets(t, broker, topic)

	var waiting atomic.Int64
	s := newSeen(t)
	cfg := DelayedConfig{
		Config:    testConfig(t, broker, group, topic),
		ReleaseAt: releaseByHeader,
		OnWaiting: func(_ string, d int) { waiting.Add(int64(d)) },
	}
	var lateMu sync.Mutex
	var maxLate time.Duration
	cfg.OnLateness = func(_ string, d time.Duration) {
		lateMu.Lock()
		defer lateMu.Unlock()
		maxLate = max(maxLate, d)
	}
	d, err := NewDelayed(cfg, onMessages(func(_ context.Context, msgs []kafka.Message) error {
		handled := time.Now()
		for _, m := range msgs {
			if at, ok := release[string(m.Value)]; ok && handled.Before(at) {
				t.Errorf("partition %d offset %d handled at %v, %v before its release time", m.Partition, m.Offset, handled, at.Sub(handled))
			}
		}
		s.add(msgs)
		return nil
	}))
	if err != nil {
		t.Fatalf("NewDelayed: %v", err)
	}
	stop := runInBackground(t, d.Run)
	eventually(t, 30*time.Second, "every message released", func() bool { return s.covers(end) })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	lateMu.Lock()
	t.Logf("largest lateness %v", maxLate)
	lateMu.Unlock()
	if got := waiting.Load(); got != 0 {
		t.Errorf("waiting gauge = %d after Run returned, want 0", got)
	}
	wantCommittedAtEnd(t, broker, group, topic)
}

// A rebalance while batches are in flight loses nothing and duplicates
// nothing: the in-flight Handle calls finish (their context is not
// cancelled), and their offsets are committed with the ending generation,
// which the coordinator accepts while it prepares the rebalance, so the
// partitions' next owners start exactly after them.
func TestKafkaRebalanceDuringBatchHandsOverExactly(t *testing.T) {
	broker := testenv.Kafka(t)
	topic, group := createTopic(t, broker), uniqueName(t, "group")
	const n = 150
	produce(t, broker, topic, values(n, "rebalance"))
	end := endOffsets(t, broker, topic)

	all := newSeen(t)
	var mu sync.Mutex
	slowDone := map[int]bool{} // partitions whose first (slow) batch finished
	firstEntered := make(chan struct{})
	var enteredOnce sync.Once
	var ctxErrs []error
	slow := onMessages(func(ctx context.Context, msgs []kafka.Message) error {
		p := msgs[0].Partition
		mu.Lock()
		first := !slowDone[p]
		slowDone[p] = true
		mu.Unlock()
		if first {
			enteredOnce.Do(func() { close(firstEntered) })
			time.Sleep(1500 * time.Millisecond) // the second member joins meanwhile
			if err := ctx.Err(); err != nil {
				mu.Lock()
				ctxErrs = append(ctxErrs, err)
				mu.Unlock()
			}
		}
		all.add(msgs)
		return nil
	})
	g1, err := NewGroup(testConfig(t, broker, group, topic), slow)
	if err != nil {
		t.Fatalf("NewGroup: %v", err)
	}
	stop1 := runInBackground(t, g1.Run)
	select {
	case <-firstEntered:
	case <-time.After(30 * time.Second):
		t.Fatal("first member handled nothing within 30s")
	}
	g2, err := NewGroup(testConfig(t, broker, group, topic), onMessages(func(_ context.Context, msgs []kafka.Message) error {
		all.add(msgs)
		return nil
	}))
	if err != nil {
		t.Fatalf("NewGroup: %v", err)
	}
	stop2 := runInBackground(t, g2.Run)

	eventually(t, 30*time.Second, "every message handled", func() bool { return all.covers(end) })
	// The slow batches were committed as their generation ended: no
	// offset was handled twice.
	mu.Lock()
	slowParts := len(slowDone)
	mu.Unlock()
	if slowParts == 0 {
		t.Fatal("no slow batch was handled")
	}
	if d := all.dups(); len(d) > 0 {
		t.Errorf("handled more than once after the rebalance: %v", d)
	}
	for _, stop := range []func() error{stop1, stop2} {
		if err := stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	mu.Lock()
	if len(ctxErrs) > 0 {
		t.Errorf("in-flight Handle contexts cancelled by the rebalance: %v", ctxErrs)
	}
	mu.Unlock()
	wantCommittedAtEnd(t, broker, group, topic)
}

// A retry-tier partition changes owner while messages beyond its committed
// offset are done and an earlier one still waits: the new owner skips what
// the last one finished (read from the commit's metadata) and hands over
// every message exactly once, whether the partitions move by a graceful
// shutdown or by a rebalance when a second member joins.
func TestKafkaDelayedHandoverSkipsDone(t *testing.T) {
	for _, how := range []string{"shutdown", "rebalance"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			broker := testenv.Kafka(t)
			topic, group := createTopic(t, broker), uniqueName(t, "group")
			const n = 300
			holdUntil := time.Now().Add(12 * time.Second)
			msgs := values(n, "handover")
			holders := 0
			for i := range msgs {
				at := time.Now().Add(-time.Second) // due at once
				if i%25 == 0 {
					at, holders = holdUntil, holders+1 // holds its partition's commit back
				}
				msgs[i] = withRelease(msgs[i], at)
			}
			produce(t, broker, topic, msgs)
			end := endOffsets(t, broker, topic)

			s := newSeen(t)
			var skipped atomic.Int64
			cfg := DelayedConfig{
				Config:    testConfig(t, broker, group, topic),
				ReleaseAt: releaseByHeader,
				OnSkipped: func(_ string, k int) { skipped.Add(int64(k)) },
			}
			handler := onMessages(func(_ context.Context, msgs []kafka.Message) error {
				s.add(msgs)
				return nil
			})
			d1, err := NewDelayed(cfg, handler)
			if err != nil {
				t.Fatalf("NewDelayed: %v", err)
			}
			stop1 := runInBackground(t, d1.Run)
			eventually(t, 30*time.Second, "first member released all that is due", func() bool { return s.distinct() == n-holders })
			// Its last commit follows the Handle call; give it a moment.
			time.Sleep(500 * time.Millisecond)
			if time.Now().After(holdUntil.Add(-5 * time.Second)) {
				t.Fatalf("too slow: the held messages are almost due before the handover")
			}
			if how == "shutdown" {
				if err := stop1(); err != nil {
					t.Fatalf("Run: %v", err)
				}
			}
			d2, err := NewDelayed(cfg, handler)
			if err != nil {
				t.Fatalf("NewDelayed: %v", err)
			}
			stop2 := runInBackground(t, d2.Run)
			eventually(t, 40*time.Second, "every message released", func() bool { return s.covers(end) })
			for _, stop := range []func() error{stop1, stop2} {
				if err := stop(); err != nil {
					t.Fatalf("Run: %v", err)
				}
			}
			if d := s.dups(); len(d) > 0 {
				t.Errorf("handed over more than once (%d): %v", len(d), first(d, 20))
			}
			if skipped.Load() == 0 {
				t.Errorf("the new owner skipped nothing; want the done offsets beyond each commit skipped")
			}
			t.Logf("%s: %d messages, %d held, %d skipped by the next owner", how, n, holders, skipped.Load())
			wantCommittedAtEnd(t, broker, group, topic)
		})
	}
}

func first[T any](s []T, n int) []T { return s[:min(len(s), n)] }
