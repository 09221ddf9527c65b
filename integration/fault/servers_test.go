//go:build fault

// Package fault is Gatekeeper's fault suite: the built binary, three
// processes of one consumer group, a real Kafka broker and a real
// redis-server, steady load with over-limit tenants, and the faults that
// break the guarantees in production (rolling update, scaling, SIGKILL, a
// frozen Redis, a broker restart). Each scenario prints its figures (lost,
// duplicated, early, max_window, recover) and asserts the guarantees.
//
// The suite runs only with the build tag:
//
//	go test -race -count=1 -tags fault -v -timeout 30m ./integration/fault/
//
// TestMain starts a private broker (deploy/local/kafka.sh, KAFKA_VERSION from
// GATEKEEPER_TEST_KAFKA_VERSION when set) and a private redis-server, because
// the scenarios stop the broker and freeze Redis. GATEKEEPER_FAULT_BINARY
// runs the suite against a gatekeeper binary built elsewhere (for example
// from another commit) instead of building ./cmd/gatekeeper;
// GATEKEEPER_FAULT_LOG_DIR, when set, keeps every gatekeeper's full log there.
package fault

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// servers are the private servers TestMain started.
var servers struct {
	broker *broker
	redis  *testenv.RedisServer
	// kafkaCut and redisCut are the proxies a replica under test reaches
	// the broker (through its CUT listener) and Redis through.
	kafkaCut, redisCut *proxy
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("fault: skipped in -short mode (starts Kafka and Redis)")
		os.Exit(0)
	}
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "gatekeeper-fault-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "fault: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := startServers(dir); err != nil {
		fmt.Fprintf(os.Stderr, "fault: %v\n", err)
		stopServers()
		return 1
	}
	defer stopServers()
	defer binary.Remove()
	return m.Run()
}

// startServers starts the private broker and redis-server under dir.
func startServers(dir string) error {
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	b, err := newBroker(root, filepath.Join(dir, "kafka"))
	if err != nil {
		return err
	}
	servers.broker = b
	if servers.kafkaCut, err = startProxy(b.proxyAddr(), b.cutAddr()); err != nil {
		return fmt.Errorf("kafka proxy: %w", err)
	}
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := b.script(ctx, "start"); err != nil {
		return fmt.Errorf("private kafka: %w\n%s", err, out)
	}
	if err := testenv.WarmUpGroupCoordinator(ctx, b.Addr(), "gkf-warm-up"); err != nil {
		return fmt.Errorf("private kafka at %s: group coordinator: %w", b.Addr(), err)
	}
	if err := ensureRedisServer(root); err != nil {
		return err
	}
	// DEBUG is enabled, so a scenario can freeze Redis with DEBUG SLEEP.
	r, err := testenv.StartRedisServer(testenv.RedisOptions{Dir: filepath.Join(dir, "redis"), Debug: true})
	if err != nil {
		return err
	}
	servers.redis = r
	if servers.redisCut, err = startProxy("127.0.0.1:0", r.Addr); err != nil {
		return fmt.Errorf("redis proxy: %w", err)
	}
	fmt.Fprintf(os.Stderr, "fault: kafka %s at %s, redis at %s (started in %v)\n",
		b.Version(), b.Addr(), r.Addr, time.Since(t0).Round(time.Millisecond))
	return nil
}

// stopServers stops what startServers started.
func stopServers() {
	for _, p := range []*proxy{servers.kafkaCut, servers.redisCut} {
		if p != nil {
			p.Close()
		}
	}
	if b := servers.broker; b != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if out, err := b.script(ctx, "stop"); err != nil {
			fmt.Fprintf(os.Stderr, "fault: stop private kafka: %v\n%s", err, out)
			b.killPid()
		}
		cancel()
		b.keepLogs(os.Getenv("GATEKEEPER_FAULT_LOG_DIR"))
	}
	if r := servers.redis; r != nil {
		r.Stop()
	}
}

// kafkaAddr is the bootstrap address of the private broker.
func kafkaAddr() string { return servers.broker.Addr() }

// redisAddr is the address of the private redis-server.
func redisAddr() string { return servers.redis.Addr }

