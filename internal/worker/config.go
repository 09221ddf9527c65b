package worker

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/route"
)

// EnvPrefix starts every configuration variable.
const EnvPrefix = "GATEKEEPER"

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
	// The groups, embedded: their fields are Config's, and their order
	// is the order of the README's configuration table.
	KafkaConfig
	TopicsConfig
	RedisConfig
	LimitsConfig
	PaceConfig
	EventsConfig
	RetryConfig
	BoundsConfig
	HTTPConfig
	OverridesConfig

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

// KafkaConfig is the Kafka group of Config: the brokers, the consumer group, the timeouts of Kafka calls, and SASL and TLS to the brokers.
type KafkaConfig struct {
	// KafkaBrokers are the bootstrap brokers, host:port each.
	KafkaBrokers []string `split_words:"true" default:"localhost:9092" desc:"comma-separated bootstrap brokers (host:port)"`
	// GroupID is the Kafka consumer group shared by all replicas.
	GroupID string `split_words:"true" default:"gatekeeper" desc:"consumer group of all replicas"`
	// KafkaTimeout bounds every Kafka call.
	KafkaTimeout time.Duration `split_words:"true" default:"10s" desc:"timeout of every Kafka call"`
	// KafkaSessionTimeout is how long the group waits for a silent member
	// (a crashed replica) before its partitions move to the others.
	KafkaSessionTimeout time.Duration `split_words:"true" default:"30s" desc:"consumer-group session timeout: how soon a crashed replica's partitions move (6s to 30s with Kafka's defaults); the retry group takes at most 10s, so that deferred events miss few reserved slots"`
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
}

// TopicsConfig is the Topics group of Config: the topics read and written.
type TopicsConfig struct {
	// SourceTopics are the topics whose events are gated.
	SourceTopics []string `split_words:"true" required:"true" desc:"comma-separated topics to gate"`
	// DownstreamTopic receives admitted events.
	DownstreamTopic string `split_words:"true" required:"true" desc:"where admitted events go"`
	// RetryTopic receives deferred events; longer delays go to tiers with
	// the suffixes .1h and .long. Default <DownstreamTopic>.retry.
	RetryTopic string `split_words:"true" doc_default:"<DOWNSTREAM_TOPIC>.retry" desc:"where deferred events go (tiers add the suffixes .1h and .long)"`
	// DLQTopic receives rejected and invalid events. Default <DownstreamTopic>.dlq.
	DLQTopic string `split_words:"true" doc_default:"<DOWNSTREAM_TOPIC>.dlq" desc:"dead-letter topic for rejected and invalid events"`
}

// RedisConfig is the Redis group of Config: the Redis servers, their timeout, the key prefix, and authentication and TLS to Redis. `gatekeeper usage` reads this group.
type RedisConfig struct {
	// RedisAddrs are the Redis servers; more than one means Redis Cluster.
	RedisAddrs []string `split_words:"true" default:"localhost:6379" desc:"comma-separated host:port, each server once; more than one means Redis Cluster (see REDIS_CLUSTER)"`
	// RedisCluster says whether REDIS_ADDRS is a Redis Cluster: true,
	// false, or auto (also when empty): more than one address is a
	// cluster, and one address is asked with CLUSTER INFO at start.
	RedisCluster string `split_words:"true" default:"auto" desc:"Redis Cluster: true, false, or auto (more than one address is a cluster; one address is asked with CLUSTER INFO at start)"`
	// RedisKeyPrefix starts every counter key.
	RedisKeyPrefix string `split_words:"true" default:"gk" desc:"prefix of every counter key; on Redis Cluster, one with a {hash tag} (e.g. {gk}) puts every key in one slot: one script call per batch, as on one Redis, and a CAPACITY allowed"`
	// RedisTimeout bounds every Redis call.
	RedisTimeout time.Duration `split_words:"true" default:"2s" desc:"timeout of every Redis call"`
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
}

