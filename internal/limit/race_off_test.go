//go:build !race

package limit

const raceEnabled = false
