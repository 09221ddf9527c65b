package override

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// The floor check of a write. The floors of all tenants must sum to at most
// each capacity rule's limit; a replica's own copy of the overrides may lag
// another replica's write by a poll, so the check runs in the write's script,
// against the floors of the overrides in Redis: two writers on two replicas
// can never together take the floors over the capacity. Redis keeps, beside
// the records, every enforced override's floors (flr) and their sums per
// window (fsum), changed by the same script calls as the records; the writer
// sends the capacity and the floors of LIMITS or LIMITS_FILE.

// FloorCheck is what a write's floor check needs from the replica that takes
// it: the capacity and the rules of LIMITS or LIMITS_FILE. The zero value
// checks nothing.
type FloorCheck struct {
	Capacity limit.Capacity
	Base     *limit.Rules
}

// FloorsError refuses a write that would take the floors of all tenants over
// a capacity rule's limit; nothing was written.
type FloorsError struct {
	Capacity limit.Rule
	Sum      int64
}

func (e *FloorsError) Error() string {
	return fmt.Sprintf("floors: the floors of window %s would sum to %d, over the capacity %s (lower another tenant's floor first)",
		e.Capacity.WindowName(), e.Sum, e.Capacity)
}

// builtField marks the floor sums as holding every override.
const builtField = "*built"

// floorsEntry is rec's floors as the flr hash holds them, "<window>=<floor>
// ..." ("" for a share without floors), or "-" when rec puts no share in
// force (none set, or shadow).
func floorsEntry(rec *Record) (string, error) {
	if rec == nil || rec.Shadow || !rec.HasShare() {
		return "-", nil
	}
	s, err := rec.Share()
	if err != nil {
		return "", err
	}
	parts := make([]string, 0, len(s.Floors))
	for _, f := range s.Floors {
		parts = append(parts, f.Counter()+"="+strconv.FormatInt(f.Limit, 10))
	}
	return strings.Join(parts, " "), nil
}

// args returns the write script's ARGV[12:] for a write of tenant's
// override.
func (fc FloorCheck) args(tenant string) []any {
	if len(fc.Capacity) == 0 {
		return []any{0}
	}
	base := limit.BaseFloors(fc.Base.Base(), fc.Capacity)
	out := []any{len(fc.Capacity)}
	own := base[tenant]
	for i, r := range fc.Capacity {
		var f int64
		if own != nil {
			f = own[i]
		}
		out = append(out, r.Counter(), r.Limit, f)
	}
	ts := make([]string, 0, len(base))
	for t := range base {
		ts = append(ts, t)
	}
	sort.Strings(ts)
	out = append(out, len(ts))
	for _, t := range ts {
		out = append(out, t)
		for _, f := range base[t] {
			out = append(out, f)
		}
	}
	return out
}

// buildFloors fills the flr and fsum hashes from the records, when fsum
// lacks its "*built" field (keys written by an older release, or deleted):
// under WATCH of the version counter, so that a change made meanwhile makes
// it read again.
func (s *Store) buildFloors(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*s.opts.Timeout)
	defer cancel()
	for range 5 {
		err := s.rdb.Watch(ctx, func(tx *redis.Tx) error {
			if ok, err := tx.HExists(ctx, s.keys.fsum, builtField).Result(); err != nil || ok {
				return err
			}
			entries := map[string]any{}
			sums := map[string]int64{}
			var cursor uint64
			for {
				kv, next, err := tx.HScan(ctx, s.keys.rec, cursor, "", 1000).Result()
				if err != nil {
					return err
				}
				for i := 0; i+1 < len(kv); i += 2 {
					r, err := parseStored(kv[i+1])
					if err != nil {
						return fmt.Errorf("tenant %q: %w", kv[i], err)
					}
					e, err := floorsEntry(&r)
					if err != nil || e == "-" {
						continue // as the watcher: a record it cannot parse is not applied
					}
					entries[r.Tenant] = e
					sh, _ := r.Share()
					for _, f := range sh.Floors {
						sums[f.Counter()] += f.Limit
					}
				}
				if cursor = next; cursor == 0 {
					break
				}
			}
			_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Del(ctx, s.keys.flr, s.keys.fsum)
				if len(entries) > 0 {
					p.HSet(ctx, s.keys.flr, entries)
				}
				vals := map[string]any{builtField: time.Now().UnixMilli()}
				for w, n := range sums {
					vals[w] = n
				}
				p.HSet(ctx, s.keys.fsum, vals)
				return nil
			})
			return err
		}, s.keys.ver)
		if !errors.Is(err, redis.TxFailedErr) {
			if err != nil {
				return fmt.Errorf("build the overrides' floor sums: %w", err)
			}
			return nil
		}
	}
	return errors.New("build the overrides' floor sums: the overrides kept changing (5 tries)")
}
