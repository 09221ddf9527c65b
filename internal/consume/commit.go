package consume

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// offsetCommit is the commit of one partition: the offset of the next
// message to consume and the metadata that goes with it (see handover.go).
type offsetCommit struct {
	next int64
	meta string
}

// tp names a topic partition.
type tp struct {
	topic     string
	partition int
}

// offsetCommitter commits the offsets of one generation's partitions. A
// caller waits for the request that carries its offset; requests go one at
// a time, and the offsets handed in while one is in flight all go together
// in the next: under load, one OffsetCommit covers many partitions instead
// of one request per partition and batch. Safe for concurrent use.
type offsetCommitter struct {
	// send commits offsets in one request. It returns the request's error,
	// or nil and the partitions' own errors.
	send func(offsets map[tp]offsetCommit) (map[tp]error, error)

	mu      sync.Mutex
	pending map[tp]offsetCommit
	waiters map[tp][]chan<- error
	running bool
}

// newOffsetCommitter commits through client as the member of gen. The
// requests carry gen's generation ID, so the group coordinator fences them:
// a commit of a member whose generation has been replaced is refused (the
// partition may have a new owner), while a commit at the end of a
// generation, during the rebalance and before this member rejoins, is
// accepted. That is how a member hands its partitions over exactly where it
// stopped.
func newOffsetCommitter(client *kafka.Client, gen *kafka.Generation, timeout time.Duration) *offsetCommitter {
	return &offsetCommitter{send: func(offsets map[tp]offsetCommit) (map[tp]error, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		req := &kafka.OffsetCommitRequest{
			Addr:         client.Addr,
			GroupID:      gen.GroupID,
			GenerationID: int(gen.ID),
			MemberID:     gen.MemberID,
			Topics:       map[string][]kafka.OffsetCommit{},
		}
		for k, c := range offsets {
			req.Topics[k.topic] = append(req.Topics[k.topic], kafka.OffsetCommit{Partition: k.partition, Offset: c.next, Metadata: c.meta})
		}
		res, err := client.OffsetCommit(ctx, req)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("%w: %w", errCommitTimeout, err)
			}
			return nil, err
		}
		errs := map[tp]error{}
		for topic, ps := range res.Topics {
			for _, p := range ps {
				if p.Error != nil {
					errs[tp{topic, p.Partition}] = p.Error
				}
			}
		}
		return errs, nil
	}}
}

// errCommitTimeout is returned when a commit outlives Config.Timeout.
var errCommitTimeout = errors.New("commit timed out")

// commit commits c for the partition and returns its error.
func (oc *offsetCommitter) commit(topic string, partition int, c offsetCommit) error {
	done := make(chan error, 1)
	k := tp{topic, partition}
	oc.mu.Lock()
	if oc.pending == nil {
		oc.pending = map[tp]offsetCommit{}
		oc.waiters = map[tp][]chan<- error{}
	}
	// Calls of one partition come one after another and never go back:
	// the later one (the higher offset, or more done beyond it) wins.
	if old, ok := oc.pending[k]; !ok || c.next >= old.next {
		oc.pending[k] = c
	}
	oc.waiters[k] = append(oc.waiters[k], done)
	if !oc.running {
		oc.running = true
		go oc.run()
	}
	oc.mu.Unlock()
	if err := <-done; err != nil {
		return fmt.Errorf("commit offset %d: %w", c.next, err)
	}
	return nil
}

// run sends requests until nothing is pending.
func (oc *offsetCommitter) run() {
	for {
		oc.mu.Lock()
		offsets, waiters := oc.pending, oc.waiters
		oc.pending, oc.waiters = nil, nil
		if len(waiters) == 0 {
			oc.running = false
			oc.mu.Unlock()
			return
		}
		oc.mu.Unlock()
		errs, err := oc.send(offsets)
		for k, ws := range waiters {
			e := err
			if e == nil {
				e = errs[k]
			}
			for _, w := range ws {
				w <- e
			}
		}
	}
}
