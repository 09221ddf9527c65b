package main

import (
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/route"
)

// tally follows every demo event by its id: offered (acknowledged by the
// source topic) and then seen in the output topics, read back from Kafka.
// It is safe for concurrent use.
type tally struct {
	rules *limit.Rules
	loc   *time.Location

	mu     sync.Mutex
	events map[string]*demoRecord
	pos    map[string]int64 // topic/partition -> next offset to read
}

// demoRecord is what is known of one event.
type demoRecord struct {
	tenant  string
	offered time.Time // zero: never offered (unknown id)

	direct, back int // downstream copies without and with gk-due
	deferrals    int // retry tier records
	dead         int // dead-letter records
	due          time.Time
	dueAttempt   int

	// span is when the event may have been counted: the first downstream
	// copy's [earliest, latest] counting time.
	span      [2]time.Time
	spanKnown bool
}

func newTally(rules *limit.Rules, loc *time.Location) *tally {
	return &tally{rules: rules, loc: loc, events: map[string]*demoRecord{}, pos: map[string]int64{}}
}

func (t *tally) record(id, tenant string) *demoRecord {
	r := t.events[id]
	if r == nil {
		r = &demoRecord{tenant: tenant}
		t.events[id] = r
	}
	return r
}

// offer records events acknowledged by the source topic at about when.
func (t *tally) offer(evs []demoEvent, when time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, ev := range evs {
		r := t.record(ev.ID, ev.Tenant)
		r.offered = when
	}
}

// next returns the next offset to read of a topic partition.
func (t *tally) next(topic string, partition int) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pos[topic+"/"+strconv.Itoa(partition)]
}

// observe records one output record, read at seen.
func (t *tally) observe(n demoNames, m kafka.Message, seen time.Time) {
	id := string(m.Key)
	var ev demoEvent
	_ = json.Unmarshal(m.Value, &ev)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pos[m.Topic+"/"+strconv.Itoa(m.Partition)] = m.Offset + 1
	// The id may be read back before the producer has recorded it as
	// offered (it does so once Kafka has acknowledged the write).
	r := t.record(id, ev.Tenant)
	due, hasDue := headerMillis(m, route.HeaderDue)
	switch {
	case m.Topic == n.Downstream && !hasDue:
		r.direct++
		if !r.spanKnown {
			// Admitted by the gate between the event's production (its
			// timestamp, kept by the router) and now.
			r.span, r.spanKnown = [2]time.Time{m.Time, seen}, true
		}
	case m.Topic == n.Downstream:
		r.back++
		if !r.spanKnown {
			// Forwarded in its reserved slot it was counted in the window of
			// gk-due; after the slot (gk-reserved) it was counted again when
			// the retrier re-admitted it, some time before now.
			r.span, r.spanKnown = [2]time.Time{due, due}, true
			if res, ok := headerMillis(m, route.HeaderReserved); !ok || !seen.Before(res) {
				r.span[1] = seen
			}
		}
	case m.Topic == n.DLQ:
		r.dead++
	default: // a retry tier
		r.deferrals++
		v, _ := route.LastHeader(m, route.HeaderAttempt)
		attempt, _ := strconv.Atoi(v)
		if attempt >= r.dueAttempt {
			r.due, r.dueAttempt = due, attempt
		}
	}
}

func headerMillis(m kafka.Message, key string) (time.Time, bool) {
	v, ok := route.LastHeader(m, key)
	if !ok || v == "" {
		return time.Time{}, false
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}

// readDemoTopic reads one partition of an output topic from its start into
// the tally until ctx is done.
func readDemoTopic(ctx context.Context, brokers []string, dialer *kafka.Dialer, topic string, partition int, tl *tally, n demoNames, log *slog.Logger) {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:   brokers,
		Topic:     topic,
		Partition: partition,
		Dialer:    dialer,
		MinBytes:  1,
		MaxBytes:  10 << 20,
		// Data is returned as soon as it arrives; MaxWait only bounds an
		// idle fetch. kafka-go allows the broker's reply 1s beyond the wait
		// when MaxWait is over 1s, but only a quarter of it below, which a
		// busy machine easily misses (an i/o timeout and a reconnect).
		MaxWait: 1500 * time.Millisecond,
	})
	defer r.Close()
	for {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
				log.Warn("read output topic", slog.String("topic", topic), slog.Int("partition", partition), slog.String("err", err.Error()))
			}
			return
		}
		tl.observe(n, m, time.Now())
	}
}

