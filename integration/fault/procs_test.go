//go:build fault

package fault

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The gatekeepers run as operators run them: the binary built once, started
// as separate processes, stopped with SIGTERM or killed with SIGKILL.
// (Adapted from integration/gatekeeper_test.go.)

var binary struct {
	once sync.Once
	path string
	dir  string // the build's temporary directory, removed by TestMain
	err  error
}

// gatekeeperBinary returns GATEKEEPER_FAULT_BINARY when set, else builds
// ./cmd/gatekeeper once per run.
func gatekeeperBinary(t testing.TB) string {
	t.Helper()
	binary.once.Do(func() {
		if p := os.Getenv("GATEKEEPER_FAULT_BINARY"); p != "" {
			binary.path, binary.err = filepath.Abs(p)
			return
		}
		root, err := repoRoot()
		if err != nil {
			binary.err = err
			return
		}
		dir, err := os.MkdirTemp("", "gatekeeper-fault-bin-")
		if err != nil {
			binary.err = err
			return
		}
		binary.dir = dir
		binary.path = filepath.Join(dir, "gatekeeper")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", binary.path, "./cmd/gatekeeper")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			binary.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binary.err != nil {
		t.Fatalf("gatekeeper binary: %v", binary.err)
	}
	return binary.path
}

// freeAddr returns a loopback address with a port that was free just now
// and not handed out before (freePorts).
func freeAddr(t testing.TB) string {
	t.Helper()
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
}

// gkProc is one running gatekeeper process. Its methods other than those
// taking a testing.TB are safe for concurrent use.
type gkProc struct {
	name string
	cmd  *exec.Cmd
	HTTP string // host:port of its HTTP server
	done chan struct{}
	err  error // exit status, once done is closed

	mu  sync.Mutex
	log []string
}

// startGatekeeper starts the binary with env (GATEKEEPER_* variables) in a
// clean environment, on a free HTTP port. It is killed when the test ends.
func startGatekeeper(t testing.TB, name string, env map[string]string) *gkProc {
	t.Helper()
	p := &gkProc{name: name, done: make(chan struct{}), HTTP: freeAddr(t)}
	p.cmd = exec.Command(gatekeeperBinary(t))
	p.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "GATEKEEPER_HTTP_ADDR=" + p.HTTP}
	for k, v := range env {
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
			t.Logf("--- log of %s (last 30 lines):\n%s", name, p.tail(30))
		}
		if dir := os.Getenv("GATEKEEPER_FAULT_LOG_DIR"); dir != "" {
			p.mu.Lock()
			log := strings.Join(p.log, "\n") + "\n"
			p.mu.Unlock()
			file := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+name+".log")
			if err := os.WriteFile(file, []byte(log), 0o644); err != nil {
				t.Logf("write the log of %s: %v", name, err)
			}
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

// exited reports whether the process has exited.
func (p *gkProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ready reports whether /readyz answers 200 within timeout.
func (p *gkProc) ready(ctx context.Context, timeout time.Duration) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+p.HTTP+"/readyz", nil)
	if err != nil {
		return false, err.Error()
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
	// The body lists every check, "[-]name failed: why" for a failed one.
	var failed []string
	for l := range strings.Lines(string(b)) {
		if strings.HasPrefix(l, "[-]") {
			failed = append(failed, strings.TrimSpace(l))
		}
	}
	return res.StatusCode == 200, fmt.Sprintf("%d %s", res.StatusCode, strings.Join(failed, ", "))
}

// waitReady waits until /readyz answers 200.
func (p *gkProc) waitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		if p.exited() {
			t.Fatalf("%s exited before it was ready: %v\n%s", p.name, p.err, p.tail(30))
		}
		var ok bool
		if ok, last = p.ready(context.Background(), 3*time.Second); ok {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s not ready after %v: %s\n%s", p.name, timeout, last, p.tail(30))
}

// terminate sends SIGTERM and waits up to timeout for the exit; it returns
// the exit code (-1 if it did not exit) and how long the exit took.
func (p *gkProc) terminate(timeout time.Duration) (int, time.Duration) {
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return -1, 0
	}
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), time.Since(start)
	case <-time.After(timeout):
		return -1, time.Since(start)
	}
}

// kill ends the process hard (SIGKILL): no drain, no commit, no leave.
func (p *gkProc) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// generation is one "consumer group generation started" log line.
type generation struct {
	ID         int      `json:"generation"`
	Group      string   `json:"group"`
	Partitions []string `json:"partitions"`
}

