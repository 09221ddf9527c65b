//go:build fault

package fault

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Reading back: a collector reads topics from their start while the
// scenario runs, and what it read is the material of the tally.

// outEvent is one record read back from a topic.
type outEvent struct {
	topic     string
	partition int32
	offset    int64
	id        int
	tenant    string    // the key
	at        time.Time // the record's timestamp: the broker's append time on a LogAppendTime topic
	due       time.Time // gk-due; zero if absent
	reserved  time.Time // gk-reserved; zero if absent
	attempt   string    // gk-attempt
	reason    string    // gk-reason
	took      bool      // gk-took: it took a later reservation's slot (#22)
}

func (e outEvent) String() string {
	s := fmt.Sprintf("%s/%d@%d at %s", e.topic, e.partition, e.offset, e.at.UTC().Format("15:04:05.000"))
	if !e.due.IsZero() {
		s += fmt.Sprintf(" due %s reserved %s attempt %s", e.due.UTC().Format("15:04:05.000"),
			e.reserved.UTC().Format("15:04:05.000"), e.attempt)
	}
	if e.reason != "" {
		s += " reason " + strconv.Quote(e.reason)
	}
	return s
}

// collector reads topics from their start, continuously, in a goroutine of
// its own (franz-go, without a group; it rides out a broker restart). Safe
// for concurrent use.
type collector struct {
	cl     *kgo.Client
	cancel context.CancelFunc
	done   chan struct{}
	logf   func(string, ...any)

	mu      sync.Mutex
	events  []outEvent
	ids     map[int]bool
	foreign int                        // records without a test event value
	next    map[string]map[int32]int64 // next offset to read, by topic and partition
	errs    int
}

// startCollector starts reading topics.
func startCollector(topics []string, logf func(string, ...any)) (*collector, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr()),
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200*time.Millisecond),
		kgo.DialTimeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("franz-go client: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &collector{cl: cl, cancel: cancel, done: make(chan struct{}), logf: logf,
		ids: map[int]bool{}, next: map[string]map[int32]int64{}}
	go c.run(ctx)
	return c, nil
}

func (c *collector) run(ctx context.Context) {
	defer close(c.done)
	defer c.cl.Close()
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		fs := c.cl.PollFetches(pctx)
		cancel()
		fs.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				return
			}
			c.mu.Lock()
			c.errs++
			n := c.errs
			c.mu.Unlock()
			if n <= 3 || n%20 == 0 {
				c.logf("collector: fetch %s/%d: %v (%d errors so far)", topic, p, err, n)
			}
		})
		c.mu.Lock()
		fs.EachRecord(func(r *kgo.Record) { c.add(r) })
		c.mu.Unlock()
	}
}

// add records r; c.mu is held.
func (c *collector) add(r *kgo.Record) {
	if c.next[r.Topic] == nil {
		c.next[r.Topic] = map[int32]int64{}
	}
	c.next[r.Topic][r.Partition] = r.Offset + 1
	e, ok := outEventOf(r)
	if !ok {
		c.foreign++
		return
	}
	c.events = append(c.events, e)
	c.ids[e.id] = true
}

// outEventOf reads the test event of r; ok is false for a record without a
// test event value.
func outEventOf(r *kgo.Record) (e outEvent, ok bool) {
	id, ok := eventID(r.Value)
	if !ok {
		return outEvent{}, false
	}
	e = outEvent{topic: r.Topic, partition: r.Partition, offset: r.Offset, id: id, tenant: string(r.Key), at: r.Timestamp}
	for _, h := range r.Headers {
		switch h.Key {
		case "gk-due":
			e.due = unixMillis(h.Value)
		case "gk-reserved":
			e.reserved = unixMillis(h.Value)
		case "gk-attempt":
			e.attempt = string(h.Value)
		case "gk-reason":
			e.reason = string(h.Value)
		case "gk-took":
			e.took = true
		}
	}
	return e, true
}

// unixMillis reads a unix-ms header value; zero time if it is not a number.
func unixMillis(v []byte) time.Time {
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(n)
}

// seen reports whether id has been read.
func (c *collector) seen(id int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ids[id]
}

// caughtUp reports whether every partition in ends has been read up to its end offset.
func (c *collector) caughtUp(ends map[string]map[int]int64) (bool, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var behind []string
	for topic, ps := range ends {
		for p, end := range ps {
			if got := c.next[topic][int32(p)]; got < end {
				behind = append(behind, fmt.Sprintf("%s/%d at %d of %d", topic, p, got, end))
			}
		}
	}
	slices.Sort(behind)
	return len(behind) == 0, strings.Join(behind, ", ")
}

// waitCaughtUp waits until caughtUp holds for topics (with their partition counts).
func (c *collector) waitCaughtUp(ctx context.Context, topics map[string]int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ends := map[string]map[int]int64{}
	for topic, n := range topics {
		e, err := endOffsets(ctx, topic, n)
		if err != nil {
			return fmt.Errorf("end offsets of %s: %w", topic, err)
		}
		ends[topic] = e
	}
	for {
		ok, status := c.caughtUp(ends)
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not read to the end after %v: %s", timeout, status)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stop stops reading and returns what was read.
func (c *collector) stop() (events []outEvent, foreign int) {
	c.cancel()
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.events, c.foreign
}
