package override

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/lua"
)

// StoreOptions configure a Store. The zero value of each field means its
// default.
type StoreOptions struct {
	// Prefix is REDIS_KEY_PREFIX. Default "gk".
	Prefix string
	// AuditMax bounds the audit entries kept (approximately: Redis trims
	// whole stream nodes). Default 100000.
	AuditMax int64
	// AuditRetention bounds how long an audit entry is kept and shown.
	// Default 30 days.
	AuditRetention time.Duration
	// Timeout bounds every Redis call. Default 2s.
	Timeout time.Duration
	// Clock stamps the changes. Default time.Now.
	Clock func() time.Time
	// Floors, when set, gives the capacity and the rules of LIMITS or
	// LIMITS_FILE that each write's floors are checked against, in the
	// write's script (floors.go). Nil: not checked.
	Floors func() FloorCheck
}

// Store reads and writes the live overrides in Redis. It is safe for
// concurrent use.
type Store struct {
	rdb    redis.UniversalClient
	keys   keys
	opts   StoreOptions
	write  *redis.Script
	expire *redis.Script
}

// Errors of the Store's writes that callers branch on.
var (
	// ErrNotFound: the tenant has no override.
	ErrNotFound = errors.New("no override for this tenant")
)

// StaleError refuses a write that named a version other than the tenant's
// current one; nothing was written.
type StaleError struct {
	Expected, Current int64
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("stale version: the write expected version %d, the override is at version %d (read it again and decide again)", e.Expected, e.Current)
}

// NewStore returns a Store and loads its scripts into Redis.
func NewStore(ctx context.Context, rdb redis.UniversalClient, opts StoreOptions) (*Store, error) {
	if opts.Prefix == "" {
		opts.Prefix = "gk"
	}
	if opts.AuditMax == 0 {
		opts.AuditMax = 100000
	}
	if opts.AuditRetention == 0 {
		opts.AuditRetention = 30 * 24 * time.Hour
	}
	if opts.Timeout == 0 {
		opts.Timeout = 2 * time.Second
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	s := &Store{rdb: rdb, keys: newKeys(opts.Prefix), opts: opts,
		write: redis.NewScript(lua.OverrideWrite), expire: redis.NewScript(lua.OverrideExpire)}
	for _, sc := range []*redis.Script{s.write, s.expire} {
		cctx, cancel := context.WithTimeout(ctx, opts.Timeout)
		err := sc.Load(cctx, rdb).Err()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("load override script: %w", err)
		}
	}
	return s, nil
}

func (s *Store) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.opts.Timeout)
}

// minID is the oldest audit entry kept: now minus the retention, as a
// stream ID.
func (s *Store) minID(now time.Time) string {
	return strconv.FormatInt(now.Add(-s.opts.AuditRetention).UnixMilli(), 10)
}

// Set writes rec (its Tenant, Rules, Shadow, Weight, Floor, Expires,
// Reason and By; the Store stamps At) if the tenant's current version is
// expect (0: it has no override), and returns it with its new version. A
// *StaleError means another write came first. The caller checks rec
// (Record.Check).
func (s *Store) Set(ctx context.Context, rec Record, expect int64) (Record, error) {
	rec.At = s.opts.Clock().UTC().Truncate(time.Millisecond)
	rec.Version = 0
	data, err := json.Marshal(rec)
	if err != nil {
		return Record{}, err
	}
	var exp int64
	if rec.Expires != nil {
		exp = rec.Expires.UnixMilli()
	}
	entry, err := floorsEntry(&rec)
	if err != nil {
		return Record{}, err
	}
	v, err := s.run(ctx, rec.Tenant, expect, "set", string(data), exp, rec.By, rec.Reason, entry)
	if err != nil {
		return Record{}, err
	}
	rec.Version = v
	return rec, nil
}

// Delete deletes the tenant's override if its version is expect, and
// returns the version of the deletion. ErrNotFound: there is none.
func (s *Store) Delete(ctx context.Context, tenant string, expect int64, by, reason string) (int64, error) {
	return s.run(ctx, tenant, expect, "delete", "", 0, by, reason, "-")
}

