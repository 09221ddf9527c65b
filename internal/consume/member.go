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

// nextAssignment numbers the partitions' assignments in this process
// (Batch.Assignment), from 1.
var nextAssignment atomic.Uint64

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

	// client sends the offset commits and, when handover is set, the
	// offset fetches that read the metadata of the last commits.
	client *kafka.Client
	// handover: read the done sets the previous owners left in the offset
	// metadata and skip those offsets (Delayed).
	handover bool
	// metaKeys sign and verify the done sets (see trust.go); onDistrusted
	// is DelayedConfig.OnDistrusted.
	metaKeys     [][]byte
	onDistrusted func(topic, reason string)

	ready   atomic.Bool
	running atomic.Bool
	// lastGenStart is when the last generation started (unix ns; 0: none yet).
	lastGenStart atomic.Int64
	// routesRefreshed is when refreshRoutes last dropped the transport's
	// metadata (unix ns).
	routesRefreshed atomic.Int64

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
		client:  &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Timeout: cfg.Timeout, Transport: cfg.Transport},
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
		JoinGroupBackoff:      c.kafkaJoinBackoff(),
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
	for {
		cg, err := kafka.NewConsumerGroup(m.groupConfig())
		if err != nil {
			return fmt.Errorf("consumer group: %w", err)
		}
		missing := m.consume(ctx, cg)
		if ctx.Err() != nil || !m.awaitTopics(ctx, missing) {
			return nil
		}
	}
}

