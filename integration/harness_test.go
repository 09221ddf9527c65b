package integration

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// servers holds the addresses TestMain resolved; read them through kafkaAddr and redisAddr.
var servers struct {
	kafka, redis string
}

// errNoDocker is returned by startContainers when no Docker engine answers.
var errNoDocker = errors.New("no Docker engine reachable")

// startContainers starts Kafka and/or Redis containers and returns their addresses and a
// function that removes them (containers_test.go); it returns errNoDocker when there is no
// engine to use.
var startContainers = runContainers

var (
	runID = strings.ToLower(rand.Text()[:6]) // makes names unique across runs against long-lived servers
	seq   atomic.Int64                       // makes names unique within a run
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("integration: skipped in -short mode (needs Kafka and Redis)")
		os.Exit(0)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	stop, err := resolveServers(ctx)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "integration: %v\n", err)
		return 1
	}
	defer stop()
	defer binary.Remove()
	return m.Run()
}

// resolveServers fills servers (see the package comment for the order) and checks that both
// answer a real request, so that a wrong address fails once here rather than in every test.
func resolveServers(ctx context.Context) (stop func(), err error) {
	stop = func() {}
	servers.kafka = os.Getenv("GATEKEEPER_TEST_KAFKA")
	servers.redis = os.Getenv("GATEKEEPER_TEST_REDIS")
	if servers.kafka == "" || servers.redis == "" {
		k, r, s, err := startContainers(ctx, servers.kafka == "", servers.redis == "")
		switch {
		case errors.Is(err, errNoDocker):
			fmt.Fprintln(os.Stderr, "integration: no Docker engine; using deploy/local scripts")
		case err != nil:
			return stop, fmt.Errorf("start containers: %w", err)
		default:
			stop = s
			servers.kafka = cmp.Or(servers.kafka, k)
			servers.redis = cmp.Or(servers.redis, r)
		}
	}
	if servers.kafka == "" {
		if err := localScript(ctx, "kafka.sh"); err != nil {
			return stop, err
		}
		servers.kafka = "127.0.0.1:" + cmp.Or(os.Getenv("KAFKA_PORT"), "9092")
	}
	if servers.redis == "" {
		if err := localScript(ctx, "redis.sh"); err != nil {
			return stop, err
		}
		servers.redis = "127.0.0.1:" + cmp.Or(os.Getenv("REDIS_PORT"), "6379")
	}
	if err := pingKafka(ctx, servers.kafka); err != nil {
		return stop, fmt.Errorf("kafka at %s: %w", servers.kafka, err)
	}
	t0 := time.Now()
	if err := testenv.WarmUpGroupCoordinator(ctx, servers.kafka, "gkt-warm-up"); err != nil {
		return stop, fmt.Errorf("kafka at %s: group coordinator: %w", servers.kafka, err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: servers.redis})
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return stop, fmt.Errorf("redis at %s: %w", servers.redis, err)
	}
	fmt.Fprintf(os.Stderr, "integration: kafka=%s redis=%s (group coordinator ready in %v)\n",
		servers.kafka, servers.redis, time.Since(t0).Round(time.Millisecond))
	return stop, nil
}

// localScript runs deploy/local/<name> start, which starts the server or reuses a running one.
// Servers started this way are left running for the next run (make servers-down stops them).
func localScript(ctx context.Context, name string) error {
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, "deploy", "local", name), "start")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("deploy/local/%s start: %w", name, err)
	}
	return nil
}

// pingKafka sends a metadata request to addr.
func pingKafka(ctx context.Context, addr string) error {
	conn, err := kafka.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	_, err = conn.Brokers()
	return err
}

// kafkaAddr is the bootstrap address (host:port) of the test Kafka broker.
func kafkaAddr() string { return servers.kafka }

// redisAddr is the address (host:port) of the test Redis (a single node, not a cluster).
func redisAddr() string { return servers.redis }

var cluster struct {
	once  sync.Once
	addrs []string
	err   error
}

