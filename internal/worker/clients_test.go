package worker

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestNewRedisKind checks the rule of REDIS_ADDRS: more than one address
// means Redis Cluster.
func TestNewRedisKind(t *testing.T) {
	tests := []struct {
		name    string
		addrs   []string
		cluster bool
	}{
		{"one address", []string{"127.0.0.1:6379"}, false},
		{"three addresses", []string{"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rdb := NewRedis(&Config{RedisAddrs: tt.addrs, RedisTimeout: time.Second})
			defer rdb.Close()
			switch c := rdb.(type) {
			case *redis.ClusterClient:
				if !tt.cluster {
					t.Errorf("got a cluster client, want a single-node client")
				}
			case *redis.Client:
				if tt.cluster {
					t.Errorf("got a single-node client, want a cluster client")
				} else if got := c.Options().Addr; got != tt.addrs[0] {
					t.Errorf("got address %q, want %q", got, tt.addrs[0])
				}
			default:
				t.Errorf("got %T, want *redis.Client or *redis.ClusterClient", rdb)
			}
		})
	}
}
