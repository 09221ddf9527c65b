//go:build fault

package fault

import (
	"context"
	"fmt"
	"maps"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// The gatekeepers run as operators run them (testenv.Process): the binary
// built once, started as separate processes, stopped with SIGTERM or killed
// with SIGKILL.

// binary is GATEKEEPER_FAULT_BINARY when set, else ./cmd/gatekeeper built
// once per run; TestMain removes the build.
var binary = testenv.Binary{Override: "GATEKEEPER_FAULT_BINARY"}

// fleet is the set of gatekeeper processes of one scenario. live holds those
// that should be serving: started and not yet signalled. Safe for concurrent
// use, except the methods that take the test (from the test goroutine only).
type fleet struct {
	env map[string]string

	mu   sync.Mutex
	live []*testenv.Process
	n    int // processes started so far, for names
}

// start starts one more process, gk<n>.
func (f *fleet) start(t testing.TB) *testenv.Process {
	t.Helper()
	return f.startWith(t, nil)
}

// startWith starts one more process with extra settings over the fleet's.
func (f *fleet) startWith(t testing.TB, extra map[string]string) *testenv.Process {
	t.Helper()
	env := maps.Clone(f.env)
	maps.Copy(env, extra)
	f.mu.Lock()
	f.n++
	name := fmt.Sprintf("gk%d", f.n)
	f.mu.Unlock()
	p := testenv.Start(t, testenv.Spec{Name: name, Binary: binary.Path(t), Env: env,
		LogDir: os.Getenv("GATEKEEPER_FAULT_LOG_DIR")})
	f.mu.Lock()
	f.live = append(f.live, p)
	f.mu.Unlock()
	return p
}

// startReady starts n processes and waits until each is ready.
func (f *fleet) startReady(t testing.TB, n int) []*testenv.Process {
	t.Helper()
	var ps []*testenv.Process
	for range n {
		ps = append(ps, f.start(t))
	}
	for _, p := range ps {
		p.WaitReady(t, 90*time.Second)
	}
	return ps
}

// procs returns the live processes.
func (f *fleet) procs() []*testenv.Process {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*testenv.Process(nil), f.live...)
}

// drop removes p from the live processes.
func (f *fleet) drop(p *testenv.Process) {
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
func (f *fleet) terminate(t testing.TB, grace time.Duration, ps ...*testenv.Process) {
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
			code, took, _ := p.Terminate(grace + 10*time.Second) // -1 if it did not exit
			exits[i] = exit{code, took}
		})
	}
	wg.Wait()
	for i, p := range ps {
		e := exits[i]
		t.Logf("%s: SIGTERM -> exit %d after %v", p.Name, e.code, e.took.Round(time.Millisecond))
		if e.code != 0 || e.took > grace+2*time.Second {
			t.Errorf("%s after SIGTERM: exit %d after %v, want exit 0 within the grace period %v (G7)\n%s",
				p.Name, e.code, e.took.Round(time.Millisecond), grace, p.Tail(20))
		}
	}
}

// kill sends SIGKILL to p and waits until it is gone.
func (f *fleet) kill(p *testenv.Process) {
	f.drop(p)
	p.Kill()
}

// allReady polls /readyz of every live process at once; ok when all answer
// 200 (and at least one is live).
func (f *fleet) allReady(ctx context.Context) (bool, string) {
	ps := f.procs()
	oks := make([]bool, len(ps))
	why := make([]string, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() { oks[i], why[i] = p.Ready(ctx, 3*time.Second) })
	}
	wg.Wait()
	all := len(ps) > 0
	var bad []string
	for i, ok := range oks {
		if !ok {
			all = false
			bad = append(bad, ps[i].Name+": "+why[i])
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

// assigned is testenv.Assigned of the live processes.
func (f *fleet) assigned(groups map[string]int) (bool, string) {
	ok, _, status := testenv.Assigned(groups, f.procs()...)
	return ok, status
}