// consume takes part in the generations of cg until ctx is cancelled or a
// subscribed topic is missing, then drains the partitions, leaves the group
// and returns the missing topics (nil when ctx was cancelled).
//
// A topic deleted under a running group would otherwise make it rejoin in a
// tight loop: kafka-go's partition watcher ends every generation at once when
// it cannot read a topic's partitions (hundreds of generations a second).
func (m *member) consume(ctx context.Context, cg *kafka.ConsumerGroup) (missing []string) {
	var current *sync.WaitGroup
	var lastGen time.Time // when the last generation started
	short := 0            // generations in a row that lasted under minGeneration
	lastMember := ""      // this member's ID in the last generation, until kafka-go drops it
	var joinLog joinFailures
	for {
		// A guard against any other cause of a rejoin loop: after a
		// generation that lasted under minGeneration, the next one is taken
		// after a growing backoff (kafka-go joins again only once Next takes
		// the generation it has).
		if short > 0 && !sleep(ctx, m.cfg.backoff(short-1)) {
			break
		}
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
			joinLog.failed(m.log, err)
			if lastMember != "" {
				// kafka-go rejoins under a new member ID after a failed
				// join (it tried to leave under the old one, which fails
				// while the broker is away): see leaveStale.
				go func(id string, gone func() bool) {
					l := m.newStaleLeaver()
					defer l.close()
					m.leaveStale(ctx, l, id, gone)
				}(lastMember, m.staleGone(time.Now()))
				lastMember = ""
			}
			if !sleep(ctx, m.cfg.joinRetryWait(err)) {
				break
			}
			continue
		}
		joinLog = joinFailures{}
		lastMember = gen.MemberID
		m.lastGenStart.Store(time.Now().UnixNano())
		if !lastGen.IsZero() && time.Since(lastGen) < minGeneration {
			short++
		} else {
			short = 0
		}
		lastGen = time.Now()
		if missing = m.missingTopics(ctx); len(missing) > 0 {
			break
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
	return missing
}

// minGeneration is the shortest generation that does not count towards the
// rejoin backoff of consume.
const minGeneration = time.Second

// missingTopics returns the subscribed topics that the brokers say do not
// exist. When the brokers cannot be asked it returns nil: the group goes on.
func (m *member) missingTopics(ctx context.Context) []string {
	mctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	res, err := m.client.Metadata(mctx, &kafka.MetadataRequest{Topics: m.cfg.Topics})
	if err != nil {
		m.log.Debug("checking the subscribed topics failed", "err", err)
		return nil
	}
	var missing []string
	for _, t := range res.Topics {
		if errors.Is(t.Error, kafka.UnknownTopicOrPartition) {
			missing = append(missing, t.Name)
		}
	}
	return missing
}

// topicsLogEvery is how often awaitTopics repeats its error while it waits.
const topicsLogEvery = time.Minute

// awaitTopics waits, out of the group and not ready, until the missing
// topics exist again, checking with backoff. It returns false when ctx is
// cancelled first.
func (m *member) awaitTopics(ctx context.Context, missing []string) bool {
	var logged time.Time
	for attempt := 0; len(missing) > 0; attempt++ {
		if time.Since(logged) >= topicsLogEvery {
			m.log.Error("subscribed topics do not exist (deleted?): left the consumer group; rejoining once they exist",
				"topics", missing)
			logged = time.Now()
		}
		if !sleep(ctx, m.cfg.backoff(attempt)) {
			return false
		}
		missing = m.missingTopics(ctx)
	}
	m.log.Info("subscribed topics exist again; rejoining the consumer group")
	return true
}

// startGeneration starts one partition loop per assignment of gen and
// returns a WaitGroup that is done when every loop has stopped (drained and
// committed, or given up because the generation ended).
func (m *member) startGeneration(ctx context.Context, gen *kafka.Generation) *sync.WaitGroup {
	var wg sync.WaitGroup
	var parts []string
	oc := newOffsetCommitter(m.client, gen, m.cfg.Timeout)
	// The partitions' topic IDs are read, the fence of the generation's
	// writes (fence.go) set up with its first heartbeat, and the metadata of
	// the last commits read, all at once; a partition starts fetching as
	// soon as it has its topic ID, and handles nothing before it has the
	// fence and the metadata (start). After a broker restart each read took
	// 0.1 to 0.7 s, the first fetch 0.1 to 0.4 s (TestBrokerRestart,
	// 2026-12-04).
	ids := m.readTopicIDs(ctx, gen)
	start := &generationStart{ready: make(chan struct{})}
	drained := make(chan struct{})
	gen.Start(func(gctx context.Context) { m.setUpGeneration(gctx, gen, start, drained) })
	for _, topic := range slices.Sorted(maps.Keys(gen.Assignments)) {
		for _, pa := range gen.Assignments[topic] {
			parts = append(parts, fmt.Sprintf("%s/%d", topic, pa.ID))
			wg.Add(1)
			commit := func(c offsetCommit) error { return oc.commit(topic, pa.ID, c) }
			id := ids[tp{topic, pa.ID}]
			gen.Start(func(gctx context.Context) {
				replaced := m.runPartition(ctx, gctx, gen, topic, pa, id, start, commit)
				wg.Done()
				if replaced {
					return // end the generation: the member rejoins with the new topic
				}
				// kafka-go ends the generation for every partition as soon as
				// one function returns. After a shutdown drain, keep it alive
				// until Run closes the group so the other partitions can
				// still commit their in-flight batch.
				<-gctx.Done()
			})
		}
	}
	go func() {
		wg.Wait()
		close(drained)
	}()
	m.log.Info("consumer group generation started", "generation", gen.ID, "member", gen.MemberID, "partitions", parts)
	if m.onGeneration != nil {
		m.onGeneration(gen)
	}
	return &wg
}

// setUpGeneration reads the metadata of the last commits while it sets up
// the generation's fence (fence.go) with its first heartbeat, and closes
// start.ready once both are in. The fence is kept (fenceKeeper.run) from
// the moment it exists, and the lease watched: a read of the metadata that
// outlasts the fence's first end (a coordinator still loading its groups)
// leaves the fence open. Everything it starts ends with the generation
// (gctx), which its return ends; it returns once the generation has ended
// and its partitions drained (drained), or the fence has ended.
func (m *member) setUpGeneration(gctx context.Context, gen *kafka.Generation, start *generationStart, drained <-chan struct{}) {
	began := time.Now()
	var metas map[tp]string
	read := make(chan struct{})
	go func() {
		defer close(read)
		if m.handover {
			metas = m.fetchMetadata(gctx, gen)
		}
	}()
	keeper := m.newFenceKeeper(gctx, gen)
	if m.cfg.Leases != nil {
		gen.Start(func(gctx context.Context) { m.watchLeases(gctx, gen, keeper.fence) })
	}
	go func() {
		select {
		case <-read:
		case <-gctx.Done():
		}
		if gctx.Err() != nil {
			return // the partitions stop unstarted
		}
		start.fence, start.metas = keeper.fence, metas
		close(start.ready)
		m.log.Debug("consumer group generation ready", "generation", gen.ID, "after", time.Since(began).Round(time.Millisecond))
	}()
	keeper.run(gctx, drained, m.log, m.cfg.OnLeaseFenced)
}

// generationStart is what a generation's partitions wait for before they
// handle their first batch, set up while they start fetching.
type generationStart struct {
	ready chan struct{} // closed once fence and metas are set
	// fence is the generation's WriteFence, carried by every Handle call's
	// context; metas holds the metadata of each partition's last commit
	// (none when the member reads no handover).
	fence *WriteFence
	metas map[tp]string
}

// wait returns once start is ready (true) or stop is done (false): false
// when both are.
func (start *generationStart) wait(stop context.Context) bool {
	select {
	case <-start.ready:
		return stop.Err() == nil
	case <-stop.Done():
		return false
	}
}

// runPartition consumes one partition until ctx is cancelled (shutdown) or
// gctx is done (the generation ended).
//
// read delivers the partition's topic ID as read when the generation started
// ("" if that failed: it is read again). Its first fetch goes out before
// start is ready; nothing is handled before. Commits made after
// gctx is done still go out: the coordinator refuses them if the group has
// moved on without this member, and accepts them otherwise (see
// newOffsetCommitter).
//
// It reports whether it stopped because the topic was deleted and created
// again under it (topicid.go): the partition then commits nothing more,
// and the caller ends the generation.
func (m *member) runPartition(ctx, gctx context.Context, gen *kafka.Generation, topic string, pa kafka.PartitionAssignment, read <-chan string, start *generationStart, commit func(c offsetCommit) error) (replaced bool) {
	stop, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(gctx, cancel)()
	hctx, hcancel := drainContext(ctx, stop, m.cfg.DrainTimeout)
	defer hcancel()

	log := m.log.With("topic", topic, "partition", pa.ID)
	id, ok := m.assignedTopicID(stop, topic, pa.ID, read, log)
	if !ok {
		return false
	}
	// pa.Offset is the committed offset, or kafka.FirstOffset when the group
	// has none for this partition. The fetcher reads committed records only
	// (read_committed): see committedFetcher.
	r := newCommittedFetcher(&m.cfg, m.client, topic, pa.ID, pa.Offset)
	defer r.Close()
	var gone atomic.Bool
	r.verified = time.Now() // id was just read
	r.verify = func(ctx context.Context) error {
		now, err := topicID(ctx, m.cfg.Transport, m.client.Addr, m.cfg.Timeout, topic, pa.ID)
		if err != nil {
			return err
		}
		if now != id {
			if !gone.Swap(true) {
				log.Error("topic deleted and created again under the consumer: partition stopped without committing; rejoining the group",
					"topic_id", id, "new_topic_id", now)
				cancel()
			}
			return errTopicReplaced
		}
		return nil
	}
	owned := commit
	commit = func(c offsetCommit) error {
		if gone.Load() {
			return errTopicReplaced // an offset of the old topic would land on the new one
		}
		return owned(c)
	}
	r.prefetch()
	if !start.wait(stop) {
		return gone.Load() // the prefetch's verify may have found the topic replaced
	}
	hctx = WithFence(hctx, start.fence)
	meta := start.metas[tp{topic, pa.ID}]
	log.Debug("partition assigned", "offset", pa.Offset, "generation", gen.ID, "topic_id", id)
	p := &partition{
		topic:         topic,
		topicID:       id,
		id:            pa.ID,
		fetcher:       r,
		commit:        commit,
		handler:       m.handler,
		cfg:           &m.cfg,
		log:           log,
		assignment:    nextAssignment.Add(1),
		committed:     pa.Offset,
		committedMeta: meta,
		hwm:           -1,
		staleRoutes:   m.refreshRoutes,
	}
	p.gaps = newGapCheck(p, pa.Offset, m.client)
	if meta != "" {
		p.inherited = m.inheritDone(hctx, gen.GroupID, topic, pa.ID, pa.Offset, meta)
	}
	m.loop(p, stop, hctx)
	if m.cfg.OnLag != nil {
		m.cfg.OnLag(topic, pa.ID, -1) // no longer this member's to report
	}
	log.Debug("partition stopped", "generation", gen.ID)
	return gone.Load()
}

// assignedTopicID returns the ID of an assigned partition's topic: the one
// read delivers, else read again with backoff until it has it or stop is
// done (false); read may be nil. A partition
// is never consumed without it, since what a Handler remembers of its
// offsets is known by it (topicid.go).
func (m *member) assignedTopicID(stop context.Context, topic string, partition int, read <-chan string, log *slog.Logger) (string, bool) {
	if read != nil {
		select {
		case id := <-read:
			if id != "" {
				return id, true
			}
		case <-stop.Done():
			return "", false
		}
	}
	for attempt := 0; ; attempt++ {
		id, err := topicID(stop, m.cfg.Transport, m.client.Addr, m.cfg.Timeout, topic, partition)
		if err == nil {
			return id, true
		}
		if stop.Err() != nil {
			return "", false
		}
		d := m.cfg.backoff(attempt)
		log.Warn("reading the topic ID failed; retrying", "attempt", attempt+1, "retry_in", d, "err", err)
		if !sleep(stop, d) {
			return "", false
		}
	}
}

// fetchMetadata reads the metadata of the last commit of every partition gen
// assigns (one OffsetFetch), trying again with backoff for up to a session
// timeout: right after a network cut heals, the first requests fail on the
// connections that lived through it, and a partition consumed without its
// done set hands its previous owner's finished messages over again (in-slot
// retry events then go downstream twice, over the window's limit). After
// that it logs and returns what it has: a partition without metadata is
// consumed from its committed offset, and messages its previous owner
// finished beyond that offset are handled again (at least once).
func (m *member) fetchMetadata(ctx context.Context, gen *kafka.Generation) map[tp]string {
	req := &kafka.OffsetFetchRequest{Addr: m.client.Addr, GroupID: gen.GroupID, Topics: map[string][]int{}}
	for topic, pas := range gen.Assignments {
		for _, pa := range pas {
			req.Topics[topic] = append(req.Topics[topic], pa.ID)
		}
	}
	if len(req.Topics) == 0 {
		return nil
	}
	metas := map[tp]string{}
	var err error
	until := time.Now().Add(m.cfg.sessionOrDefault())
	for attempt := 0; ; attempt++ {
		fctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
		var res *kafka.OffsetFetchResponse
		res, err = m.client.OffsetFetch(fctx, req)
		cancel()
		if err == nil && res.Error != nil {
			err = res.Error
		}
		if err == nil {
			for topic, ps := range res.Topics {
				for _, p := range ps {
					if p.Error == nil && p.Metadata != "" && p.CommittedOffset == assigned(gen, topic, p.Partition) {
						metas[tp{topic, p.Partition}] = p.Metadata
					}
				}
			}
			return metas
		}
		if staleRoute(err) {
			m.refreshRoutes()
		}
		d := m.cfg.retryWait(attempt, err)
		if ctx.Err() != nil || time.Now().Add(d).After(until) || !sleep(ctx, d) {
			break
		}
	}
	if ctx.Err() != nil {
		return metas // the generation ended: nothing will use them
	}
	m.log.Warn("reading the offset metadata failed; finished offsets beyond the committed ones will be handled again",
		"generation", gen.ID, "err", err)
	return metas
}

// readTopicIDs reads, each in a goroutine of its own, the topic ID of every
// partition gen assigns, and returns where each one is delivered once ("" if
// the read failed: assignedTopicID reads it again).
func (m *member) readTopicIDs(ctx context.Context, gen *kafka.Generation) map[tp]<-chan string {
	out := map[tp]<-chan string{}
	for topic, pas := range gen.Assignments {
		for _, pa := range pas {
			ch := make(chan string, 1)
			out[tp{topic, pa.ID}] = ch
			go func() {
				id, err := topicID(ctx, m.cfg.Transport, m.client.Addr, m.cfg.Timeout, topic, pa.ID)
				if err != nil {
					id = ""
				}
				ch <- id
			}()
		}
	}
	return out
}

// assigned returns the offset gen assigned to a partition (its committed
// offset), or -1.
func assigned(gen *kafka.Generation, topic string, partition int) int64 {
	for _, pa := range gen.Assignments[topic] {
		if pa.ID == partition {
			return pa.Offset
		}
	}
	return -1
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
