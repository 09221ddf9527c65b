package consume

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// errCommitTimeout is returned when a commit outlives Config.Timeout.
var errCommitTimeout = errors.New("commit timed out")

// offsetCommitter commits the offsets of one generation's partitions. A
// caller waits for the request that carries its offset; requests go one at
// a time, and the offsets handed in while one is in flight all go together
// in the next: under load, one OffsetCommit covers many partitions instead
// of one request per partition and batch. Safe for concurrent use.
type offsetCommitter struct {
	// send commits offsets (topic -> partition -> next offset) in one request.
	send func(offsets map[string]map[int]int64) error

	mu      sync.Mutex
	pending map[string]map[int]int64
	waiters []chan<- error
	running bool
}

// newOffsetCommitter commits through gen. gen.CommitOffsets takes no
// context; kafka-go bounds it with a deadline of timeout on the coordinator
// connection, and an extra timer guarantees no caller waits much longer.
func newOffsetCommitter(gen *kafka.Generation, timeout time.Duration) *offsetCommitter {
	return &offsetCommitter{send: func(offsets map[string]map[int]int64) error {
		errc := make(chan error, 1)
		go func() { errc <- gen.CommitOffsets(offsets) }()
		t := time.NewTimer(timeout + time.Second)
		defer t.Stop()
		select {
		case err := <-errc:
			return err
		case <-t.C:
			return errCommitTimeout
		}
	}}
}

// commit commits next for the partition and returns the request's error.
func (c *offsetCommitter) commit(topic string, partition int, next int64) error {
	done := make(chan error, 1)
	c.mu.Lock()
	if c.pending == nil {
		c.pending = map[string]map[int]int64{}
	}
	if c.pending[topic] == nil {
		c.pending[topic] = map[int]int64{}
	}
	c.pending[topic][partition] = max(c.pending[topic][partition], next)
	c.waiters = append(c.waiters, done)
	if !c.running {
		c.running = true
		go c.run()
	}
	c.mu.Unlock()
	if err := <-done; err != nil {
		return fmt.Errorf("commit offset %d: %w", next, err)
	}
	return nil
}

// run sends requests until nothing is pending.
func (c *offsetCommitter) run() {
	for {
		c.mu.Lock()
		offsets, waiters := c.pending, c.waiters
		c.pending, c.waiters = nil, nil
		if len(waiters) == 0 {
			c.running = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		err := c.send(offsets)
		for _, w := range waiters {
			w <- err
		}
	}
}

// committer returns the commit function of one partition in a generation. It
// refuses to commit once the generation has ended (gctx done): the partition
// may already belong to another member.
func committer(c *offsetCommitter, gctx context.Context, topic string, partition int) func(next int64) error {
	return func(next int64) error {
		if gctx.Err() != nil {
			return kafka.ErrGenerationEnded
		}
		return c.commit(topic, partition, next)
	}
}
