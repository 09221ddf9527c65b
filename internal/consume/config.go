package consume

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"
)

// Defaults applied to zero fields of Config and DelayedConfig.
const (
	DefaultBatchSize    = 500
	DefaultBatchWait    = 50 * time.Millisecond
	DefaultDrainTimeout = 10 * time.Second
	DefaultTimeout      = 5 * time.Second
	DefaultCloseTimeout = 10 * time.Second
	DefaultFetchMaxWait = 1500 * time.Millisecond
	DefaultBackoffMin   = 100 * time.Millisecond
	DefaultBackoffMax   = 5 * time.Second
	DefaultLookAhead    = 10000
	DefaultMaxBytes     = 1 << 20

	// kafkaRebalanceTimeout is kafka-go's default RebalanceTimeout, used to
	// check DrainTimeout when Config.RebalanceTimeout is zero.
	kafkaRebalanceTimeout = 30 * time.Second
)

// Config configures a Group; DelayedConfig embeds it. Zero fields take the
// defaults above (or kafka-go's, where stated). A Config is read once by the
// constructor and not kept by reference.
type Config struct {
	// Brokers are the bootstrap brokers (host:port). Required.
	Brokers []string
	// GroupID is the consumer group. Required.
	GroupID string
	// Topics are the topics to consume. Required.
	Topics []string

	// BatchSize is the most messages handed to the Handler at once.
	BatchSize int
	// BatchBytes, if positive, bounds the bytes (keys, values and headers)
	// of a batch Group hands over: a batch ends once it holds this many.
	// A batch holds at least one message, whatever its size.
	BatchBytes int
	// BatchWait is how long Group waits, after the first message of a batch,
	// for more messages to fill it. Delayed does not wait: it hands over
	// whatever is due.
	BatchWait time.Duration
	// DecideAhead lets a partition stage its next batch while the one
	// before it is being written, when the Handler is a Stager (see
	// Stager): one more batch per partition in memory, its limiter call
	// made before the batch before it is acknowledged.
	DecideAhead bool
	// DrainTimeout bounds the in-flight Handle call once shutdown has begun
	// or the generation has ended; it must be below RebalanceTimeout so that a
	// draining member still rejoins in time.
	DrainTimeout time.Duration
	// Timeout bounds every call to the group coordinator (join, sync,
	// heartbeat, offset fetch and commit, leave) and every dial.
	Timeout time.Duration
	// CloseTimeout bounds how long Run waits for kafka-go to end the
	// generation and leave the group at shutdown.
	CloseTimeout time.Duration
	// FetchMaxWait, with Timeout, bounds a fetch on an idle partition. The
	// broker is asked to wait FetchMaxWait minus 1s when it is over 1s (else
	// minus a quarter): the default 1.5s gives a 0.5s broker wait, so a
	// partition's fetches see new records within half a second.
	FetchMaxWait time.Duration
	// MaxBytes caps the bytes of one fetch response per partition. A larger
	// record batch is still fetched, alone. A partition holds at most one
	// response, decoded, beside what it has handed over: there is no other
	// queue (see committedFetcher).
	MaxBytes int
	// BackoffMin and BackoffMax bound the capped exponential backoff between
	// attempts of a failing batch and after fetch errors.
	BackoffMin, BackoffMax time.Duration

	// SessionTimeout, RebalanceTimeout, HeartbeatInterval and
	// JoinGroupBackoff are passed to kafka-go (defaults 30s, 30s, 3s, 5s).
	SessionTimeout    time.Duration
	RebalanceTimeout  time.Duration
	HeartbeatInterval time.Duration
	JoinGroupBackoff  time.Duration
	// CoordinatorJoinBackoff, if set below JoinGroupBackoff, is the wait
	// between join attempts while the coordinator answers that it has not
	// loaded the group yet (after a broker restart); other failed joins are
	// still tried again every JoinGroupBackoff (see joinwait.go).
	CoordinatorJoinBackoff time.Duration
	// RetentionTime is passed to kafka-go's consumer group. The commits
	// themselves go out as OffsetCommit requests of the newest version both
	// sides know, which carry no retention: the broker keeps the offsets for
	// its offsets.retention.minutes.
	RetentionTime time.Duration

	// Leases, if set, makes a crashed member's partitions move within
	// LeaseTTL (default DefaultLeaseTTL) plus a heartbeat rather than a
	// session timeout (see lease.go). OnLeaseEnded, if set, is called each
	// time this member removed a peer whose lease ended; OnLeaseFenced each
	// time it ended a generation of its own because its lease could not be
	// renewed in time (its write fence ended with the lease).
	Leases        Leases
	LeaseTTL      time.Duration
	OnLeaseEnded  func()
	OnLeaseFenced func()

	// Dialer sets TLS, SASL or a client ID (default: kafka-go's dialer with
	// Timeout as its dial timeout).
	Dialer *kafka.Dialer
	// Transport carries the offset commits and offset fetches; it must
	// have the same TLS and SASL settings as Dialer (default: a
	// kafka.Transport built from Dialer).
	Transport kafka.RoundTripper
	// Logger receives the package's logs (default slog.Default()).
	Logger *slog.Logger
	// Clock is the time source for release times (default: package time).
	Clock Clock

	// OnOffsetsLost, if set, is called when a partition's offsets jump over
	// events Kafka deleted before they were consumed (retention), with the
	// number of offsets lost. Called from partition goroutines, concurrently.
	OnOffsetsLost func(topic string, partition int, lost int64)

	// OnLag, if set, is called after each commit with the number of messages
	// of the partition beyond the committed offset, as of the last fetch, and
	// with -1 when the partition stops being consumed here (revoked, or the
	// member stops): its last figure would otherwise stay reported forever.
	// It is called from partition goroutines, concurrently.
	OnLag func(topic string, partition int, lag int64)

	// OnCommitted, if set, is called after each commit the broker accepted,
	// with the offset committed (the next to read). It is called from
	// partition goroutines, concurrently, and holds up the partition's next
	// commit while it runs.
	OnCommitted func(topic string, partition int, next int64)
}