// tenantCounts are one tenant's figures. A value type.
type tenantCounts struct {
	Tenant string
	Rule   string
	// Offered events; Direct: admitted by the gate; Deferred: sent to a
	// retry tier at least once; Back: forwarded downstream from the retry
	// path; Dead: dead-lettered; Waiting: deferred and not yet back nor
	// dead-lettered; Lost: offered and seen in no output topic.
	Offered, Direct, Deferred, Back, Dead, Waiting, Lost int
	// Rejected are dead-lettered without ever being deferred (by the gate).
	Rejected int
	// Duplicates are downstream copies beyond the first (at-least-once).
	Duplicates int
	// NextDue is the earliest gk-due of a waiting event.
	NextDue time.Time
}

// demoSnapshot is the tally at one moment.
type demoSnapshot struct {
	At      time.Time
	Tenants []tenantCounts
	Total   tenantCounts
	// Unknown counts ids seen in an output topic but not offered (yet).
	Unknown int
}

func (t *tally) snapshot(now time.Time) demoSnapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := demoSnapshot{At: now}
	byTenant := map[string]*tenantCounts{}
	var order []string
	for _, d := range demoTenants {
		byTenant[d.Name] = &tenantCounts{Tenant: d.Name, Rule: d.Rule}
		order = append(order, d.Name)
	}
	for _, r := range t.events {
		c := byTenant[r.tenant]
		if c == nil {
			c = &tenantCounts{Tenant: r.tenant}
			byTenant[r.tenant] = c
			order = append(order, r.tenant)
		}
		if r.offered.IsZero() {
			s.Unknown++
		} else {
			c.Offered++
		}
		switch {
		case r.direct > 0:
			c.Direct++
		case r.back > 0:
			c.Back++
		}
		if r.direct+r.back > 1 {
			c.Duplicates += r.direct + r.back - 1
		}
		if r.deferrals > 0 {
			c.Deferred++
		}
		if r.dead > 0 {
			c.Dead++
			if r.deferrals == 0 {
				c.Rejected++
			}
		}
		if r.deferrals > 0 && r.direct+r.back+r.dead == 0 {
			c.Waiting++
			if c.NextDue.IsZero() || r.due.Before(c.NextDue) {
				c.NextDue = r.due
			}
		}
		if !r.offered.IsZero() && r.direct+r.back+r.deferrals+r.dead == 0 {
			c.Lost++
		}
	}
	s.Total.Tenant = "total"
	for _, name := range order {
		c := *byTenant[name]
		s.Tenants = append(s.Tenants, c)
		s.Total.Offered += c.Offered
		s.Total.Direct += c.Direct
		s.Total.Deferred += c.Deferred
		s.Total.Back += c.Back
		s.Total.Dead += c.Dead
		s.Total.Rejected += c.Rejected
		s.Total.Waiting += c.Waiting
		s.Total.Lost += c.Lost
		s.Total.Duplicates += c.Duplicates
		if !c.NextDue.IsZero() && (s.Total.NextDue.IsZero() || c.NextDue.Before(s.Total.NextDue)) {
			s.Total.NextDue = c.NextDue
		}
	}
	return s
}

// pending returns the offered events not yet seen in any output topic, and
// the deferred events due by dueBy that are neither back nor dead-lettered.
func (t *tally) pending(dueBy time.Time) (unrouted, overdue int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.events {
		routed := r.direct+r.back+r.dead > 0
		switch {
		case !r.offered.IsZero() && !routed && r.deferrals == 0:
			unrouted++
		case r.deferrals > 0 && !routed && !r.due.After(dueBy):
			overdue++
		}
	}
	return unrouted, overdue
}

// ruleCheck is the per-window check of one tenant's rule.
type ruleCheck struct {
	Tenant string
	Rule   limit.Rule
	// Max is the most events known to have been counted in one window: the
	// events whose possible counting times all fall in that window.
	Max int
	// Held is true when every downstream event can be placed in a window it
	// may have been counted in without any window passing the limit; when
	// it is false, Worst is the most events some window had to take.
	Held  bool
	Worst int
}

