package consume

import (
	"context"

	"github.com/segmentio/kafka-go"
)

// Batch is what a consumer of this package hands to a Handler: messages of
// one partition, offsets ascending, with where they come from and the
// partition's committed offset. A Batch is a value; its Messages slice is
// the consumer's and is reused for the next batch (see Handler).
type Batch struct {
	// Topic and Partition name the partition the messages were read from.
	// An empty Topic means a batch that no consumer handed over (a test, a
	// tool): it names no source and no committed offset.
	Topic     string
	Partition int
	// TopicID is Kafka's ID of the topic (unpadded base64url, as
	// kafka-topics prints it): a topic deleted and created again under the
	// same name has a new one, and its offsets start again (see
	// topicid.go). Empty without a consumer, or from a cluster without
	// topic IDs.
	TopicID string
	// Committed is the committed offset of the partition as the consumer
	// knew it when it handed the batch over (0 when the group had none
	// yet). Every message that this or any later owner of the partition
	// hands over again is at or above it: a new owner starts at the last
	// commit, and commits never go back. A Handler may forget what it did
	// for earlier offsets.
	Committed int64
	// Assignment names this process's ownership of the partition: a number
	// that changes each time the partition starts being consumed here (0
	// without a consumer). Under a new one, another owner may have handled
	// any offset at or above Committed since this process last saw the
	// partition: a Handler that remembers what it did per partition (the
	// limiter, see limit.Source.Assignment) must not trust it across
	// assignments.
	Assignment uint64
	// Messages holds the batch's messages, offsets ascending.
	Messages []kafka.Message
	// Notes, from a Delayed consumer, holds its release clock's Note of
	// each message (Release.Note), index-aligned with Messages; nil from a
	// source consumer and from callers that have none.
	Notes []any
}

// Handler processes one batch of one partition (offsets ascending). It returns
// nil only when every message is durably handled (all writes acknowledged);
// then the consumer may commit up to last offset+1. On error the consumer must
// not commit and must retry the same batch after a backoff (never skip),
// unless ctx is done. Must be safe for concurrent use (partitions run in
// parallel). The b.Messages slice is reused for the next batch: a Handler must
// not keep it once Handle returns (the messages' Key, Value and Headers it may
// keep).
//
// The context given to Handle is not cancelled when shutdown begins: the
// in-flight batch may finish its writes. It is cancelled Config.DrainTimeout
// after shutdown or the end of the generation, and a Handler must then return.
// It carries the generation's WriteFence (FenceOf): a Handler writes through a
// writer that honours it (route.FencedWriter), so that nothing it writes lands
// after the partition may have a new owner.
type Handler interface {
	Handle(ctx context.Context, b Batch) error
}

// HandlerFunc adapts an ordinary function to the Handler interface.
type HandlerFunc func(ctx context.Context, b Batch) error

// Handle calls f(ctx, b).
func (f HandlerFunc) Handle(ctx context.Context, b Batch) error {
	return f(ctx, b)
}

// A Stager is a Handler that can handle a batch in two parts: Stage does
// what must come before the batch's writes (a Gate's decisions) and the
// Staged it returns does the rest. Group then stages a partition's next
// batch while the batch before it is being written (Config.DecideAhead),
// so that the limiter's round trip and the writes' acknowledgements of
// one partition overlap instead of adding up.
//
// Handle(ctx, b) must do what Stage(ctx, b) followed by Finish does. A
// batch staged and then dropped is handed over again later (to Handle or
// Stage), by this member or the partition's next owner: whatever Stage
// recorded must then be found again (a limiter's replay record), never
// done twice. Stage should try once and fail fast (Group then handles the
// batch with Handle, once the batch before it is done): it must not wait
// out an outage while the batch before it waits for its commit.
type Stager interface {
	Handler
	Stage(ctx context.Context, b Batch) (Staged, error)
}

// Staged is a batch that a Stager has staged. Exactly one of Finish and
// Drop is called, once.
type Staged interface {
	// Finish does the rest of the batch's handling, as Handle would: it
	// returns nil only when every message is durably handled. On error
	// the batch is handed over again with Handle.
	Finish(ctx context.Context) error
	// Drop releases the batch unfinished: nothing of it may be taken as
	// done.
	Drop()
}
