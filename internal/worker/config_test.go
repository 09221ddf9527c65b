package worker

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/route"
	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// setEnv makes the GATEKEEPER_* configuration exactly vars (names without
// the prefix): every other configuration variable is unset for the test.
func setEnv(t *testing.T, vars map[string]string) {
	t.Helper()
	keys, err := ConfigKeys()
	if err != nil {
		t.Fatal(err)
	}
	testenv.SetEnv(t, EnvPrefix, keys, vars)
}

// minimal is the least configuration that validates; with adds to a copy.
var minimal, with = testenv.MinimalConfig, testenv.With

func TestConfigKeys(t *testing.T) {
	got, err := ConfigKeys()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		// DESIGN.md's contract: these names are relied on by operators.
		// The groups of Config, in order: Kafka, topics, Redis, limits,
		// events, retry, bounds, HTTP.
		"KAFKA_BROKERS", "GROUP_ID", "KAFKA_TIMEOUT", "KAFKA_SESSION_TIMEOUT",
		"KAFKA_SASL_MECHANISM", "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD", "KAFKA_TLS",
		"KAFKA_TLS_CA_FILE", "KAFKA_TLS_CERT_FILE", "KAFKA_TLS_KEY_FILE",
		"SOURCE_TOPICS", "DOWNSTREAM_TOPIC", "RETRY_TOPIC", "DLQ_TOPIC",
		"REDIS_ADDRS", "REDIS_CLUSTER", "REDIS_KEY_PREFIX", "REDIS_TIMEOUT",
		"REDIS_USERNAME", "REDIS_PASSWORD", "REDIS_TLS", "REDIS_TLS_CA_FILE", "REDIS_TLS_CERT_FILE", "REDIS_TLS_KEY_FILE",
		"LIMITS", "LIMITS_FILE", "CAPACITY", "WINDOW", "TIMEZONE", "DEFER_HORIZON", "RETENTION",
		"CAPACITY_FROM", "CAPACITY_TARGET_WAIT", "CAPACITY_FLOOR", "CAPACITY_INTERVAL", "CAPACITY_HOLD", "CAPACITY_SHADOW",
		"TENANT_FROM", "COST_FROM", "ROLES", "ON_REDIS_ERROR", "SHADOW",
		"MAX_ATTEMPTS", "LATE_TAKES_SLOTS", "RETRY_LOOKAHEAD", "RETRY_LOOKAHEAD_BYTES", "RETRY_SECRET", "RETRY_SECRET_PREVIOUS", "RETRY_ACCEPT_UNSIGNED_UNTIL", "CAPACITY_ADVANCE",
		"BATCH_SIZE", "BATCH_BYTES", "BATCH_WAIT", "DECIDE_AHEAD", "MAX_MESSAGE_BYTES", "LIMITER_CACHE_BYTES",
		"HTTP_ADDR", "ADMIN_TOKEN", "ADMIN_TOKENS", "PPROF", "LOG_LEVEL", "SHUTDOWN_GRACE",
		"OVERRIDE_AUDIT_RETENTION", "OVERRIDE_AUDIT_MAX", "TOP_WINDOW",
	}
	for i := range want {
		want[i] = EnvPrefix + "_" + want[i]
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("variable names (-want +got):\n%s", diff)
	}
}

func TestConfigFieldsDocumented(t *testing.T) {
	for _, f := range reflect.VisibleFields(reflect.TypeOf(Config{})) {
		if !f.IsExported() || f.Anonymous {
			continue // not a variable (a group's fields are Config's): envconfig does not read it
		}
		desc := f.Tag.Get("desc")
		if desc == "" {
			t.Errorf("%s: no desc tag", f.Name)
		}
		if strings.ContainsAny(desc, "|\n") {
			t.Errorf("%s: desc holds | or a newline, which break the README table", f.Name)
		}
		if f.Tag.Get("envconfig") != "" {
			t.Errorf("%s: envconfig tag: envconfig would also read the unprefixed name", f.Name)
		}
	}
}

