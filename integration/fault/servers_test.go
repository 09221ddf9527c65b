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
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
)

// servers are the private servers TestMain started.
var servers struct {
	broker *broker
	redis  *redisServer
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
	defer func() {
		if binary.dir != "" {
			os.RemoveAll(binary.dir)
		}
	}()
	return m.Run()
}

// startServers starts the private broker and redis-server under dir.
func startServers(dir string) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	b, err := newBroker(root, filepath.Join(dir, "kafka"))
	if err != nil {
		return err
	}
	servers.broker = b
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := b.script(ctx, "start"); err != nil {
		return fmt.Errorf("private kafka: %w\n%s", err, out)
	}
	if err := warmUpGroupCoordinator(ctx, b.Addr()); err != nil {
		return fmt.Errorf("private kafka at %s: group coordinator: %w", b.Addr(), err)
	}
	r, err := startRedisServer(root, filepath.Join(dir, "redis"))
	if err != nil {
		return err
	}
	servers.redis = r
	fmt.Fprintf(os.Stderr, "fault: kafka %s at %s, redis at %s (started in %v)\n",
		b.Version(), b.Addr(), r.Addr, time.Since(t0).Round(time.Millisecond))
	return nil
}

// stopServers stops what startServers started.
func stopServers() {
	if b := servers.broker; b != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if out, err := b.script(ctx, "stop"); err != nil {
			fmt.Fprintf(os.Stderr, "fault: stop private kafka: %v\n%s", err, out)
			b.killPid()
		}
		cancel()
	}
	if r := servers.redis; r != nil {
		r.stop()
	}
}

// kafkaAddr is the bootstrap address of the private broker.
func kafkaAddr() string { return servers.broker.Addr() }

// redisAddr is the address of the private redis-server.
func redisAddr() string { return servers.redis.Addr }

// repoRoot is the nearest directory above the working directory that holds go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repository root (go.mod) not found")
		}
		dir = parent
	}
}

// handedOut are the ports freePorts has returned in this run: a port is
// free again once its probe listener is closed, and the kernel may offer it
// to the next probe, before the process meant to use it has bound it.
var handedOut struct {
	sync.Mutex
	ports map[int]bool
}

// freePorts returns n loopback ports that were free just now and were never
// returned before in this run.
func freePorts(n int) ([]int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports == nil {
		handedOut.ports = map[int]bool{}
	}
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 100 {
			return nil, errors.New("no free port found in 100 tries")
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close() // held until all are chosen
		if p := l.Addr().(*net.TCPAddr).Port; !handedOut.ports[p] {
			handedOut.ports[p] = true
			ports = append(ports, p)
		}
	}
	return ports, nil
}

// broker is a private one-node Kafka run by deploy/local/kafka.sh; stop then
// start on the same KAFKA_DIR restarts it with the same data.
type broker struct {
	root, dir  string
	port, ctrl int
}

func newBroker(root, dir string) (*broker, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	return &broker{root: root, dir: dir, port: ports[0], ctrl: ports[1]}, nil
}

// Addr is the broker's bootstrap address.
func (b *broker) Addr() string { return "127.0.0.1:" + strconv.Itoa(b.port) }

// script runs deploy/local/kafka.sh verb for this broker and returns its output.
// KAFKA_VERSION is GATEKEEPER_TEST_KAFKA_VERSION when that is set; otherwise
// the script chooses.
func (b *broker) script(ctx context.Context, verb string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(b.root, "deploy", "local", "kafka.sh"), verb)
	cmd.Env = append(os.Environ(),
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

var kafkaVersionLine = regexp.MustCompile(`Kafka version: (\S+)`)

// Version is the release the broker logged at start-up ("unknown" if it did not).
func (b *broker) Version() string {
	log, err := os.ReadFile(filepath.Join(b.dir, "kafka.log"))
	if sm := kafkaVersionLine.FindSubmatch(log); err == nil && sm != nil {
		return string(sm[1])
	}
	return "unknown"
}

// warmUpGroupCoordinator waits until consumer-group requests succeed: on a
// fresh broker the first one creates __consumer_offsets, and until it is
// loaded group requests fail (copied from integration/harness_test.go).
func warmUpGroupCoordinator(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 5 * time.Second, Transport: &kafka.Transport{}}
	defer c.Transport.(*kafka.Transport).CloseIdleConnections()
	for {
		res, err := c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: "gkf-warm-up", Topics: map[string][]int{}})
		if err == nil {
			err = res.Error
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready after a minute: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// redisServer is the private redis-server child process. DEBUG is enabled on
// it, so a scenario can freeze it with DEBUG SLEEP.
type redisServer struct {
	Addr string
	cmd  *exec.Cmd
	done chan struct{}
}

// startRedisServer starts redis-server on a free port, without persistence,
// and waits until it answers PING. When redis-server is not on PATH it tries
// the install step of deploy/local/redis.sh (Debian's package) first.
func startRedisServer(root, dir string) (*redisServer, error) {
	if err := ensureRedisServer(root); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	port := strconv.Itoa(ports[0])
	s := &redisServer{Addr: "127.0.0.1:" + port, done: make(chan struct{})}
	s.cmd = exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", dir, "--enable-debug-command", "yes",
		"--logfile", filepath.Join(dir, "redis.log"))
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: time.Second})
	defer rdb.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return s, nil
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			return nil, fmt.Errorf("redis-server on %s exited at start:\n%s", s.Addr, log)
		default:
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("redis-server on %s does not answer PING after 20s: %v", s.Addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
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

// stop kills the server and waits until it has exited.
func (s *redisServer) stop() {
	select {
	case <-s.done:
		return
	default:
	}
	s.cmd.Process.Kill()
	<-s.done
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
