package worker

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// TestLoadUsageConfig checks that the usage configuration reads the Redis
// variables and the rules as LoadConfig does, and nothing else.
func TestLoadUsageConfig(t *testing.T) {
	setEnv(t, map[string]string{
		"REDIS_ADDRS": "r:7000", "REDIS_CLUSTER": "true", "REDIS_KEY_PREFIX": "p", "REDIS_TIMEOUT": "3s",
		"REDIS_USERNAME": "u", "REDIS_PASSWORD": "pw", "REDIS_TLS": "true",
		"LIMITS": "*=10/1d", "WINDOW": "ttl", "TIMEZONE": "Asia/Tokyo",
		// Not read: neither required nor checked.
		"SOURCE_TOPICS": "", "BATCH_SIZE": "lots", "GROUP_ID": " ", "ADMIN_TOKEN": "short",
	})
	got, err := LoadUsageConfig()
	if err != nil {
		t.Fatalf("got %v, want the usage configuration", err)
	}
	want := &Config{
		RedisConfig: RedisConfig{
			RedisAddrs:     []string{"r:7000"},
			RedisCluster:   "true",
			RedisKeyPrefix: "p",
			RedisTimeout:   3 * time.Second,
			RedisUsername:  "u",
			RedisPassword:  "pw",
			RedisTLS:       true,
		},
		LimitsConfig: LimitsConfig{
			Limits:       "*=10/1d",
			Window:       "ttl",
			Timezone:     "Asia/Tokyo",
			DeferHorizon: 24 * time.Hour,
			Retention:    168 * time.Hour,
		},
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreUnexported(Config{})); diff != "" {
		t.Errorf("usage configuration (-want +got):\n%s", diff)
	}
	if rules, err := got.Rules(); err != nil || len(rules.For("acme")) != 1 {
		t.Errorf("rules: got %v, %v; want the rules of LIMITS", rules, err)
	}
}

func TestLoadUsageConfigErrors(t *testing.T) {
	base := map[string]string{"LIMITS": "*=10/1m"}
	tests := []struct {
		env     map[string]string
		wantVar string
	}{
		{with(base, "LIMITS", "<unset>"), "LIMITS"},
		{with(base, "LIMITS", "acme=lots"), "LIMITS"},
		{with(base, "WINDOW", "hourly"), "WINDOW"},
		{with(base, "TIMEZONE", "Mars/Olympus"), "TIMEZONE"},
		{with(base, "REDIS_ADDRS", "r:6379,R:6379"), "REDIS_ADDRS"},
		{with(base, "REDIS_CLUSTER", "maybe"), "REDIS_CLUSTER"},
		{with(base, "REDIS_KEY_PREFIX", "g{k"), "REDIS_KEY_PREFIX"},
		{with(base, "REDIS_TIMEOUT", "0s"), "REDIS_TIMEOUT"},
		{with(base, "REDIS_TIMEOUT", "soon"), "REDIS_TIMEOUT"},
		{with(base, "REDIS_TLS", "on"), "REDIS_TLS"},
		{with(base, "DEFER_HORIZON", "-1h"), "DEFER_HORIZON"},
		{with(base, "RETENTION", "0h"), "RETENTION"},
	}
	for _, tt := range tests {
		t.Run(tt.wantVar, func(t *testing.T) {
			setEnv(t, tt.env)
			_, err := LoadUsageConfig()
			if want := EnvPrefix + "_" + tt.wantVar + ": "; err == nil || !strings.HasPrefix(err.Error(), want) {
				t.Errorf("got %v, want an error starting with %q", err, want)
			}
		})
	}
}

// TestLoadUsageConfigUnits checks that `gatekeeper usage` reads rules that
// count units without COST_FROM, which only the gate needs.
func TestLoadUsageConfigUnits(t *testing.T) {
	setEnv(t, map[string]string{"LIMITS": "*=5000u/1m,10MiB/1m"})
	got, err := LoadUsageConfig()
	if err != nil {
		t.Fatalf("got %v, want the usage configuration", err)
	}
	if rules, err := got.Rules(); err != nil || len(rules.For("acme")) != 2 {
		t.Errorf("rules: got %v, %v; want the two rules of LIMITS", rules, err)
	}
}
