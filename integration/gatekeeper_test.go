package integration

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// The integration tests run the real binary, as operators do: built once,
// started as separate processes (testenv.Process), stopped with SIGTERM or
// killed hard.

// binary is ./cmd/gatekeeper, built once per run and removed by TestMain.
var binary testenv.Binary

// gatekeeperBinary returns the binary, building it on the first call.
func gatekeeperBinary(t testing.TB) string { return binary.Path(t) }

// gkProc is one running gatekeeper process of a test.
type gkProc struct {
	*testenv.Process
	t testing.TB
}

// startGatekeeper starts the binary with env (GATEKEEPER_* variables) added to
// a clean environment, the test servers and log level info unless env sets
// them. HTTP_ADDR is chosen here unless env sets it.
func startGatekeeper(t testing.TB, name string, env map[string]string, args ...string) *gkProc {
	t.Helper()
	vars := map[string]string{
		"GATEKEEPER_KAFKA_BROKERS": kafkaAddr(),
		"GATEKEEPER_REDIS_ADDRS":   redisAddr(),
		"GATEKEEPER_LOG_LEVEL":     "info",
	}
	for k, v := range env {
		vars[k] = v
	}
	p := testenv.Start(t, testenv.Spec{Name: name, Binary: gatekeeperBinary(t), Env: vars, Args: args})
	return &gkProc{Process: p, t: t}
}

// waitReady waits until /readyz answers 200 (the groups are joined).
func (p *gkProc) waitReady(timeout time.Duration) {
	p.t.Helper()
	p.WaitReady(p.t, timeout)
}

// terminate sends SIGTERM and waits for the exit; it returns the exit code
// and how long the process took to exit.
func (p *gkProc) terminate(timeout time.Duration) (int, time.Duration) {
	p.t.Helper()
	code, took, err := p.Terminate(timeout)
	if err != nil {
		p.t.Fatalf("%v\n%s", err, p.Tail(30))
	}
	return code, took
}

// flow is one gatekeeper pipeline's topics: a source and the outputs.
type flow struct {
	Source, Downstream, Retry, DLQ string
}

// newFlow creates the topics of a pipeline: the source with the given
// partitions, downstream and the dead-letter topic with 3, and the three
// retry tiers with 3. Downstream stamps messages with the broker's append
// time, so a test can tell when an event was forwarded.
func newFlow(t testing.TB, sourcePartitions int) flow {
	t.Helper()
	f := flow{Source: newTopic(t, sourcePartitions)}
	f.Downstream = f.Source + ".out"
	f.Retry = f.Downstream + ".retry"
	f.DLQ = f.Downstream + ".dlq"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topics := []kafka.TopicConfig{{Topic: f.Downstream, NumPartitions: 3, ReplicationFactor: 1,
		ConfigEntries: []kafka.ConfigEntry{{ConfigName: "message.timestamp.type", ConfigValue: "LogAppendTime"}}}}
	for _, name := range []string{f.Retry, f.Retry + ".1h", f.Retry + ".long", f.DLQ} {
		topics = append(topics, kafka.TopicConfig{Topic: name, NumPartitions: 3, ReplicationFactor: 1,
			ConfigEntries: []kafka.ConfigEntry{{ConfigName: "message.timestamp.type", ConfigValue: "LogAppendTime"}}})
	}
	res, err := adminClient().CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: topics})
	if err != nil {
		t.Fatalf("create topics: %v", err)
	}
	for _, tc := range topics {
		if err := res.Errors[tc.Topic]; err != nil {
			t.Fatalf("create topic %s: %v", tc.Topic, err)
		}
		for {
			ok, err := topicReady(ctx, tc.Topic, tc.NumPartitions)
			if ok {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("topic %s not ready: %v", tc.Topic, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if os.Getenv("GATEKEEPER_TEST_KEEP_TOPICS") == "" {
			name := tc.Topic
			t.Cleanup(func() { deleteTopic(name) })
		}
	}
	return f
}

// env returns the gatekeeper variables for the flow.
func (f flow) env(t testing.TB, more ...string) map[string]string {
	e := map[string]string{
		"GATEKEEPER_SOURCE_TOPICS":    f.Source,
		"GATEKEEPER_DOWNSTREAM_TOPIC": f.Downstream,
		"GATEKEEPER_RETRY_TOPIC":      f.Retry,
		"GATEKEEPER_DLQ_TOPIC":        f.DLQ,
		"GATEKEEPER_GROUP_ID":         "gk-" + f.Source,
		"GATEKEEPER_REDIS_KEY_PREFIX": keyPrefix(t),
		"GATEKEEPER_BATCH_WAIT":       "20ms",
		"GATEKEEPER_SHUTDOWN_GRACE":   "15s",
	}
	for i := 0; i+1 < len(more); i += 2 {
		e[more[i]] = more[i+1]
	}
	return e
}

// partitionWriter returns a producer for topic that writes each message to
// the partition it names, with acks from all replicas.
func partitionWriter(topic string) *kafka.Writer {
	return &kafka.Writer{
		Addr:         kafka.TCP(kafkaAddr()),
		Topic:        topic,
		Balancer:     kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition }),
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 2 * time.Millisecond,
		BatchSize:    1000,
		WriteTimeout: 30 * time.Second,
	}
}

// produce writes msgs to topic, each to the partition it names, and waits
// for the acknowledgements.
func produce(t testing.TB, topic string, msgs []kafka.Message) {
	t.Helper()
	w := partitionWriter(topic)
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := 0; i < len(msgs); i += 1000 {
		if err := w.WriteMessages(ctx, msgs[i:min(i+1000, len(msgs))]...); err != nil {
			t.Fatalf("produce to %s: %v", topic, err)
		}
	}
}

// waitFor polls cond every half second until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var status string
	for {
		var ok bool
		ok, status = cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached after %v: %s", what, timeout, status)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// header returns the last value of header k of m, or "".
func header(m kafka.Message, k string) string {
	v := ""
	for _, h := range m.Headers {
		if h.Key == k {
			v = string(h.Value)
		}
	}
	return v
}

// committed returns the group's committed offset per partition of topic.
func committed(t testing.TB, group, topic string, partitions int) map[int]int64 {
	t.Helper()
	return committedAt(t, adminClient(), group, topic, partitions)
}

// committedAt returns the group's committed offset per partition of topic
// as the broker of c knows it (-1 where none is committed).
func committedAt(t testing.TB, c *kafka.Client, group, topic string, partitions int) map[int]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: nil}}
	for p := 0; p < partitions; p++ {
		req.Topics[topic] = append(req.Topics[topic], p)
	}
	res, err := c.OffsetFetch(ctx, req)
	if err != nil {
		t.Fatalf("offset fetch: %v", err)
	}
	out := map[int]int64{}
	for _, p := range res.Topics[topic] {
		out[p.Partition] = p.CommittedOffset
	}
	return out
}

// readRetry returns the messages of every retry tier.
func (f flow) readRetry(t testing.TB) []kafka.Message {
	var out []kafka.Message
	for _, tier := range []string{f.Retry, f.Retry + ".1h", f.Retry + ".long"} {
		out = append(out, readTopic(t, tier)...)
	}
	return out
}
