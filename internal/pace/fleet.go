package pace

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Key layout, under one {hash tag}:
//
//	<prefix>:{<prefix>/pace}:state  hash: the fleet's paced rate (Paced)
//	<prefix>:{<prefix>/pace}:lease  string: the replica that computes it, with a TTL
//	<prefix>:{<prefix>/pace}:cap    hash: an operator's cap (Cap), while it lasts
//	<prefix>:{<prefix>/pace}:log    stream: the caps set and lifted, with who and why
type keys struct{ state, lease, cap, log string }

func newKeys(prefix string) keys {
	base := prefix + ":{" + prefix + "/pace}:"
	return keys{state: base + "state", lease: base + "lease", cap: base + "cap", log: base + "log"}
}

// maxLog bounds the audit stream (approximately, XADD MAXLEN ~).
const maxLog = 10000

// Paced is the fleet's paced rate as the controller last stored it. It is a
// value type.
type Paced struct {
	Estimate
	At time.Time // when it was computed
	By string    // the replica that computed it
}

// Cap is an operator's cap on the capacity: at most Rate events a second
// until Until. It is a value type; its JSON is the API's.
type Cap struct {
	Rate  float64   `json:"rate"`
	Until time.Time `json:"until"`
	By    string    `json:"by"`
	Why   string    `json:"reason"`
	At    time.Time `json:"at"`
}

// CapEntry is one audit entry: a cap set or lifted. Its JSON is the API's.
type CapEntry struct {
	ID string `json:"id"`
	Op string `json:"op"` // set or lift
	Cap
}

// Fleet keeps the fleet's pacing state in Redis. Safe for concurrent use.
type Fleet struct {
	rdb     redis.UniversalClient
	keys    keys
	timeout time.Duration
}

// NewFleet returns the pacing state under prefix; every call is bounded by
// timeout (default 2s).
func NewFleet(rdb redis.UniversalClient, prefix string, timeout time.Duration) *Fleet {
	return &Fleet{rdb: rdb, keys: newKeys(prefix), timeout: cmpDur(timeout, 2*time.Second)}
}

func (f *Fleet) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, f.timeout)
}

// leaseScript takes or renews the lease.
//
// KEYS[1] the lease key. ARGV[1] the replica's id, ARGV[2] the lease in ms.
// Reply: 1 when the replica holds the lease now, else 0.
var leaseScript = redis.NewScript(`
local v = redis.call("GET", KEYS[1])
if v == ARGV[1] then
  redis.call("PEXPIRE", KEYS[1], ARGV[2])
  return 1
elseif v == false then
  redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
  return 1
end
return 0
`)

// publishScript stores the paced rate if the replica still holds the lease.
//
// KEYS[1] the lease key, KEYS[2] the state key. ARGV[1] the replica's id,
// then field, value pairs. Reply: 1 when stored, 0 when the lease is another's.
var publishScript = redis.NewScript(`
if redis.call("GET", KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call("DEL", KEYS[2])
redis.call("HSET", KEYS[2], unpack(ARGV, 2))
return 1
`)

// Lease takes or renews the lease of replica id for ttl; it reports whether
// id holds it.
func (f *Fleet) Lease(ctx context.Context, id string, ttl time.Duration) (bool, error) {
	ctx, cancel := f.ctx(ctx)
	defer cancel()
	n, err := leaseScript.Run(ctx, f.rdb, []string{f.keys.lease}, id, ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("pace lease: %w", err)
	}
	return n == 1, nil
}

// Publish stores p as the fleet's paced rate if p.By still holds the lease.
func (f *Fleet) Publish(ctx context.Context, p Paced) (bool, error) {
	ctx, cancel := f.ctx(ctx)
	defer cancel()
	av := []any{p.By,
		"rate", fmtFloat(p.Rate), "drain", fmtFloat(p.Drain), "input", fmtFloat(p.Input),
		"lag", p.Lag, "wait_ms", p.Wait.Milliseconds(), "skew", fmtFloat(p.Skew), "state", p.State, "reason", p.Reason,
		"lost_since", unixMs(p.LostSince), "at", unixMs(p.At), "by", p.By}
	n, err := publishScript.Run(ctx, f.rdb, []string{f.keys.lease, f.keys.state}, av...).Int()
	if err != nil {
		return false, fmt.Errorf("pace publish: %w", err)
	}
	return n == 1, nil
}

