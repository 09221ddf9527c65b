package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
)

// partitionLoop consumes one assigned partition until stop is done. hctx is
// the context for Handle calls: it outlives stop by Config.DrainTimeout.
type partitionLoop func(p *partition, stop, hctx context.Context)

// member is the consumer-group membership shared by Group and Delayed: it
// joins the group, starts a partition loop per assigned partition for each
// generation, and on shutdown drains the partitions, then leaves the group.
// ready and running are safe for concurrent use; the rest is set before Run.
type member struct {
	cfg     Config
	handler Handler
	loop    partitionLoop
	log     *slog.Logger

	ready   atomic.Bool
	running atomic.Bool

	// onGeneration, if set, is called with each new generation (tests).
	onGeneration func(gen *kafka.Generation)
}

func newMember(cfg Config, h Handler, loop partitionLoop) (*member, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if h == nil {
		return nil, errors.New("consume: nil handler")
	}
	cfg = cfg.withDefaults()
	return &member{
		cfg:     cfg,
		handler: h,
		loop:    loop,
		log:     cfg.Logger.With("group", cfg.GroupID),
	}, nil
}

func (m *member) groupConfig() kafka.ConsumerGroupConfig {
	c := m.cfg
	return kafka.ConsumerGroupConfig{
		ID:                    c.GroupID,
		Brokers:               c.Brokers,
		Dialer:                c.Dialer,
		Topics:                c.Topics,
		WatchPartitionChanges: true,
		SessionTimeout:        c.SessionTimeout,
		RebalanceTimeout:      c.RebalanceTimeout,
		HeartbeatInterval:     c.HeartbeatInterval,
		JoinGroupBackoff:      c.JoinGroupBackoff,
		RetentionTime:         c.RetentionTime,
		StartOffset:           kafka.FirstOffset,
		Timeout:               c.Timeout,
		Logger:                kafkaLogger(m.log, slog.LevelDebug),
		// Join failures come back from Next and are logged there.
		ErrorLogger: kafkaLogger(m.log, slog.LevelDebug),
	}
}

// run is Group.Run and Delayed.Run.
func (m *member) run(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return errors.New("consume: Run called more than once")
	}
	cg, err := kafka.NewConsumerGroup(m.groupConfig())
	if err != nil {
		return fmt.Errorf("consumer group: %w", err)
	}
	var current *sync.WaitGroup
	for {
		gen, err := cg.Next(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, kafka.ErrGroupClosed) {
				break
			}
			// A rebalance that interrupts a join is routine (another member
			// joined); anything else means we are not a working member until
			// a join succeeds. kafka-go backs off before the next attempt.
			if errors.Is(err, kafka.RebalanceInProgress) {
				m.log.Info("rebalance in progress; rejoining")
				continue
			}
			m.ready.Store(false)
			m.log.Warn("join consumer group failed; retrying", "err", err)
			continue
		}
		m.ready.Store(true)
		current = m.startGeneration(ctx, gen)
	}
	// Partitions of the last generation stop fetching, finish their
	// in-flight batch and commit; wait for that before ending the generation.
	if current != nil {
		current.Wait()
	}
	m.ready.Store(false)
	m.close(cg)
	return nil
}

// startGeneration starts one partition loop per assignment of gen and
// returns a WaitGroup that is done when every loop has stopped (drained and
// committed, or given up because the generation ended).
func (m *member) startGeneration(ctx context.Context, gen *kafka.Generation) *sync.WaitGroup {
	var wg sync.WaitGroup
	var parts []string
	oc := newOffsetCommitter(gen, m.cfg.Timeout)
	for _, topic := range slices.Sorted(maps.Keys(gen.Assignments)) {
		for _, pa := range gen.Assignments[topic] {
			parts = append(parts, fmt.Sprintf("%s/%d", topic, pa.ID))
			wg.Add(1)
			gen.Start(func(gctx context.Context) {
				m.runPartition(ctx, gctx, gen, topic, pa, committer(oc, gctx, topic, pa.ID))
				wg.Done()
				// kafka-go ends the generation for every partition as soon as
				// one function returns. After a shutdown drain, keep it alive
				// until Run closes the group so the other partitions can
				// still commit their in-flight batch.
				<-gctx.Done()
			})
		}
	}
	m.log.Info("consumer group generation started", "generation", gen.ID, "member", gen.MemberID, "partitions", parts)
	if m.onGeneration != nil {
		m.onGeneration(gen)
	}
	return &wg
}

