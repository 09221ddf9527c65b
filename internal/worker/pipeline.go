package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/errgroup"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/route"
)

// rebalanceTimeout is the consumer groups' rebalance timeout; a drain must
// end before it so that a draining member still rejoins in time.
const rebalanceTimeout = 30 * time.Second

// BuiltPipeline is the pipeline of ROLES built and checked, ready to Run:
// the consumer groups (gate: SOURCE_TOPICS, retry: the retry tier topics),
// the router and its writer. Health reports its state to readiness. Safe
// for concurrent use; Run it once.
type BuiltPipeline struct {
	log    *slog.Logger
	cfg    *Config
	signer *route.Signer
	writer interface{ Close() error }
	router *route.Router
	groups []consumerGroup
	paused atomic.Bool // consumption paused (Redis trouble, ON_REDIS_ERROR=pause)
}

// Build waits for the topics of ROLES to exist, checks their limits and
// builds the writer, the router and every consumer group, so that a group
// that fails to build leaves none running behind the returned error. It
// returns nil and no error when ctx ends while Kafka cannot be reached.
func (p Pipeline) Build(ctx context.Context) (_ *BuiltPipeline, err error) {
	cfg := p.Config
	m, err := newPipelineMetrics(p.Registerer)
	if err != nil {
		return nil, err
	}
	topics := route.Topics{Downstream: cfg.DownstreamTopic, Retry: cfg.RetryTopic, DLQ: cfg.DLQTopic}
	if err := waitForTopics(ctx, p, pipelineTopics(cfg, topics)); err != nil || ctx.Err() != nil {
		return nil, err
	}
	topicMax, err := verifyTopicLimits(ctx, p, topics)
	if err != nil {
		return nil, err
	}
	signer, err := cfg.RetrySigner()
	if err != nil {
		return nil, err
	}
	writer := route.NewFencedWriter(cfg.KafkaBrokers, route.WriterOptions{
		Transport:    p.Transport,
		BatchBytes:   writerBatchBytes(cfg.MaxMessageBytes, topicMax),
		WriteTimeout: cfg.KafkaTimeout,
		ReadTimeout:  cfg.KafkaTimeout,
		Logger:       p.Log,
	})
	defer func() {
		if err != nil {
			writer.Close()
		}
	}()
	b := &BuiltPipeline{log: p.Log, cfg: cfg, signer: signer, writer: writer}
	b.router = &route.Router{
		// Writes retry at least every recoverBackoff, so that they go out
		// soon after the broker returns.
		Backoff: consume.Backoff{Max: recoverBackoff},
		Writer:  writer,
		Topics:  topics,
		Clock:   time.Now,
		Logger:  p.Log,
		Metrics: m.route,
		Signer:  signer,

		MaxMessageBytes: cfg.MaxMessageBytes,
		TopicMaxBytes:   topicMax,
	}
	m.zeroKnownSeries(cfg.SourceTopics, topics)

	if cfg.HasRole(route.RoleRetry) {
		p.metadataMax = readMetadataMax(ctx, p)
	}
	p.paused = &b.paused
	for _, build := range []func(*pipelineMetrics, *route.Router) (consumerGroup, error){p.gateGroup, p.retryGroup} {
		grp, err := build(m, b.router)
		if err != nil {
			return nil, err
		}
		if grp != nil {
			b.groups = append(b.groups, grp)
		}
	}
	return b, nil
}

// Run runs the consumer groups until ctx is done, then drains: finishes the
// writes in flight, commits and leaves the groups, within SHUTDOWN_GRACE.
// It returns nil after a clean drain, and closes the writer.
func (b *BuiltPipeline) Run(ctx context.Context) error {
	defer b.writer.Close()
	g, gctx := errgroup.WithContext(ctx)
	for _, grp := range b.groups {
		g.Go(func() error { return grp.Run(gctx) })
	}
	cfg := b.cfg
	b.log.Info("pipeline started", slog.Any("roles", cfg.Roles), slog.Any("source_topics", cfg.SourceTopics),
		slog.String("downstream_topic", cfg.DownstreamTopic), slog.Bool("retry_signed", b.signer != nil))
	return g.Wait()
}