// withDefaults returns a copy of c with every zero field set to its default.
func (c Config) withDefaults() Config {
	setDefault(&c.BatchSize, DefaultBatchSize)
	setDefault(&c.BatchWait, DefaultBatchWait)
	setDefault(&c.DrainTimeout, DefaultDrainTimeout)
	setDefault(&c.Timeout, DefaultTimeout)
	setDefault(&c.CloseTimeout, DefaultCloseTimeout)
	setDefault(&c.FetchMaxWait, DefaultFetchMaxWait)
	setDefault(&c.MaxBytes, DefaultMaxBytes)
	setDefault(&c.BackoffMin, DefaultBackoffMin)
	setDefault(&c.BackoffMax, DefaultBackoffMax)
	setDefault(&c.LeaseTTL, DefaultLeaseTTL)
	if c.Dialer == nil {
		c.Dialer = &kafka.Dialer{Timeout: c.Timeout, DualStack: true}
	}
	if c.Transport == nil {
		c.Transport = &kafka.Transport{
			ClientID:    c.Dialer.ClientID,
			DialTimeout: c.Timeout,
			TLS:         c.Dialer.TLS,
			SASL:        c.Dialer.SASLMechanism,
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	return c
}

func setDefault[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// Validate reports the first problem with c, after defaults are applied.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case len(c.Brokers) == 0:
		return errors.New("consume: no brokers")
	case c.GroupID == "":
		return errors.New("consume: no group ID")
	case len(c.Topics) == 0:
		return errors.New("consume: no topics")
	}
	for _, b := range c.Brokers {
		if b == "" {
			return errors.New("consume: empty broker address")
		}
	}
	for _, t := range c.Topics {
		if t == "" {
			return errors.New("consume: empty topic name")
		}
	}
	if c.BatchSize < 0 {
		return fmt.Errorf("consume: batch size %d is negative", c.BatchSize)
	}
	if c.BatchBytes < 0 {
		return fmt.Errorf("consume: batch bytes %d is negative", c.BatchBytes)
	}
	if c.MaxBytes < 0 {
		return fmt.Errorf("consume: max bytes %d is negative", c.MaxBytes)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"batch wait", c.BatchWait}, {"drain timeout", c.DrainTimeout},
		{"timeout", c.Timeout}, {"close timeout", c.CloseTimeout},
		{"fetch max wait", c.FetchMaxWait}, {"backoff min", c.BackoffMin},
		{"backoff max", c.BackoffMax}, {"session timeout", c.SessionTimeout},
		{"rebalance timeout", c.RebalanceTimeout},
		{"heartbeat interval", c.HeartbeatInterval},
		{"join group backoff", c.JoinGroupBackoff}, {"coordinator join backoff", c.CoordinatorJoinBackoff},
		{"lease ttl", c.LeaseTTL},
		{"retention time", c.RetentionTime},
	} {
		if d.v < 0 {
			return fmt.Errorf("consume: %s %v is negative", d.name, d.v)
		}
	}
	if c.BackoffMin > c.BackoffMax {
		return fmt.Errorf("consume: backoff min %v is above backoff max %v", c.BackoffMin, c.BackoffMax)
	}
	rebalance := c.RebalanceTimeout
	if rebalance == 0 {
		rebalance = kafkaRebalanceTimeout
	}
	if c.DrainTimeout >= rebalance {
		return fmt.Errorf("consume: drain timeout %v must be below the rebalance timeout %v", c.DrainTimeout, rebalance)
	}
	return nil
}

// Release is what a Delayed consumer's release clock (DelayedConfig.ReleaseAt)
// says of a message: when it may be handed over, and a Note of what the clock
// found in its headers on the way (checks, parsed values), handed to the
// Handler with the message (Batch.Notes) so that nothing is read twice.
type Release struct {
	At   time.Time // zero: at once
	Note any       // the release clock's own; nil if it has none
}