// LimitsConfig is the Limits group of Config: the rules and the windows they count in. `gatekeeper usage` reads this group.
type LimitsConfig struct {
	// Limits are the rules, e.g. *=100/1m;acme=1000/1m,50000/1d.
	Limits string `doc_required:"unless LIMITS_FILE" desc:"rules, e.g. *=100/1m;acme=1000/1m,10MiB/1m (* is every other tenant; units s m h d w mo; limits in events, bytes with B KB MB GB TB KiB MiB GiB TiB, or units with u)"`
	// LimitsFile is a YAML file of rules, reloaded when it changes. It
	// replaces LIMITS; setting both is an error.
	LimitsFile string `split_words:"true" desc:"YAML file of rules, reloaded on change (instead of LIMITS)"`
	// Capacity is the budget shared by every tenant (capacity.go).
	Capacity string `desc:"one budget for the downstream shared fairly by all tenants: events, bytes or units (one measure) per aligned second, minute, hour, day or week (hours, days and weeks in a zone without daylight saving), e.g. 5000/1s, 5000/1s,200000/1m or 10MiB/1s (tenants' weight:N and floor:N/1s in LIMITS, floors in the capacity's measure); a single Redis, or a Redis Cluster under a REDIS_KEY_PREFIX with a {hash tag}"`
	// Window is the window kind: aligned or ttl.
	Window string `default:"aligned" desc:"window kind: aligned (calendar boundaries) or ttl (from a tenant's first event)"`
	// Timezone places day, week and month boundaries of aligned windows.
	Timezone string `default:"UTC" desc:"IANA zone for day, week and month boundaries"`
	// DeferHorizon is the furthest in the future a deferral may reach.
	DeferHorizon time.Duration `split_words:"true" default:"24h" desc:"furthest a deferral may reach"`
	// Retention keeps aligned window keys this long after their window ends.
	Retention time.Duration `default:"168h" desc:"how long counters of windows of a day or longer stay after the window ends; shorter windows keep 24 windows (at least 1m), at most this"`
}

// EventsConfig is the Events group of Config: where an event's tenant and cost are, and what the process does with events.
type EventsConfig struct {
	// TenantFrom says where an event's tenant is: key, header:<name> or json:<dot.path>.
	TenantFrom string `split_words:"true" default:"key" desc:"where the tenant is: key, header:NAME or json:DOT.PATH"`
	// CostFrom says where an event's cost in units is, for rules that count
	// units (5000u/1m): header:<name> or json:<dot.path>. Empty: no units.
	CostFrom string `split_words:"true" desc:"where an event's cost in units is, for rules counting units (5000u/1m): header:NAME or json:DOT.PATH; when set, an event without a valid cost is invalid"`
	// Roles are the parts this process runs: gate (source topics), retry
	// (retry topics), or both.
	Roles []string `default:"gate,retry" desc:"what this process runs: gate, retry or gate,retry"`
	// OnRedisError is what happens while Redis fails: pause or forward.
	OnRedisError string `split_words:"true" default:"pause" desc:"while Redis fails: pause consumption, or forward unchecked"`
	// Shadow counts and records decisions but forwards every event.
	Shadow bool `default:"false" desc:"count and record decisions, forward everything"`
}

// RetryConfig is the Retry group of Config: the deferral of events: attempts, the retry role's lookahead, and the signature of deferred events.
// The values of LATE_TAKES_SLOTS.
const (
	lateOff   = "off"
	lateCheck = "check"
	lateOn    = "on"
)