// PipelineHealth is what readiness reports of a pipeline; a nil error is
// healthy.
type PipelineHealth struct {
	// Groups: has every consumer group joined?
	Groups error
	// Consumption: does consumption run (not paused by Redis trouble with
	// ON_REDIS_ERROR=pause)?
	Consumption error
	// Writes: do the router's Kafka writes succeed?
	Writes error
}

// Health reports the pipeline's state to readiness.
func (b *BuiltPipeline) Health() PipelineHealth {
	var h PipelineHealth
	for _, grp := range b.groups {
		if !grp.Ready() {
			h.Groups = errors.New("not joined")
			break
		}
	}
	if b.paused.Load() {
		h.Consumption = errors.New("paused")
	}
	if n := b.router.WritesFailing(); n > 0 {
		h.Writes = fmt.Errorf("%d batches' Kafka writes keep failing (their partitions wait; see the log)", n)
	}
	return h
}

// consumerGroup is a consumer group of the pipeline: consume.Group or
// consume.Delayed.
type consumerGroup interface {
	Run(ctx context.Context) error
	Ready() bool
}

// onRedisError is the Redis error policy of the gate and the retrier: a
// shadow deployment must never stop traffic, so it forwards everything.
func (p Pipeline) onRedisError() string {
	if p.Config.Shadow {
		return route.RedisForward
	}
	return p.Config.OnRedisError
}

// admission is what the gate and the retrier share: the limiter, the router,
// the Redis error policy, the cost source, the clock, logger, metrics and
// readiness.
func (p Pipeline) admission(m *pipelineMetrics, router *route.Router) (route.Admission, error) {
	costFrom, err := route.ParseCostFrom(p.Config.CostFrom)
	if err != nil {
		return route.Admission{}, fmt.Errorf("GATEKEEPER_COST_FROM: %w", err)
	}
	return route.Admission{
		Admitter:     p.admitter(),
		Router:       router,
		CostFrom:     costFrom,
		OnRedisError: p.onRedisError(),
		Clock:        time.Now,
		Logger:       p.Log,
		Metrics:      m.route,
		SetReady:     p.setReady,
	}, nil
}

// setReady reports to readiness whether consumption runs (false: paused).
func (p Pipeline) setReady(ready bool) { p.paused.Store(!ready) }

// groupConfig is the consumer-group configuration both roles share; the
// caller sets the topics (and the retry role its group).
func (p Pipeline) groupConfig(m *pipelineMetrics) consume.Config {
	cfg := p.Config
	return consume.Config{
		Brokers:          cfg.KafkaBrokers,
		GroupID:          cfg.GroupID,
		BatchSize:        cfg.BatchSize,
		BatchBytes:       cfg.BatchBytes,
		BatchWait:        cfg.BatchWait,
		DrainTimeout:     min(cfg.ShutdownGrace, rebalanceTimeout-time.Second),
		Timeout:          cfg.KafkaTimeout,
		RebalanceTimeout: rebalanceTimeout,
		SessionTimeout:   cfg.KafkaSessionTimeout,
		// kafka-go's default heartbeat is 3s; a short session needs more.
		HeartbeatInterval: min(3*time.Second, cfg.KafkaSessionTimeout/5),
		// After a broker restart, join again soon after the coordinator
		// has loaded the group: deferred events whose trip to a retry tier
		// is decided again by the source group come back only then (with
		// kafka-go's 5s, up to 5s after the retry group).
		JoinGroupBackoff:       joinBackoff,
		CoordinatorJoinBackoff: loadingJoinBackoff,
		Dialer:                 p.Dialer,
		Transport:              p.Transport,
		Logger:                 p.Log,
		OnOffsetsLost:          func(topic string, _ int, n int64) { m.offsetsLost.WithLabelValues(topic).Add(float64(n)) },
		OnLag: func(topic string, partition int, n int64) {
			if n < 0 {
				m.lag.DeleteLabelValues(topic, fmt.Sprint(partition))
				return
			}
			m.lag.WithLabelValues(topic, fmt.Sprint(partition)).Set(float64(n))
		},
	}
}

