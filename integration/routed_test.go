package integration

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// idOfKind returns the id of an event that a harness wrote as "<kind> <id>
// <tenant>", or -1 for any other value.
func idOfKind(kind string) func(kafka.Message) int {
	return func(m kafka.Message) int {
		fs := strings.Fields(string(m.Value))
		if len(fs) != 3 || fs[0] != kind {
			return -1
		}
		i, _ := strconv.Atoi(fs[1])
		return i
	}
}

// awaitRouted waits until each of the n events (ids 0 to n-1) is
// downstream, in a retry tier or dead-lettered, and returns the outputs.
func awaitRouted(t testing.TB, f flow, n int, idOf func(kafka.Message) int) outputs {
	t.Helper()
	var o outputs
	waitFor(t, 2*time.Minute, "every event routed", func() (bool, string) {
		o = readOutputs(t, f)
		seen := map[int]bool{}
		for _, m := range o.all() {
			seen[idOf(m)] = true
		}
		missing := 0
		for i := 0; i < n; i++ {
			if !seen[i] {
				missing++
			}
		}
		return missing == 0, fmt.Sprintf("%s, %d of %d missing", o, missing, n)
	})
	return o
}

// lostAndCopies adds the dead-lettered events of o to down (copies
// downstream by id) and counts, of the n events, those neither out nor
// waiting in a retry tier (lost) and the copies past the first (copies).
func lostAndCopies(o outputs, down map[int]int, n int, idOf func(kafka.Message) int) (lost, copies int) {
	inRetry := map[int]bool{}
	for _, m := range o.retry {
		inRetry[idOf(m)] = true
	}
	for _, m := range o.dlq {
		down[idOf(m)]++
	}
	for i := 0; i < n; i++ {
		switch {
		case down[i] == 0 && !inRetry[i]:
			lost++
		case down[i] > 1:
			copies += down[i] - 1
		}
	}
	return lost, copies
}

// partitionOf returns the partition of parts that a harness writes
// tenant's events to (FNV-1a of its name).
func partitionOf(tenant string, parts int) int {
	h := fnv.New32a()
	h.Write([]byte(tenant))
	return int(h.Sum32() % uint32(parts))
}