// lastGeneration returns the last generation of group the process logged.
func (p *gkProc) lastGeneration(group string) (generation, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.log) - 1; i >= 0; i-- {
		l := p.log[i]
		if !strings.Contains(l, "consumer group generation started") {
			continue
		}
		var g generation
		if json.Unmarshal([]byte(l), &g) == nil && g.Group == group {
			return g, true
		}
	}
	return generation{}, false
}

// fleet is the set of gatekeeper processes of one scenario. live holds those
// that should be serving: started and not yet signalled. Safe for concurrent
// use, except the methods that take the test (from the test goroutine only).
type fleet struct {
	env map[string]string

	mu   sync.Mutex
	live []*gkProc
	n    int // processes started so far, for names
}

// start starts one more process, gk<n>.
func (f *fleet) start(t testing.TB) *gkProc {
	t.Helper()
	f.mu.Lock()
	f.n++
	name := fmt.Sprintf("gk%d", f.n)
	f.mu.Unlock()
	p := startGatekeeper(t, name, f.env)
	f.mu.Lock()
	f.live = append(f.live, p)
	f.mu.Unlock()
	return p
}

// startReady starts n processes and waits until each is ready.
func (f *fleet) startReady(t testing.TB, n int) []*gkProc {
	t.Helper()
	var ps []*gkProc
	for range n {
		ps = append(ps, f.start(t))
	}
	for _, p := range ps {
		p.waitReady(t, 90*time.Second)
	}
	return ps
}

// procs returns the live processes.
func (f *fleet) procs() []*gkProc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*gkProc(nil), f.live...)
}

// drop removes p from the live processes.
func (f *fleet) drop(p *gkProc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, q := range f.live {
		if q == p {
			f.live = append(f.live[:i], f.live[i+1:]...)
			return
		}
	}
}

// terminate sends SIGTERM to each of ps at once and waits for their exits;
// a process that does not exit 0 within the grace period (G7) fails the test.
func (f *fleet) terminate(t testing.TB, grace time.Duration, ps ...*gkProc) {
	t.Helper()
	type exit struct {
		code int
		took time.Duration
	}
	exits := make([]exit, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		f.drop(p)
		wg.Go(func() {
			code, took := p.terminate(grace + 10*time.Second)
			exits[i] = exit{code, took}
		})
	}
	wg.Wait()
	for i, p := range ps {
		e := exits[i]
		t.Logf("%s: SIGTERM -> exit %d after %v", p.name, e.code, e.took.Round(time.Millisecond))
		if e.code != 0 || e.took > grace+2*time.Second {
			t.Errorf("%s after SIGTERM: exit %d after %v, want exit 0 within the grace period %v (G7)\n%s",
				p.name, e.code, e.took.Round(time.Millisecond), grace, p.tail(20))
		}
	}
}

// kill sends SIGKILL to p and waits until it is gone.
func (f *fleet) kill(p *gkProc) {
	f.drop(p)
	p.kill()
}

// allReady polls /readyz of every live process at once; ok when all answer
// 200 (and at least one is live).
func (f *fleet) allReady(ctx context.Context) (bool, string) {
	ps := f.procs()
	oks := make([]bool, len(ps))
	why := make([]string, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() { oks[i], why[i] = p.ready(ctx, 3*time.Second) })
	}
	wg.Wait()
	all := len(ps) > 0
	var bad []string
	for i, ok := range oks {
		if !ok {
			all = false
			bad = append(bad, ps[i].name+": "+why[i])
		}
	}
	return all, strings.Join(bad, "; ")
}

// waitAssigned waits until the live processes are the members of one
// generation of each group and together own all its partitions (parts per
// group), so that the load starts with every partition consumed.
func (f *fleet) waitAssigned(t testing.TB, groups map[string]int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, status := f.assigned(groups)
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer groups not assigned after %v: %s", timeout, status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (f *fleet) assigned(groups map[string]int) (bool, string) {
	var status []string
	ok := true
	for group, parts := range groups {
		seen := map[string]bool{}
		gen := -1
		for _, p := range f.procs() {
			g, found := p.lastGeneration(group)
			status = append(status, fmt.Sprintf("%s %s: generation %d %v", p.name, group, g.ID, g.Partitions))
			if !found || (gen != -1 && g.ID != gen) {
				ok = false
			}
			gen = g.ID
			for _, part := range g.Partitions {
				seen[part] = true
			}
		}
		if len(seen) != parts {
			ok = false
		}
	}
	return ok, strings.Join(status, "; ")
}