// gateGroup returns the consumer group of the source topics with the gate
// as its handler, or nil when this process does not run the gate role.
func (p Pipeline) gateGroup(m *pipelineMetrics, router *route.Router) (consumerGroup, error) {
	cfg := p.Config
	if !cfg.HasRole(route.RoleGate) {
		return nil, nil
	}
	extractor, err := route.ParseTenantFrom(cfg.TenantFrom)
	if err != nil {
		return nil, fmt.Errorf("GATEKEEPER_TENANT_FROM: %w", err)
	}
	adm, err := p.admission(m, router)
	if err != nil {
		return nil, err
	}
	gate, err := route.NewGate(route.Gate{Admission: adm, Extractor: extractor, Shadow: cfg.Shadow})
	if err != nil {
		return nil, err // NewGate's errors already start with "gate: "
	}
	src, err := consume.NewGroup(p.sourceConfig(m), gate)
	if err != nil {
		return nil, fmt.Errorf("source consumer: %w", err)
	}
	return src, nil
}

// sourceConfig is the configuration of the source topics' consumer group.
func (p Pipeline) sourceConfig(m *pipelineMetrics) consume.Config {
	gc := p.groupConfig(m)
	gc.Topics = p.Config.SourceTopics
	gc.DecideAhead = p.Config.DecideAhead
	// A fetch response is held whole until handed out: at most one per
	// partition, of at most BATCH_BYTES and at most 1 MiB (or one record
	// batch when a single batch is larger), so fetching adds at most one
	// batch's bytes per partition to the batch being decided. Responses of
	// BATCH_BYTES (4 MiB) held six partitions' 24 MiB decoded at once for
	// nothing: a 1 MiB response still holds several 500-event batches.
	gc.MaxBytes = min(p.Config.BatchBytes, consume.DefaultMaxBytes)
	if p.Limiter != nil {
		// Redis Cluster: the replay records a commit has passed go at
		// once, not at the partition's next batch.
		gc.OnCommitted = p.Limiter.Committed
	}
	return gc
}

// retrySessionTimeout caps the retry group's session timeout: Kafka's
// default group.min.session.timeout.ms is 6s.
const retrySessionTimeout = 10 * time.Second

// retryLeaseHeartbeat is the retry group's heartbeat with leases: the
// survivors learn of the rebalance that removing a crashed member starts
// at their next heartbeat.
const retryLeaseHeartbeat = 500 * time.Millisecond

// joinBackoff is both groups' wait between failed joins (kafka-go's default
// is 5s), loadingJoinBackoff their wait while the coordinator answers that
// it has not loaded the group yet (consume/joinwait.go: right after a broker
// restart), and recoverBackoff the longest wait between attempts of a failed
// write or batch of the retry role (consume's default is 5s).
const (
	joinBackoff        = 500 * time.Millisecond
	loadingJoinBackoff = 100 * time.Millisecond
	recoverBackoff     = time.Second
)

// retryGroup returns the consumer group of the retry tiers with the retrier
// as its handler, or nil when this process does not run the retry role.
// advancesBacklog says whether the retry tiers move waiting deferred events
// into the capacity's idle room (#24): with CAPACITY_ADVANCE and a capacity
// (of events, bytes or units) on aligned windows; otherwise nothing changes.
func (c Config) advancesBacklog() bool {
	return c.CapacityAdvance && len(c.CapacityRules()) > 0 && limit.WindowKind(c.Window) == limit.Aligned
}

// checksClaims says whether the first retry tier checks the events that
// come back inside their slot (claims) with one admit call per batch: with
// LATE_TAKES_SLOTS check or on, and whenever the backlog's moves are on. A
// moved event whose replica crashed before forwarding it comes back to the
// next owner at its old due time, inside the old slot the move freed; the
// check finds the move in the replay record (an admission already counted)
// where an unchecked claim would be forwarded uncounted, one over that
// slot's window if the freed slot was booked again
// (limit.TestAdvancedEventClaimedAgain).
func (c Config) checksClaims() bool {
	return c.LateTakesSlots != lateOff || c.advancesBacklog()
}

