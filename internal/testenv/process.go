package testenv

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is one running gatekeeper process, started as operators start it:
// the built binary, its configuration in the environment, stopped with
// SIGTERM or killed with SIGKILL. Its methods other than those taking a
// testing.TB are safe for concurrent use.
type Process struct {
	Name string
	HTTP string // host:port of its HTTP server

	cmd  *exec.Cmd
	done chan struct{}
	err  error // exit status, once done is closed

	mu  sync.Mutex
	log []string
}

// Spec says what process Start starts.
type Spec struct {
	Name   string            // names the process in messages and log files
	Binary string            // the gatekeeper binary (Binary.Path)
	Env    map[string]string // GATEKEEPER_* variables, added to a clean environment
	Args   []string          // command-line arguments
	// LogDir, when set, receives the process's full log when the test ends,
	// as <test name>-<Name>.log.
	LogDir string
}

// tailOnFailure is how many log lines of each process a failed test shows.
const tailOnFailure = 40

// Start starts the process of s. GATEKEEPER_HTTP_ADDR is a free address
// unless s.Env sets it. The process is killed when the test ends, and the
// end of its log is shown if the test failed.
func Start(t testing.TB, s Spec) *Process {
	t.Helper()
	p := &Process{Name: s.Name, HTTP: s.Env["GATEKEEPER_HTTP_ADDR"], done: make(chan struct{})}
	if p.HTTP == "" {
		p.HTTP = FreeAddr(t)
	}
	p.cmd = exec.Command(s.Binary, s.Args...)
	p.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "GATEKEEPER_HTTP_ADDR=" + p.HTTP}
	for k, v := range s.Env {
		if k != "GATEKEEPER_HTTP_ADDR" {
			p.cmd.Env = append(p.cmd.Env, k+"="+v)
		}
	}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = io.Discard
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", s.Name, err)
	}
	go p.collect(stderr)
	t.Cleanup(func() { p.cleanup(t, s.LogDir) })
	return p
}

// collect keeps the log lines of r until it ends, then waits for the exit.
func (p *Process) collect(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		p.mu.Lock()
		p.log = append(p.log, sc.Text())
		p.mu.Unlock()
	}
	p.err = p.cmd.Wait()
	close(p.done)
}

// cleanup kills the process if it still runs, shows the end of its log if
// the test failed and writes the whole log to logDir when that is set.
func (p *Process) cleanup(t testing.TB, logDir string) {
	if !p.Exited() {
		p.Kill()
	}
	if t.Failed() {
		t.Logf("--- log of %s (last %d lines):\n%s", p.Name, tailOnFailure, p.Tail(tailOnFailure))
	}
	if logDir == "" {
		return
	}
	p.mu.Lock()
	log := strings.Join(p.log, "\n") + "\n"
	p.mu.Unlock()
	file := filepath.Join(logDir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+p.Name+".log")
	if err := os.WriteFile(file, []byte(log), 0o644); err != nil {
		t.Logf("write the log of %s: %v", p.Name, err)
	}
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is the exit status; read it only after Done is closed.
func (p *Process) Err() error { return p.err }

// ExitCode is the exit code (-1 if a signal ended the process); read it
// only after Done is closed.
func (p *Process) ExitCode() int { return p.cmd.ProcessState.ExitCode() }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Tail returns the last n lines of the process's log so far.
func (p *Process) Tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	from := max(0, len(p.log)-n)
	return strings.Join(p.log[from:], "\n")
}

// LogContains reports whether a log line so far contains s.
func (p *Process) LogContains(s string) bool { return p.CountLines(s) > 0 }

// CountLines returns how many log lines so far contain s.
func (p *Process) CountLines(s string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, l := range p.log {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

// Get does a GET on the process's HTTP server with the header pairs (key,
// value, key, value...) and returns the status and body.
func (p *Process) Get(path string, header ...string) (int, string, error) {
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

// Ready reports whether /readyz answers 200 within timeout, and else the
// status and the failed checks.
func (p *Process) Ready(ctx context.Context, timeout time.Duration) (bool, string) {
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

// WaitReady waits until /readyz answers 200 (the groups are joined); it
// fails the test if the process exits first or timeout passes.
func (p *Process) WaitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		if p.Exited() {
			t.Fatalf("%s exited before it was ready: %v\n%s", p.Name, p.err, p.Tail(30))
		}
		var ok bool
		if ok, last = p.Ready(context.Background(), 3*time.Second); ok {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s not ready after %v: %s\n%s", p.Name, timeout, last, p.Tail(30))
}

// Terminate sends SIGTERM and waits up to timeout for the exit; it returns
// the exit code and how long the exit took, or an error if the signal
// could not be sent or the process still runs after timeout.
func (p *Process) Terminate(timeout time.Duration) (int, time.Duration, error) {
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return -1, 0, fmt.Errorf("SIGTERM %s: %w", p.Name, err)
	}
	select {
	case <-p.done:
		return p.ExitCode(), time.Since(start), nil
	case <-time.After(timeout):
		return -1, time.Since(start), fmt.Errorf("%s still running %v after SIGTERM", p.Name, timeout)
	}
}

// Signal sends sig to the process (SIGSTOP and SIGCONT pause and resume
// it, as a long GC pause or a starved CPU would).
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Kill ends the process hard (SIGKILL): no drain, no commit, no leave.
func (p *Process) Kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// Generation is one "consumer group generation started" log line.
type Generation struct {
	ID         int      `json:"generation"`
	Group      string   `json:"group"`
	Member     string   `json:"member"`
	Partitions []string `json:"partitions"`
}

// Generations returns the consumer group generations the process has
// logged for group, oldest first.
func (p *Process) Generations(group string) []Generation {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Generation
	for _, l := range p.log {
		if !strings.Contains(l, "consumer group generation started") {
			continue
		}
		var g Generation
		if json.Unmarshal([]byte(l), &g) == nil && g.Group == group {
			out = append(out, g)
		}
	}
	return out
}

// LastGeneration returns the last generation of group the process logged.
func (p *Process) LastGeneration(group string) (Generation, bool) {
	gens := p.Generations(group)
	if len(gens) == 0 {
		return Generation{}, false
	}
	return gens[len(gens)-1], true
}

// Assigned reports whether procs are the members of one generation of each
// group and together own all its partitions (parts per group), as their
// last logged generations say. owned holds, by group, the partitions of
// each process in the order of procs; status describes every process.
func Assigned(groups map[string]int, procs ...*Process) (ok bool, owned map[string][][]string, status string) {
	var lines []string
	ok = true
	owned = map[string][][]string{}
	for group, parts := range groups {
		seen := map[string]bool{}
		gen := -1
		for _, p := range procs {
			g, found := p.LastGeneration(group)
			lines = append(lines, fmt.Sprintf("%s %s: generation %d %v", p.Name, group, g.ID, g.Partitions))
			if !found || (gen != -1 && g.ID != gen) {
				ok = false
			}
			gen = g.ID
			for _, part := range g.Partitions {
				seen[part] = true
			}
			owned[group] = append(owned[group], g.Partitions)
		}
		if len(seen) != parts {
			ok = false
		}
	}
	return ok, owned, strings.Join(lines, "; ")
}
