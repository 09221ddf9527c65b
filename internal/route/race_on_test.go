//go:build race

package route

// raceEnabled: the race detector makes sync.Pool drop a share of what is put
// back, so allocation counts of pooled work are not held to their bound.
const raceEnabled = true
