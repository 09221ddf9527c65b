package main

import (
	"bytes"
	"context"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/worker"
)

// returnsWithin runs realMain with ctx and fails the test if it has not
// returned after 10s.
func returnsWithin(t *testing.T, ctx context.Context, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	done := make(chan int, 1)
	go func() { done <- realMain(ctx, args, &stdout, &stderr) }()
	select {
	case code := <-done:
		return code, stdout.String(), stderr.String()
	case <-time.After(10 * time.Second):
		t.Fatalf("gatekeeper %v: still running after 10s", args)
		return 0, "", ""
	}
}

// TestMainCheckConfigStopsOnSignal checks that check-config and run stop
// when SIGINT or SIGTERM (the context main derives from them) arrives while
// the configuration is being read, however long the read takes.
func TestMainCheckConfigStopsOnSignal(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	loadConfig = func() (*worker.Config, error) {
		<-release // a read that does not end: a hung file system
		return nil, context.Canceled
	}
	t.Cleanup(func() { loadConfig = worker.LoadConfig })

	for _, cmd := range []string{"check-config", "run"} {
		t.Run(cmd, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(50*time.Millisecond, cancel) // the signal
			code, out, errOut := returnsWithin(t, ctx, cmd)
			if want := errInterrupted.Error() + "\n"; code != 1 || out != "" || errOut != want {
				t.Errorf("got %d, stdout %q, stderr %q; want 1, nothing, %q", code, out, errOut, want)
			}
		})
	}
}

// TestMainCheckConfigFIFO checks that check-config refuses a FIFO as
// LIMITS_FILE at once, instead of waiting for a writer.
func TestMainCheckConfigFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "limits.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	setEnv(t, with(minimal(), "LIMITS", "<unset>", "LIMITS_FILE", fifo))
	code, out, errOut := returnsWithin(t, context.Background(), "check-config")
	if want := "GATEKEEPER_LIMITS_FILE: " + fifo + ": a FIFO, not a regular file\n"; code != 1 || out != "" || errOut != want {
		t.Errorf("got %d, stdout %q, stderr %q; want 1, nothing, %q", code, out, errOut, want)
	}
}
