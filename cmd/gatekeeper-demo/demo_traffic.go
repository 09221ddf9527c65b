package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// demoTenant is one tenant of the demo traffic: Rate events per second,
// plus Burst events at once every Every (the first burst half a second in).
type demoTenant struct {
	Name  string
	Rule  string // its LIMITS rule, e.g. 20/1s
	Rate  float64
	Burst int
	Every time.Duration
	// Size, if set, is the bytes of each of its events (key and value, no
	// headers), for a rule that counts bytes.
	Size  int
	About string // how it behaves, for the view
}

// demoSize returns the bytes of each event of the demo tenant named name,
// or 0 when its events are not of one size.
func demoSize(name string) int {
	for _, t := range demoTenants {
		if t.Name == name {
			return t.Size
		}
	}
	return 0
}

// offeredBy returns how many events the tenant has offered after elapsed.
func (t demoTenant) offeredBy(elapsed time.Duration) int {
	n := int(math.Floor(t.Rate * elapsed.Seconds()))
	if t.Burst > 0 && t.Every > 0 && elapsed >= demoFirstBurst {
		n += t.Burst * (1 + int((elapsed-demoFirstBurst)/t.Every))
	}
	return n
}

// demoFirstBurst is when bursty tenants send their first burst.
const demoFirstBurst = 500 * time.Millisecond

// demoEvent is the value of one synthetic event; its key is ID.
type demoEvent struct {
	Tenant string `json:"tenant"`
	ID     string `json:"id"`
	Seq    int    `json:"seq"`
	// Pad brings the event to its tenant's Size.
	Pad string `json:"pad,omitempty"`
}

// value returns the JSON value of ev, padded so that the event (its key ID
// and the value) is size bytes when size is set and large enough.
func (ev demoEvent) value(size int) ([]byte, error) {
	v, err := json.Marshal(ev)
	if err != nil || size == 0 {
		return v, err
	}
	// The pad field adds 9 bytes (,"pad":"") and then one per character.
	if n := size - len(ev.ID) - len(v) - len(`,"pad":""`); n >= 0 {
		ev.Pad = strings.Repeat("x", n)
		return json.Marshal(ev)
	}
	return v, nil
}

// demoProducer writes the synthetic traffic to the source topic and records
// every acknowledged event in the tally. It is used by one goroutine.
type demoProducer struct {
	w  *kafka.Writer
	tl *tally
}

func newDemoProducer(brokers []string, transport kafka.RoundTripper, topic string, tl *tally) *demoProducer {
	return &demoProducer{
		w: &kafka.Writer{
			Addr:         kafka.TCP(brokers...),
			Topic:        topic,
			Balancer:     &kafka.Murmur2Balancer{},
			RequiredAcks: kafka.RequireAll,
			BatchTimeout: 2 * time.Millisecond,
			BatchSize:    1000,
			WriteTimeout: 10 * time.Second,
			Transport:    transport,
		},
		tl: tl,
	}
}

// Run produces the tenants' traffic, measured from start, until ctx is done.
// A failed write is retried (on stop, within the writes' own timeouts), so
// that every event recorded as offered was acknowledged by Kafka.
func (p *demoProducer) Run(ctx, stop context.Context, start time.Time, tenants []demoTenant) error {
	sent := make([]int, len(tenants))
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var msgs []kafka.Message
		var evs []demoEvent
		now := time.Now()
		for i, t := range tenants {
			for want := t.offeredBy(now.Sub(start)); sent[i] < want; sent[i]++ {
				ev := demoEvent{Tenant: t.Name, ID: fmt.Sprintf("%s-%06d", t.Name, sent[i]+1), Seq: sent[i] + 1}
				v, err := ev.value(t.Size)
				if err != nil {
					return err
				}
				msgs = append(msgs, kafka.Message{Key: []byte(ev.ID), Value: v, Time: now})
				evs = append(evs, ev)
			}
		}
		if len(msgs) > 0 {
			if err := p.write(stop, msgs); err != nil {
				return err
			}
			p.tl.offer(evs, now)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (p *demoProducer) write(ctx context.Context, msgs []kafka.Message) error {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err = p.w.WriteMessages(wctx, msgs...)
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("write %d events: %w", len(msgs), err)
}

// Close closes the writer.
func (p *demoProducer) Close() error { return p.w.Close() }