// boundsTakes says whether the first retry tier keeps and trusts the
// fleet's bound on the slots late events took (route.Retrier.Takes): with
// LATE_TAKES_SLOTS=on, which every replica of the fleet runs (or check,
// which takes nothing and trusts nothing), unless the backlog's moves are
// on, which need every claim checked. Then a batch of events back inside
// their slot makes one small call (lua.TakesUntil) instead of an admit
// call whenever no take is due as late as their slots.
func (c Config) boundsTakes() bool {
	return c.LateTakesSlots == lateOn && !c.advancesBacklog()
}

func (p Pipeline) retryGroup(m *pipelineMetrics, router *route.Router) (consumerGroup, error) {
	cfg := p.Config
	if !cfg.HasRole(route.RoleRetry) {
		return nil, nil
	}
	adm, err := p.admission(m, router)
	if err != nil {
		return nil, err
	}
	spec := route.Retrier{Admission: adm, MaxAttempts: cfg.MaxAttempts,
		CheckClaims: cfg.checksClaims(), TakeSlots: cfg.LateTakesSlots == lateOn}
	if p.Live != nil && p.Live.Expediter != nil {
		spec.Expedited = p.Live.Expediter.Expedited
	}
	spec.AdvanceBacklog = cfg.advancesBacklog()
	if cfg.boundsTakes() && p.Limiter != nil {
		spec.Takes = p.Limiter
	}
	retrier, err := route.NewRetrier(spec)
	if err != nil {
		return nil, err // NewRetrier's errors already start with "retrier: "
	}
	retry, err := consume.NewDelayed(p.retryConfig(m, retrier), retrier)
	if err != nil {
		return nil, fmt.Errorf("retry consumer: %w", err)
	}
	return retry, nil
}

// retryConfig is the configuration of the retry tiers' consumer group,
// which releases messages by retrier's clock.
func (p Pipeline) retryConfig(m *pipelineMetrics, retrier *route.Retrier) consume.DelayedConfig {
	cfg := p.Config
	dc := consume.DelayedConfig{
		Config:         p.groupConfig(m),
		LookAhead:      cfg.RetryLookahead,
		LookAheadBytes: cfg.RetryLookaheadBytes,
		ReleaseAt:      retrier.ReleaseAt,
		OnWaiting:      func(topic string, delta int) { m.waiting.WithLabelValues(topic).Add(float64(delta)) },
		OnLateness: func(topic string, late time.Duration) {
			m.lateness.WithLabelValues(topic).Observe(late.Seconds())
		},
		OnSkipped:    func(topic string, n int) { m.skipped.WithLabelValues(topic).Add(float64(n)) },
		OnPassedOver: func(topic string, n int) { m.passedOver.WithLabelValues(topic).Add(float64(n)) },
		OnTruncated:  func(topic string, _ int64) { m.truncated.WithLabelValues(topic).Inc() },
		// The done sets are sized to the brokers' offset.metadata.max.bytes
		// and signed with RETRY_SECRET when it is set (RETRY_SECRET_PREVIOUS
		// still verifies).
		MetadataMax:  p.metadataMax,
		MetadataKeys: signingKeys(cfg.RetrySecret, cfg.RetrySecretPrevious),
		OnDistrusted: func(topic, reason string) { m.distrusted.WithLabelValues(topic, reason).Inc() },
	}
	p.Live.retryHooks(&dc)
	if retrier.AdvanceBacklog {
		dc.Advance = retrier
	}
	// The retry tiers have a group of their own, so that their rebalances
	// never disturb the source group.
	dc.GroupID = cfg.GroupID + ".retry"
	// Fetched and not yet in the look-ahead: one response per partition, of
	// at most RETRY_LOOKAHEAD_BYTES (or one record batch).
	dc.MaxBytes = cfg.RetryLookaheadBytes
	// A retry partition without an owner holds events whose reserved slot
	// is running out (an event back after its slot is checked again as new):
	// after a crash, its partitions move after a lease (consume.Leases) and
	// a heartbeat, or at most retrySessionTimeout rather than the whole
	// KAFKA_SESSION_TIMEOUT without leases.
	dc.SessionTimeout = min(cfg.KafkaSessionTimeout, retrySessionTimeout)
	dc.HeartbeatInterval = min(3*time.Second, dc.SessionTimeout/5)
	// Deferred events due while the broker was away go out within about
	// two seconds of its return: the group rejoins, and a failing batch is
	// tried again, at least that often.
	dc.BackoffMax = recoverBackoff
	if p.Leases != nil {
		dc.Leases = p.Leases
		dc.OnLeaseEnded = func() { m.leasesEnded.Inc() }
		dc.OnLeaseFenced = func() { m.leaseFenced.Inc() }
		dc.HeartbeatInterval = retryLeaseHeartbeat
	}
	for _, t := range retrier.Router.Topics.Tiers() {
		dc.Topics = append(dc.Topics, t.Topic)
	}
	return dc
}