func TestConfigDefaults(t *testing.T) {
	setEnv(t, minimal())
	got, err := LoadConfig()
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		KafkaConfig: KafkaConfig{
			KafkaBrokers:        []string{"localhost:9092"},
			GroupID:             "gatekeeper",
			KafkaTimeout:        10 * time.Second,
			KafkaSessionTimeout: 30 * time.Second,
		},
		TopicsConfig: TopicsConfig{
			SourceTopics:    []string{"events"},
			DownstreamTopic: "events.out",
			RetryTopic:      "events.out.retry",
			DLQTopic:        "events.out.dlq",
		},
		RedisConfig: RedisConfig{
			RedisAddrs:     []string{"localhost:6379"},
			RedisCluster:   "auto",
			RedisKeyPrefix: "gk",
			RedisTimeout:   2 * time.Second,
		},
		EventsConfig: EventsConfig{
			TenantFrom:   "key",
			OnRedisError: "pause",
			Roles:        []string{"gate", "retry"},
		},
		LimitsConfig: LimitsConfig{
			Limits:       "*=100/1m",
			Window:       "aligned",
			Timezone:     "UTC",
			DeferHorizon: 24 * time.Hour,
			Retention:    168 * time.Hour,
		},
		PaceConfig: PaceConfig{
			CapacityTargetWait: 2 * time.Second,
			CapacityInterval:   time.Second,
			CapacityHold:       30 * time.Second,
		},
		RetryConfig: RetryConfig{
			MaxAttempts:         5,
			LateTakesSlots:      "on",
			CapacityAdvance:     true,
			RetryLookahead:      10000,
			RetryLookaheadBytes: 512 << 10,
		},
		HTTPConfig: HTTPConfig{
			HTTPAddr:      ":8080",
			LogLevel:      "info",
			ShutdownGrace: 25 * time.Second,
		},
		BoundsConfig: BoundsConfig{
			BatchSize:         500,
			BatchBytes:        4 << 20,
			MaxMessageBytes:   1 << 20,
			LimiterCacheBytes: 16 << 20,
			BatchWait:         50 * time.Millisecond,
			DecideAhead:       true,
		},
		OverridesConfig: OverridesConfig{
			OverrideAuditRetention: 720 * time.Hour,
			OverrideAuditMax:       100000,
			TopWindow:              time.Minute,
		},
	}
	// The rules Validate parsed are not a setting.
	if diff := cmp.Diff(want, got, cmpopts.IgnoreUnexported(Config{})); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
}

// TestConfigRulesParsedOnce checks that Rules returns the rules Validate
// parsed: LIMITS_FILE is read once, by Validate.
func TestConfigRulesParsedOnce(t *testing.T) {
	file := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(file, []byte("default: [100/1m]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	setEnv(t, with(minimal(), "LIMITS", "<unset>", "LIMITS_FILE", file))
	cfg, err := LoadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	first, err := cfg.Rules()
	if err != nil {
		t.Fatalf("Rules after the file went: got %v, want the rules Validate read", err)
	}
	if again, _ := cfg.Rules(); again != first {
		t.Errorf("Rules parsed again: got %p, then %p", first, again)
	}
}

func TestConfigDerivedTopics(t *testing.T) {
	tests := []struct {
		name               string
		env                map[string]string
		wantRetry, wantDLQ string
	}{
		{"derived", minimal(), "events.out.retry", "events.out.dlq"},
		{"retry given", with(minimal(), "RETRY_TOPIC", "slow"), "slow", "events.out.dlq"},
		{"dlq given", with(minimal(), "DLQ_TOPIC", "dead"), "events.out.retry", "dead"},
		{"both given", with(minimal(), "RETRY_TOPIC", "r", "DLQ_TOPIC", "d"), "r", "d"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, tt.env)
			cfg, err := LoadConfig()
			if err != nil {
				t.Fatal(err)
			}
			if cfg.RetryTopic != tt.wantRetry || cfg.DLQTopic != tt.wantDLQ {
				t.Errorf("got retry %q, dlq %q; want %q, %q", cfg.RetryTopic, cfg.DLQTopic, tt.wantRetry, tt.wantDLQ)
			}
		})
	}
}