// runPartition consumes one partition until ctx is cancelled (shutdown) or
// gctx is done (the generation ended).
func (m *member) runPartition(ctx, gctx context.Context, gen *kafka.Generation, topic string, pa kafka.PartitionAssignment, commit func(next int64) error) {
	stop, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(gctx, cancel)()
	hctx, hcancel := drainContext(ctx, stop, m.cfg.DrainTimeout)
	defer hcancel()

	log := m.log.With("topic", topic, "partition", pa.ID)
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:   m.cfg.Brokers,
		Dialer:    m.cfg.Dialer,
		Topic:     topic,
		Partition: pa.ID,
		// MinBytes stays 0 (kafka-go: 1). kafka-go's NewReader validates
		// before applying defaults, so MaxBytes must be set: withDefaults does.
		MaxBytes:        m.cfg.MaxBytes,
		MaxWait:         m.cfg.FetchMaxWait,
		ReadLagInterval: -1, // lag comes from each message's high watermark
		Logger:          kafkaLogger(log, slog.LevelDebug),
		ErrorLogger:     kafkaLogger(log, slog.LevelWarn),
	})
	defer func() {
		if err := r.Close(); err != nil {
			log.Warn("close partition reader", "err", err)
		}
	}()
	// pa.Offset is the committed offset, or kafka.FirstOffset when the group
	// has none for this partition.
	if err := r.SetOffset(pa.Offset); err != nil {
		log.Error("position partition reader", "offset", pa.Offset, "err", err)
		return
	}
	log.Debug("partition assigned", "offset", pa.Offset, "generation", gen.ID)
	p := &partition{
		topic:     topic,
		id:        pa.ID,
		fetcher:   r,
		commit:    commit,
		handler:   m.handler,
		cfg:       &m.cfg,
		log:       log,
		committed: -1,
		hwm:       -1,
	}
	m.loop(p, stop, hctx)
	log.Debug("partition stopped", "generation", gen.ID)
}

// close ends the current generation and leaves the group, waiting at most
// Config.CloseTimeout: kafka-go's Close waits for an in-progress join, which
// can take Timeout+RebalanceTimeout.
func (m *member) close(cg *kafka.ConsumerGroup) {
	done := make(chan struct{})
	go func() {
		_ = cg.Close() // always nil; leave failures are logged by kafka-go
		close(done)
	}()
	t := time.NewTimer(m.cfg.CloseTimeout)
	defer t.Stop()
	select {
	case <-done:
		m.log.Info("left consumer group")
	case <-t.C:
		m.log.Warn("leaving consumer group timed out; the broker will expire the session", "timeout", m.cfg.CloseTimeout)
	}
}

// drainContext returns a context for Handle calls: it carries parent's values
// but is not cancelled with parent or stop; once stop is done it is cancelled
// after grace. The returned function releases its resources.
func drainContext(parent, stop context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(parent))
	unregister := context.AfterFunc(stop, func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel(fmt.Errorf("drain timeout %v exceeded", grace))
		case <-ctx.Done():
		}
	})
	return ctx, func() {
		unregister()
		cancel(context.Canceled)
	}
}

// kafkaLogger adapts l to kafka-go's Logger at level, or returns nil (no
// logging, no formatting cost) when l discards that level.
func kafkaLogger(l *slog.Logger, level slog.Level) kafka.Logger {
	if !l.Enabled(context.Background(), level) {
		return nil
	}
	return kafka.LoggerFunc(func(format string, args ...any) {
		l.Log(context.Background(), level, "kafka-go: "+fmt.Sprintf(format, args...))
	})
}