// demoSummary is the result of a run.
type demoSummary struct {
	demoSnapshot
	Checks      []ruleCheck
	Traffic     time.Duration
	Interrupted bool
	Where       string
}

// OK reports whether every limit held and no event was lost.
func (s *demoSummary) OK() bool {
	if s.Total.Lost != 0 {
		return false
	}
	for _, c := range s.Checks {
		if !c.Held {
			return false
		}
	}
	return true
}

// summary returns the final snapshot and the per-window checks.
func (t *tally) summary(now time.Time) *demoSummary {
	s := &demoSummary{demoSnapshot: t.snapshot(now)}
	t.mu.Lock()
	defer t.mu.Unlock()
	spans := map[string][][2]time.Time{}
	for _, r := range t.events {
		if r.spanKnown {
			spans[r.tenant] = append(spans[r.tenant], r.span)
		}
	}
	for _, c := range s.Tenants {
		for _, rule := range t.rules.For(c.Tenant) {
			ck := checkRule(rule, demoSize(c.Tenant), spans[c.Tenant], t.loc)
			ck.Tenant = c.Tenant
			s.Checks = append(s.Checks, ck)
		}
	}
	return s
}

// checkRule checks a rule of a tenant whose events are size bytes each
// (0: not known): a byte rule is checked as a limit of whole events, and
// Max and Worst are given in bytes.
func checkRule(rule limit.Rule, size int, spans [][2]time.Time, loc *time.Location) ruleCheck {
	if rule.Measure != limit.Bytes {
		return checkWindows(rule, spans, loc)
	}
	if size <= 0 {
		// No size known: nothing to check against.
		return ruleCheck{Rule: rule, Held: true}
	}
	events := rule
	events.Limit /= int64(size)
	ck := checkWindows(events, spans, loc)
	ck.Rule, ck.Max, ck.Worst = rule, ck.Max*size, ck.Worst*size
	return ck
}

// checkWindows checks that the events, each counted at some unknown time
// within its span, can have been counted with no more than rule.Limit in any
// aligned window of rule. Spans usually fall in one window; one that
// straddles a boundary (an event admitted right at it) may go to any window
// it touches. Placing events earliest-deadline-first, window by window, finds
// a placement within the limit whenever one exists.
func checkWindows(rule limit.Rule, spans [][2]time.Time, loc *time.Location) ruleCheck {
	ck := ruleCheck{Rule: rule, Held: true}
	type item struct{ first, last time.Time } // window starts
	items := make([]item, 0, len(spans))
	definite := map[int64]int{} // window start (unix ns) -> events known to be in it
	for _, sp := range spans {
		lo, hi := sp[0], sp[1]
		if hi.Before(lo) {
			lo = hi
		}
		f, _ := limit.WindowBounds(rule, lo, loc)
		l, _ := limit.WindowBounds(rule, hi, loc)
		items = append(items, item{f, l})
		if f.Equal(l) {
			definite[f.UnixNano()]++
			ck.Max = max(ck.Max, definite[f.UnixNano()])
		}
	}
	sort.Slice(items, func(i, j int) bool { return items[i].first.Before(items[j].first) })
	h := &deadlines{}
	var cur time.Time
	for i := 0; i < len(items) || h.Len() > 0; {
		if h.Len() == 0 {
			cur = items[i].first
		}
		for ; i < len(items) && !items[i].first.After(cur); i++ {
			heap.Push(h, items[i].last)
		}
		took := 0
		for ; h.Len() > 0 && int64(took) < rule.Limit; took++ {
			heap.Pop(h)
		}
		for h.Len() > 0 && !(*h)[0].After(cur) {
			heap.Pop(h)
			took++
		}
		if int64(took) > rule.Limit {
			ck.Held = false
		}
		ck.Worst = max(ck.Worst, took)
		_, cur = limit.WindowBounds(rule, cur, loc)
	}
	if ck.Held {
		ck.Worst = 0
	}
	return ck
}

// deadlines is a min-heap of window starts.
type deadlines []time.Time

func (h deadlines) Len() int           { return len(h) }
func (h deadlines) Less(i, j int) bool { return h[i].Before(h[j]) }
func (h deadlines) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *deadlines) Push(x any)        { *h = append(*h, x.(time.Time)) }
func (h *deadlines) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
