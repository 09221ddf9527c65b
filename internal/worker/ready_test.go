package worker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// countingCheck is a readiness check that counts its runs and, while gate
// is open, blocks each run until gate is closed.
type countingCheck struct {
	runs    atomic.Int32
	started chan struct{} // receives once per run, if there is room
	gate    chan struct{}
}

func newCountingCheck() *countingCheck {
	return &countingCheck{started: make(chan struct{}, 100), gate: make(chan struct{})}
}

func (c *countingCheck) check(ctx context.Context) error {
	c.runs.Add(1)
	select {
	case c.started <- struct{}{}:
	default:
	}
	select {
	case <-c.gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestReadyzOneCheckInFlight sends many /readyz requests at once while the
// check is slow: one run serves them all, and its result is served until it
// is readyMaxAge old.
func TestReadyzOneCheckInFlight(t *testing.T) {
	cc := newCountingCheck()
	clock := testenv.NewClock(time.Unix(1700000000, 0))
	ready := newReadiness([]readyCheck{{Name: "redis", Check: cc.check}}, 5*time.Second, readyMaxAge)
	ready.now = clock.Now
	srv := newTestServer(t, httpConfig{Ready: ready})

	const n = 50
	codes := make(chan int, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			code, _, _ := get(t, srv, "/readyz")
			codes <- code
		})
	}
	<-cc.started
	time.Sleep(50 * time.Millisecond) // let the other requests come in
	close(cc.gate)
	wg.Wait()
	close(codes)
	for code := range codes {
		if code != 200 {
			t.Errorf("got status %d, want 200", code)
		}
	}
	if got := cc.runs.Load(); got != 1 {
		t.Errorf("%d concurrent requests: got %d check runs, want 1", n, got)
	}

	// The result is served until it is readyMaxAge old, then the check runs again.
	for _, tt := range []struct {
		advance  time.Duration
		wantRuns int32
	}{
		{readyMaxAge - time.Millisecond, 1},
		{time.Millisecond, 2},
		{0, 2},
	} {
		clock.Add(tt.advance)
		if code, body, _ := get(t, srv, "/readyz"); code != 200 {
			t.Errorf("got %d %q, want 200", code, body)
		}
		if got := cc.runs.Load(); got != tt.wantRuns {
			t.Errorf("after %v more: got %d check runs, want %d", tt.advance, got, tt.wantRuns)
		}
	}
}

// TestReadyMetricSharesReadyz checks that gatekeeper_ready reads the
// results /readyz reads: scrapes and probes within readyMaxAge cost one run.
func TestReadyMetricSharesReadyz(t *testing.T) {
	cc := newCountingCheck()
	close(cc.gate)
	clock := testenv.NewClock(time.Unix(1700000000, 0))
	ready := newReadiness([]readyCheck{{Name: "redis", Check: cc.check}}, time.Second, readyMaxAge)
	ready.now = clock.Now
	reg := prometheus.NewRegistry()
	reg.MustRegister(newReadyCollector(ready))
	srv := newTestServer(t, httpConfig{Gatherer: reg, Ready: ready})
	for range 3 {
		if _, err := reg.Gather(); err != nil {
			t.Fatal(err)
		}
		if code, body, _ := get(t, srv, "/readyz"); code != 200 {
			t.Errorf("got %d %q, want 200", code, body)
		}
		if code, _, _ := get(t, srv, "/metrics"); code != 200 {
			t.Errorf("/metrics: got %d, want 200", code)
		}
	}
	if got := cc.runs.Load(); got != 1 {
		t.Errorf("3 scrapes and 3 probes: got %d check runs, want 1", got)
	}
}

// TestReadinessWaitBounded checks that a caller does not wait for a check
// that ignores its context longer than the timeout and a second, nor longer
// than its own context.
func TestReadinessWaitBounded(t *testing.T) {
	stuck := make(chan struct{})
	defer close(stuck)
	ignoring := readyCheck{Name: "stuck", Check: func(context.Context) error { <-stuck; return nil }}
	ready := newReadiness([]readyCheck{ignoring}, 10*time.Millisecond, readyMaxAge)

	start := time.Now()
	if _, err := ready.results(context.Background()); err == nil {
		t.Error("got results, want an error: the check never returned")
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("took %v, want about the timeout and a second", took)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := ready.results(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want the caller's context.DeadlineExceeded", err)
	}
}