// run calls the write script; floors is the tenant's floors entry after the
// write (floorsEntry). The floors are checked when the options say against
// what; a missing floor index is built once and the write tried again.
func (s *Store) run(ctx context.Context, tenant string, expect int64, op, data string, exp int64, by, reason, floors string) (int64, error) {
	var fc FloorCheck
	if s.opts.Floors != nil {
		fc = s.opts.Floors()
	}
	for try := 0; ; try++ {
		res, err := s.call(ctx, tenant, expect, op, data, exp, by, reason, floors, fc)
		if err != nil {
			return 0, err
		}
		switch res[0] {
		case 1:
			return res[1], nil
		case 0:
			return 0, &StaleError{Expected: expect, Current: res[1]}
		case -1:
			return 0, ErrNotFound
		case -2:
			if len(res) < 3 || res[1] < 1 || int(res[1]) > len(fc.Capacity) {
				return 0, fmt.Errorf("override %s: unexpected reply %v", op, res)
			}
			return 0, &FloorsError{Capacity: fc.Capacity[res[1]-1], Sum: res[2]}
		}
		if try > 0 {
			return 0, fmt.Errorf("override %s: the floor sums are still not built", op)
		}
		if err := s.buildFloors(ctx); err != nil {
			return 0, err
		}
	}
}

func (s *Store) call(ctx context.Context, tenant string, expect int64, op, data string, exp int64, by, reason, floors string, fc FloorCheck) ([]int64, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	now := s.opts.Clock()
	args := append([]any{tenant, expect, op, data, exp, by, now.UnixMilli(), reason, s.opts.AuditMax, s.minID(now), floors},
		fc.args(tenant)...)
	res, err := s.write.Run(ctx, s.rdb, s.keys.all(), args...).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("override %s: %w", op, err)
	}
	if len(res) < 2 {
		return nil, fmt.Errorf("override %s: unexpected reply %v", op, res)
	}
	return res, nil
}

// parseStored reads a records hash value, "<version> <JSON>".
func parseStored(v string) (Record, error) {
	ver, data, ok := strings.Cut(v, " ")
	if !ok {
		return Record{}, errors.New("stored override: no version")
	}
	var r Record
	if err := json.Unmarshal([]byte(data), &r); err != nil {
		return Record{}, fmt.Errorf("stored override: %w", err)
	}
	n, err := strconv.ParseInt(ver, 10, 64)
	if err != nil {
		return Record{}, fmt.Errorf("stored override: version %q", ver)
	}
	r.Version = n
	return r, nil
}

// Get returns the tenant's override as stored (an expired one the sweep
// has not deleted yet included; see Record.Expires), or ErrNotFound.
func (s *Store) Get(ctx context.Context, tenant string) (Record, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	v, err := s.rdb.HGet(ctx, s.keys.rec, tenant).Result()
	if errors.Is(err, redis.Nil) {
		return Record{}, ErrNotFound
	}
	if err != nil {
		return Record{}, fmt.Errorf("override get: %w", err)
	}
	return parseStored(v)
}

// List returns one page of overrides from cursor (0: the first), about
// count of them (HSCAN's COUNT: a hint), and the cursor of the next page
// (0: none).
func (s *Store) List(ctx context.Context, cursor uint64, count int64) ([]Record, uint64, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	kv, next, err := s.rdb.HScan(ctx, s.keys.rec, cursor, "", count).Result()
	if err != nil {
		return nil, 0, fmt.Errorf("override list: %w", err)
	}
	out := make([]Record, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		r, err := parseStored(kv[i+1])
		if err != nil {
			return nil, 0, fmt.Errorf("tenant %q: %w", kv[i], err)
		}
		out = append(out, r)
	}
	return out, next, nil
}

// Version returns the last version given out (0: no change yet).
func (s *Store) Version(ctx context.Context) (int64, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	v, err := s.rdb.Get(ctx, s.keys.ver).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("override version: %w", err)
	}
	return v, nil
}

// ExpireDue deletes up to max overrides whose expiry has passed, each with
// an audit entry by "expiry", and returns how many it deleted.
func (s *Store) ExpireDue(ctx context.Context, max int) (int, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	now := s.opts.Clock()
	n, err := s.expire.Run(ctx, s.rdb, s.keys.all(), now.UnixMilli(), max, ExpiryActor, s.opts.AuditMax, s.minID(now)).Int()
	if err != nil {
		return 0, fmt.Errorf("override expire: %w", err)
	}
	return n, nil
}

// ExpiryActor is the name of the expiry sweep in the audit.
const ExpiryActor = "expiry"

// Layer returns base with the tenant's override in force now, if it has
// one that is neither expired nor shadow: the rules a replica enforces
// for the tenant (for a one-off reader such as `gatekeeper usage`).
func (s *Store) Layer(ctx context.Context, base *limit.Rules, tenant string) (*limit.Rules, error) {
	rec, err := s.Get(ctx, tenant)
	if errors.Is(err, ErrNotFound) {
		return base, nil
	}
	if err != nil {
		return nil, err
	}
	if rec.Shadow || rec.expired(s.opts.Clock()) {
		return base, nil
	}
	o, err := overlayOf(rec)
	if err != nil {
		return nil, err
	}
	return base.WithOverlays(map[string]limit.Overlay{tenant: o}, rec.Version), nil
}