// pipelineMetrics are the collectors of the pipeline: the route package's
// and those of the consumer groups' callbacks.
type pipelineMetrics struct {
	route       *route.Metrics
	waiting     *prometheus.GaugeVec
	lateness    *prometheus.HistogramVec
	lag         *prometheus.GaugeVec
	skipped     *prometheus.CounterVec
	truncated   *prometheus.CounterVec
	offsetsLost *prometheus.CounterVec
	leasesEnded prometheus.Counter
	leaseFenced prometheus.Counter
	distrusted  *prometheus.CounterVec
	passedOver  *prometheus.CounterVec
}

// signingKeys returns the non-empty secrets as keys, the current one first.
func signingKeys(secrets ...string) [][]byte {
	var keys [][]byte
	for _, s := range secrets {
		if s != "" {
			keys = append(keys, []byte(s))
		}
	}
	return keys
}

// newPipelineMetrics builds the pipeline's collectors and registers them
// with reg.
func newPipelineMetrics(reg prometheus.Registerer) (*pipelineMetrics, error) {
	routeMetrics, err := route.NewMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("route metrics: %w", err)
	}
	m := &pipelineMetrics{
		route: routeMetrics,
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gatekeeper_deferred_waiting",
			Help: "Deferred events read from a retry tier and waiting for their release time.",
		}, []string{"topic"}),
		lateness: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gatekeeper_retry_lateness_seconds",
			Help: "Time from a deferred event's release time to the acknowledgement of its writes. " +
				"For the first retry tier the release time is gk-due: this is how late the event was " +
				"forwarded (or deferred again). For the other tiers it is gk-due minus the tier's lower " +
				"bound, and the write moves the event to a shorter tier.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"topic"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gatekeeper_consumer_lag",
			Help: "Messages of a partition beyond its committed offset, as of the last fetch.",
		}, []string{"topic", "partition"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gatekeeper_handover_skipped_total",
			Help: "Retry-tier events skipped because the partition's previous owner had already handled them " +
				"(read from the offset metadata of its last commit): duplicates avoided at a handover.",
		}, []string{"topic"}),
		truncated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gatekeeper_handover_truncated_commits_total",
			Help: "Retry-tier commits whose set of handled offsets beyond the committed one did not fit in the " +
				"offset metadata (the brokers' offset.metadata.max.bytes); a new owner of the partition would handle the rest again.",
		}, []string{"topic"}),
		offsetsLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gatekeeper_offsets_lost_total",
			Help: "Offsets Kafka deleted (retention) before Gatekeeper consumed them: the events there are lost. " +
				"Each jump is also an error log line.",
		}, []string{"topic"}),
		leasesEnded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gatekeeper_retry_leases_ended_total",
			Help: "Members of the retry group this replica removed from the group because their lease ended " +
				"(a crashed replica): its retry partitions moved without waiting for its session to time out.",
		}),
		leaseFenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gatekeeper_retry_lease_fenced_total",
			Help: "Generations of the retry group this replica ended because its own lease could not be renewed in time " +
				"(Redis out of reach or stalled): it stopped writing and rejoined before the others could remove it.",
		}),
		distrusted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gatekeeper_handover_distrusted_total",
			Help: "Done sets in a retry tier's commit metadata that a new owner did not trust (unsigned or badly signed " +
				"with RETRY_SECRET set, unreadable, or beyond the partition's end): their events were handled again.",
		}, []string{"topic", "reason"}),
		passedOver: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gatekeeper_retry_passed_over_total",
			Help: "Deferred events a retry-tier partition dropped from its look-ahead, full of events not due, so as to " +
				"read on to events due sooner; each is read again from Kafka shortly before it is due.",
		}, []string{"topic"}),
	}
	for _, c := range []prometheus.Collector{m.waiting, m.lateness, m.lag, m.skipped, m.truncated, m.offsetsLost, m.leasesEnded, m.leaseFenced, m.distrusted, m.passedOver} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("pipeline metrics: %w", err)
		}
	}
	return m, nil
}

