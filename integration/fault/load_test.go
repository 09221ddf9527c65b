//go:build fault

package fault

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Load: a producer goroutine writes steady traffic of 100 tenants (the
// message key): hot tenants at about twice the limit, normal tenants well
// under it. Each event's value holds a unique id; the producer records when
// each id was produced.

// Rates of the load, in events per second per tenant. The limit is
// limitPerWindow per window (50/5s = 10/s). Hot tenants are at about twice
// it: from hotRateMin to hotRateMax, 19/s on average. The spread matters:
// a tenant at 2.3x the limit defers its events further than one at 1.5x, so
// a retry-tier partition holds events whose due times are out of offset
// order, as in production, and its owner releases events beyond its
// committed offset (what a handover must not hand again). Normal tenants are
// at under half the limit, so a normal tenant never fills a window.
const (
	hotTenants    = 10
	hotRateMin    = 15.0
	hotRateMax    = 23.0
	normalTenants = 90
	normalRate    = 4.5
	// loadTick is how often the producer writes what is due.
	loadTick = 50 * time.Millisecond
	// writeTimeout bounds one write of the producer; the client retries
	// inside it (through a broker restart), and a failed write is retried.
	writeTimeout = 60 * time.Second
	// flushTimeout bounds the writes of what is still unacknowledged when the load ends.
	flushTimeout = 90 * time.Second
	// maxCatchUp is the most of its schedule the producer makes up after a
	// stall (a write blocked while the broker is down): the events due
	// further back are skipped, so that a burst after the stall does not
	// push normal tenants over the limit.
	maxCatchUp = time.Second
)

// tenant is one tenant of the load.
type tenant struct {
	name      string
	rate      float64 // events per second
	hot       bool
	partition int // source partition of all its events (its key's partition)
}

// loadTenants returns the hot tenants first, then the normal ones, spread
// evenly over the source partitions: hotTenants and normalTenants of them
// times scale (1 when zero), each at its usual rate, so that the load is
// about scale times 600 events/s.
func loadTenants(partitions int, scale float64) []tenant {
	if scale == 0 {
		scale = 1
	}
	hot, normal := int(hotTenants*scale+0.5), int(normalTenants*scale+0.5)
	var ts []tenant
	for i := range hot + normal {
		tn := tenant{name: fmt.Sprintf("normal-%02d", i-hot), rate: normalRate, partition: i % partitions}
		if i < hot {
			rate := hotRateMin + (hotRateMax-hotRateMin)*float64(i)/float64(hot-1)
			tn = tenant{name: fmt.Sprintf("hot-%02d", i), rate: rate, hot: true, partition: i % partitions}
		}
		ts = append(ts, tn)
	}
	return ts
}

// eventValue is the value of event id.
func eventValue(id int) []byte { return []byte("fault-event " + strconv.Itoa(id)) }

// eventID reads the id from an event value; ok is false for another value.
func eventID(value []byte) (id int, ok bool) {
	s, found := strings.CutPrefix(string(value), "fault-event ")
	if !found {
		return 0, false
	}
	id, err := strconv.Atoi(s)
	return id, err == nil
}

// sent is what the producer knows of one event.
type sent struct {
	tenant   int       // index in the tenants
	produced time.Time // start of the write that was acknowledged; zero if none was
}

// loadResult is the producer's record, complete once the producer is done.
type loadResult struct {
	Tenants    []tenant
	Events     []sent // by id
	Start, End time.Time
	Writes     int // acknowledged writes
	Failed     int // writes that failed (their events were written again)
	Unacked    int // events never acknowledged (the flush gave up)
	Skipped    int // events of the schedule skipped after a stall (maxCatchUp)
}

// producer writes the load to a topic with franz-go's idempotent producer
// (acks from all replicas), which retries through a broker restart without
// writing an event twice. Safe for concurrent use.
type producer struct {
	cl      *kgo.Client
	tenants []tenant
	logf    func(format string, args ...any)

	mu  sync.Mutex
	res loadResult

	done chan struct{}
}

// startLoad starts a producer that writes the load to topic for dur, then
// flushes what is unacknowledged. Stop with stop (idempotent) or wait.
func startLoad(ctx context.Context, topic string, tenants []tenant, dur time.Duration, logf func(string, ...any)) (*producer, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr()),
		kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.DialTimeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("franz-go producer: %w", err)
	}
	p := &producer{cl: cl, tenants: tenants, logf: logf, done: make(chan struct{})}
	p.res.Tenants = tenants
	p.res.Start = time.Now()
	go p.run(ctx, p.res.Start, dur)
	return p, nil
}

