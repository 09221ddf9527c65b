package route

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// These tests run against the Kafka broker at GATEKEEPER_TEST_KAFKA
// (host:port), for example one started by deploy/local/kafka.sh. Each test
// creates and deletes its own topics.

const testPartitions = 3

var unsafeTopicChars = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)

// uniqueTopics returns Topics named after the test and the time, so that runs never share topics.
func uniqueTopics(t *testing.T) Topics {
	base := fmt.Sprintf("gk-route-%s-%d", unsafeTopicChars.ReplaceAllString(t.Name(), "_"), time.Now().UnixNano())
	return Topics{Downstream: base + ".down", Retry: base + ".down.retry", DLQ: base + ".down.dlq"}
}

func allTopics(tp Topics) []string {
	names := []string{tp.Downstream, tp.DLQ}
	for _, tr := range tp.Tiers() {
		names = append(names, tr.Topic)
	}
	return names
}

func createTopics(t *testing.T, addr string, names ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 20 * time.Second}
	req := &kafka.CreateTopicsRequest{}
	for _, n := range names {
		req.Topics = append(req.Topics, kafka.TopicConfig{Topic: n, NumPartitions: testPartitions, ReplicationFactor: 1})
	}
	res, err := client.CreateTopics(ctx, req)
	if err != nil {
		t.Fatalf("create topics: %v", err)
	}
	for n, err := range res.Errors {
		if err != nil {
			t.Fatalf("create topic %s: %v", n, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: names}); err != nil {
			t.Logf("delete topics: %v", err)
		}
	})
}

// readAll reads every message of topic, partition by partition.
func readAll(t *testing.T, addr, topic string) []kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var msgs []kafka.Message
	for p := range testPartitions {
		conn, err := kafka.DialLeader(ctx, "tcp", addr, topic, p)
		if err != nil {
			t.Fatalf("dial leader of %s/%d: %v", topic, p, err)
		}
		last, err := conn.ReadLastOffset()
		conn.Close()
		if err != nil {
			t.Fatalf("last offset of %s/%d: %v", topic, p, err)
		}
		if last == 0 {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{addr}, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
		for range last {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				r.Close()
				t.Fatalf("read %s/%d: %v", topic, p, err)
			}
			msgs = append(msgs, m)
		}
		r.Close()
	}
	return msgs
}

func newTestWriter(t *testing.T, addr string) *kafka.Writer {
	t.Helper()
	transport := &kafka.Transport{DialTimeout: 5 * time.Second, MetadataTTL: time.Second}
	w := NewKafkaWriter([]string{addr}, WriterOptions{Transport: transport, Logger: testenv.DiscardLogger()})
	t.Cleanup(func() {
		w.Close()
		transport.CloseIdleConnections()
	})
	return w
}

// TestRouterKafka writes one batch of every outcome through a real broker and
// reads it back: key, value, headers and timestamp kept, partition chosen by
// Murmur2 on the key, order kept within a key.
func TestRouterKafka(t *testing.T) {
	addr := testenv.Kafka(t)
	tp := uniqueTopics(t)
	createTopics(t, addr, allTopics(tp)...)

	r := &Router{Writer: newTestWriter(t, addr), Topics: tp, Clock: fixedClock(t0), Logger: testenv.DiscardLogger()}
	src := func(off int, key string) kafka.Message {
		return kafka.Message{Topic: "events", Partition: 2, Offset: int64(off), Key: []byte(key),
			Value: []byte("value-" + strconv.Itoa(off)), Headers: hdr("trace", strconv.Itoa(off), "dup", "a", "dup", "b"),
			Time: t0.Add(time.Duration(off) * time.Millisecond)}
	}
	var items []Item
	var wantDown []out
	for i := range 30 { // ten keys, three events each, in order
		m := src(i, "tenant-"+strconv.Itoa(i%10))
		items = append(items, Item{Msg: m, Outcome: Forward})
		wantDown = append(wantDown, outOf(m, tp.Downstream))
	}
	d := deferral("tenant-x", 1, t0.Add(30*time.Second), t0.Add(time.Minute))
	deferred := src(100, "tenant-x")
	items = append(items,
		Item{Msg: deferred, Outcome: Defer, Deferral: d},
		Item{Msg: src(101, "tenant-y"), Outcome: DeadLetter, Reason: "no room within 24h"},
	)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.Route(ctx, items); err != nil {
		t.Fatalf("Route: %v", err)
	}

	got := readAll(t, addr, tp.Downstream)
	// Partition and order: each key on its Murmur2 partition, offsets rising in source order.
	partitions := make([]int, testPartitions)
	for i := range partitions {
		partitions[i] = i
	}
	lastOffset := map[string]int64{}
	for _, m := range got {
		if want := (&kafka.Murmur2Balancer{}).Balance(m, partitions...); m.Partition != want {
			t.Errorf("key %s: got partition %d, want %d", m.Key, m.Partition, want)
		}
		if prev, ok := lastOffset[string(m.Key)]; ok && m.Offset <= prev {
			t.Errorf("key %s: got offset %d after %d, want rising", m.Key, m.Offset, prev)
		}
		lastOffset[string(m.Key)] = m.Offset
	}
	sortOut := func(list []out) []out {
		sort.SliceStable(list, func(i, j int) bool { return list[i].Value < list[j].Value })
		return list
	}
	if diff := cmp.Diff(sortOut(wantDown), sortOut(view(got))); diff != "" {
		t.Errorf("downstream mismatch (-want +got):\n%s", diff)
	}

	wantRetry := outOf(WithDeferral(deferred, d), tp.Retry)
	if diff := cmp.Diff([]out{wantRetry}, view(readAll(t, addr, tp.Retry))); diff != "" {
		t.Errorf("retry tier mismatch (-want +got):\n%s", diff)
	}
	wantDLQ := outOf(src(101, "tenant-y"), tp.DLQ, "gk-reason=no room within 24h")
	if diff := cmp.Diff([]out{wantDLQ}, view(readAll(t, addr, tp.DLQ))); diff != "" {
		t.Errorf("dead-letter mismatch (-want +got):\n%s", diff)
	}
}