// broker is a private one-node Kafka run by deploy/local/kafka.sh; stop then
// start on the same KAFKA_DIR restarts it with the same data. Besides its
// listener it has a second one, CUT, that advertises the address of a proxy
// (servers.kafkaCut): a client that bootstraps through the proxy reaches the
// broker only through it, so the proxy can cut it off.
type broker struct {
	root, dir  string
	port, ctrl int
	cut, proxy int // the CUT listener's port and the proxy's it advertises
}

func newBroker(root, dir string) (*broker, error) {
	ports, err := testenv.FreePorts(4)
	if err != nil {
		return nil, err
	}
	return &broker{root: root, dir: dir, port: ports[0], ctrl: ports[1], cut: ports[2], proxy: ports[3]}, nil
}

func (b *broker) cutAddr() string   { return "127.0.0.1:" + strconv.Itoa(b.cut) }
func (b *broker) proxyAddr() string { return "127.0.0.1:" + strconv.Itoa(b.proxy) }

// extraConfig writes the CUT listener's configuration for kafka.sh
// (KAFKA_EXTRA_CONFIG) and returns its path.
func (b *broker) extraConfig() (string, error) {
	path := b.dir + "-cut.properties"
	conf := fmt.Sprintf("listeners=PLAINTEXT://127.0.0.1:%d,CUT://127.0.0.1:%d,CONTROLLER://127.0.0.1:%d\n"+
		"advertised.listeners=PLAINTEXT://127.0.0.1:%d,CUT://127.0.0.1:%d\n"+
		"listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,CUT:PLAINTEXT\n",
		b.port, b.cut, b.ctrl, b.port, b.proxy)
	return path, os.WriteFile(path, []byte(conf), 0o644)
}

// Addr is the broker's bootstrap address.
func (b *broker) Addr() string { return "127.0.0.1:" + strconv.Itoa(b.port) }

// script runs deploy/local/kafka.sh verb for this broker and returns its output.
// KAFKA_VERSION is GATEKEEPER_TEST_KAFKA_VERSION when that is set; otherwise
// the script chooses.
func (b *broker) script(ctx context.Context, verb string) (string, error) {
	extra, err := b.extraConfig()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(b.root, "deploy", "local", "kafka.sh"), verb)
	cmd.Env = append(os.Environ(), "KAFKA_EXTRA_CONFIG="+extra,
		"KAFKA_PORT="+strconv.Itoa(b.port),
		"KAFKA_CONTROLLER_PORT="+strconv.Itoa(b.ctrl),
		"KAFKA_DIR="+b.dir)
	if v := os.Getenv("GATEKEEPER_TEST_KAFKA_VERSION"); v != "" {
		cmd.Env = append(cmd.Env, "KAFKA_VERSION="+v)
	}
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("deploy/local/kafka.sh %s: %w", verb, err)
	}
	return string(out), nil
}

// killPid kills the broker by the pid kafka.sh recorded, when the script
// itself could not stop it: a broker runs detached (setsid) and would outlive
// the run.
func (b *broker) killPid() {
	pid, err := os.ReadFile(filepath.Join(b.dir, "kafka.pid"))
	if err != nil {
		return
	}
	if n, err := strconv.Atoi(strings.TrimSpace(string(pid))); err == nil && n > 1 {
		if p, err := os.FindProcess(n); err == nil {
			fmt.Fprintf(os.Stderr, "fault: killing private kafka pid %d\n", n)
			p.Kill()
		}
	}
}

// keepLogs copies the broker's logs (kafka.log since the last start,
// kafka.log.1 the run before, that is before a restart) into dir when dir is
// set, so that the broker's side of a scenario (listening again, groups
// loaded) can be read beside the gatekeepers' logs.
func (b *broker) keepLogs(dir string) {
	if dir == "" {
		return
	}
	for _, name := range []string{"kafka.log", "kafka.log.1"} {
		data, err := os.ReadFile(filepath.Join(b.dir, name))
		if err != nil {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, "broker-"+name), data, 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "fault: keep broker log: %v\n", err)
		}
	}
}

var kafkaVersionLine = regexp.MustCompile(`Kafka version: (\S+)`)

// Version is the release the broker logged at start-up ("unknown" if it did not).
func (b *broker) Version() string {
	log, err := os.ReadFile(filepath.Join(b.dir, "kafka.log"))
	if sm := kafkaVersionLine.FindSubmatch(log); err == nil && sm != nil {
		return string(sm[1])
	}
	return "unknown"
}