// wait waits until the producer is done (bounded by the load's duration and
// the flush timeout) and returns its record.
func (p *producer) wait() loadResult {
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.res
}

// startedAt is when the load started.
func (p *producer) startedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.res.Start
}

func (p *producer) run(ctx context.Context, start time.Time, dur time.Duration) {
	defer close(p.done)
	defer p.cl.Close()
	emitted := make([]int, len(p.tenants))
	skipped := 0
	var pending []*kgo.Record
	var pendingIDs []int
	nextLog := start.Add(5 * time.Second)
	tick := time.NewTicker(loadTick)
	defer tick.Stop()
	for {
		now := time.Now()
		elapsed := min(now.Sub(start), dur)
		// What each tenant is due by now, from the elapsed time: after a
		// stalled write (broker down) the producer makes up at most
		// maxCatchUp of its schedule.
		for i, tn := range p.tenants {
			due := int(tn.rate * elapsed.Seconds())
			if behind := due - emitted[i] - int(tn.rate*maxCatchUp.Seconds()); behind > 0 {
				emitted[i] += behind
				skipped += behind
			}
			for ; emitted[i] < due; emitted[i]++ {
				id := p.newEvent(i)
				pending = append(pending, &kgo.Record{Partition: int32(tn.partition), Key: []byte(tn.name), Value: eventValue(id)})
				pendingIDs = append(pendingIDs, id)
			}
		}
		if len(pending) > 0 && p.write(ctx, pending, pendingIDs) {
			// New slices: a writer whose context ended may still hold the old ones.
			pending, pendingIDs = nil, nil
		}
		if now.After(nextLog) {
			p.logf("load: %v in, %d events, %d waiting for an ack, %d skipped after stalls",
				now.Sub(start).Round(time.Second), p.count(), len(pending), skipped)
			for !nextLog.After(now) {
				nextLog = nextLog.Add(5 * time.Second)
			}
		}
		if elapsed >= dur {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
	p.mu.Lock()
	p.res.End = time.Now()
	p.res.Skipped = skipped
	p.mu.Unlock()
	p.flush(ctx, pending, pendingIDs)
}

// flush writes what is still unacknowledged, bounded by flushTimeout.
func (p *producer) flush(ctx context.Context, pending []*kgo.Record, ids []int) {
	deadline := time.Now().Add(flushTimeout)
	for len(pending) > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		if p.write(ctx, pending, ids) {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	if len(pending) > 0 {
		p.logf("load: %d events never acknowledged (flush gave up)", len(pending))
		p.mu.Lock()
		p.res.Unacked = len(pending)
		p.mu.Unlock()
	}
}

// newEvent records a new event of tenant i and returns its id.
func (p *producer) newEvent(i int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.res.Events = append(p.res.Events, sent{tenant: i})
	return len(p.res.Events) - 1
}

func (p *producer) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.res.Events)
}

// write writes rs once; on success it records the start of this write as
// the produce time of ids. A failed write may still have landed in part: the
// events are written again, and the tally counts copies against the source.
func (p *producer) write(ctx context.Context, rs []*kgo.Record, ids []int) bool {
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	at := time.Now()
	// Fresh records: a record handed to the client is not to be reused.
	fresh := make([]*kgo.Record, len(rs))
	for i, r := range rs {
		fresh[i] = &kgo.Record{Partition: r.Partition, Key: r.Key, Value: r.Value}
	}
	err := p.cl.ProduceSync(ctx, fresh...).FirstErr()
	took := time.Since(at)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.res.Failed++
		if p.res.Failed <= 3 || p.res.Failed%10 == 0 {
			p.logf("load: write of %d events failed after %v (%d failures so far; written again): %v",
				len(rs), took.Round(time.Millisecond), p.res.Failed, err)
		}
		return false
	}
	if took > 2*time.Second {
		p.logf("load: a write of %d events took %v", len(rs), took.Round(time.Millisecond))
	}
	p.res.Writes++
	for _, id := range ids {
		p.res.Events[id].produced = at
	}
	return true
}
