package limit

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// safePolicy is the one maxmemory-policy under which Redis never evicts a
// counter key.
const safePolicy = "noeviction"

// CheckEviction reads Redis's maxmemory-policy (on every master of a Redis
// Cluster) and returns a warning naming the policy when Redis may evict
// counter keys, or "" when it may not. Only noeviction is safe: every
// counter key has a TTL, so the volatile-* policies may evict live counters
// as the allkeys-* ones do (volatile-ttl picks the keys nearest their expiry
// first: the current windows of short rules), and an evicted window starts
// again from zero, which lets its limit be passed. Under noeviction a full
// Redis refuses writes instead: admission fails and consumption pauses.
//
// A non-nil error means the policy could not be read (managed Redis services
// often refuse CONFIG); the caller may go on without the check. Calls are
// bounded by ctx and the client's timeouts.
func CheckEviction(ctx context.Context, rdb redis.UniversalClient) (warning string, err error) {
	var mu sync.Mutex
	unsafe := map[string][]string{} // policy -> nodes
	check := func(ctx context.Context, c *redis.Client) error {
		addr := c.Options().Addr
		v, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		if err != nil {
			return fmt.Errorf("read maxmemory-policy of %s: %w", addr, err)
		}
		p, ok := v["maxmemory-policy"]
		if !ok {
			return fmt.Errorf("read maxmemory-policy of %s: not reported", addr)
		}
		if p != safePolicy {
			mu.Lock()
			unsafe[p] = append(unsafe[p], addr)
			mu.Unlock()
		}
		return nil
	}
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, check)
	case *redis.Client:
		err = check(ctx, c)
	default:
		err = fmt.Errorf("read maxmemory-policy: unsupported client %T", rdb)
	}
	if err != nil {
		return "", err
	}
	return evictionWarning(unsafe), nil
}

// evictionWarning words the warning for the unsafe policies found, each with
// its nodes; "" when there are none.
func evictionWarning(unsafe map[string][]string) string {
	if len(unsafe) == 0 {
		return ""
	}
	parts := make([]string, 0, len(unsafe))
	for p, nodes := range unsafe {
		sort.Strings(nodes)
		parts = append(parts, p+" ("+strings.Join(nodes, ", ")+")")
	}
	sort.Strings(parts)
	return "redis maxmemory-policy is " + strings.Join(parts, ", ") +
		": Redis may evict counter keys when memory runs short, which resets their counts and lets limits be passed; set maxmemory-policy to " + safePolicy
}
