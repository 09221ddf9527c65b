package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"
)

// Profiles of the gatekeeper binary under the benchmark (-profile): the
// binary serves Go's profiles on its HTTP port (GATEKEEPER_PPROF); while the
// backlog drains, the driver takes CPU profiles of profileChunk each, one
// after the other, and merges them into <base>.cpu.pprof; after the drain it
// takes the allocations since start (<base>.allocs.pprof) and the heap
// (<base>.heap.pprof). `go tool pprof` reads all three.

// profileChunk is the length of one CPU profile: the drain's last chunk is
// cut short when the process is stopped, so it is short.
const profileChunk = 2 * time.Second

// freeAddr returns a loopback address with a port free right now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// profiler takes the CPU profiles of one process's drain.
type profiler struct {
	base   string // path prefix of the profile files
	addr   string
	done   chan struct{} // closed by stop: no further chunk
	wg     sync.WaitGroup
	chunks []string
}

// startProfiles starts taking CPU profiles of ch when it serves them; the
// returned profiler's stop is a no-op otherwise.
func (d *driver) startProfiles(ctx context.Context, ch *child, nm modeNames) *profiler {
	p := &profiler{base: filepath.Join(d.o.Work, nm.base), addr: ch.pprofAddr, done: make(chan struct{})}
	if p.addr == "" {
		return p
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for i := 0; ; i++ {
			select {
			case <-p.done:
				return
			case <-ctx.Done():
				return
			default:
			}
			path := fmt.Sprintf("%s.cpu.%03d.pprof", p.base, i)
			// Until the HTTP server listens, fetches fail: retry shortly.
			if err := fetchProfile(ctx, p.addr, fmt.Sprintf("profile?seconds=%d", int(profileChunk/time.Second)), path); err != nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			p.chunks = append(p.chunks, path)
		}
	}()
	return p
}

// stop ends the CPU profiles after the chunk under way, merges them, and
// takes the allocation and heap profiles.
func (p *profiler) stop() {
	if p.addr == "" {
		return
	}
	ctx := context.Background()
	close(p.done)
	p.wg.Wait() // the chunk under way covers the drain's end
	for _, name := range []string{"allocs", "heap"} {
		path := p.base + "." + name + ".pprof"
		if err := fetchProfile(ctx, p.addr, name, path); err != nil {
			logf("warning: %s profile: %v", name, err)
		} else {
			logf("profile: %s", path)
		}
	}
	if len(p.chunks) == 0 {
		logf("warning: no CPU profile taken")
		return
	}
	out := p.base + ".cpu.pprof"
	cmd := exec.Command("go", append([]string{"tool", "pprof", "-proto", "-output", out}, p.chunks...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		logf("warning: merge CPU profiles: %v: %s", err, b)
		return
	}
	for _, c := range p.chunks {
		os.Remove(c)
	}
	logf("profile: %s (%d chunks of %v)", out, len(p.chunks), profileChunk)
}

// fetchProfile writes the profile /debug/pprof/<query> of the server at
// addr to path.
func fetchProfile(ctx context.Context, addr, query, path string) error {
	ctx, cancel := context.WithTimeout(ctx, profileChunk+10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/debug/pprof/"+query, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s: %s", query, resp.Status, b)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
