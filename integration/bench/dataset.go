package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// workload describes one data set: how many events, over how many tenants,
// how skewed, how big. The same workload always yields the same events.
type workload struct {
	Events     int
	Tenants    int
	Skew       float64 // Zipf exponent s (> 1): larger means heavier heads
	EventSize  int     // approximate bytes of each JSON value
	Partitions int
	Seed       int64
}

// name is the source topic of the workload: it encodes every parameter, so
// a topic of that name that holds Events messages is the same data set and
// can be reused across runs.
func (w workload) name() string {
	h := fnv.New32a()
	fmt.Fprintf(h, "%d/%d/%g/%d/%d/%d", w.Events, w.Tenants, w.Skew, w.EventSize, w.Partitions, w.Seed)
	return fmt.Sprintf("gkbench-data-e%d-t%d-%08x", w.Events, w.Tenants, h.Sum32())
}

// tenantName is the tenant of Zipf rank k (0 is the heaviest).
func tenantName(k uint64) string { return "t-" + strconv.FormatUint(k, 10) }

// tenantSource draws tenant ranks: a few heavy tenants and a long tail.
type tenantSource struct{ z *rand.Zipf }

func newTenantSource(seed int64, skew float64, tenants int) tenantSource {
	r := rand.New(rand.NewSource(seed))
	return tenantSource{z: rand.NewZipf(r, skew, 1, uint64(max(tenants, 1)-1))}
}

func (s tenantSource) next() uint64 { return s.z.Uint64() }

// ranks returns the tenant rank of every event of the workload, in order.
func (w workload) ranks() []uint32 {
	src := newTenantSource(w.Seed, w.Skew, w.Tenants)
	out := make([]uint32, w.Events)
	for i := range out {
		out[i] = uint32(src.next())
	}
	return out
}

// counts returns the events per tenant rank.
func counts(ranks []uint32, tenants int) []int {
	c := make([]int, tenants)
	for _, r := range ranks {
		c[r]++
	}
	return c
}

// overLimit returns the events beyond limit per tenant: the events a
// per-tenant limit of `limit` in one window leaves out.
func overLimit(counts []int, limit int) int {
	n := 0
	for _, c := range counts {
		if c > limit {
			n += c - limit
		}
	}
	return n
}

// solveLimit returns the smallest per-tenant limit that leaves at most
// fraction of all events over it (so about that fraction is deferred when
// the whole data set falls in one window).
func solveLimit(counts []int, fraction float64) int {
	total := 0
	hi := 1
	for _, c := range counts {
		total += c
		hi = max(hi, c)
	}
	want := fraction * float64(total)
	lo := 1
	for lo < hi {
		m := (lo + hi) / 2
		if float64(overLimit(counts, m)) > want {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// eventValue is a JSON event of about size bytes.
func eventValue(tenant string, seq int, ts time.Time, size int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `{"tenant":%q,"event_id":"ev-%010d","type":"order.created","ts":%d,"amount_cents":%d,"pad":"`,
		tenant, seq, ts.UnixMilli(), 100+seq%99900)
	pad := size - b.Len() - 2
	for i := 0; i < pad; i++ {
		b.WriteByte(byte('a' + (seq+i)%26))
	}
	b.WriteString(`"}`)
	return []byte(b.String())
}

// produceWorkload writes the workload's events to topic, keyed by tenant
// (Murmur2, like Gatekeeper's writer), printing progress to logf.
func produceWorkload(ctx context.Context, brokers []string, topic string, w workload, ranks []uint32, logf func(string, ...any)) error {
	wr := &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Balancer:     &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll,
		BatchSize:    20000,
		BatchBytes:   1 << 20,
		BatchTimeout: 5 * time.Millisecond,
		WriteTimeout: 30 * time.Second,
	}
	defer wr.Close()
	const chunk = 60000
	start := time.Now()
	ts := time.Now()
	msgs := make([]kafka.Message, 0, chunk)
	lastLog := time.Now()
	for i := 0; i < len(ranks); i += chunk {
		msgs = msgs[:0]
		for j := i; j < min(i+chunk, len(ranks)); j++ {
			t := tenantName(uint64(ranks[j]))
			msgs = append(msgs, kafka.Message{Topic: topic, Key: []byte(t), Value: eventValue(t, j, ts, w.EventSize)})
		}
		if err := wr.WriteMessages(ctx, msgs...); err != nil {
			return fmt.Errorf("produce data set: %w", err)
		}
		if time.Since(lastLog) > 5*time.Second || i+chunk >= len(ranks) {
			done := min(i+chunk, len(ranks))
			logf("producing data set %s: %d/%d events (%.0f ev/s)", topic, done, len(ranks),
				float64(done)/time.Since(start).Seconds())
			lastLog = time.Now()
		}
	}
	return nil
}

// liveHeader carries the unix microseconds at which a paced (latency phase)
// event was handed to the producer.
const liveHeader = "bench-sent-us"

// producePaced writes n events at rate per second to topic, each with
// liveHeader, and returns when all are acknowledged.
func producePaced(ctx context.Context, brokers []string, topic string, w workload, n, rate int) error {
	wr := &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Balancer:     &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond,
		WriteTimeout: 30 * time.Second,
	}
	defer wr.Close()
	src := newTenantSource(w.Seed+1, w.Skew, w.Tenants)
	const tick = 10 * time.Millisecond
	perTick := max(1, rate/int(time.Second/tick))
	t := time.NewTicker(tick)
	defer t.Stop()
	sent := 0
	start := time.Now()
	for sent < n {
		// Catch up on ticks missed while a write was in flight, so the
		// rate holds on a busy machine.
		due := min(n, int(float64(rate)*time.Since(start).Seconds())+perTick)
		var msgs []kafka.Message
		now := time.Now()
		for ; sent < due; sent++ {
			tn := tenantName(src.next())
			msgs = append(msgs, kafka.Message{
				Topic: topic, Key: []byte(tn), Value: eventValue(tn, sent, now, w.EventSize), Time: now,
				Headers: []kafka.Header{{Key: liveHeader, Value: []byte(strconv.FormatInt(now.UnixMicro(), 10))}},
			})
		}
		if len(msgs) > 0 {
			if err := wr.WriteMessages(ctx, msgs...); err != nil {
				return fmt.Errorf("produce paced events: %w", err)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
