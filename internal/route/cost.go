package route

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// CostFrom reads what an event costs the rules that do not count events
// (see limit.Cost): its bytes, always, and the units it carries, from one of
// its headers or a field of its JSON value, as configured by
// GATEKEEPER_COST_FROM. A nil *CostFrom reads bytes only.
//
// A CostFrom is immutable and safe for concurrent use.
type CostFrom struct {
	spec string
	ex   *Extractor // a header or json Extractor that returns the field as written
}

// ParseCostFrom parses a cost source: "header:<name>" or "json:<dot.path>",
// as for the tenant (see ParseTenantFrom); the empty spec means no units
// (nil, nil). A header name may not start with "gk-": Gatekeeper owns those
// headers and removes them from events. The error names the spec.
func ParseCostFrom(spec string) (*CostFrom, error) {
	if spec == "" {
		return nil, nil
	}
	if !strings.HasPrefix(spec, "header:") && !strings.HasPrefix(spec, "json:") {
		return nil, fmt.Errorf("cost source %q: want header:<name> or json:<dot.path>", spec)
	}
	if strings.HasPrefix(spec, "header:"+HeaderPrefix) {
		return nil, fmt.Errorf("cost source %q: headers starting with %q are Gatekeeper's", spec, HeaderPrefix)
	}
	ex, err := ParseTenantFrom(spec)
	if err != nil {
		return nil, fmt.Errorf("cost source %q: %s", spec, strings.TrimPrefix(err.Error(), fmt.Sprintf("tenant source %q: ", spec)))
	}
	ex.number = true
	return &CostFrom{spec: spec, ex: ex}, nil
}

// String returns the spec the CostFrom was parsed from ("" when nil).
func (c *CostFrom) String() string {
	if c == nil {
		return ""
	}
	return c.spec
}

// Cost returns what m costs. A non-nil error means the event is invalid;
// its text is the dead-letter reason, for example `cost: no header "cost"`,
// `cost: json path "a.b" not found`, `cost: json path "a.b" is not a
// number`, `cost "-3" is negative`, `cost "2.5" is not a whole number`,
// `cost "1e3" is not a whole number in plain decimal` or `cost
// "2000000000000" is over 2^40`. A header that appears more than once must
// hold the same value in each (readers may take either).
func (c *CostFrom) Cost(m kafka.Message) (limit.Cost, error) {
	cost := limit.Cost{Bytes: EventBytes(m)}
	if c == nil {
		return cost, nil
	}
	var text string
	var err error
	if c.ex.source == fromHeader {
		text, err = c.ex.headerTenant(m.Headers)
	} else {
		text, err = c.ex.jsonTenant(m.Value)
	}
	if err != nil {
		return limit.Cost{}, fmt.Errorf("cost: %w", err)
	}
	cost.Units, err = parseCost(text)
	return cost, err
}

// parseCost reads a cost in units: a whole number from 0 to limit.MaxCost in
// plain decimal.
func parseCost(text string) (int64, error) {
	digits := strings.TrimPrefix(text, "-")
	plain := digits != ""
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			plain = false
		}
	}
	q := strconv.Quote(text)
	if len(q) > 40 {
		q = q[:36] + `..."`
	}
	switch {
	case plain && digits != text:
		return 0, fmt.Errorf("cost %s is negative", q)
	case plain:
		n, err := strconv.ParseInt(digits, 10, 64)
		if err != nil || n > limit.MaxCost {
			return 0, fmt.Errorf("cost %s is over 2^40", q)
		}
		return n, nil
	}
	if f, err := strconv.ParseFloat(text, 64); err == nil {
		if f < 0 {
			return 0, fmt.Errorf("cost %s is negative", q)
		}
		if f != float64(int64(f)) {
			return 0, fmt.Errorf("cost %s is not a whole number", q)
		}
		return 0, fmt.Errorf("cost %s is not a whole number in plain decimal", q)
	}
	return 0, fmt.Errorf("cost %s is not a number", q)
}

// EventBytes is what an event costs a byte rule: the lengths of its key,
// its value, and the names and values of its headers, as read from the
// source. Headers starting with "gk-" are not counted: Gatekeeper removes
// them from source events and adds its own to deferred ones, so an event
// costs the same when it comes back from a retry tier.
func EventBytes(m kafka.Message) int64 {
	n := int64(len(m.Key)) + int64(len(m.Value))
	for _, h := range m.Headers {
		if !isGK(h.Key) {
			n += int64(len(h.Key)) + int64(len(h.Value))
		}
	}
	return n
}
