package worker

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// readyMaxAge is how long a readiness result is served before the checks
// run again.
const readyMaxAge = time.Second

// readiness runs the readiness checks for /readyz and the gatekeeper_ready
// metric, so that neither a flood of probes nor of scrapes can multiply the
// dials to Kafka and the PINGs to Redis: at most one run is in flight, each
// check is bounded by a timeout, and a result is served for maxAge after
// its run ended. A caller that comes while a run is in flight waits for its
// result. So a change of state (Redis gone, shutting down) shows within
// maxAge plus the run's time. Safe for concurrent use if the checks are,
// as readyCheck requires.
type readiness struct {
	checks  []readyCheck
	timeout time.Duration
	maxAge  time.Duration
	now     func() time.Time

	mu      sync.Mutex
	errs    []error       // of the last run, in the order of checks
	ended   time.Time     // when the last run ended; zero before the first
	running chan struct{} // closed when the run in flight ends; nil if none
}

// newReadiness returns the readiness of checks; a timeout of zero or less
// means 2s, and a maxAge of zero or less runs the checks for every caller
// that does not find a run in flight.
func newReadiness(checks []readyCheck, timeout, maxAge time.Duration) *readiness {
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	return &readiness{checks: checks, timeout: timeout, maxAge: maxAge, now: time.Now}
}

// results returns the result of each check, in the order of checks: the
// last run's if it ended less than maxAge ago, or else the next run's,
// starting it unless one is in flight. It returns an error, and no results,
// when ctx ends first or the run takes longer than the timeout and a
// second (a check that does not heed its context).
func (r *readiness) results(ctx context.Context) ([]error, error) {
	r.mu.Lock()
	if !r.ended.IsZero() && r.now().Sub(r.ended) < r.maxAge {
		errs := r.errs
		r.mu.Unlock()
		return errs, nil
	}
	done := r.running
	if done == nil {
		done = make(chan struct{})
		r.running = done
		go r.run(done)
	}
	r.mu.Unlock()

	wait := r.timeout + time.Second
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-done:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-timer.C:
		return nil, fmt.Errorf("readiness checks still running after %v", wait)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errs, nil
}

// run runs every check, not bound to any caller's context, keeps the
// result and closes done.
func (r *readiness) run(done chan struct{}) {
	errs := runChecks(context.Background(), r.checks, r.timeout)
	r.mu.Lock()
	r.errs, r.ended, r.running = errs, r.now(), nil
	r.mu.Unlock()
	close(done)
}

// runChecks runs every check at once, each bounded by timeout, and returns
// their results in the order of checks.
func runChecks(ctx context.Context, checks []readyCheck, timeout time.Duration) []error {
	errs := make([]error, len(checks))
	var wg sync.WaitGroup
	for i, ch := range checks {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			errs[i] = ch.Check(ctx)
		})
	}
	wg.Wait()
	return errs
}