// pipelineTopics lists every topic the roles of cfg read or write.
func pipelineTopics(cfg *Config, topics route.Topics) []string {
	var ts []string
	if cfg.HasRole(route.RoleGate) {
		ts = append(ts, cfg.SourceTopics...)
	}
	ts = append(ts, cfg.DownstreamTopic, cfg.DLQTopic)
	for _, t := range topics.Tiers() {
		ts = append(ts, t.Topic)
	}
	return ts
}

// waitForTopics checks that every topic exists. Gatekeeper never creates
// topics: a missing one is a configuration error, named in the one line it
// returns. While Kafka cannot be reached it waits and tries again (readiness
// stays false), so that a fleet started before its brokers does not crash-loop.
func waitForTopics(ctx context.Context, p Pipeline, topics []string) error {
	client := &kafka.Client{Addr: kafka.TCP(p.Config.KafkaBrokers...), Timeout: p.Config.KafkaTimeout, Transport: p.Transport}
	wait := 250 * time.Millisecond
	for {
		mctx, cancel := context.WithTimeout(ctx, p.Config.KafkaTimeout)
		res, err := client.Metadata(mctx, &kafka.MetadataRequest{Topics: topics})
		cancel()
		if err == nil {
			var missing []string
			for _, t := range res.Topics {
				if t.Error != nil {
					missing = append(missing, fmt.Sprintf("%q (%v)", t.Name, t.Error))
				}
			}
			if len(missing) > 0 {
				return fmt.Errorf("topics missing (Gatekeeper never creates topics; create them first): %s", strings.Join(missing, ", "))
			}
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		var kerr kafka.Error
		if errors.As(err, &kerr) && !kerr.Temporary() {
			return fmt.Errorf("kafka metadata: %w", err)
		}
		p.Log.Error("kafka unavailable, waiting to check the topics", slog.String("err", err.Error()), slog.String("retry_in", wait.String()))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, 10*time.Second)
	}
}

// zeroKnownSeries creates at 0 the series of every label value known at
// start: a series that first appears with the value 1 shows no increase to
// increase() or rate(), so the first event of a kind would go unseen by the
// alert rules and the dashboard.
func (m *pipelineMetrics) zeroKnownSeries(sources []string, topics route.Topics) {
	for _, k := range []limit.Kind{limit.Admit, limit.Defer, limit.Reject, limit.Fail} {
		m.route.Decisions.WithLabelValues(k.String())
	}
	for _, d := range []string{route.DecisionInvalid, route.DecisionReserved, route.DecisionMaxAttempts} {
		m.route.Decisions.WithLabelValues(d)
	}
	for _, r := range []string{"missing", "mismatch"} { // route.Retrier's gk-sig reasons
		m.route.SigFailures.WithLabelValues(r)
	}
	var tiers []string
	for _, t := range topics.Tiers() {
		tiers = append(tiers, t.Topic)
	}
	for _, t := range append(append([]string{}, sources...), tiers...) {
		m.route.EventsIn.WithLabelValues(t)
		m.offsetsLost.WithLabelValues(t)
	}
	for _, t := range append([]string{topics.Downstream, topics.DLQ}, tiers...) {
		m.route.EventsOut.WithLabelValues(t)
		m.route.Oversized.WithLabelValues(t)
	}
	for _, t := range tiers {
		m.skipped.WithLabelValues(t)
		m.truncated.WithLabelValues(t)
		m.passedOver.WithLabelValues(t)
	}
}
