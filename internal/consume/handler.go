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

// HandlerFunc adapts an ordinary function to the Handler interface.
type HandlerFunc func(ctx context.Context, msgs []kafka.Message) error

// Handle calls f(ctx, msgs).
func (f HandlerFunc) Handle(ctx context.Context, msgs []kafka.Message) error {
	return f(ctx, msgs)
}
