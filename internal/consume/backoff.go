package consume

import (
	"context"
	"math/rand/v2"
	"time"
)

// backoff returns the wait before retry number attempt (0-based): lo doubled
// per attempt, capped at hi, with jitter in [d/2, d] so that partitions that
// failed together do not retry in lockstep.
func backoff(attempt int, lo, hi time.Duration) time.Duration {
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