// TestRouterKafkaMissingTopic checks that a write to a topic that does not
// exist is neither reported done nor creates the topic, and that it goes
// through once the topic is there.
func TestRouterKafkaMissingTopic(t *testing.T) {
	addr := testenv.Kafka(t)
	tp := uniqueTopics(t)
	r := &Router{Writer: newTestWriter(t, addr), Topics: tp, Logger: testenv.DiscardLogger(),
		Backoff: consume.Backoff{Min: 50 * time.Millisecond, Max: 500 * time.Millisecond}}
	item := Item{Msg: kafka.Message{Key: []byte("k"), Value: []byte("v"), Time: t0}, Outcome: Forward}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	err := r.Route(ctx, []Item{item})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got error %v, want context.DeadlineExceeded while the topic is missing", err)
	}

	client := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 10 * time.Second}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{tp.Downstream}})
	cancel()
	if err != nil {
		t.Fatalf("metadata: %v", err)
	}
	for _, topic := range md.Topics {
		if topic.Name == tp.Downstream && topic.Error == nil {
			t.Fatalf("got topic %s created by the writer, want no auto-creation", tp.Downstream)
		}
	}

	done := make(chan error, 1)
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() { done <- r.Route(ctx, []Item{item}) }()
	time.Sleep(500 * time.Millisecond) // let it fail at least once
	createTopics(t, addr, tp.Downstream)
	if err := <-done; err != nil {
		t.Fatalf("Route after creating the topic: %v", err)
	}
	got := readAll(t, addr, tp.Downstream)
	if len(got) != 1 || string(got[0].Value) != "v" {
		t.Errorf("got %d messages %v, want the one written", len(got), view(got))
	}
}

// TestWriterBatchBytesKafka: a writer batch whose records sum to the topic's
// max.message.bytes (by kafka-go's count) is refused by a real broker, for
// the record batch's header; with WriterBatchBytes the writer leaves room for
// it and the same records are accepted.
func TestWriterBatchBytesKafka(t *testing.T) {
	addr := testenv.Kafka(t)
	tp := uniqueTopics(t)
	createTopics(t, addr, tp.Downstream)
	const topicMax = 1048588 // Kafka's default max.message.bytes
	// Two records of one key (one partition) whose kafka-go sizes (24 bytes
	// beside key and value, without headers) sum to topicMax.
	half := topicMax / 2
	msgs := func() []kafka.Message {
		var out []kafka.Message
		for range 2 {
			out = append(out, kafka.Message{Topic: tp.Downstream, Key: []byte("k"), Value: bytes.Repeat([]byte("v"), half-24)})
		}
		return out
	}
	for _, tt := range []struct {
		name       string
		batchBytes int64
		wantErr    bool
	}{
		{"batch bytes at max.message.bytes", topicMax, true},
		{"WriterBatchBytes", WriterBatchBytes(topicMax), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			transport := &kafka.Transport{DialTimeout: 5 * time.Second, MetadataTTL: time.Second}
			defer transport.CloseIdleConnections()
			w := NewKafkaWriter([]string{addr}, WriterOptions{Transport: transport, BatchBytes: tt.batchBytes, Logger: testenv.DiscardLogger()})
			defer w.Close()
			w.BatchTimeout = 50 * time.Millisecond // both records in one batch when they fit
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := w.WriteMessages(ctx, msgs()...)
			var werrs kafka.WriteErrors
			tooLarge := errors.As(err, &werrs) && errors.Is(werrs[0], kafka.MessageSizeTooLarge)
			if tt.wantErr != (err != nil) || (err != nil && !tooLarge) {
				t.Errorf("got %v, want an error %v (too large)", err, tt.wantErr)
			}
		})
	}
}
