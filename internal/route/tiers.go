package route

import (
	"strings"
	"time"
)

// Topics names the output topics. It is a value type, safe for concurrent
// use as long as it is not modified.
type Topics struct {
	// Downstream receives admitted events.
	Downstream string
	// Retry is the first retry tier; the other tiers add suffixes (see Tiers).
	Retry string
	// DLQ receives rejected and invalid events.
	DLQ string
}

// Tier is one retry tier topic. A tier holds events whose remaining delay is
// in (LowerBound, UpperBound] (the first tier also takes delays <= 0) and
// releases each one at gk-due minus LowerBound. It is a value type.
type Tier struct {
	Topic                  string
	LowerBound, UpperBound time.Duration // UpperBound 0 means none
}

// tiers are the retry tiers, shortest first, as topic suffixes of the retry
// topic: the first (no suffix) takes delays up to 1m, ".1h" up to 1h, ".long"
// anything longer.
var tiers = [...]struct {
	suffix       string
	lower, upper time.Duration
}{
	{"", 0, time.Minute},
	{".1h", time.Minute, time.Hour},
	{".long", time.Hour, 0},
}

// RetryTierSuffixes returns what the tiers after the first add to the retry
// topic's name, shortest tier first.
func RetryTierSuffixes() []string {
	var out []string
	for _, tr := range tiers {
		if tr.suffix != "" {
			out = append(out, tr.suffix)
		}
	}
	return out
}

// Tiers returns the retry tiers, shortest first.
func (t Topics) Tiers() []Tier {
	out := make([]Tier, len(tiers))
	for i, tr := range tiers {
		out[i] = Tier{Topic: t.Retry + tr.suffix, LowerBound: tr.lower, UpperBound: tr.upper}
	}
	return out
}

// RetryTier returns the tier topic for an event due in delay, and that tier's
// lower bound.
func (t Topics) RetryTier(delay time.Duration) (topic string, lowerBound time.Duration) {
	tr := pickTier(t.Tiers(), delay)
	return tr.Topic, tr.LowerBound
}

// pickTier returns the tier of tiers (as Tiers returns them) for an event due
// in delay.
func pickTier(ts []Tier, delay time.Duration) Tier {
	for _, tr := range ts[:len(ts)-1] {
		if delay <= tr.UpperBound {
			return tr
		}
	}
	return ts[len(ts)-1]
}

// Tier returns the retry tier whose topic is topic.
func (t Topics) Tier(topic string) (Tier, bool) {
	// Called per retried message: match without building the tier names.
	if rest, ok := strings.CutPrefix(topic, t.Retry); ok {
		for _, tr := range tiers {
			if tr.suffix == rest {
				return Tier{Topic: topic, LowerBound: tr.lower, UpperBound: tr.upper}, true
			}
		}
	}
	return Tier{}, false
}