// Read returns the fleet's paced rate (nil: none yet) and the operator's
// cap (nil: none).
func (f *Fleet) Read(ctx context.Context) (*Paced, *Cap, error) {
	ctx, cancel := f.ctx(ctx)
	defer cancel()
	var st, cp *redis.MapStringStringCmd
	_, err := f.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		st = p.HGetAll(ctx, f.keys.state)
		cp = p.HGetAll(ctx, f.keys.cap)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("pace read: %w", err)
	}
	var paced *Paced
	if m := st.Val(); len(m) > 0 {
		paced = &Paced{At: fromMs(m["at"]), By: m["by"], Estimate: Estimate{
			Rate: toFloat(m["rate"]), Drain: toFloat(m["drain"]), Input: toFloat(m["input"]),
			Lag: int64(toFloat(m["lag"])), Wait: time.Duration(toFloat(m["wait_ms"])) * time.Millisecond, Skew: toFloat(m["skew"]),
			State: m["state"], Reason: m["reason"], LostSince: fromMs(m["lost_since"]),
		}}
	}
	var c *Cap
	if m := cp.Val(); len(m) > 0 {
		c = &Cap{Rate: toFloat(m["rate"]), Until: fromMs(m["until"]), By: m["by"], Why: m["why"], At: fromMs(m["at"])}
	}
	return paced, c, nil
}

// SetCap records an operator's cap (c.Rate > 0, c.Until after c.At) and
// its audit entry, at once; the cap key expires at c.Until.
func (f *Fleet) SetCap(ctx context.Context, c Cap) error {
	if !(c.Rate > 0) || !c.Until.After(c.At) {
		return errors.New("a cap needs a rate above 0 and an end after now")
	}
	return f.writeCap(ctx, "set", c)
}

// LiftCap removes the operator's cap, recording who and why.
func (f *Fleet) LiftCap(ctx context.Context, by, why string, at time.Time) error {
	return f.writeCap(ctx, "lift", Cap{By: by, Why: why, At: at})
}

func (f *Fleet) writeCap(ctx context.Context, op string, c Cap) error {
	ctx, cancel := f.ctx(ctx)
	defer cancel()
	_, err := f.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, f.keys.cap)
		if op == "set" {
			p.HSet(ctx, f.keys.cap, "rate", fmtFloat(c.Rate), "until", unixMs(c.Until), "by", c.By, "why", c.Why, "at", unixMs(c.At))
			p.PExpireAt(ctx, f.keys.cap, c.Until)
		}
		p.XAdd(ctx, &redis.XAddArgs{Stream: f.keys.log, MaxLen: maxLog, Approx: true, Values: []any{
			"op", op, "rate", fmtFloat(c.Rate), "until", unixMs(c.Until), "by", c.By, "why", c.Why, "at", unixMs(c.At)}})
		return nil
	})
	if err != nil {
		return fmt.Errorf("pace cap %s: %w", op, err)
	}
	return nil
}

// Audit returns up to n audit entries of the caps, newest first.
func (f *Fleet) Audit(ctx context.Context, n int64) ([]CapEntry, error) {
	ctx, cancel := f.ctx(ctx)
	defer cancel()
	msgs, err := f.rdb.XRevRangeN(ctx, f.keys.log, "+", "-", n).Result()
	if err != nil {
		return nil, fmt.Errorf("pace audit: %w", err)
	}
	out := make([]CapEntry, 0, len(msgs))
	for _, m := range msgs {
		s := func(k string) string { v, _ := m.Values[k].(string); return v }
		out = append(out, CapEntry{ID: m.ID, Op: s("op"), Cap: Cap{
			Rate: toFloat(s("rate")), Until: fromMs(s("until")), By: s("by"), Why: s("why"), At: fromMs(s("at"))}})
	}
	return out, nil
}

func fmtFloat(x float64) string { return strconv.FormatFloat(x, 'f', 3, 64) }

func toFloat(s string) float64 { x, _ := strconv.ParseFloat(s, 64); return x }

func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMs(s string) time.Time {
	ms, _ := strconv.ParseInt(s, 10, 64)
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}