func TestConfigGoodValues(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(file, []byte("default: [100/1m]\ntenants:\n  acme: [1000/1m, 50000/1d]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		env  map[string]string
	}{
		{"spaces in lists", with(minimal(), "SOURCE_TOPICS", "a, b", "KAFKA_BROKERS", "k1:9092, k2:9092")},
		{"redis cluster", with(minimal(), "REDIS_ADDRS", "r1:7000,r2:7001,[::1]:7002")},
		{"redis cluster, one port per host", with(minimal(), "REDIS_ADDRS", "r:7000,r:7001,r2:7000")},
		{"redis cluster, one address", with(minimal(), "REDIS_ADDRS", "r:7000", "REDIS_CLUSTER", "true")},
		{"redis cluster off", with(minimal(), "REDIS_ADDRS", "r:6379", "REDIS_CLUSTER", "false")},
		{"redis cluster empty is auto", with(minimal(), "REDIS_CLUSTER", "")},
		{"header tenant", with(minimal(), "TENANT_FROM", "header:x-tenant")},
		{"json tenant", with(minimal(), "TENANT_FROM", "json:customer.id")},
		{"byte rules", with(minimal(), "LIMITS", "*=100/1m,10MiB/1m;acme=1000/1m,10MiB/1m,2GiB/1d")},
		{"unit rules", with(minimal(), "LIMITS", "*=5000u/1m", "COST_FROM", "header:x-cost")},
		{"capacity", with(minimal(), "CAPACITY", "5000/1s,200000/1m", "LIMITS", "*=100/1m;acme=1000/1m,weight:3,floor:200/1s")},
		{"byte capacity", with(minimal(), "CAPACITY", "10MiB/1s,200MiB/1m", "LIMITS", "*=100/1m;acme=1000/1m,weight:3,floor:1MiB/1s")},
		{"hour capacity", with(minimal(), "CAPACITY", "5000/1s,1000000/1h", "TIMEZONE", "Asia/Kolkata", "LIMITS", "*=100/1m;acme=floor:1000/1h")},
		// Under one event a second: the default CAPACITY_FLOOR is then the capacity's rate.
		{"slow hour capacity", with(minimal(), "CAPACITY", "3000/1h")},
		{"day capacity", with(minimal(), "CAPACITY", "100000/1d", "TIMEZONE", "Asia/Kolkata", "LIMITS", "*=100/1m;acme=floor:1000/1d")},
		{"week capacity", with(minimal(), "CAPACITY", "5000/1s,1000000/1w")},
		// Every key in one slot of a Redis Cluster (a prefix with a hash tag).
		{"capacity on Redis Cluster", with(minimal(), "CAPACITY", "5000/1s", "REDIS_ADDRS", "a:1,b:2", "REDIS_KEY_PREFIX", "{gk}")},
		{"unit capacity", with(minimal(), "CAPACITY", "2000u/1s", "COST_FROM", "header:cost", "LIMITS", "*=100/1m;acme=floor:500u/1s")},
		{"paced capacity", with(minimal(), "CAPACITY", "5000/1s", "CAPACITY_FROM", "group:billing", "CAPACITY_FLOOR", "6000/1m", "CAPACITY_TARGET_WAIT", "500ms", "CAPACITY_SHADOW", "true")},
		{"json cost", with(minimal(), "COST_FROM", "json:usage.tokens")},
		{"ttl", with(minimal(), "WINDOW", "ttl", "LIMITS", "*=10/7m")},
		{"zone", with(minimal(), "TIMEZONE", "Europe/Berlin")},
		{"limits file", with(minimal(), "LIMITS", "<unset>", "LIMITS_FILE", file)},
		{"gate only", with(minimal(), "ROLES", "gate")},
		{"retry only", with(minimal(), "ROLES", "retry")},
		{"sasl", with(minimal(), "KAFKA_SASL_MECHANISM", "SCRAM-SHA-512", "KAFKA_SASL_USERNAME", "u", "KAFKA_SASL_PASSWORD", "p", "KAFKA_TLS", "true")},
		{"http any port", with(minimal(), "HTTP_ADDR", "127.0.0.1:0")},
		{"forward", with(minimal(), "ON_REDIS_ERROR", "forward", "SHADOW", "1")},
		{"retry secret", with(minimal(), "RETRY_SECRET", strings.Repeat("s", 32))},
		{"admin token of 16 bytes", with(minimal(), "ADMIN_TOKEN", "sixteen-bytes-xx")},
		{"admin token mentioning REPLACE-ME", with(minimal(), "ADMIN_TOKEN", "do-not-REPLACE-ME-token")},
		{"retry secret rotated", with(minimal(), "RETRY_SECRET", strings.Repeat("s", 44), "RETRY_SECRET_PREVIOUS", strings.Repeat("p", 32))},
		{"retry secret turned on", with(minimal(), "RETRY_SECRET", strings.Repeat("s", 32), "RETRY_ACCEPT_UNSIGNED_UNTIL", time.Now().Add(48*time.Hour).UTC().Format(time.RFC3339))},
		{"transition over", with(minimal(), "RETRY_SECRET", strings.Repeat("s", 32), "RETRY_ACCEPT_UNSIGNED_UNTIL", "2020-01-01T00:00:00Z")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, tt.env)
			if _, err := LoadConfig(); err != nil {
				t.Errorf("got %v, want no error", err)
			}
		})
	}
}

