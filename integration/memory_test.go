package integration

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// TestMemoryLargeEventsWithinBudget: with 1 MiB events, the binary's memory
// stays within its byte budgets. 200 events of 1,000,000 bytes, 100 on each
// of two source partitions, written before Gatekeeper starts (a backlog),
// half admitted and half deferred (five an hour) to the .1h and .long tiers,
// where they wait. What one process may hold, by the budgets:
//
//   - per source partition: two batches (BATCH_BYTES plus one event each:
//     one being written while the next is decided, DECIDE_AHEAD) and one
//     fetch response (BATCH_BYTES, or one record batch: one event here);
//   - per retry-tier partition holding events: the look-ahead
//     (RETRY_LOOKAHEAD_BYTES plus one event) and one fetch response
//     (RETRY_LOOKAHEAD_BYTES, or one event);
//   - the writer: one produce request per output partition (MAX_MESSAGE_BYTES).
//
// The Go heap may grow to twice what is live before a collection (GOGC=100),
// so the peak RSS may be twice that, plus an allowance of 48 MiB for the
// process itself (about 21 MiB at readiness), the runtime, buffers and
// decoding. kafka-go's reader, used before, queued up to 100 events per
// partition beyond these budgets (about 100 MiB per partition at this size):
// its peak was 193 MiB here (this code: 53 MiB).
func TestMemoryLargeEventsWithinBudget(t *testing.T) {
	t.Parallel()
	const (
		event        = 1_000_000
		perPartition = 100
		batchBytes   = 2 << 20
		lookahead    = 1 << 20
		maxMessage   = 1 << 20
		allowance    = 48 << 20
		mib          = 1 << 20
	)
	f := newFlow(t, 2)
	env := f.env(t, "GATEKEEPER_LIMITS", "a=1000/1m;b=5/1h",
		"GATEKEEPER_BATCH_BYTES", fmt.Sprint(batchBytes), "GATEKEEPER_RETRY_LOOKAHEAD_BYTES", fmt.Sprint(lookahead),
		"GATEKEEPER_MAX_MESSAGE_BYTES", fmt.Sprint(maxMessage))
	for part := range 2 {
		for i := range perPartition {
			key := "a"
			if i%2 == 1 {
				key = "b"
			}
			// One at a time: a produce request of the test's writer takes about one.
			produce(t, f.Source, []kafka.Message{{Partition: part, Key: []byte(key), Value: bytes.Repeat([]byte{byte('0' + i%10)}, event)}})
		}
	}
	p := startGatekeeper(t, "gk", env)
	p.waitReady(90 * time.Second)
	var o outputs
	waitFor(t, 180*time.Second, "admitted events downstream and deferred ones in the retry tiers", func() (bool, string) {
		o = readOutputs(t, f)
		return len(o.down)+len(o.retry)+len(o.dlq) >= 2*perPartition, o.String()
	})
	if len(o.dlq) > 0 {
		t.Errorf("%d dead letters, want none", len(o.dlq))
	}
	time.Sleep(5 * time.Second) // the retry role fills its look-ahead with the deferred events
	_, peak, err := p.RSS()
	if err != nil {
		t.Fatal(err)
	}
	sourceParts, tierParts, outputParts := 2, 6, 3+6 // partitions of .1h and .long holding events; downstream, .1h and .long written
	budget := sourceParts*(2*(batchBytes+event)+max(batchBytes, event)) +
		tierParts*(lookahead+event+max(lookahead, event)) +
		outputParts*maxMessage
	limit := 2*int64(budget) + allowance
	t.Logf("peak RSS %d MiB; budget %d MiB, limit %d MiB (2 x budget + %d MiB)", peak/mib, budget/mib, limit/mib, allowance/mib)
	if peak > limit {
		t.Errorf("peak RSS %d MiB, over %d MiB", peak/mib, limit/mib)
	}
}