type RetryConfig struct {
	// MaxAttempts is how often one event may be deferred before it is dead-lettered.
	MaxAttempts int `split_words:"true" default:"5" desc:"deferrals of one event before it is dead-lettered"`
	// LateTakesSlots: off, check (the Retrier checks claims,
	// route.Retrier.CheckClaims) or on (a deferred event that missed its
	// slot takes the slot of its tenant's earliest later reservation,
	// route.Retrier.TakeSlots, and claims are checked).
	LateTakesSlots string `split_words:"true" default:"on" desc:"on: a deferred event that missed its slot takes the slot of its tenant's earliest later reservation, ahead of what the tenant deferred after it (tenants whose rules are all aligned windows, of any measure, with or without a CAPACITY, or one ttl rule without a CAPACITY), and events back in their slot are checked with one small read while no take is due that late (with a CAPACITY_ADVANCE backlog, with an admit call per retry batch); check: take none, but check whether an event back in its slot lost it (one Redis call per retry batch); off: neither. Rolling from a release whose default was off (before 2026-12-05), or from one that took no slot for some tenants that take them now (rules of bytes or units, a CAPACITY, rules that do not nest, or bytes or units only in coarser windows: each before 2026-12-05): set check on every replica for that rollout, then remove it in a second one, no sooner than DEFER_HORIZON after the last older replica stopped"`
	// RetryLookahead bounds the deferred events the retry role holds in
	// memory per retry-tier partition.
	RetryLookahead int `split_words:"true" default:"10000" desc:"most deferred events held in memory per retry-tier partition while they wait for their release time (memory: about this many times the partitions of the retry tiers times the event size, with headers)"`
	// RetryLookaheadBytes bounds the bytes of the deferred events the retry
	// role holds per retry-tier partition.
	RetryLookaheadBytes int `split_words:"true" default:"524288" desc:"most bytes of deferred events held in memory per retry-tier partition (keys, values, headers and their overhead on the heap, and 16 bytes per passed-over event); when they are all not due, the ones released last are passed over and read again before they are due"`
	// RetrySecret, when set, is the HMAC-SHA256 key that signs the gk-
	// headers of deferred events (gk-sig); events in the retry tiers whose
	// signature is missing or does not match are dead-lettered. At least
	// route.MinSecretBytes. Secret.
	RetrySecret string `split_words:"true" desc:"key of at least 32 bytes that signs deferred events (gk-sig); the retry tiers dead-letter events it did not sign (none: not signed or checked)"`
	// RetrySecretPrevious is the retry secret being rotated out: gk-sig made
	// with it still verifies, but nothing is signed with it. Secret.
	RetrySecretPrevious string `split_words:"true" desc:"the RETRY_SECRET being rotated out: still accepted when checking gk-sig, never used to sign"`
	// RetryAcceptUnsignedUntil, an RFC 3339 time, is the end of the
	// transition while signing is turned on: until then the retry tiers also
	// accept events without gk-sig (written by replicas not yet rolled, or
	// by a release before gk-sig was bound to its tier). Not a secret.
	RetryAcceptUnsignedUntil string `split_words:"true" desc:"while turning RETRY_SECRET on: until this RFC 3339 time the retry tiers also accept unsigned events, deferred by replicas not yet rolled (set it to the rollout's end plus DEFER_HORIZON; none: never)"`
	// CapacityAdvance: with a capacity on aligned windows, the
	// retry tiers move waiting deferred events into the capacity's idle
	// room (route.Retrier.AdvanceBacklog, #24).
	CapacityAdvance bool `split_words:"true" default:"true" desc:"with a CAPACITY (of events, bytes or units) and aligned windows, the retry tiers move waiting deferred events into the current window when the capacity has room nobody is expected to take, each by its cost, so that a backlog drains at the capacity (false: they wait for their reserved slots, at about half of it). With it the first retry tier checks the events back in their slot, one Redis call per batch, as LATE_TAKES_SLOTS=check does. Set false on every replica while rolling from a release without it"`
}

