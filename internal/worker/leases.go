package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisLeases keeps the retry group members' leases (consume.Leases) in
// Redis: one key per member, <prefix>:{lease:<group>}:<member>, set with a
// time to live of the lease (so a lease ends on Redis's clock, whatever the
// replicas' clocks say) and gone once it ends. The group sits in a hash tag:
// on Redis Cluster one MGET reads every member's lease. It is safe for
// concurrent use.
type redisLeases struct {
	rdb    redis.UniversalClient
	prefix string
}

func (l redisLeases) key(group, member string) string {
	return l.prefix + ":{lease:" + group + "}:" + member
}

// Renew sets member's lease to end ttl from now.
func (l redisLeases) Renew(ctx context.Context, group, member string, ttl time.Duration) error {
	if err := l.rdb.Set(ctx, l.key(group, member), 1, ttl).Err(); err != nil {
		return fmt.Errorf("renew lease: %w", err)
	}
	return nil
}

// Held reports whose lease has not ended.
func (l redisLeases) Held(ctx context.Context, group string, members []string) ([]bool, error) {
	if len(members) == 0 {
		return nil, nil
	}
	keys := make([]string, len(members))
	for i, m := range members {
		keys[i] = l.key(group, m)
	}
	vals, err := l.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, fmt.Errorf("read leases: %w", err)
	}
	held := make([]bool, len(vals))
	for i, v := range vals {
		held[i] = v != nil
	}
	return held, nil
}
