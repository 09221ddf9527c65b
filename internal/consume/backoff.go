package consume

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is a capped exponential backoff with jitter, the one backoff of the
// gatekeeper: the consumer's fetch, handle and commit retries and route's
// write and Admit retries all use it. The zero value means
// DefaultBackoffMin doubling up to DefaultBackoffMax. It is a value type, safe
// for concurrent use.
type Backoff struct {
	Min, Max time.Duration
}

// Delay returns the wait before retry number attempt (0-based): Min doubled
// per attempt, capped at Max, with jitter in [d/2, d] so that partitions and
// replicas that failed together do not retry in lockstep.
func (b Backoff) Delay(attempt int) time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = DefaultBackoffMin
	}
	if hi <= 0 {
		hi = DefaultBackoffMax
	}
	d := hi
	if attempt < 32 {
		if v := lo << attempt; v > 0 && v < hi {
			d = v
		}
	}
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// backoff returns the wait before retry number attempt with the bounds of a
// consumer's Config.
func (c *Config) backoff(attempt int) time.Duration {
	return Backoff{Min: c.BackoffMin, Max: c.BackoffMax}.Delay(attempt)
}

// sleep waits for d or until ctx is done; it reports whether the full wait
// elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
