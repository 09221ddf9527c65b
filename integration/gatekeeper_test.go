package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// The integration tests run the real binary, as operators do: built once,
// started as separate processes, stopped with SIGTERM or killed hard.

var binary struct {
	once sync.Once
	path string
	err  error
}

// gatekeeperBinary builds cmd/gatekeeper once per test run.
func gatekeeperBinary(t testing.TB) string {
	t.Helper()
	binary.once.Do(func() {
		root, err := repoRoot()
		if err != nil {
			binary.err = err
			return
		}
		dir, err := os.MkdirTemp("", "gatekeeper-bin-")
		if err != nil {
			binary.err = err
			return
		}
		binary.path = filepath.Join(dir, "gatekeeper")
		cmd := exec.Command("go", "build", "-o", binary.path, "./cmd/gatekeeper")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			binary.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binary.err != nil {
		t.Fatalf("build gatekeeper: %v", binary.err)
	}
	return binary.path
}

// freeAddr returns a loopback address with a port that was free just now.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// gkProc is one running gatekeeper process.
type gkProc struct {
	t    testing.TB
	name string
	cmd  *exec.Cmd
	HTTP string // host:port of its HTTP server
	done chan struct{}
	err  error // exit status, once done is closed

	mu  sync.Mutex
	log []string
}

// startGatekeeper starts the binary with env (GATEKEEPER_* variables) added to
// a clean environment. HTTP_ADDR is chosen here unless env sets it.
func startGatekeeper(t testing.TB, name string, env map[string]string, args ...string) *gkProc {
	t.Helper()
	p := &gkProc{t: t, name: name, done: make(chan struct{})}
	vars := map[string]string{
		"GATEKEEPER_KAFKA_BROKERS": kafkaAddr(),
		"GATEKEEPER_REDIS_ADDRS":   redisAddr(),
		"GATEKEEPER_LOG_LEVEL":     "info",
	}
	for k, v := range env {
		vars[k] = v
	}
	if vars["GATEKEEPER_HTTP_ADDR"] == "" {
		vars["GATEKEEPER_HTTP_ADDR"] = freeAddr(t)
	}
	p.HTTP = vars["GATEKEEPER_HTTP_ADDR"]
	p.cmd = exec.Command(gatekeeperBinary(t), args...)
	p.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range vars {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = io.Discard
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.log = append(p.log, sc.Text())
			p.mu.Unlock()
		}
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("--- log of %s (last 40 lines):\n%s", name, p.tail(40))
		}
	})
	return p
}

func (p *gkProc) tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	from := max(0, len(p.log)-n)
	return strings.Join(p.log[from:], "\n")
}

// logContains reports whether a log line so far contains s.
func (p *gkProc) logContains(s string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.log {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// get does a GET on the process's HTTP server and returns the status and body.
func (p *gkProc) get(path string, header ...string) (int, string, error) {
	req, err := http.NewRequest("GET", "http://"+p.HTTP+path, nil)
	if err != nil {
		return 0, "", err
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	c := http.Client{Timeout: 5 * time.Second}
	res, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, string(b), err
}

// waitReady waits until /readyz answers 200 (the groups are joined).
func (p *gkProc) waitReady(timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			p.t.Fatalf("%s exited before it was ready: %v\n%s", p.name, p.err, p.tail(30))
		default:
		}
		code, body, err := p.get("/readyz")
		if err == nil && code == 200 {
			return
		}
		last = fmt.Sprintf("%d %s %v", code, body, err)
		time.Sleep(200 * time.Millisecond)
	}
	p.t.Fatalf("%s not ready after %v: %s\n%s", p.name, timeout, last, p.tail(30))
}

// terminate sends SIGTERM and waits for the exit; it returns the exit code
// and how long the process took to exit.
func (p *gkProc) terminate(timeout time.Duration) (int, time.Duration) {
	p.t.Helper()
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatalf("SIGTERM %s: %v", p.name, err)
	}
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("%s still running %v after SIGTERM\n%s", p.name, timeout, p.tail(30))
	}
	return p.cmd.ProcessState.ExitCode(), time.Since(start)
}

// kill ends the process hard (SIGKILL): no drain, no commit, no leave.
func (p *gkProc) kill() {
	p.cmd.Process.Kill()
	<-p.done
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: nil}}
	for p := 0; p < partitions; p++ {
		req.Topics[topic] = append(req.Topics[topic], p)
	}
	res, err := adminClient().OffsetFetch(ctx, req)
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