func TestConfigBadValues(t *testing.T) {
	dir := t.TempDir()
	badFile := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(badFile, []byte("tenants:\n  acme: [lots]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hourFile := filepath.Join(dir, "hour.yaml")
	if err := os.WriteFile(hourFile, []byte("default: [10/7m]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		env     map[string]string
		wantVar string // the variable the error must name
	}{
		{with(minimal(), "SOURCE_TOPICS", "<unset>"), "SOURCE_TOPICS"},
		{with(minimal(), "SOURCE_TOPICS", ""), "SOURCE_TOPICS"},
		{with(minimal(), "SOURCE_TOPICS", "a,,b"), "SOURCE_TOPICS"},
		{with(minimal(), "SOURCE_TOPICS", "a b"), "SOURCE_TOPICS"},
		{with(minimal(), "SOURCE_TOPICS", "a,a"), "SOURCE_TOPICS"},
		{with(minimal(), "DOWNSTREAM_TOPIC", "<unset>"), "DOWNSTREAM_TOPIC"},
		{with(minimal(), "DOWNSTREAM_TOPIC", ""), "DOWNSTREAM_TOPIC"},
		{with(minimal(), "DOWNSTREAM_TOPIC", "events"), "DOWNSTREAM_TOPIC"},
		{with(minimal(), "DOWNSTREAM_TOPIC", "bad/topic"), "DOWNSTREAM_TOPIC"},
		{with(minimal(), "RETRY_TOPIC", "events"), "RETRY_TOPIC"},
		{with(minimal(), "RETRY_TOPIC", strings.Repeat("r", 246)), "RETRY_TOPIC"},
		{with(minimal(), "DLQ_TOPIC", "events.out"), "DLQ_TOPIC"},
		{with(minimal(), "DLQ_TOPIC", "events.out.retry.1h"), "DLQ_TOPIC"},
		{with(minimal(), "DLQ_TOPIC", "d*"), "DLQ_TOPIC"},
		{with(minimal(), "KAFKA_BROKERS", ""), "KAFKA_BROKERS"},
		{with(minimal(), "KAFKA_BROKERS", "localhost"), "KAFKA_BROKERS"},
		{with(minimal(), "KAFKA_BROKERS", ":9092"), "KAFKA_BROKERS"},
		{with(minimal(), "KAFKA_BROKERS", "k:port"), "KAFKA_BROKERS"},
		{with(minimal(), "GROUP_ID", " "), "GROUP_ID"},
		{with(minimal(), "REDIS_ADDRS", "a:1,"), "REDIS_ADDRS"},
		{with(minimal(), "REDIS_ADDRS", "a:99999"), "REDIS_ADDRS"},
		{with(minimal(), "REDIS_ADDRS", "redis:6379,redis:6379"), "REDIS_ADDRS"},
		{with(minimal(), "REDIS_ADDRS", "Redis.:6379,redis:06379"), "REDIS_ADDRS"},
		{with(minimal(), "REDIS_ADDRS", "[::1]:7000,[0:0::1]:7000"), "REDIS_ADDRS"},
		{with(minimal(), "REDIS_ADDRS", "127.0.0.1:7000,[::ffff:127.0.0.1]:7000"), "REDIS_ADDRS"},
		{with(minimal(), "REDIS_CLUSTER", "yes"), "REDIS_CLUSTER"},
		{with(minimal(), "REDIS_CLUSTER", "false", "REDIS_ADDRS", "r1:7000,r2:7000"), "REDIS_CLUSTER"},
		{with(minimal(), "REDIS_KEY_PREFIX", ""), "REDIS_KEY_PREFIX"},
		{with(minimal(), "REDIS_KEY_PREFIX", "g{k"), "REDIS_KEY_PREFIX"},
		{with(minimal(), "REDIS_KEY_PREFIX", "g{}"), "REDIS_KEY_PREFIX"},    // an empty tag hashes the whole key
		{with(minimal(), "REDIS_KEY_PREFIX", "{a}{b}"), "REDIS_KEY_PREFIX"}, // one tag at most
		{with(minimal(), "TENANT_FROM", "value"), "TENANT_FROM"},
		{with(minimal(), "TENANT_FROM", "header:"), "TENANT_FROM"},
		{with(minimal(), "TENANT_FROM", "json:"), "TENANT_FROM"},
		{with(minimal(), "TENANT_FROM", "json:a..b"), "TENANT_FROM"},
		{with(minimal(), "TENANT_FROM", "json:a.\xff"), "TENANT_FROM"},
		{with(minimal(), "COST_FROM", "key"), "COST_FROM"},
		{with(minimal(), "COST_FROM", "header:gk-cost"), "COST_FROM"},
		{with(minimal(), "COST_FROM", "json:a..b"), "COST_FROM"},
		{with(minimal(), "LIMITS", "*=5000u/1m"), "COST_FROM"}, // units need COST_FROM
		{with(minimal(), "LIMITS", "*=10mib/1m"), "LIMITS"},
		{with(minimal(), "CAPACITY", "5000/1mo"), "CAPACITY"},
		{with(minimal(), "CAPACITY", "5000/1d", "TIMEZONE", "Europe/Paris"), "CAPACITY"}, // days too
		{with(minimal(), "CAPACITY", "5000/2h", "TIMEZONE", "Europe/Paris"), "CAPACITY"}, // hours need a zone without daylight saving
		{with(minimal(), "CAPACITY", "5000/1s", "REDIS_ADDRS", "a:1,b:2"), "CAPACITY"},
		{with(minimal(), "CAPACITY", "100/1s", "LIMITS", "*=10/1s;a=floor:60/1s;b=floor:50/1s"), "LIMITS"},
		{with(minimal(), "LIMITS", "*=10/1s;a=weight:0"), "LIMITS"},
		{with(minimal(), "CAPACITY", "10MiB/1s", "LIMITS", "*=10/1s;a=floor:200/1s"), "LIMITS"},  // a floor of events, a capacity of bytes
		{with(minimal(), "CAPACITY", "100/1s", "LIMITS", "*=10/1s;a=floor:1KiB/1s"), "LIMITS"},   // the reverse
		{with(minimal(), "CAPACITY", "10MiB/1s,100/1m"), "CAPACITY"},                             // two measures
		{with(minimal(), "CAPACITY", "2000u/1s"), "CAPACITY"},                                    // units need COST_FROM
		{with(minimal(), "CAPACITY", "10MiB/1s", "CAPACITY_FROM", "group:b"), "CAPACITY_FROM"},   // pacing is in events
		{with(minimal(), "CAPACITY", "1000000/1h", "CAPACITY_FROM", "group:b"), "CAPACITY_FROM"}, // the hour fixed at its first call
		{with(minimal(), "CAPACITY_FROM", "group:billing"), "CAPACITY_FROM"},                     // needs CAPACITY
		{with(minimal(), "CAPACITY", "100/1s", "CAPACITY_FROM", "billing"), "CAPACITY_FROM"},
		{with(minimal(), "CAPACITY", "100/1s", "CAPACITY_FROM", "group:"), "CAPACITY_FROM"},
		{with(minimal(), "CAPACITY", "100/1s", "CAPACITY_FROM", "group:gatekeeper"), "CAPACITY_FROM"}, // its own group
		{with(minimal(), "CAPACITY", "100/1s", "CAPACITY_FROM", "group:b", "CAPACITY_FLOOR", "200/1s"), "CAPACITY_FLOOR"},
		{with(minimal(), "CAPACITY", "100/1s", "CAPACITY_FROM", "group:b", "CAPACITY_FLOOR", "ten"), "CAPACITY_FLOOR"},
		{with(minimal(), "CAPACITY_FLOOR", "10/1s"), "CAPACITY_FLOOR"},
		{with(minimal(), "CAPACITY", "100/1s", "CAPACITY_FROM", "group:b", "CAPACITY_TARGET_WAIT", "0s"), "CAPACITY_TARGET_WAIT"},
		{with(minimal(), "CAPACITY", "100/1s", "CAPACITY_FROM", "group:b", "CAPACITY_INTERVAL", "10ms"), "CAPACITY_INTERVAL"},
		{with(minimal(), "CAPACITY", "100/1s", "CAPACITY_FROM", "group:b", "CAPACITY_HOLD", "0s"), "CAPACITY_HOLD"},
		{with(minimal(), "CAPACITY", "100/1s", "CAPACITY_SHADOW", "true"), "CAPACITY_SHADOW"},
		{with(minimal(), "LIMITS", "<unset>"), "LIMITS"},
		{with(minimal(), "LIMITS", " "), "LIMITS"},
		{with(minimal(), "LIMITS", "acme=lots"), "LIMITS"},
		{with(minimal(), "LIMITS", "*=10/7m"), "LIMITS"}, // 7m does not tile the hour
		{with(minimal(), "LIMITS_FILE", badFile), "LIMITS_FILE"},
		{with(minimal(), "LIMITS", "<unset>", "LIMITS_FILE", badFile), "LIMITS_FILE"},
		{with(minimal(), "LIMITS", "<unset>", "LIMITS_FILE", hourFile), "LIMITS_FILE"},
		{with(minimal(), "LIMITS", "<unset>", "LIMITS_FILE", filepath.Join(dir, "missing.yaml")), "LIMITS_FILE"},
		{with(minimal(), "WINDOW", "hourly"), "WINDOW"},
		{with(minimal(), "TIMEZONE", "Mars/Olympus"), "TIMEZONE"},
		{with(minimal(), "TIMEZONE", ""), "TIMEZONE"},
		{with(minimal(), "DEFER_HORIZON", "0s"), "DEFER_HORIZON"},
		{with(minimal(), "DEFER_HORIZON", "-1h"), "DEFER_HORIZON"},
		{with(minimal(), "DEFER_HORIZON", "1 day"), "DEFER_HORIZON"},
		{with(minimal(), "ON_REDIS_ERROR", "drop"), "ON_REDIS_ERROR"},
		{with(minimal(), "MAX_ATTEMPTS", "0"), "MAX_ATTEMPTS"},
		{with(minimal(), "LATE_TAKES_SLOTS", "true"), "LATE_TAKES_SLOTS"},
		{with(minimal(), "MAX_ATTEMPTS", "five"), "MAX_ATTEMPTS"},
		{with(minimal(), "SHADOW", "maybe"), "SHADOW"},
		{with(minimal(), "HTTP_ADDR", "8080"), "HTTP_ADDR"},
		{with(minimal(), "HTTP_ADDR", ""), "HTTP_ADDR"},
		{with(minimal(), "ADMIN_TOKEN", "two words"), "ADMIN_TOKEN"},
		{with(minimal(), "ADMIN_TOKEN", "a"), "ADMIN_TOKEN"},
		{with(minimal(), "ADMIN_TOKEN", "fifteen-bytes-x"), "ADMIN_TOKEN"},
		{with(minimal(), "ADMIN_TOKEN", "REPLACE-ME-admin-token"), "ADMIN_TOKEN"},
		{with(minimal(), "ADMIN_TOKEN", "replace-me-with-a-random-token"), "ADMIN_TOKEN"},
		{with(minimal(), "LOG_LEVEL", "verbose"), "LOG_LEVEL"},
		{with(minimal(), "LOG_LEVEL", "INFO"), "LOG_LEVEL"},
		{with(minimal(), "ROLES", ""), "ROLES"},
		{with(minimal(), "ROLES", "gate,admin"), "ROLES"},
		{with(minimal(), "ROLES", "gate,gate"), "ROLES"},
		{with(minimal(), "BATCH_SIZE", "0"), "BATCH_SIZE"},
		{with(minimal(), "BATCH_SIZE", "lots"), "BATCH_SIZE"},
		{with(minimal(), "RETRY_LOOKAHEAD", "0"), "RETRY_LOOKAHEAD"},
		{with(minimal(), "RETRY_LOOKAHEAD", "2000000"), "RETRY_LOOKAHEAD"},
		{with(minimal(), "RETRY_LOOKAHEAD", "many"), "RETRY_LOOKAHEAD"},
		{with(minimal(), "BATCH_BYTES", "100"), "BATCH_BYTES"},
		{with(minimal(), "RETRY_LOOKAHEAD_BYTES", "0"), "RETRY_LOOKAHEAD_BYTES"},
		{with(minimal(), "RETRY_LOOKAHEAD_BYTES", "4GiB"), "RETRY_LOOKAHEAD_BYTES"},
		{with(minimal(), "LIMITER_CACHE_BYTES", "1000"), "LIMITER_CACHE_BYTES"},
		{with(minimal(), "LIMITER_CACHE_BYTES", "2147483648"), "LIMITER_CACHE_BYTES"},
		{with(minimal(), "MAX_MESSAGE_BYTES", "1000000000"), "MAX_MESSAGE_BYTES"},
		{with(minimal(), "BATCH_WAIT", "0s"), "BATCH_WAIT"},
		{with(minimal(), "BATCH_WAIT", "abc"), "BATCH_WAIT"},
		{with(minimal(), "SHUTDOWN_GRACE", "-5s"), "SHUTDOWN_GRACE"},
		{with(minimal(), "REDIS_TIMEOUT", "0"), "REDIS_TIMEOUT"},
		{with(minimal(), "KAFKA_TIMEOUT", "10"), "KAFKA_TIMEOUT"},
		{with(minimal(), "KAFKA_SESSION_TIMEOUT", "500ms"), "KAFKA_SESSION_TIMEOUT"},
		{with(minimal(), "RETENTION", "0h"), "RETENTION"},
		{with(minimal(), "REDIS_TLS", "yes please"), "REDIS_TLS"},
		{with(minimal(), "KAFKA_TLS", "on"), "KAFKA_TLS"},
		{with(minimal(), "KAFKA_SASL_MECHANISM", "GSSAPI", "KAFKA_SASL_USERNAME", "u", "KAFKA_SASL_PASSWORD", "p"), "KAFKA_SASL_MECHANISM"},
		{with(minimal(), "KAFKA_SASL_USERNAME", "u"), "KAFKA_SASL_MECHANISM"},
		{with(minimal(), "KAFKA_SASL_MECHANISM", "PLAIN", "KAFKA_SASL_PASSWORD", "p"), "KAFKA_SASL_USERNAME"},
		{with(minimal(), "KAFKA_SASL_MECHANISM", "PLAIN", "KAFKA_SASL_USERNAME", "u"), "KAFKA_SASL_PASSWORD"},
		{with(minimal(), "RETRY_SECRET", "short-secret-31-bytes-xxxxxxxxx"), "RETRY_SECRET"},
		{with(minimal(), "RETRY_SECRET_PREVIOUS", strings.Repeat("p", 32)), "RETRY_SECRET_PREVIOUS"},
		{with(minimal(), "RETRY_SECRET", strings.Repeat("s", 32), "RETRY_SECRET_PREVIOUS", "short-previous"), "RETRY_SECRET_PREVIOUS"},
		{with(minimal(), "RETRY_ACCEPT_UNSIGNED_UNTIL", "2020-01-01T00:00:00Z"), "RETRY_ACCEPT_UNSIGNED_UNTIL"},
		{with(minimal(), "RETRY_SECRET", strings.Repeat("s", 32), "RETRY_ACCEPT_UNSIGNED_UNTIL", "tomorrow"), "RETRY_ACCEPT_UNSIGNED_UNTIL"},
		{with(minimal(), "RETRY_SECRET", strings.Repeat("s", 32), "RETRY_ACCEPT_UNSIGNED_UNTIL", time.Now().Add(60*24*time.Hour).UTC().Format(time.RFC3339)), "RETRY_ACCEPT_UNSIGNED_UNTIL"},
	}
	for _, tt := range tests {
		name := tt.wantVar
		for k, v := range tt.env {
			if minimal()[k] != v {
				name += "/" + k + "=" + v
			}
		}
		t.Run(name, func(t *testing.T) {
			setEnv(t, tt.env)
			_, err := LoadConfig()
			if err == nil {
				t.Fatalf("got no error, want one naming %s", tt.wantVar)
			}
			msg := err.Error()
			if want := EnvPrefix + "_" + tt.wantVar + ": "; !strings.HasPrefix(msg, want) {
				t.Errorf("got %q, want it to start with %q", msg, want)
			}
			if strings.ContainsAny(msg, "\r\n") {
				t.Errorf("got %q, want one line", msg)
			}
		})
	}
}

func TestConfigErrorText(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want string
	}{
		{with(minimal(), "WINDOW", "hourly"), `GATEKEEPER_WINDOW: "hourly" is not aligned or ttl`},
		{with(minimal(), "BATCH_WAIT", "abc"), `GATEKEEPER_BATCH_WAIT: "abc" is not a duration (e.g. 50ms, 2s, 24h)`},
		{with(minimal(), "SOURCE_TOPICS", "<unset>"), `GATEKEEPER_SOURCE_TOPICS: required, not set`},
		{with(minimal(), "SHADOW", "maybe"), `GATEKEEPER_SHADOW: "maybe" is not true or false`},
		{with(minimal(), "REDIS_ADDRS", "redis:6379,REDIS:6379"), `GATEKEEPER_REDIS_ADDRS: "redis:6379" and "REDIS:6379" are the same server (redis:6379): list each once`},
		{with(minimal(), "RETRY_SECRET", "hunter2"), `GATEKEEPER_RETRY_SECRET: must be at least 32 bytes (e.g. openssl rand -base64 32)`},
		{with(minimal(), "ADMIN_TOKEN", "hunter2"), `GATEKEEPER_ADMIN_TOKEN: must be at least 16 bytes (e.g. openssl rand -base64 24)`},
		{with(minimal(), "ADMIN_TOKEN", "REPLACE-ME-admin-token"), `GATEKEEPER_ADMIN_TOKEN: is a REPLACE-ME... placeholder: set a random token (e.g. openssl rand -base64 24)`},
		{with(minimal(), "REDIS_PASSWORD", "REPLACE-ME-redis-password", "REDIS_TLS", "true"), `GATEKEEPER_REDIS_PASSWORD: is a REPLACE-ME... placeholder: set the real value`},
		{with(minimal(), "KAFKA_SASL_MECHANISM", "PLAIN", "KAFKA_SASL_USERNAME", "gk", "KAFKA_SASL_PASSWORD", "replace-me-kafka", "KAFKA_TLS", "true"), `GATEKEEPER_KAFKA_SASL_PASSWORD: is a REPLACE-ME... placeholder: set the real value`},
		{with(minimal(), "RETRY_SECRET", "REPLACE-ME-retry-secret-0123456789abcdef"), `GATEKEEPER_RETRY_SECRET: is a REPLACE-ME... placeholder: set the real value`},
		{with(minimal(), "RETRY_SECRET_PREVIOUS", strings.Repeat("p", 32)), `GATEKEEPER_RETRY_SECRET_PREVIOUS: set without GATEKEEPER_RETRY_SECRET, which signs (the previous secret only verifies)`},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			setEnv(t, tt.env)
			_, err := LoadConfig()
			if err == nil || err.Error() != tt.want {
				t.Errorf("got %v, want %s", err, tt.want)
			}
		})
	}
}

