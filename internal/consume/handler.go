package consume

import (
	"context"

	"github.com/segmentio/kafka-go"
)

// Handler processes one batch of one partition (offsets ascending). It returns
// nil only when every message is durably handled (all writes acknowledged);
// then the consumer may commit up to last offset+1. On error the consumer must
// not commit and must retry the same batch after a backoff (never skip),
// unless ctx is done. Must be safe for concurrent use (partitions run in
// parallel). The msgs slice is reused for the next batch: a Handler must not
// keep it once Handle returns (the messages' Key, Value and Headers it may keep).
//
// The context given to Handle is not cancelled when shutdown begins: the
// in-flight batch may finish its writes. It is cancelled Config.DrainTimeout
// after shutdown or the end of the generation, and a Handler must then return.
type Handler interface {
	Handle(ctx context.Context, msgs []kafka.Message) error
}

// committedKey is the context key of the committed offset of a batch's partition.
type committedKey struct{}

// CommittedOffset returns, from the context a consumer of this package gives
// to Handle, the committed offset of the batch's partition as the consumer
// knew it when it handed the batch over (0 when the group had none yet).
// Every message that this or any later owner of the partition hands over
// again is at or above it: a new owner starts at the last commit, and
// commits never go back. A Handler may forget what it did for earlier
// offsets. ok is false for a context that did not come from a consumer.
func CommittedOffset(ctx context.Context) (offset int64, ok bool) {
	offset, ok = ctx.Value(committedKey{}).(int64)
	return offset, ok
}

// WithCommittedOffset returns ctx carrying offset as CommittedOffset gives
// it: what the consumers of this package do for each Handle call, for
// Handlers called in other ways (tests, tools).
func WithCommittedOffset(ctx context.Context, offset int64) context.Context {
	return context.WithValue(ctx, committedKey{}, max(offset, 0))
}

// HandlerFunc adapts an ordinary function to the Handler interface.
type HandlerFunc func(ctx context.Context, msgs []kafka.Message) error

// Handle calls f(ctx, msgs).
func (f HandlerFunc) Handle(ctx context.Context, msgs []kafka.Message) error {
	return f(ctx, msgs)
}