// BoundsConfig is the Bounds group of Config: the bounds of batches, records and the limiter's memory.
type BoundsConfig struct {
	// BatchSize bounds the events of one partition handled as one batch.
	BatchSize int `split_words:"true" default:"500" desc:"most events of one partition decided in one batch"`
	// BatchBytes bounds the bytes of one source batch.
	BatchBytes int `split_words:"true" default:"4194304" desc:"most bytes (keys, values, headers and their overhead on the heap) of one partition's source events decided in one batch; a batch holds at least one event"`
	// BatchWait bounds how long a batch waits to fill.
	BatchWait time.Duration `split_words:"true" default:"50ms" desc:"longest a batch waits to fill"`
	// DecideAhead lets a source partition decide its next batch while the
	// one before it is written (consume.Config.DecideAhead).
	DecideAhead bool `split_words:"true" default:"true" desc:"a source partition decides its next batch (its one Redis call) while the batch before it is written to Kafka, so that the two waits overlap; a partition then holds up to two batches (2 x BATCH_BYTES; in the bench's mix about 7 MB more peak RSS). false: one batch at a time, for a replica whose memory counts more than its events a second"`
	// MaxMessageBytes is the largest record Gatekeeper writes downstream and
	// to the dead-letter topic (and to a retry tier whose max.message.bytes
	// it cannot read at start-up).
	MaxMessageBytes int `split_words:"true" default:"1048576" desc:"largest record written downstream and to the dead-letter topic, gk- headers included (at most the output topics' max.message.bytes; the retry tiers take up to their own, read at start-up); optional gk- headers go first, and only an event too large by itself is dead-lettered, without its value if need be"`
	// LimiterCacheBytes bounds the limiter's memory of tenants
	// (limit.Options.CacheBytes).
	LimiterCacheBytes int `split_words:"true" default:"16777216" desc:"most bytes (estimated, on the heap) of the tenants the limiter remembers: key names and tenants known full, whose events are rejected without Redis; the least recently used go first, tenants known full last"`
}

// HTTPConfig is the HTTP group of Config: the HTTP server (metrics, health, the usage API), logging and shutdown.
type HTTPConfig struct {
	// HTTPAddr is where metrics, health and the usage API listen.
	HTTPAddr string `split_words:"true" default:":8080" desc:"listen address of metrics, health and the usage API"`
	// AdminToken, when set, is the bearer token the usage API requires. Secret.
	AdminToken string `split_words:"true" desc:"bearer token for the usage API, at least 16 bytes (none: the API is open, with a warning)"`
	// AdminTokens are more bearer tokens of the HTTP API, each with a name
	// (for the audit of overrides) and a scope. Secret.
	AdminTokens string `split_words:"true" desc:"more API tokens, comma-separated NAME:SCOPE:TOKEN; SCOPE read (usage, top, overrides, audit) or write (also set and delete overrides); tokens at least 16 bytes; ADMIN_TOKEN is admin:write"`
	// Pprof serves Go's profiles under /debug/pprof/ on HTTP_ADDR, behind
	// ADMIN_TOKEN when one is set.
	Pprof bool `default:"false" desc:"serve Go's profiles (CPU, heap, allocations, goroutines) under /debug/pprof/ on HTTP_ADDR, behind ADMIN_TOKEN when it is set"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `split_words:"true" default:"info" desc:"debug, info, warn or error"`
	// ShutdownGrace bounds the drain after SIGTERM.
	ShutdownGrace time.Duration `split_words:"true" default:"25s" desc:"time to finish writes, commit and leave the group after SIGTERM"`
}

// OverridesConfig is the Overrides group of Config: the audit of live
// overrides and the top view.
type OverridesConfig struct {
	// OverrideAuditRetention bounds how long audit entries of overrides are kept.
	OverrideAuditRetention time.Duration `split_words:"true" default:"720h" desc:"how long the audit of override changes is kept"`
	// OverrideAuditMax bounds the audit entries of overrides kept.
	OverrideAuditMax int `split_words:"true" default:"100000" desc:"most audit entries of override changes kept (the oldest go first)"`
	// TopWindow is the window of the top view's counts.
	TopWindow time.Duration `split_words:"true" default:"1m" desc:"window of the top view (GET /v1/tenants/top, gatekeeper top): counts of the current and the last window"`
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

// retryTopics lists the retry topic and its tiers.
func (c *Config) retryTopics() []string {
	out := []string{c.RetryTopic}
	for _, s := range route.RetryTierSuffixes() {
		out = append(out, c.RetryTopic+s)
	}
	return out
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
	if c.RetryAcceptUnsignedUntil != "" {
		until, err := time.Parse(time.RFC3339, c.RetryAcceptUnsignedUntil)
		if err != nil {
			return nil, bad("RETRY_ACCEPT_UNSIGNED_UNTIL", "%q is not an RFC 3339 time", c.RetryAcceptUnsignedUntil)
		}
		s = s.AcceptUnsignedUntil(until, time.Now)
	}
	return s, nil
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