// ensureRedisServer makes sure redis-server is on PATH, installing it the way
// deploy/local/redis.sh does when it is missing.
func ensureRedisServer(root string) error {
	if _, err := exec.LookPath("redis-server"); err == nil {
		return nil
	}
	fmt.Fprintln(os.Stderr, "fault: redis-server not on PATH; installing it as deploy/local/redis.sh does")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	common := filepath.Join(root, "deploy", "local", "common.sh")
	cmd := exec.CommandContext(ctx, "bash", "-c", `source "$1" && ensure_redis_installed`, "bash", common)
	out, err := cmd.CombinedOutput()
	if _, lerr := exec.LookPath("redis-server"); lerr != nil {
		return fmt.Errorf("redis-server is not on PATH and installing it failed (%v): install Debian's redis-server "+
			"(apt-get install redis-server) or run deploy/local/redis.sh start once\n%s", err, out)
	}
	return nil
}

// adminClient talks to the private broker; every request has a timeout.
func adminClient() *kafka.Client {
	return &kafka.Client{Addr: kafka.TCP(kafkaAddr()), Timeout: 15 * time.Second}
}

// createTopics creates topics and waits until every partition has an acting leader.
func createTopics(ctx context.Context, topics []kafka.TopicConfig) error {
	res, err := adminClient().CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: topics})
	if err != nil {
		return fmt.Errorf("create topics: %w", err)
	}
	for _, tc := range topics {
		if err := res.Errors[tc.Topic]; err != nil {
			return fmt.Errorf("create topic %s: %w", tc.Topic, err)
		}
		for {
			_, err := endOffsets(ctx, tc.Topic, tc.NumPartitions)
			if err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("topic %s not ready: %w", tc.Topic, err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// deleteTopics deletes topics, best effort (the broker is private and goes
// away with the run; deleting keeps it light for the next scenario).
func deleteTopics(topics []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	adminClient().DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: topics})
}

// endOffsets returns the end offset (next offset to be written) of each of
// the first partitions of topic. ListOffsets is answered only by an acting
// leader, so success also means every partition is served.
func endOffsets(ctx context.Context, topic string, partitions int) (map[int]int64, error) {
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for p := range partitions {
		req.Topics[topic] = append(req.Topics[topic], kafka.LastOffsetOf(p))
	}
	res, err := adminClient().ListOffsets(ctx, req)
	if err != nil {
		return nil, err
	}
	out := map[int]int64{}
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("%s/%d: %w", topic, p.Partition, p.Error)
		}
		out[p.Partition] = p.LastOffset
	}
	if len(out) != partitions {
		return nil, fmt.Errorf("%s: offsets of %d of %d partitions", topic, len(out), partitions)
	}
	return out, nil
}

// committedOffsets returns group's committed offset of each of the first
// partitions of topic (-1 where none is committed).
func committedOffsets(ctx context.Context, group, topic string, partitions int) (map[int]int64, error) {
	req := &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{}}
	for p := range partitions {
		req.Topics[topic] = append(req.Topics[topic], p)
	}
	res, err := adminClient().OffsetFetch(ctx, req)
	if err != nil {
		return nil, err
	}
	if res.Error != nil {
		return nil, res.Error
	}
	out := map[int]int64{}
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("%s/%d: %w", topic, p.Partition, p.Error)
		}
		out[p.Partition] = p.CommittedOffset
	}
	return out, nil
}

// lagOf sums, over the partitions of topic, the messages beyond group's
// committed offset; it describes the partitions that lag.
func lagOf(ctx context.Context, group, topic string, partitions int) (int64, string, error) {
	end, err := endOffsets(ctx, topic, partitions)
	if err != nil {
		return 0, "", err
	}
	com, err := committedOffsets(ctx, group, topic, partitions)
	if err != nil {
		return 0, "", err
	}
	var sum int64
	var lagging []string
	for p := range partitions {
		c := max(com[p], 0)
		if end[p] > c {
			sum += end[p] - c
			lagging = append(lagging, fmt.Sprintf("%d:%d/%d", p, com[p], end[p]))
		}
	}
	return sum, strings.Join(lagging, " "), nil
}