// redisClusterAddrs returns the seed addresses of the test Redis Cluster: those in
// GATEKEEPER_TEST_REDIS_CLUSTER, or else a local cluster started on first use.
func redisClusterAddrs(t testing.TB) []string {
	t.Helper()
	cluster.once.Do(func() {
		env := os.Getenv("GATEKEEPER_TEST_REDIS_CLUSTER")
		if env == "" {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if cluster.err = localScript(ctx, "redis-cluster.sh"); cluster.err != nil {
				return
			}
			env = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"
			if p := os.Getenv("REDIS_CLUSTER_PORTS"); p != "" {
				env = "127.0.0.1:" + strings.Join(strings.Fields(p), ",127.0.0.1:")
			}
		}
		cluster.addrs = strings.Split(env, ",")
	})
	if cluster.err != nil {
		t.Fatalf("redis cluster: %v", cluster.err)
	}
	return cluster.addrs
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// uniqueName is "<runID>-<test name>-<seq>", made of [A-Za-z0-9_.-] only (valid in a topic
// name, and without the braces that mark Redis Cluster hash tags).
func uniqueName(t testing.TB) string {
	name := unsafeChars.ReplaceAllString(t.Name(), "-")
	if len(name) > 80 {
		name = name[:80]
	}
	return fmt.Sprintf("%s-%s-%d", runID, name, seq.Add(1))
}

// keyPrefix returns a Redis key prefix unique to this call (test name, run and sequence
// number), for GATEKEEPER_REDIS_KEY_PREFIX or limit.Options.Prefix. It contains no braces.
func keyPrefix(t testing.TB) string {
	t.Helper()
	return "gkt-" + uniqueName(t)
}

// newTopic creates a topic with the given number of partitions (replication factor 1) and a
// unique name, waits until the broker's metadata shows a leader for every partition, and
// deletes it when the test ends (unless GATEKEEPER_TEST_KEEP_TOPICS is set).
//
// The topic is created through kafka.DefaultTransport (which routes CreateTopics to the
// controller and then refreshes its metadata cache), so Writers and Clients on the default
// transport see it at once. A kafka-go Transport of your own that cached metadata before the
// topic existed answers Unknown Topic Or Partition until it refreshes (MetadataTTL, 6s by
// default): create topics before building such writers.
func newTopic(t testing.TB, partitions int) string {
	t.Helper()
	topic := "gkt-" + uniqueName(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := createTopic(ctx, topic, partitions); err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	if os.Getenv("GATEKEEPER_TEST_KEEP_TOPICS") == "" {
		t.Cleanup(func() {
			if err := deleteTopic(topic); err != nil {
				t.Logf("delete topic %s: %v", topic, err)
			}
		})
	}
	return topic
}

func adminClient() *kafka.Client {
	return &kafka.Client{Addr: kafka.TCP(kafkaAddr()), Timeout: 30 * time.Second}
}

func createTopic(ctx context.Context, topic string, partitions int) error {
	res, err := adminClient().CreateTopics(ctx, &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}},
	})
	if err != nil {
		return err
	}
	if err := res.Errors[topic]; err != nil {
		return err
	}
	// Check on a connection of its own that the broker serves every partition.
	for {
		ready, err := topicReady(ctx, topic, partitions)
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("metadata never showed %d partitions with leaders (last error: %v): %w", partitions, err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func topicReady(ctx context.Context, topic string, partitions int) (bool, error) {
	conn, err := kafka.DialContext(ctx, "tcp", kafkaAddr())
	if err != nil {
		return false, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return false, err
	}
	parts, err := conn.ReadPartitions(topic)
	if err != nil {
		return false, err
	}
	if len(parts) != partitions {
		return false, fmt.Errorf("%d of %d partitions", len(parts), partitions)
	}
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for _, p := range parts {
		if p.Leader.Host == "" {
			return false, fmt.Errorf("partition %d has no leader", p.ID)
		}
		req.Topics[topic] = append(req.Topics[topic], kafka.LastOffsetOf(p.ID))
	}
	// Metadata can name a leader a moment before that broker acts as one (Produce then fails
	// with Not Leader For Partition); ListOffsets is answered only by an acting leader.
	res, err := adminClient().ListOffsets(ctx, req)
	if err != nil {
		return false, err
	}
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			return false, fmt.Errorf("partition %d: %w", p.Partition, p.Error)
		}
	}
	return true, nil
}

func deleteTopic(topic string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := adminClient().DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	if err != nil {
		return err
	}
	return res.Errors[topic]
}

// TestHarness proves the harness: a fresh topic takes a message and gives it back through a
// consumer group (committing its offset), and Redis answers under a per-test key prefix.
func TestHarness(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	topic := newTopic(t, 3)
	w := &kafka.Writer{
		Addr:         kafka.TCP(kafkaAddr()),
		Topic:        topic,
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 2 * time.Millisecond,
		WriteTimeout: 10 * time.Second,
	}
	defer w.Close()
	want := kafka.Message{Key: []byte("tenant-a"), Value: []byte("hello " + topic)}
	if err := w.WriteMessages(ctx, want); err != nil {
		t.Fatalf("write: %v", err)
	}

	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:          []string{kafkaAddr()},
		GroupID:          topic,
		Topic:            topic,
		StartOffset:      kafka.FirstOffset,
		MaxWait:          100 * time.Millisecond,
		JoinGroupBackoff: 200 * time.Millisecond, // the group coordinator is warm (TestMain)
	})
	defer r.Close()
	got, err := r.FetchMessage(ctx)
	if err != nil {
		t.Fatalf("fetch: %v", err)
	}
	if string(got.Key) != string(want.Key) || string(got.Value) != string(want.Value) {
		t.Errorf("got message %q=%q, want %q=%q", got.Key, got.Value, want.Key, want.Value)
	}
	if err := r.CommitMessages(ctx, got); err != nil {
		t.Fatalf("commit: %v", err)
	}

	rdb := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("redis ping: %v", err)
	}
	key := keyPrefix(t) + ":probe"
	if err := rdb.Set(ctx, key, topic, time.Minute).Err(); err != nil {
		t.Fatalf("redis set: %v", err)
	}
	if v, err := rdb.Get(ctx, key).Result(); err != nil || v != topic {
		t.Errorf("redis get %s: got %q, %v; want %q", key, v, err, topic)
	}
	if a, b := keyPrefix(t), keyPrefix(t); a == b {
		t.Errorf("keyPrefix returned %q twice", a)
	}
}

// TestHarnessRedisCluster proves the cluster helper: every shard answers, and a key under
// the test's prefix can be written and read through the cluster client.
func TestHarnessRedisCluster(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redisClusterAddrs(t)})
	defer rdb.Close()
	err := rdb.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() })
	if err != nil {
		t.Fatalf("ping shards: %v", err)
	}
	key := keyPrefix(t) + ":{probe}"
	if err := rdb.Set(ctx, key, "ok", time.Minute).Err(); err != nil {
		t.Fatalf("set: %v", err)
	}
	if v, err := rdb.Get(ctx, key).Result(); err != nil || v != "ok" {
		t.Errorf("get %s: got %q, %v; want \"ok\"", key, v, err)
	}
}