func TestConfigSecretsNotInErrors(t *testing.T) {
	setEnv(t, with(minimal(), "ADMIN_TOKEN", "s3cret value"))
	_, err := LoadConfig()
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("got %v, want an error without the token", err)
	}
}

func TestConfigIgnoresUnprefixed(t *testing.T) {
	setEnv(t, minimal())
	t.Setenv("LOG_LEVEL", "verbose")
	t.Setenv("WINDOW", "hourly")
	t.Setenv("TIMEZONE", "Nowhere")
	cfg, err := LoadConfig()
	if err != nil {
		t.Fatalf("got %v, want unprefixed variables ignored", err)
	}
	if cfg.LogLevel != "info" {
		t.Errorf("got log level %q, want info", cfg.LogLevel)
	}
}

func TestConfigMasked(t *testing.T) {
	retrySecret, previous := strings.Repeat("r", 32), strings.Repeat("q", 32)
	const token = "tok-0123456789abcdef"
	setEnv(t, with(minimal(), "ADMIN_TOKEN", token, "REDIS_PASSWORD", "rpw",
		"KAFKA_SASL_MECHANISM", "PLAIN", "KAFKA_SASL_USERNAME", "user", "KAFKA_SASL_PASSWORD", "kpw",
		"RETRY_SECRET", retrySecret, "RETRY_SECRET_PREVIOUS", previous,
		"ADMIN_TOKENS", "ops:write:ops-token-0123456789"))
	cfg, err := LoadConfig()
	if err != nil {
		t.Fatal(err)
	}
	m := cfg.Masked()
	if m.AdminToken != mask || m.RedisPassword != mask || m.KafkaSASLPassword != mask {
		t.Errorf("got %q %q %q, want all %q", m.AdminToken, m.RedisPassword, m.KafkaSASLPassword, mask)
	}
	if m.KafkaSASLUsername != "user" {
		t.Errorf("got user %q, want user", m.KafkaSASLUsername)
	}
	if cfg.AdminToken != token {
		t.Errorf("Masked changed the original: token %q", cfg.AdminToken)
	}
	lines, err := m.Environ()
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(lines, "\n")
	for _, secret := range []string{token, "rpw", "kpw", retrySecret, previous, "ops-token-0123456789"} {
		if strings.Contains(all, "="+secret) {
			t.Errorf("masked environ shows %q:\n%s", secret, all)
		}
	}
	// Every field that looks like a secret must be masked.
	typ := reflect.TypeOf(Config{})
	v := reflect.ValueOf(m)
	for i := 0; i < typ.NumField(); i++ {
		name := typ.Field(i).Name
		if (strings.Contains(name, "Password") || strings.Contains(name, "Token") || strings.Contains(name, "Secret")) && v.Field(i).String() != mask {
			t.Errorf("%s is not masked", name)
		}
	}
	// An unset secret stays visibly unset.
	if got := (Config{}).Masked().AdminToken; got != "" {
		t.Errorf("got %q for an unset token, want empty", got)
	}
}

