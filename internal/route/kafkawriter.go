package route

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"
)

// Writer writes messages to Kafka; *kafka.Writer implements it. WriteMessages
// returns nil only when every message is acknowledged. It may return
// kafka.WriteErrors, index-aligned with msgs, to say which ones failed.
// Once it has returned nil it holds no reference to msgs, their headers or
// the headers' values: the Gate reuses their memory for its next batch.
// Implementations must be safe for concurrent use.
type Writer interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// WriterOptions tune NewKafkaWriter. The zero value is usable. It is a plain
// value, read once by NewKafkaWriter.
type WriterOptions struct {
	// Transport carries the dial, TLS and SASL settings; nil means kafka.DefaultTransport.
	Transport kafka.RoundTripper
	// BatchBytes caps one produce request per partition; it should not exceed
	// the brokers' message.max.bytes. Zero means 1 MiB.
	BatchBytes int64
	// WriteTimeout and ReadTimeout bound each produce and metadata request.
	// Zero means 10s.
	WriteTimeout, ReadTimeout time.Duration
	// Logger, if set, receives kafka-go's error logs.
	Logger *slog.Logger
}

// writerBatchSize is the most messages kafka-go sends in one produce request
// per partition. kafka-go allocates that many messages (~150 bytes each) for
// every new batch, so it costs memory and GC per request whether used or not:
// 10000 made allocation a fifth of the gating path's CPU, 1000 still a third
// of all bytes allocated (make bench, issue 6). At 250, a 500-event consumer
// batch spread over the output partitions still goes out in about one request
// per partition; passthrough in make bench drained 1.4x faster than at 1000
// and Gatekeeper was unchanged.
const writerBatchSize = 250

// NewKafkaWriter returns a synchronous writer with the settings the gating
// path relies on: acks from all in-sync replicas, a 2ms batch timeout, the
// Murmur2 balancer on the key (the partitioning Java clients use), bounded
// timeouts, no automatic topic creation, and the topics' partition counts
// cached for a second (metadataCache). Messages must name their topic.
// Close it when done.
func NewKafkaWriter(brokers []string, opts WriterOptions) *kafka.Writer {
	if opts.BatchBytes <= 0 {
		opts.BatchBytes = 1 << 20
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = 10 * time.Second
	}
	if opts.ReadTimeout <= 0 {
		opts.ReadTimeout = 10 * time.Second
	}
	w := &kafka.Writer{
		Addr:                   kafka.TCP(brokers...),
		Balancer:               &kafka.Murmur2Balancer{},
		RequiredAcks:           kafka.RequireAll,
		Async:                  false,
		BatchTimeout:           2 * time.Millisecond,
		BatchSize:              writerBatchSize,
		BatchBytes:             opts.BatchBytes,
		WriteTimeout:           opts.WriteTimeout,
		ReadTimeout:            opts.ReadTimeout,
		Transport:              newMetadataCache(opts.Transport),
		AllowAutoTopicCreation: false,
	}
	if l := opts.Logger; l != nil {
		w.ErrorLogger = kafka.LoggerFunc(func(msg string, args ...any) {
			l.Error(fmt.Sprintf(msg, args...), "component", "kafka-writer")
		})
	}
	return w
}
