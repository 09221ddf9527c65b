package top

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Key layout, one {hash tag} so that a read is one MGET on Redis Cluster
// (the "/" keeps it apart from every tenant's keys, as in override):
//
//	<prefix>:{<prefix>/top}:replicas        sorted set: replica -> last publish (unix ms)
//	<prefix>:{<prefix>/top}:r.<replica>     string: the replica's Tables (JSON), with a TTL
//
// No ":" follows the tag's "}:" (a replica's name holds none: host/pid), so
// that these keys never match the counters' <prefix>:{<tenant>}:<counter>:<start>.
type keys struct{ replicas, base string }

func newKeys(prefix string) keys {
	b := prefix + ":{" + prefix + "/top}:"
	return keys{replicas: b + "replicas", base: b + "r."}
}

// Stale is how long a replica's published tables count after its last
// publish: a replica gone for longer drops out of the view.
const Stale = 5 * time.Second

// PublishK is how many tenants per ranking a replica publishes.
const PublishK = 50

// MaxReplicas bounds the replicas one read merges.
const MaxReplicas = 256

// Publisher writes a Tracker's top tables to Redis once a second.
type Publisher struct {
	Tracker *Tracker
	Redis   redis.UniversalClient
	Prefix  string
	// Replica names this replica (unique among replicas: host and pid).
	Replica string
	Timeout time.Duration
	Log     *slog.Logger
}

// Run publishes every second until ctx is done; errors are logged once
// until a publish works again. It returns nil.
func (p *Publisher) Run(ctx context.Context) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := p.Publish(ctx); err != nil {
			if !failing && ctx.Err() == nil {
				p.Log.Warn("cannot publish the top tenants", slog.String("err", err.Error()))
			}
			failing = true
			continue
		}
		failing = false
	}
}

// Publish writes the tables once: one pipeline of three commands.
func (p *Publisher) Publish(ctx context.Context) error {
	data, err := json.Marshal(p.Tracker.Top(PublishK))
	if err != nil {
		return err
	}
	k := newKeys(p.Prefix)
	ctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	now := time.Now()
	ttl := 2*p.Tracker.Window() + Stale
	_, err = p.Redis.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Set(ctx, k.base+p.Replica, data, ttl)
		pipe.ZAdd(ctx, k.replicas, redis.Z{Score: float64(now.UnixMilli()), Member: p.Replica})
		pipe.ZRemRangeByScore(ctx, k.replicas, "-inf", strconv.FormatInt(now.Add(-ttl).UnixMilli(), 10))
		return nil
	})
	if err != nil {
		return fmt.Errorf("publish top: %w", err)
	}
	return nil
}

// Merged is the view of all replicas: their tables summed by tenant.
type Merged struct {
	Tables
	Replicas int `json:"replicas"`
}

// Read merges the tables the replicas published in the last Stale: three
// commands whatever the number of tenants, at most MaxReplicas replicas.
func Read(ctx context.Context, rdb redis.UniversalClient, prefix string, timeout time.Duration) (Merged, error) {
	k := newKeys(prefix)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ids, err := rdb.ZRevRangeByScore(ctx, k.replicas, &redis.ZRangeBy{
		Min: strconv.FormatInt(time.Now().Add(-Stale).UnixMilli(), 10), Max: "+inf", Count: MaxReplicas}).Result()
	if err != nil {
		return Merged{}, fmt.Errorf("read top: %w", err)
	}
	out := Merged{Tables: Tables{Current: Table{Rows: []Row{}}, Last: Table{Rows: []Row{}}}}
	if len(ids) == 0 {
		return out, nil
	}
	names := make([]string, len(ids))
	for i, id := range ids {
		names[i] = k.base + id
	}
	vals, err := rdb.MGet(ctx, names...).Result()
	if err != nil {
		return Merged{}, fmt.Errorf("read top: %w", err)
	}
	var all []Tables
	for _, v := range vals {
		s, ok := v.(string)
		if !ok {
			continue
		}
		var t Tables
		if err := json.Unmarshal([]byte(s), &t); err != nil {
			return Merged{}, fmt.Errorf("read top: a replica's table: %w", err)
		}
		all = append(all, t)
	}
	out.Replicas = len(all)
	if len(all) == 0 {
		return out, nil
	}
	// The newest current window is the current one; a replica whose
	// current window is older (it saw nothing since) adds to the last.
	var newest time.Time
	for _, t := range all {
		if t.Current.Start.After(newest) {
			newest = t.Current.Start
		}
		out.Window = t.Window
	}
	cur, last := map[string]*Row{}, map[string]*Row{}
	out.Current.Start = newest
	out.Last.Start = newest.Add(-windowOf(out.Window))
	for _, t := range all {
		for _, tab := range []Table{t.Current, t.Last} {
			into, intoTab := cur, &out.Current
			switch {
			case tab.Start.Equal(newest):
			case tab.Start.Equal(out.Last.Start):
				into, intoTab = last, &out.Last
			default:
				continue
			}
			intoTab.Other.add(tab.Other)
			for _, r := range tab.Rows {
				m := into[r.Tenant]
				if m == nil {
					m = &Row{Tenant: r.Tenant}
					into[r.Tenant] = m
				}
				m.Counts.add(r.Counts)
				m.Waiting += r.Waiting
			}
		}
	}
	for _, r := range cur {
		out.Current.Rows = append(out.Current.Rows, *r)
	}
	for _, r := range last {
		out.Last.Rows = append(out.Last.Rows, *r)
	}
	SortRows(out.Current.Rows, "deferred")
	SortRows(out.Last.Rows, "deferred")
	return out, nil
}

func windowOf(s string) time.Duration {
	d, _ := time.ParseDuration(s)
	return d
}
