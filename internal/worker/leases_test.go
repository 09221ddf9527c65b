package worker

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// The retry group's leases on a real Redis and Redis Cluster: a renewed
// lease is held until its time to live has passed on Redis's clock.
func TestRedisLeases(t *testing.T) {
	single, _ := testenv.Redis(t)
	for name, rdb := range map[string]redis.UniversalClient{"single": single, "cluster": testenv.RedisCluster(t)} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			l := redisLeases{rdb: rdb, prefix: "gktest:leases:" + time.Now().Format("150405.000000000")}
			if err := l.Renew(ctx, "g.retry", "m1", 300*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			if err := l.Renew(ctx, "g.retry", "m2", time.Minute); err != nil {
				t.Fatal(err)
			}
			held, err := l.Held(ctx, "g.retry", []string{"m1", "m2", "m3"})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]bool{true, true, false}, held); diff != "" {
				t.Errorf("held (-want +got):\n%s", diff)
			}
			time.Sleep(400 * time.Millisecond)
			held, err = l.Held(ctx, "g.retry", []string{"m1", "m2"})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]bool{false, true}, held); diff != "" {
				t.Errorf("held after m1's lease ended (-want +got):\n%s", diff)
			}
		})
	}
}
