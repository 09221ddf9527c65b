package consume

import "time"

// Clock tells the time and makes one-shot timers. Delayed compares release
// times with Now and sleeps until the earliest one with After, so a fake Clock
// controls release completely in tests. Implementations must be safe for
// concurrent use.
//
// Network timeouts, batch waits and retry backoff are real-time I/O bounds and
// do not go through the Clock.
type Clock interface {
	Now() time.Time
	// After returns a channel that receives once d has elapsed.
	After(d time.Duration) <-chan time.Time
}

// systemClock is the Clock backed by package time.
type systemClock struct{}

func (systemClock) Now() time.Time                         { return time.Now() }
func (systemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