// DelayedConfig configures a Delayed consumer: the Config of its group plus
// the release schedule. Zero fields take the defaults.
type DelayedConfig struct {
	Config

	// ReleaseAt gives the time at which a message may be handed to the
	// Handler, and what it learned of the message on the way (see Release).
	// It returns the zero time for a message whose release time cannot be
	// read: such a message is released at once (the Handler dead-letters
	// it). Required; it must be safe for concurrent use.
	ReleaseAt func(kafka.Message) Release
	// LookAhead is the most messages per partition fetched and not yet
	// handed to the Handler; when it is reached, fetching pauses, unless
	// messages not due can be passed over (passover.go).
	LookAhead int
	// LookAheadBytes, if positive, bounds the same messages by their bytes
	// (keys, values and headers), with the offsets of passed-over messages
	// (16 bytes each): fetching pauses once they hold this many, so a
	// partition holds at most this plus one message.
	LookAheadBytes int
	// MetadataMax bounds the offset metadata of a commit, which carries
	// the offsets done beyond the committed one to the partition's next
	// owner (default DefaultMetadataMax, Kafka's default
	// offset.metadata.max.bytes; never set it above the brokers' value).
	MetadataMax int

	// OnSkipped, if set, is called with the number of messages skipped
	// because the partition's previous owner had handled them (duplicates
	// avoided at a handover). OnTruncated, if set, is called for each commit
	// whose done set did not fit in MetadataMax, with the number of done
	// offsets left out: the next owner would hand those again. Both are
	// called from partition goroutines, concurrently.
	OnSkipped   func(topic string, n int)
	OnTruncated func(topic string, left int64)
	// MetadataKeys, if set, sign the done sets in the offset metadata
	// (with the first) and verify them (with any): a new owner handles
	// again the messages of a done set that is unsigned or whose signature
	// does not match (see trust.go). OnDistrusted, if set, is called with
	// the reason each time a new owner did not take a done set.
	MetadataKeys [][]byte
	OnDistrusted func(topic, reason string)
	metaKeys     [][]byte // derived from MetadataKeys (metaKey)

	// OnWaiting, if set, is called with the change in the number of messages
	// waiting for their release time in a topic (summed over partitions it is
	// a gauge). OnLateness, if set, is called for each released message with
	// the time from its release time to the return of the Handler call that
	// succeeded with it (its writes acknowledged): the delay a reader of the
	// Handler's output sees, failed attempts included. Messages released at
	// once (zero release time) are not reported. Both are called from
	// partition goroutines, concurrently.
	OnWaiting  func(topic string, delta int)
	OnLateness func(topic string, late time.Duration)
	// OnWaitingMessage, if set, is called as OnWaiting is, once per
	// message, with the message (+1 when it starts waiting, -1 when it is
	// released or its partition is given up). Called concurrently.
	OnWaitingMessage func(m kafka.Message, delta int)
	// OnPassedOver, if set, is called with the number of waiting messages
	// a partition passed over because its look-ahead was full of messages
	// not due (passover.go): dropped from memory, to be fetched again
	// before they are due. Called concurrently.
	OnPassedOver func(topic string, n int)

	// Expedite, if set, may let waiting messages go before their release
	// time (see Expediter).
	Expedite Expediter
	// Advance, if set, is offered each partition's earliest waiting
	// messages at most once per AdvanceEvery (default
	// DefaultAdvanceEvery) while messages wait, and lets go before their
	// release time those it says may go (see Advancer). OnAdvanced, if
	// set, is called with the number it let go. Called concurrently.
	Advance      Advancer
	AdvanceEvery time.Duration
	OnAdvanced   func(topic string, n int)
}

func (c DelayedConfig) withDefaults() DelayedConfig {
	c.Config = c.Config.withDefaults()
	setDefault(&c.LookAhead, DefaultLookAhead)
	setDefault(&c.MetadataMax, DefaultMetadataMax)
	if c.AdvanceEvery <= 0 {
		c.AdvanceEvery = DefaultAdvanceEvery
	}
	return c
}

// Validate reports the first problem with c, after defaults are applied.
func (c DelayedConfig) Validate() error {
	if err := c.Config.Validate(); err != nil {
		return err
	}
	if c.ReleaseAt == nil {
		return errors.New("consume: no ReleaseAt function")
	}
	if c.LookAhead < 0 {
		return fmt.Errorf("consume: look-ahead %d is negative", c.LookAhead)
	}
	if c.LookAheadBytes < 0 {
		return fmt.Errorf("consume: look-ahead bytes %d is negative", c.LookAheadBytes)
	}
	if c.MetadataMax < 0 {
		return fmt.Errorf("consume: metadata max %d is negative", c.MetadataMax)
	}
	if len(c.MetadataKeys) > 0 && c.MetadataMax > 0 && c.MetadataMax <= sigLen {
		return fmt.Errorf("consume: metadata max %d leaves no room beside the signature", c.MetadataMax)
	}
	return nil
}
