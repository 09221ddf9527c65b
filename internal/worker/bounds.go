package worker

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// settingRange is the range of one count or duration variable. The ranges
// are written once, in settingRanges: Validate checks them and the README's
// configuration table shows them (ConfigTable).
type settingRange struct {
	key      string // the variable, without the prefix
	min, max int64  // a duration's in nanoseconds
	duration bool   // the variable is a time.Duration
}

func counts(key string, lo, hi int64) settingRange {
	return settingRange{key: key, min: lo, max: hi}
}

func durations(key string, lo, hi time.Duration) settingRange {
	return settingRange{key: key, min: int64(lo), max: int64(hi), duration: true}
}

// maxDeferHorizon bounds DEFER_HORIZON. Every call for an aligned rule of
// hours, days, weeks or months carries each window boundary up to the
// horizon, so its cost grows with it: for a 10/1h rule, 0.17 ms per call at
// 24h, 0.5 ms at 744h, 5 ms at 8784h and 72 ms at 100000h
// (BenchmarkAdmitHorizon). 31 days keeps a call under a millisecond and
// still reaches the next month's window.
const maxDeferHorizon = 31 * 24 * time.Hour

// settingRanges are the bounds of every count and duration variable, in the
// order of Config's fields. TestSettingRangesCoverConfig makes sure every
// such field has one.
var settingRanges = []settingRange{
	durations("DEFER_HORIZON", time.Second, maxDeferHorizon),
	// The paced capacity (pace.go): a target wait under the interval
	// cannot be seen; the hold may be short, never zero.
	durations("CAPACITY_TARGET_WAIT", 100*time.Millisecond, time.Hour),
	durations("CAPACITY_INTERVAL", 100*time.Millisecond, time.Minute),
	durations("CAPACITY_HOLD", time.Second, 24*time.Hour),
	// Every attempt is one more trip through the retry tiers.
	counts("MAX_ATTEMPTS", 1, 1000),
	counts("BATCH_SIZE", 1, 100000),
	// RETRY_LOOKAHEAD_BYTES bounds the memory; this bounds the entries of
	// a partition's heap of waiting events.
	counts("RETRY_LOOKAHEAD", 1, 100000),
	counts("BATCH_BYTES", 1<<10, 1<<30),
	counts("RETRY_LOOKAHEAD_BYTES", 1<<10, 1<<30),
	counts("MAX_MESSAGE_BYTES", 1<<10, 100<<20),
	// Below 64 KiB a few hundred tenants fill it; the estimate is per entry.
	counts("LIMITER_CACHE_BYTES", 64<<10, 1<<30),
	// Below a millisecond a batch hardly waits; past 10s quiet tenants
	// wait for nothing.
	durations("BATCH_WAIT", time.Millisecond, 10*time.Second),
	durations("SHUTDOWN_GRACE", time.Second, 10*time.Minute),
	// Shorter timeouts fail every call (and run waits for Redis forever);
	// longer ones hold a batch that long when a server hangs.
	durations("REDIS_TIMEOUT", 10*time.Millisecond, time.Minute),
	durations("KAFKA_TIMEOUT", time.Second, 5*time.Minute),
	durations("KAFKA_SESSION_TIMEOUT", time.Second, 5*time.Minute),
	// At least the shortest retention a window gets (limit.retention); at
	// most the longest window.
	durations("RETENTION", time.Minute, limit.MaxWindow),
	// The audit of override changes: at least an hour, at most a year;
	// at least 100 entries, at most 10 million (about 1 KiB each).
	durations("OVERRIDE_AUDIT_RETENTION", time.Hour, 366*24*time.Hour),
	counts("OVERRIDE_AUDIT_MAX", 100, 10_000_000),
	// The top view's window: a second to a day.
	durations("TOP_WINDOW", time.Second, 24*time.Hour),
}

// rangeChecks returns one check per variable of settingRanges, so that a
// caller that keeps only some variables' problems (LoadUsageConfig) still
// sees those of the variables it keeps.
func (c *Config) rangeChecks() []func() error {
	fields, err := configFields(c)
	if err != nil {
		return []func() error{func() error { return err }}
	}
	checks := make([]func() error, 0, len(settingRanges))
	for _, r := range settingRanges {
		checks = append(checks, func() error {
			f, ok := fields[r.key]
			if !ok {
				return fmt.Errorf("config: no variable %s_%s", EnvPrefix, r.key)
			}
			if v := f.Int(); v < r.min || v > r.max {
				return bad(r.key, "%s is not from %s to %s", r.format(v), r.format(r.min), r.format(r.max))
			}
			return nil
		})
	}
	return checks
}

// configFields maps the variable names (without the prefix) to the fields
// of c that envconfig sets from them.
func configFields(c *Config) (map[string]reflect.Value, error) {
	keys, err := ConfigKeys()
	if err != nil {
		return nil, err
	}
	fields := leafFields(reflect.ValueOf(c).Elem(), nil)
	if len(fields) != len(keys) {
		return nil, fmt.Errorf("config has %d fields, envconfig sees %d", len(fields), len(keys))
	}
	out := make(map[string]reflect.Value, len(keys))
	for i, k := range keys {
		out[strings.TrimPrefix(k, EnvPrefix+"_")] = fields[i]
	}
	return out, nil
}

// format writes a bound or value as the variable takes it: a Go duration
// without trailing zero units ("744h", "1m", "10ms"), or a number, for
// bytes with its KiB, MiB or GiB.
func (r settingRange) format(v int64) string {
	if r.duration {
		s := time.Duration(v).String()
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
		return s
	}
	s := strconv.FormatInt(v, 10)
	if strings.HasSuffix(r.key, "_BYTES") {
		for _, u := range []struct {
			name string
			size int64
		}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
			if v >= u.size && v%u.size == 0 {
				return fmt.Sprintf("%s (%d %s)", s, v/u.size, u.name)
			}
		}
	}
	return s
}

// boundsText is the README table's bounds of a variable (without the
// prefix), or "" when it has none beyond its description.
func boundsText(key string) string {
	for _, r := range settingRanges {
		if r.key == key {
			return r.format(r.min) + " to " + r.format(r.max)
		}
	}
	switch key {
	case "LIMITS":
		return fmt.Sprintf("limits 0 to 2^%d (bytes: 0B to 2^%d, 1PiB); windows 1s to %dd (%dw, %dmo); tenants 1 to %d bytes, without = or control characters",
			bitLen(limit.MaxLimit), bitLen(limit.MaxBytesLimit), int(limit.MaxWindow/(24*time.Hour)), int(limit.MaxWindow/(7*24*time.Hour)),
			int(limit.MaxWindow/(30*24*time.Hour)), limit.MaxTenantBytes)
	case "COST_FROM":
		return fmt.Sprintf("a cost is a whole number 0 to 2^%d in plain decimal; header names not starting with gk-", bitLen(limit.MaxCost))
	case "RETRY_ACCEPT_UNSIGNED_UNTIL":
		return fmt.Sprintf("an RFC 3339 time at most %dd ahead; needs RETRY_SECRET", int(maxAcceptUnsigned/(24*time.Hour)))
	case "LIMITS_FILE":
		size := settingRange{key: "LIMITS_FILE_BYTES"}.format(maxLimitsFile)
		return "a regular file of at most " + size + " bytes, one YAML document; rules as in LIMITS"
	}
	return ""
}

// bitLen returns n's exponent when n is a power of two.
func bitLen(n int64) int {
	b := 0
	for n > 1 {
		n >>= 1
		b++
	}
	return b
}
