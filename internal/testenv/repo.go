package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// RepoRoot is the nearest directory above the working directory that holds go.mod.
func RepoRoot() (string, error) {
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

// handedOut are the ports FreePorts has returned in this run: a port is
// free again once its probe listener is closed, and the kernel may offer it
// to the next probe, before the process meant to use it has bound it.
var handedOut struct {
	sync.Mutex
	ports map[int]bool
}

// FreePorts returns n loopback ports that were free just now and were never
// returned before in this run. Safe for concurrent use.
func FreePorts(n int) ([]int, error) {
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

// FreeAddr returns a loopback address (host:port) with a port from FreePorts.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ports, err := FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
}

// Binary is the gatekeeper binary of a test run: ./cmd/gatekeeper, built
// once on first use. Declare one per test package; safe for concurrent use.
type Binary struct {
	// Override names an environment variable that, when set, holds the path
	// of a binary built elsewhere (for example from another commit) to use
	// instead of building one. Empty: always build.
	Override string

	once sync.Once
	path string
	dir  string // the build's temporary directory, removed by Remove
	err  error
}

// Path returns the binary's path, building it on the first call; a failed
// build fails the test.
func (b *Binary) Path(t testing.TB) string {
	t.Helper()
	b.once.Do(b.build)
	if b.err != nil {
		t.Fatalf("gatekeeper binary: %v", b.err)
	}
	return b.path
}

func (b *Binary) build() {
	if p := os.Getenv(b.Override); b.Override != "" && p != "" {
		b.path, b.err = filepath.Abs(p)
		return
	}
	root, err := RepoRoot()
	if err != nil {
		b.err = err
		return
	}
	if b.dir, b.err = os.MkdirTemp("", "gatekeeper-bin-"); b.err != nil {
		return
	}
	b.path = filepath.Join(b.dir, "gatekeeper")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", b.path, "./cmd/gatekeeper")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		b.err = fmt.Errorf("go build: %v\n%s", err, out)
	}
}

// Remove deletes the binary when Path built it; TestMain calls it after the run.
func (b *Binary) Remove() {
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}
