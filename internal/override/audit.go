package override

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Entry is one audit entry: one change of one tenant's override. It is a
// value type; its JSON is the API's.
type Entry struct {
	ID      string    `json:"id"`
	Version int64     `json:"version"`
	Tenant  string    `json:"tenant"`
	Op      string    `json:"op"` // set, delete or expire
	By      string    `json:"by"`
	At      time.Time `json:"at"`
	Reason  string    `json:"reason"`
	Before  *Record   `json:"before"`
	After   *Record   `json:"after"`
}

// maxAuditScan bounds the entries one Audit call reads to find a tenant's.
const maxAuditScan = 10000

// Audit returns up to count audit entries, newest first, of tenant (empty:
// of every tenant), within the retention. Looking for one tenant's entries
// it reads at most the newest 10,000 entries.
func (s *Store) Audit(ctx context.Context, tenant string, count int) ([]Entry, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	scan := int64(count)
	if tenant != "" {
		scan = maxAuditScan
	}
	msgs, err := s.rdb.XRevRangeN(ctx, s.keys.log, "+", s.minID(s.opts.Clock()), scan).Result()
	if err != nil {
		return nil, fmt.Errorf("override audit: %w", err)
	}
	out := []Entry{}
	for _, m := range msgs {
		e, err := parseEntry(m)
		if err != nil {
			return nil, err
		}
		if tenant != "" && e.Tenant != tenant {
			continue
		}
		out = append(out, e)
		if len(out) == count {
			break
		}
	}
	return out, nil
}

// changesSince returns up to count audit entries after the stream ID from,
// oldest first.
func (s *Store) changesSince(ctx context.Context, from string, count int64) ([]Entry, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	msgs, err := s.rdb.XRangeN(ctx, s.keys.log, "("+from, "+", count).Result()
	if err != nil {
		return nil, fmt.Errorf("override changes: %w", err)
	}
	out := make([]Entry, 0, len(msgs))
	for _, m := range msgs {
		e, err := parseEntry(m)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// lastID returns the ID of the newest audit entry ("0-0": none).
func (s *Store) lastID(ctx context.Context) (string, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	msgs, err := s.rdb.XRevRangeN(ctx, s.keys.log, "+", "-", 1).Result()
	if err != nil {
		return "", fmt.Errorf("override audit: %w", err)
	}
	if len(msgs) == 0 {
		return "0-0", nil
	}
	return msgs[0].ID, nil
}

func parseEntry(m redis.XMessage) (Entry, error) {
	str := func(k string) string { s, _ := m.Values[k].(string); return s }
	e := Entry{ID: m.ID, Tenant: str("tenant"), Op: str("op"), By: str("by"), Reason: str("why")}
	var err error
	if e.Version, err = strconv.ParseInt(str("v"), 10, 64); err != nil {
		return Entry{}, fmt.Errorf("audit entry %s: version %q", m.ID, str("v"))
	}
	at, err := strconv.ParseInt(str("at"), 10, 64)
	if err != nil {
		return Entry{}, fmt.Errorf("audit entry %s: time %q", m.ID, str("at"))
	}
	e.At = time.UnixMilli(at).UTC()
	bv, _ := strconv.ParseInt(str("bv"), 10, 64)
	for _, f := range []struct {
		key string
		dst **Record
		ver int64
	}{{"before", &e.Before, bv}, {"after", &e.After, e.Version}} {
		if s := str(f.key); s != "" {
			var r Record
			if err := json.Unmarshal([]byte(s), &r); err != nil {
				return Entry{}, fmt.Errorf("audit entry %s: %s: %w", m.ID, f.key, err)
			}
			r.Version = f.ver
			*f.dst = &r
		}
	}
	return e, nil
}
