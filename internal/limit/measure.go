package limit

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Measure is what a rule counts: events, the events' bytes, or units of a
// cost each event carries (GATEKEEPER_COST_FROM).
type Measure uint8

// The measures of a rule, told apart in LIMITS by the limit's suffix.
const (
	// Events: every event costs 1 ("1000/1m").
	Events Measure = iota
	// Bytes: an event costs its size in bytes ("10MiB/1m", see Cost).
	Bytes
	// Units: an event costs the units it carries ("5000u/1m", see Cost).
	Units
)

// String returns the measure's name, as in reasons and the usage API.
func (m Measure) String() string {
	switch m {
	case Events:
		return "events"
	case Bytes:
		return "bytes"
	case Units:
		return "units"
	}
	return "?"
}

// keySuffix is the measure's part of a rule's counter key (Rule.Counter):
// none for events, so that the keys of event rules are those of before.
func (m Measure) keySuffix() string {
	switch m {
	case Bytes:
		return "/bytes"
	case Units:
		return "/units"
	}
	return ""
}

// MaxBytesLimit is the largest limit of a byte rule (1 PiB; MaxLimit bounds
// event and unit rules): counts stay exact in the scripts, whose numbers are
// doubles (exact below 2^53), even when an event's cost is added to a count
// at its limit.
const MaxBytesLimit = 1 << 50

// MaxCost is the largest cost in units one event may carry; an event's
// bytes are bounded by Kafka's message size.
const MaxCost = 1 << 40

// byteSuffixes are the suffixes of a byte limit, with their factor. Both
// "kB" (SI) and "KB" mean 1000 bytes.
var byteSuffixes = []struct {
	name   string
	factor int64
}{
	// Binary first: format prefers them on a tie.
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"kB", 1e3},
	{"B", 1},
}