func TestConfigEnvironRoundTrip(t *testing.T) {
	setEnv(t, with(minimal(), "SOURCE_TOPICS", "a,b", "TIMEZONE", "Asia/Tokyo", "SHADOW", "true", "BATCH_WAIT", "75ms"))
	want, err := LoadConfig()
	if err != nil {
		t.Fatal(err)
	}
	lines, err := want.Environ()
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, l := range lines {
		k, v, _ := strings.Cut(l, "=")
		env[strings.TrimPrefix(k, EnvPrefix+"_")] = v
	}
	setEnv(t, env)
	got, err := LoadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreUnexported(Config{})); diff != "" {
		t.Errorf("config after Environ round trip (-want +got):\n%s", diff)
	}
}

func TestUnknownVars(t *testing.T) {
	got, err := UnknownVars([]string{"GATEKEEPER_LIMTS=1", "GATEKEEPER_WINDOW=ttl", "GATEKEEPER_TEST_REDIS=x", "PATH=/bin", "GATEKEEPER_A=1"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"GATEKEEPER_A", "GATEKEEPER_LIMTS"}, got); diff != "" {
		t.Errorf("unknown vars (-want +got):\n%s", diff)
	}
}

func TestConfigRetrySigner(t *testing.T) {
	current, previous := strings.Repeat("c", 32), strings.Repeat("p", 32)
	signedBy := func(secret string) kafka.Message {
		s, err := route.NewSigner([]byte(secret))
		if err != nil {
			t.Fatal(err)
		}
		return s.Sign(kafka.Message{Key: []byte("k"), Value: []byte("v")})
	}
	if s, err := (&Config{}).RetrySigner(); s != nil || err != nil {
		t.Errorf("without RETRY_SECRET: got %v, %v, want no signer and no error", s, err)
	}
	tests := []struct {
		name             string
		cfg              Config
		previousVerifies bool
	}{
		{name: "current", cfg: Config{RetryConfig: RetryConfig{RetrySecret: current}}},
		{name: "rotated", cfg: Config{RetryConfig: RetryConfig{RetrySecret: current, RetrySecretPrevious: previous}}, previousVerifies: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := tt.cfg.RetrySigner()
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Verify(signedBy(current)); err != nil {
				t.Errorf("signed with RETRY_SECRET: got %v, want it verified", err)
			}
			if err := s.Verify(signedBy(previous)); (err == nil) != tt.previousVerifies {
				t.Errorf("signed with the previous secret: got %v, want verified %v", err, tt.previousVerifies)
			}
		})
	}
}
