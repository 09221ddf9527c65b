package worker

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/route"
)

// EnvPrefix starts every configuration variable.
const EnvPrefix = "GATEKEEPER"

// mask replaces a secret when the configuration is printed.
const mask = "****"

// Config is the whole configuration, read from GATEKEEPER_* environment
// variables by envconfig. Variable names come from the field names
// (split_words), never from an `envconfig` tag: envconfig falls back to the
// unprefixed name for tagged fields, and an unrelated LOG_LEVEL or TIMEZONE
// in the environment must not configure Gatekeeper.
//
// The `desc` tag is the description in the README's configuration table;
// `doc_default` stands in that table for a default computed from other
// variables. Descriptions must not hold "|" (they are table cells).
//
// A Config is a plain value; it is not safe for concurrent mutation.
type Config struct {
	// KafkaBrokers are the bootstrap brokers, host:port each.
	KafkaBrokers []string `split_words:"true" default:"localhost:9092" desc:"comma-separated bootstrap brokers (host:port)"`
	// GroupID is the Kafka consumer group shared by all replicas.
	GroupID string `split_words:"true" default:"gatekeeper" desc:"consumer group of all replicas"`
	// SourceTopics are the topics whose events are gated.
	SourceTopics []string `split_words:"true" required:"true" desc:"comma-separated topics to gate"`
	// DownstreamTopic receives admitted events.
	DownstreamTopic string `split_words:"true" required:"true" desc:"where admitted events go"`
	// RetryTopic receives deferred events; longer delays go to tiers with
	// the suffixes .1h and .long. Default <DownstreamTopic>.retry.
	RetryTopic string `split_words:"true" doc_default:"<DOWNSTREAM_TOPIC>.retry" desc:"where deferred events go (tiers add the suffixes .1h and .long)"`
	// DLQTopic receives rejected and invalid events. Default <DownstreamTopic>.dlq.
	DLQTopic string `split_words:"true" doc_default:"<DOWNSTREAM_TOPIC>.dlq" desc:"dead-letter topic for rejected and invalid events"`
	// RedisAddrs are the Redis servers; more than one means Redis Cluster.
	RedisAddrs []string `split_words:"true" default:"localhost:6379" desc:"comma-separated host:port, each server once; more than one means Redis Cluster (see REDIS_CLUSTER)"`
	// RedisCluster says whether REDIS_ADDRS is a Redis Cluster: true,
	// false, or auto (also when empty): more than one address is a
	// cluster, and one address is asked with CLUSTER INFO at start.
	RedisCluster string `split_words:"true" default:"auto" desc:"Redis Cluster: true, false, or auto (more than one address is a cluster; one address is asked with CLUSTER INFO at start)"`
	// RedisKeyPrefix starts every counter key.
	RedisKeyPrefix string `split_words:"true" default:"gk" desc:"prefix of every counter key"`
	// TenantFrom says where an event's tenant is: key, header:<name> or json:<dot.path>.
	TenantFrom string `split_words:"true" default:"key" desc:"where the tenant is: key, header:NAME or json:DOT.PATH"`
	// CostFrom says where an event's cost in units is, for rules that count
	// units (5000u/1m): header:<name> or json:<dot.path>. Empty: no units.
	CostFrom string `split_words:"true" desc:"where an event's cost in units is, for rules counting units (5000u/1m): header:NAME or json:DOT.PATH; when set, an event without a valid cost is invalid"`
	// Limits are the rules, e.g. *=100/1m;acme=1000/1m,50000/1d.
	Limits string `doc_required:"unless LIMITS_FILE" desc:"rules, e.g. *=100/1m;acme=1000/1m,10MiB/1m (* is every other tenant; units s m h d w mo; limits in events, bytes with B KB MB GB TB KiB MiB GiB TiB, or units with u)"`
	// LimitsFile is a YAML file of rules, reloaded when it changes. It
	// replaces LIMITS; setting both is an error.
	LimitsFile string `split_words:"true" desc:"YAML file of rules, reloaded on change (instead of LIMITS)"`
	// Capacity is the budget shared by every tenant (capacity.go).
	Capacity string `desc:"one budget for the downstream shared fairly by all tenants: events per aligned second or minute, e.g. 5000/1s or 5000/1s,200000/1m (tenants' weight:N and floor:N/1s in LIMITS); single Redis only"`
	// Window is the window kind: aligned or ttl.
	Window string `default:"aligned" desc:"window kind: aligned (calendar boundaries) or ttl (from a tenant's first event)"`
	// Timezone places day, week and month boundaries of aligned windows.
	Timezone string `default:"UTC" desc:"IANA zone for day, week and month boundaries"`
	// DeferHorizon is the furthest in the future a deferral may reach.
	DeferHorizon time.Duration `split_words:"true" default:"24h" desc:"furthest a deferral may reach"`
	// OnRedisError is what happens while Redis fails: pause or forward.
	OnRedisError string `split_words:"true" default:"pause" desc:"while Redis fails: pause consumption, or forward unchecked"`
	// MaxAttempts is how often one event may be deferred before it is dead-lettered.
	MaxAttempts int `split_words:"true" default:"5" desc:"deferrals of one event before it is dead-lettered"`
	// Shadow counts and records decisions but forwards every event.
	Shadow bool `default:"false" desc:"count and record decisions, forward everything"`
	// HTTPAddr is where metrics, health and the usage API listen.
	HTTPAddr string `split_words:"true" default:":8080" desc:"listen address of metrics, health and the usage API"`
	// AdminToken, when set, is the bearer token the usage API requires. Secret.
	AdminToken string `split_words:"true" desc:"bearer token for the usage API, at least 16 bytes (none: the API is open, with a warning)"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `split_words:"true" default:"info" desc:"debug, info, warn or error"`
	// Roles are the parts this process runs: gate (source topics), retry
	// (retry topics), or both.
	Roles []string `default:"gate,retry" desc:"what this process runs: gate, retry or gate,retry"`
	// BatchSize bounds the events of one partition handled as one batch.
	BatchSize int `split_words:"true" default:"500" desc:"most events of one partition decided in one batch"`
	// RetryLookahead bounds the deferred events the retry role holds in
	// memory per retry-tier partition.
	RetryLookahead int `split_words:"true" default:"10000" desc:"most deferred events held in memory per retry-tier partition while they wait for their release time (memory: about this many times the partitions of the retry tiers times the event size, with headers)"`
	// BatchBytes bounds the bytes of one source batch.
	BatchBytes int `split_words:"true" default:"4194304" desc:"most bytes (keys, values, headers and their overhead on the heap) of one partition's source events decided in one batch; a batch holds at least one event"`
	// RetryLookaheadBytes bounds the bytes of the deferred events the retry
	// role holds per retry-tier partition.
	RetryLookaheadBytes int `split_words:"true" default:"1048576" desc:"most bytes of deferred events held in memory per retry-tier partition (keys, values, headers and their overhead on the heap); fetching pauses while they are held"`
	// MaxMessageBytes is the largest record Gatekeeper writes.
	MaxMessageBytes int `split_words:"true" default:"1048576" desc:"largest record written, gk- headers included (at most the output topics' max.message.bytes); a larger event is dead-lettered, without its value if need be"`
	// LimiterCacheBytes bounds the limiter's memory of tenants
	// (limit.Options.CacheBytes).
	LimiterCacheBytes int `split_words:"true" default:"16777216" desc:"most bytes (estimated, on the heap) of the tenants the limiter remembers: key names and tenants known full, whose events are rejected without Redis; the least recently used go first, tenants known full last"`
	// BatchWait bounds how long a batch waits to fill.
	BatchWait time.Duration `split_words:"true" default:"50ms" desc:"longest a batch waits to fill"`
	// ShutdownGrace bounds the drain after SIGTERM.
	ShutdownGrace time.Duration `split_words:"true" default:"25s" desc:"time to finish writes, commit and leave the group after SIGTERM"`
	// RedisTimeout bounds every Redis call.
	RedisTimeout time.Duration `split_words:"true" default:"2s" desc:"timeout of every Redis call"`
	// KafkaTimeout bounds every Kafka call.
	KafkaTimeout time.Duration `split_words:"true" default:"10s" desc:"timeout of every Kafka call"`
	// KafkaSessionTimeout is how long the group waits for a silent member
	// (a crashed replica) before its partitions move to the others.
	KafkaSessionTimeout time.Duration `split_words:"true" default:"30s" desc:"consumer-group session timeout: how soon a crashed replica's partitions move (6s to 30s with Kafka's defaults); the retry group takes at most 10s, so that deferred events miss few reserved slots"`
	// Retention keeps aligned window keys this long after their window ends.
	Retention time.Duration `default:"168h" desc:"how long counters of windows of a day or longer stay after the window ends; shorter windows keep 24 windows (at least 1m), at most this"`
	// RedisUsername is the Redis ACL user (none: the default user).
	RedisUsername string `split_words:"true" desc:"Redis ACL user name"`
	// RedisPassword authenticates to Redis. Secret.
	RedisPassword string `split_words:"true" desc:"Redis password"`
	// RedisTLS connects to Redis over TLS.
	RedisTLS bool `split_words:"true" default:"false" desc:"connect to Redis over TLS"`
	// RedisTLSCaFile is a PEM file of the CA certificates Redis servers'
	// certificates must chain to; it replaces the system's CAs. (Ca, not
	// CA: envconfig splits the words of the field name into REDIS_TLS_CA_FILE.)
	RedisTLSCaFile string `split_words:"true" desc:"PEM file of the CAs that sign the Redis servers' certificates, trusted instead of the system's (needs REDIS_TLS)"`
	// RedisTLSCertFile is the PEM client certificate (and chain) for mutual TLS.
	RedisTLSCertFile string `split_words:"true" desc:"PEM file of the client certificate (and its chain) for mutual TLS with Redis (with REDIS_TLS_KEY_FILE)"`
	// RedisTLSKeyFile is the unencrypted PEM key of RedisTLSCertFile.
	RedisTLSKeyFile string `split_words:"true" desc:"PEM file of the unencrypted private key of REDIS_TLS_CERT_FILE"`
	// KafkaSASLMechanism is none, PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	KafkaSASLMechanism string `split_words:"true" desc:"SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (none: no SASL)"`
	// KafkaSASLUsername is the SASL user.
	KafkaSASLUsername string `split_words:"true" desc:"SASL user name"`
	// KafkaSASLPassword is the SASL password. Secret.
	KafkaSASLPassword string `split_words:"true" desc:"SASL password"`
	// KafkaTLS connects to Kafka over TLS.
	KafkaTLS bool `split_words:"true" default:"false" desc:"connect to Kafka over TLS"`
	// KafkaTLSCaFile is a PEM file of the CA certificates brokers'
	// certificates must chain to; it replaces the system's CAs.
	KafkaTLSCaFile string `split_words:"true" desc:"PEM file of the CAs that sign the brokers' certificates, trusted instead of the system's (needs KAFKA_TLS)"`
	// KafkaTLSCertFile is the PEM client certificate (and chain) for mutual TLS.
	KafkaTLSCertFile string `split_words:"true" desc:"PEM file of the client certificate (and its chain) for mutual TLS with Kafka (with KAFKA_TLS_KEY_FILE)"`
	// KafkaTLSKeyFile is the unencrypted PEM key of KafkaTLSCertFile.
	KafkaTLSKeyFile string `split_words:"true" desc:"PEM file of the unencrypted private key of KAFKA_TLS_CERT_FILE"`
	// RetrySecret, when set, is the HMAC-SHA256 key that signs the gk-
	// headers of deferred events (gk-sig); events in the retry tiers whose
	// signature is missing or does not match are dead-lettered. At least
	// route.MinSecretBytes. Secret.
	RetrySecret string `split_words:"true" desc:"key of at least 32 bytes that signs deferred events (gk-sig); the retry tiers dead-letter events it did not sign (none: not signed or checked)"`
	// RetrySecretPrevious is the retry secret being rotated out: gk-sig made
	// with it still verifies, but nothing is signed with it. Secret.
	RetrySecretPrevious string `split_words:"true" desc:"the RETRY_SECRET being rotated out: still accepted when checking gk-sig, never used to sign"`

	// limits are the rules of LIMITS or LIMITS_FILE as Validate parsed them:
	// Rules returns them, and the limits-file watcher starts from the
	// content Validate read, so that the rules are parsed and the file read
	// once on the way to the limiter. nil until Validate passes the rules.
	limits *loadedLimits
	// tls are the TLS configurations of Kafka and Redis, built by Validate
	// from the TLS variables and files (tlsfiles.go). nil until Validate
	// passes them.
	tls *loadedTLS
}

// configError is a bad configuration value. Its text is one line that starts
// with the variable's full name.
type configError struct {
	Var string // without the prefix, e.g. "WINDOW"
	Msg string
}

func (e *configError) Error() string {
	return OneLine(EnvPrefix + "_" + e.Var + ": " + e.Msg)
}

// OneLine folds a message onto one line.
func OneLine(s string) string {
	s = strings.TrimSpace(s)
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	lines := strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' })
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	return strings.Join(lines, "; ")
}

func bad(variable, format string, args ...any) error {
	return &configError{Var: variable, Msg: fmt.Sprintf(format, args...)}
}

// LoadConfig reads the environment, fills derived defaults and validates.
// Its error is one line naming the variable.
func LoadConfig() (*Config, error) {
	var cfg Config
	if err := envconfig.Process(EnvPrefix, &cfg); err != nil {
		return nil, ProcessError(err)
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// ProcessError turns envconfig's errors into one line naming the variable.
func ProcessError(err error) error {
	var pe *envconfig.ParseError
	if errors.As(err, &pe) {
		what := pe.TypeName
		switch pe.TypeName {
		case "time.Duration":
			what = "a duration (e.g. 50ms, 2s, 24h)"
		case "bool":
			what = "true or false"
		case "int", "int64":
			what = "a whole number"
		}
		return &configError{Var: strings.TrimPrefix(pe.KeyName, EnvPrefix+"_"), Msg: fmt.Sprintf("%q is not %s", pe.Value, what)}
	}
	// envconfig: "required key GATEKEEPER_X missing value".
	if msg := err.Error(); strings.HasPrefix(msg, "required key ") && strings.HasSuffix(msg, " missing value") {
		key := strings.TrimSuffix(strings.TrimPrefix(msg, "required key "), " missing value")
		return &configError{Var: strings.TrimPrefix(key, EnvPrefix+"_"), Msg: "required, not set"}
	}
	return fmt.Errorf("read %s_* environment: %s", EnvPrefix, OneLine(err.Error()))
}

// setDefaults fills the defaults that depend on other variables and trims
// list items.
func (c *Config) setDefaults() {
	for _, l := range []*[]string{&c.KafkaBrokers, &c.SourceTopics, &c.RedisAddrs, &c.Roles} {
		for i := range *l {
			(*l)[i] = strings.TrimSpace((*l)[i])
		}
	}
	c.DownstreamTopic = strings.TrimSpace(c.DownstreamTopic)
	if c.RetryTopic == "" && c.DownstreamTopic != "" {
		c.RetryTopic = c.DownstreamTopic + ".retry"
	}
	if c.DLQTopic == "" && c.DownstreamTopic != "" {
		c.DLQTopic = c.DownstreamTopic + ".dlq"
	}
}

// Validate checks every field and returns the first problem as one line
// naming the variable, e.g. `GATEKEEPER_WINDOW: "hourly" is not aligned or ttl`.
// It reads LIMITS_FILE when set and keeps the rules it parsed for Rules.
func (c *Config) Validate() error {
	return c.validate(func(string) bool { return true })
}

// validate runs every check and returns the first problem of a variable
// that keep accepts (its name without the prefix); problems of the other
// variables are ignored.
func (c *Config) validate(keep func(variable string) bool) error {
	for _, checks := range [][]func() error{c.serverChecks(), c.routingChecks(), c.sizeAndTimeChecks(), c.placeholderChecks()} {
		for _, check := range checks {
			var ce *configError
			if err := check(); err != nil && (!errors.As(err, &ce) || keep(ce.Var)) {
				return err
			}
		}
	}
	return nil
}

// serverChecks check the Kafka brokers, the group, the topics and Redis.
func (c *Config) serverChecks() []func() error {
	return []func() error{
		func() error { return checkAddrs("KAFKA_BROKERS", c.KafkaBrokers) },
		func() error {
			if strings.TrimSpace(c.GroupID) == "" {
				return bad("GROUP_ID", "must not be empty")
			}
			return nil
		},
		c.checkTopics,
		c.checkRedisAddrs,
		func() error {
			switch {
			case c.RedisKeyPrefix == "":
				return bad("REDIS_KEY_PREFIX", "must not be empty")
			case strings.ContainsAny(c.RedisKeyPrefix, "{}"):
				return bad("REDIS_KEY_PREFIX", "%q must not hold { or } (keys use a {hash tag} per tenant)", c.RedisKeyPrefix)
			case strings.ContainsFunc(c.RedisKeyPrefix, func(r rune) bool { return r <= ' ' || r == 0x7f }):
				return bad("REDIS_KEY_PREFIX", "%q must not hold spaces or control characters", c.RedisKeyPrefix)
			}
			return nil
		},
	}
}

// routingChecks check how events are routed and counted, the HTTP server,
// the secrets, the log level and the roles.
func (c *Config) routingChecks() []func() error {
	return []func() error{
		func() error {
			if _, err := route.ParseTenantFrom(c.TenantFrom); err != nil {
				return bad("TENANT_FROM", "%v", err)
			}
			return nil
		},
		func() error {
			if _, err := route.ParseCostFrom(c.CostFrom); err != nil {
				return bad("COST_FROM", "%v", err)
			}
			return nil
		},
		func() error {
			if c.Window != string(limit.Aligned) && c.Window != string(limit.TTL) {
				return bad("WINDOW", "%q is not aligned or ttl", c.Window)
			}
			return nil
		},
		c.checkLimits,
		c.checkCapacity,
		func() error {
			// Not a check of LIMITS: `gatekeeper usage` reads unit rules
			// without COST_FROM.
			if c.limits == nil {
				return nil
			}
			if err := c.CheckUnits(c.limits.rules); err != nil {
				return bad("COST_FROM", "%v", err)
			}
			return nil
		},
		func() error {
			if c.Timezone == "" {
				return bad("TIMEZONE", "must not be empty (e.g. UTC, Europe/Berlin)")
			}
			if _, err := time.LoadLocation(c.Timezone); err != nil {
				return bad("TIMEZONE", "%q is not a known time zone (e.g. UTC, Europe/Berlin)", c.Timezone)
			}
			return nil
		},
		func() error {
			if c.OnRedisError != route.RedisPause && c.OnRedisError != route.RedisForward {
				return bad("ON_REDIS_ERROR", "%q is not pause or forward", c.OnRedisError)
			}
			return nil
		},
		func() error {
			if err := checkHostPort(c.HTTPAddr); err != nil {
				return bad("HTTP_ADDR", "%q: %v", c.HTTPAddr, err)
			}
			return nil
		},
		c.checkAdminToken,
		c.checkRetrySecret,
		func() error {
			if _, ok := logLevels[c.LogLevel]; !ok {
				return bad("LOG_LEVEL", "%q is not debug, info, warn or error", c.LogLevel)
			}
			return nil
		},
		c.checkRoles,
	}
}

// sizeAndTimeChecks check the counts, sizes and durations (settingRanges)
// and the SASL settings.
func (c *Config) sizeAndTimeChecks() []func() error {
	return append(c.rangeChecks(), c.checkSASL, c.checkTLS)
}

// checkAddrs checks a list of host:port addresses.
func checkAddrs(variable string, addrs []string) error {
	if len(addrs) == 0 {
		return bad(variable, "must not be empty")
	}
	for _, a := range addrs {
		if a == "" {
			return bad(variable, "empty item in the list")
		}
		host, _, err := net.SplitHostPort(a)
		if err == nil && host == "" {
			err = errors.New("missing host")
		}
		if err == nil {
			err = checkHostPort(a)
		}
		if err != nil {
			return bad(variable, "%q is not host:port: %v", a, err)
		}
	}
	return nil
}

// checkHostPort checks a listen or dial address: [host]:port.
func checkHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) {
			return errors.New(ae.Err)
		}
		return err
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return nil
}

// Values of REDIS_CLUSTER.
const (
	RedisClusterAuto  = "auto"
	RedisClusterTrue  = "true"
	RedisClusterFalse = "false"
)

// checkRedisAddrs checks REDIS_ADDRS, which must not name one server twice,
// and REDIS_CLUSTER against it.
func (c *Config) checkRedisAddrs() error {
	if err := checkAddrs("REDIS_ADDRS", c.RedisAddrs); err != nil {
		return err
	}
	seen := map[string]string{}
	for _, a := range c.RedisAddrs {
		n := normalAddr(a)
		if first, ok := seen[n]; ok {
			return bad("REDIS_ADDRS", "%q and %q are the same server (%s): list each once", first, a, n)
		}
		seen[n] = a
	}
	switch c.RedisCluster {
	case "", RedisClusterAuto, RedisClusterTrue:
	case RedisClusterFalse:
		if len(c.RedisAddrs) > 1 {
			return bad("REDIS_CLUSTER", "false, but %s_REDIS_ADDRS has %d addresses (one Redis has one address)", EnvPrefix, len(c.RedisAddrs))
		}
	default:
		return bad("REDIS_CLUSTER", "%q is not true, false or auto", c.RedisCluster)
	}
	return nil
}

// normalAddr returns a host:port address in one spelling: the host in lower
// case without a trailing dot, an IP address in its canonical form, the port
// without leading zeros. Names are not resolved.
func normalAddr(a string) string {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return a
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if ip, err := netip.ParseAddr(host); err == nil {
		host = ip.Unmap().String()
	}
	if n, err := strconv.Atoi(port); err == nil {
		port = strconv.Itoa(n)
	}
	return net.JoinHostPort(host, port)
}

// checkTopic checks a Kafka topic name: 1 to 249 of [a-zA-Z0-9._-].
func checkTopic(t string, room int) error {
	if t == "" {
		return errors.New("empty topic name")
	}
	if t == "." || t == ".." {
		return fmt.Errorf("%q is not a valid topic name", t)
	}
	if len(t)+room > 249 {
		return fmt.Errorf("topic %q is longer than %d bytes", t, 249-room)
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("topic %q: only letters, digits, '.', '_' and '-' are allowed", t)
		}
	}
	return nil
}

func (c *Config) checkTopics() error {
	if len(c.SourceTopics) == 0 {
		return bad("SOURCE_TOPICS", "required, not set")
	}
	for i, t := range c.SourceTopics {
		if err := checkTopic(t, 0); err != nil {
			return bad("SOURCE_TOPICS", "%v", err)
		}
		if slices.Contains(c.SourceTopics[:i], t) {
			return bad("SOURCE_TOPICS", "topic %q given twice", t)
		}
	}
	if c.DownstreamTopic == "" {
		return bad("DOWNSTREAM_TOPIC", "required, not set")
	}
	if err := checkTopic(c.DownstreamTopic, 0); err != nil {
		return bad("DOWNSTREAM_TOPIC", "%v", err)
	}
	if slices.Contains(c.SourceTopics, c.DownstreamTopic) {
		return bad("DOWNSTREAM_TOPIC", "%q is also a source topic: events would loop", c.DownstreamTopic)
	}
	longest := 0
	for _, s := range route.RetryTierSuffixes() {
		longest = max(longest, len(s))
	}
	if err := checkTopic(c.RetryTopic, longest); err != nil {
		return bad("RETRY_TOPIC", "%v (tiers add %s)", err, strings.Join(route.RetryTierSuffixes(), " and "))
	}
	for _, t := range c.retryTopics() {
		if slices.Contains(c.SourceTopics, t) || t == c.DownstreamTopic {
			return bad("RETRY_TOPIC", "retry topic %q is also a source or the downstream topic", t)
		}
	}
	if err := checkTopic(c.DLQTopic, 0); err != nil {
		return bad("DLQ_TOPIC", "%v", err)
	}
	if slices.Contains(c.SourceTopics, c.DLQTopic) || c.DLQTopic == c.DownstreamTopic || slices.Contains(c.retryTopics(), c.DLQTopic) {
		return bad("DLQ_TOPIC", "%q is also a source, downstream or retry topic", c.DLQTopic)
	}
	return nil
}

// retryTopics lists the retry topic and its tiers.
func (c *Config) retryTopics() []string {
	out := []string{c.RetryTopic}
	for _, s := range route.RetryTierSuffixes() {
		out = append(out, c.RetryTopic+s)
	}
	return out
}

// MinAdminTokenBytes is the shortest ADMIN_TOKEN accepted.
const MinAdminTokenBytes = 16

// adminTokenPlaceholder starts the placeholder values of the secrets in
// deploy/ (e.g. REPLACE-ME-admin-token), which must never be a token or a
// password (placeholderChecks).
const adminTokenPlaceholder = "REPLACE-ME"

// placeholderChecks refuse the placeholder values of the secrets in
// deploy/ (REPLACE-ME-redis-password, ...) in every secret setting, as
// checkAdminToken does for ADMIN_TOKEN: a manifest applied unedited must not
// start with a guessable password. The messages never show the value.
func (c *Config) placeholderChecks() []func() error {
	secrets := []struct{ variable, value string }{
		{"REDIS_PASSWORD", c.RedisPassword},
		{"KAFKA_SASL_PASSWORD", c.KafkaSASLPassword},
		{"RETRY_SECRET", c.RetrySecret},
		{"RETRY_SECRET_PREVIOUS", c.RetrySecretPrevious},
	}
	checks := make([]func() error, 0, len(secrets))
	for _, sec := range secrets {
		checks = append(checks, func() error {
			if strings.HasPrefix(strings.ToUpper(sec.value), adminTokenPlaceholder) {
				return bad(sec.variable, "is a %s... placeholder: set the real value", adminTokenPlaceholder)
			}
			return nil
		})
	}
	return checks
}

// checkAdminToken checks ADMIN_TOKEN, when set. The messages never show
// the token, nor its length.
func (c *Config) checkAdminToken() error {
	switch {
	case c.AdminToken == "":
		return nil // the usage API is open; Warnings says so
	case strings.ContainsFunc(c.AdminToken, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return bad("ADMIN_TOKEN", "must not hold spaces or control characters")
	case strings.HasPrefix(strings.ToUpper(c.AdminToken), adminTokenPlaceholder):
		return bad("ADMIN_TOKEN", "is a %s... placeholder: set a random token (e.g. openssl rand -base64 24)", adminTokenPlaceholder)
	case len(c.AdminToken) < MinAdminTokenBytes:
		return bad("ADMIN_TOKEN", "must be at least %d bytes (e.g. openssl rand -base64 24)", MinAdminTokenBytes)
	}
	return nil
}

// checkRetrySecret checks RETRY_SECRET and RETRY_SECRET_PREVIOUS. The
// messages never show a secret, nor its length.
func (c *Config) checkRetrySecret() error {
	if c.RetrySecret != "" && len(c.RetrySecret) < route.MinSecretBytes {
		return bad("RETRY_SECRET", "must be at least %d bytes (e.g. openssl rand -base64 32)", route.MinSecretBytes)
	}
	switch {
	case c.RetrySecretPrevious == "":
		return nil
	case c.RetrySecret == "":
		return bad("RETRY_SECRET_PREVIOUS", "set without %s_RETRY_SECRET, which signs (the previous secret only verifies)", EnvPrefix)
	case len(c.RetrySecretPrevious) < route.MinSecretBytes:
		return bad("RETRY_SECRET_PREVIOUS", "must be at least %d bytes", route.MinSecretBytes)
	}
	return nil
}

// RetrySigner returns the signer of RETRY_SECRET (verifying with
// RETRY_SECRET_PREVIOUS too), or nil when RETRY_SECRET is not set.
func (c *Config) RetrySigner() (*route.Signer, error) {
	if c.RetrySecret == "" {
		return nil, nil
	}
	var previous [][]byte
	if c.RetrySecretPrevious != "" {
		previous = append(previous, []byte(c.RetrySecretPrevious))
	}
	s, err := route.NewSigner([]byte(c.RetrySecret), previous...)
	if err != nil {
		return nil, &configError{Var: "RETRY_SECRET", Msg: err.Error()}
	}
	return s, nil
}

// checkLimits parses LIMITS or reads LIMITS_FILE, checks the rules against
// WINDOW and keeps them in c.limits.
func (c *Config) checkLimits() error {
	c.limits = nil
	switch {
	case c.Limits != "" && c.LimitsFile != "":
		return bad("LIMITS_FILE", "set either LIMITS or LIMITS_FILE, not both")
	case c.LimitsFile != "":
		l, err := loadLimitsFile(c.LimitsFile)
		if err != nil {
			return bad("LIMITS_FILE", "%v", err)
		}
		if err := limit.CheckRules(l.rules, limit.WindowKind(c.Window)); err != nil {
			return bad("LIMITS_FILE", "%s: %v", c.LimitsFile, err)
		}
		c.limits = &l
	case strings.TrimSpace(c.Limits) == "":
		return bad("LIMITS", "required unless LIMITS_FILE is set (e.g. *=100/1m;acme=1000/1m)")
	default:
		rules, err := limit.ParseRules(c.Limits)
		if err != nil {
			return bad("LIMITS", "%v", err)
		}
		if err := limit.CheckRules(rules, limit.WindowKind(c.Window)); err != nil {
			return bad("LIMITS", "%v", err)
		}
		c.limits = &loadedLimits{rules: rules}
	}
	return nil
}

// CheckUnits reports rules that count units (5000u/1m) when COST_FROM does
// not say where an event's units are.
func (c *Config) CheckUnits(rules *limit.Rules) error {
	if c.CostFrom == "" && rules.Counts(limit.Units) {
		return errors.New("not set, and a rule of the limits counts units (like 500u/1m): set it to where an event's cost is")
	}
	return nil
}

// Rules returns the rules of LIMITS or LIMITS_FILE that Validate parsed.
// On a Config that has not passed Validate it parses LIMITS, or reads
// LIMITS_FILE as it is now.
func (c *Config) Rules() (*limit.Rules, error) {
	if c.limits != nil {
		return c.limits.rules, nil
	}
	if c.LimitsFile != "" {
		l, err := loadLimitsFile(c.LimitsFile)
		return l.rules, err
	}
	return limit.ParseRules(c.Limits)
}

// limitsFile returns LIMITS_FILE's rules and the digest of its content as
// Validate read them, or reads the file now on a Config that has not passed
// Validate.
func (c *Config) limitsFile() (loadedLimits, error) {
	if c.limits != nil {
		return *c.limits, nil
	}
	return loadLimitsFile(c.LimitsFile)
}

// Location returns the TIMEZONE location.
func (c *Config) Location() (*time.Location, error) {
	return time.LoadLocation(c.Timezone)
}

// HasRole reports whether this process runs the role.
func (c *Config) HasRole(role string) bool { return slices.Contains(c.Roles, role) }

func (c *Config) checkRoles() error {
	if len(c.Roles) == 0 {
		return bad("ROLES", "must not be empty (gate, retry or gate,retry)")
	}
	for i, r := range c.Roles {
		if r != route.RoleGate && r != route.RoleRetry {
			return bad("ROLES", "%q is not gate or retry", r)
		}
		if slices.Contains(c.Roles[:i], r) {
			return bad("ROLES", "%q given twice", r)
		}
	}
	return nil
}

func (c *Config) checkSASL() error {
	switch c.KafkaSASLMechanism {
	case "":
		if c.KafkaSASLUsername != "" || c.KafkaSASLPassword != "" {
			return bad("KAFKA_SASL_MECHANISM", "not set, but KAFKA_SASL_USERNAME or KAFKA_SASL_PASSWORD is (want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")
		}
		return nil
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		if c.KafkaSASLUsername == "" {
			return bad("KAFKA_SASL_USERNAME", "required with KAFKA_SASL_MECHANISM=%s", c.KafkaSASLMechanism)
		}
		if c.KafkaSASLPassword == "" {
			return bad("KAFKA_SASL_PASSWORD", "required with KAFKA_SASL_MECHANISM=%s", c.KafkaSASLMechanism)
		}
		return nil
	}
	return bad("KAFKA_SASL_MECHANISM", "%q is not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", c.KafkaSASLMechanism)
}

// Masked returns a copy for printing, with every secret that is set shown as
// "****" (an unset secret stays empty, so that it shows as unset).
func (c Config) Masked() Config {
	for _, s := range []*string{&c.AdminToken, &c.RetrySecret, &c.RetrySecretPrevious, &c.RedisPassword, &c.KafkaSASLPassword} {
		if *s != "" {
			*s = mask
		}
	}
	c.KafkaBrokers = slices.Clone(c.KafkaBrokers)
	c.SourceTopics = slices.Clone(c.SourceTopics)
	c.RedisAddrs = slices.Clone(c.RedisAddrs)
	c.Roles = slices.Clone(c.Roles)
	return c
}

// ConfigKeys returns the variable names of Config's fields in field order,
// as envconfig derives them.
func ConfigKeys() ([]string, error) {
	var buf bytes.Buffer
	if err := envconfig.Usagef(EnvPrefix, &Config{}, &buf, "{{range .}}{{usage_key .}}\n{{end}}"); err != nil {
		return nil, err
	}
	return strings.Fields(buf.String()), nil
}

// Environ returns the configuration as KEY=value lines, in field order, as
// they could be given to the process. Print only a Masked copy.
func (c Config) Environ() ([]string, error) {
	keys, err := ConfigKeys()
	if err != nil {
		return nil, err
	}
	v := reflect.ValueOf(c)
	var fields []reflect.Value // the exported ones, which envconfig reads
	for i := range v.NumField() {
		if v.Type().Field(i).IsExported() {
			fields = append(fields, v.Field(i))
		}
	}
	if len(keys) != len(fields) {
		return nil, fmt.Errorf("config has %d fields, envconfig sees %d", len(fields), len(keys))
	}
	out := make([]string, 0, len(keys))
	for i, k := range keys {
		var s string
		switch f := fields[i].Interface().(type) {
		case []string:
			s = strings.Join(f, ",")
		default:
			s = fmt.Sprint(f)
		}
		out = append(out, k+"="+s)
	}
	return out, nil
}

// UnknownVars lists GATEKEEPER_* variables in env that configure nothing,
// most likely typos. GATEKEEPER_TEST_* (test servers) are not reported.
func UnknownVars(env []string) ([]string, error) {
	keys, err := ConfigKeys()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, EnvPrefix+"_") && !strings.HasPrefix(k, EnvPrefix+"_TEST_") && !slices.Contains(keys, k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out, nil
}