// parseLimit parses a rule's limit: a whole number of events ("1000"), of
// bytes with a suffix of byteSuffixes ("10MiB", "500KB", "300B"), or of
// units with the suffix u ("5000u").
func parseLimit(s string) (int64, Measure, error) {
	measure, factor, digits := Events, int64(1), s
	switch {
	case strings.HasSuffix(s, "u"):
		measure, digits = Units, strings.TrimSuffix(s, "u")
	case strings.HasSuffix(s, "B"):
		for _, b := range byteSuffixes {
			if strings.HasSuffix(s, b.name) {
				measure, factor, digits = Bytes, b.factor, strings.TrimSuffix(s, b.name)
				break
			}
		}
	}
	max := int64(MaxLimit)
	if measure == Bytes {
		max = MaxBytesLimit
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n < 0 || digits[0] == '+' || n > max/factor {
		return 0, 0, limitError(s, measure)
	}
	return n * factor, measure, nil
}

// limitError words a limit that parseLimit could not read.
func limitError(s string, m Measure) error {
	switch m {
	case Bytes:
		return fmt.Errorf("limit %q is not a whole number of bytes up to 1PiB (2^50) with a suffix B, KB, MB, GB, TB, KiB, MiB, GiB or TiB", s)
	case Units:
		return fmt.Errorf("limit %q is not a whole number of units from 0 to 2^40", s)
	}
	return fmt.Errorf("limit %q is not a whole number from 0 to 2^40 (or bytes, e.g. 10MiB, or units, e.g. 500u)", s)
}

// format writes a limit of the measure as LIMITS takes it back.
func (m Measure) format(limit int64) string {
	switch m {
	case Bytes:
		// The suffix that writes the smallest whole number, binary on a tie.
		best := byteSuffixes[len(byteSuffixes)-1]
		for _, b := range byteSuffixes {
			if limit%b.factor == 0 && limit/b.factor < limit/best.factor {
				best = b
			}
		}
		return strconv.FormatInt(limit/best.factor, 10) + best.name
	case Units:
		return strconv.FormatInt(limit, 10) + "u"
	}
	return strconv.FormatInt(limit, 10)
}

// Cost is what one event costs the rules that do not count events: its size
// in bytes (key, value and headers as read from the source, see
// route.EventBytes) and, when GATEKEEPER_COST_FROM is set, the units it
// carries. Event rules count every event as 1. It is a value type.
type Cost struct {
	Bytes, Units int64
}

// of returns what the event costs a rule of measure m.
func (c Cost) of(m Measure) int64 {
	switch m {
	case Bytes:
		return c.Bytes
	case Units:
		return c.Units
	}
	return 1
}

// ErrCost is wrapped by the errors of a cost that no rule may count.
var ErrCost = errors.New("bad cost")

// Check reports a cost that is negative or over MaxCost units.
func (c Cost) Check() error {
	switch {
	case c.Bytes < 0:
		return fmt.Errorf("%w: %d bytes is negative", ErrCost, c.Bytes)
	case c.Units < 0:
		return fmt.Errorf("%w: %d units is negative", ErrCost, c.Units)
	case c.Units > MaxCost:
		return fmt.Errorf("%w: %d units is over 2^40", ErrCost, c.Units)
	case c.Bytes > MaxBytesLimit:
		return fmt.Errorf("%w: %d bytes is over 2^50", ErrCost, c.Bytes)
	}
	return nil
}

// CountsCosts reports whether a rule list counts something other than events
// (bytes or units): its tenant's events then need their costs.
func CountsCosts(rules []Rule) bool {
	for _, r := range rules {
		if r.Measure != Events {
			return true
		}
	}
	return false
}

// Counts reports whether rules holds a rule of measure m.
func (rs *Rules) Counts(m Measure) bool {
	for _, rules := range ruleLists(rs) {
		for _, r := range rules {
			if r.Measure == m {
				return true
			}
		}
	}
	return false
}

// overLimit returns the reason of an event whose cost is over the whole
// limit of one of rules (it could never fit in any window), or "".
func overLimit(rules []Rule, c Cost) string {
	for _, r := range rules {
		if r.Measure != Events && c.of(r.Measure) > r.Limit {
			return fmt.Sprintf("cost of %d %s over the whole limit of rule %s", c.of(r.Measure), r.Measure, r)
		}
	}
	return ""
}

// overCapacity returns the reason of an event whose cost is over the whole
// limit of a capacity rule c of bytes or units in force (no window of a
// call could hold it), or "".
func overCapacity(c Capacity, cost Cost) string {
	for _, r := range c {
		if r.Measure != Events && cost.of(r.Measure) > r.Limit {
			return fmt.Sprintf("cost of %d %s over the whole capacity %s", cost.of(r.Measure), r.Measure, r)
		}
	}
	return ""
}

// takeCosts keeps, for each group of a tenant whose rules or capacity count
// bytes or units, the costs of its events in g.costs (all in one array), and
// takes out of g.idx, with their decision in out, the events whose cost is
// not valid or is over the whole limit of one of the rules or of the
// capacity in force c.
func takeCosts(groups []*group, costs []Cost, out []Decision, c Capacity) {
	var buf []Cost
	for _, g := range groups {
		if !g.byCost {
			continue
		}
		if buf == nil {
			buf = make([]Cost, 0, len(costs))
		}
		start, keep := len(buf), g.idx[:0]
		for _, i := range g.idx {
			cost := costs[i]
			if err := cost.Check(); err != nil {
				out[i] = Decision{Kind: Reject, Reason: err.Error()}
				continue
			}
			why := overLimit(g.rules, cost)
			if why == "" {
				why = overCapacity(c, cost)
			}
			if why != "" {
				out[i] = Decision{Kind: Reject, Reason: why}
				continue
			}
			keep = append(keep, i)
			buf = append(buf, cost)
		}
		g.idx, g.costs = keep, buf[start:len(buf):len(buf)]
	}
}

// costOf returns the cost of the batch's event i, one of g's (zero when
// g's rules count events only).
func (g *group) costOf(i int) Cost {
	for j, k := range g.idx {
		if k == i && g.costs != nil {
			return g.costs[j]
		}
	}
	return Cost{}
}

// fullFor reports whether the tenant's state known full holds for events
// of costs (nil: events only): the window search that found no room up to
// the horizon was for an event of st.fullCost, so every event that costs at
// least as much in each measure finds none either. A cheaper event may
// still fit, and goes to Redis.
func (st *tenantState) fullFor(costs []Cost) bool {
	for _, c := range costs {
		if c.Bytes < st.fullCost.Bytes || c.Units < st.fullCost.Units {
			return false
		}
	}
	return true
}

// anyCosts reports whether one of groups has costs.
func anyCosts(groups []*group) bool {
	for _, g := range groups {
		if g.costs != nil {
			return true
		}
	}
	return false
}

// appendCosts writes, with num, the costs of the events of g, the ti-th
// tenant of a script call, for admit.lua (see "Costs" there): ti, then per
// rule, and after them per rule of the capacity c, the list it counts by
// (0: none, an event rule; 1, 2: the lists that follow), then the events'
// bytes if a rule counts bytes, then their units if a rule counts units.
func appendCosts(num func(int64), ti int, g *group, c Capacity) {
	lists := []Measure{}
	for _, m := range []Measure{Bytes, Units} {
		if c.Measure() == m || slices.ContainsFunc(g.rules, func(r Rule) bool { return r.Measure == m }) {
			lists = append(lists, m)
		}
	}
	listOf := func(m Measure) int64 {
		for j, l := range lists {
			if l == m {
				return int64(j + 1)
			}
		}
		return 0
	}
	num(int64(ti))
	for _, r := range g.rules {
		num(listOf(r.Measure))
	}
	for _, r := range c {
		num(listOf(r.Measure))
	}
	for _, m := range lists {
		for _, c := range g.costs {
			num(c.of(m))
		}
	}
}
