package worker

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/route"
)

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
			case strings.ContainsAny(c.RedisKeyPrefix, "{}") && !oneTag(c.RedisKeyPrefix):
				return bad("REDIS_KEY_PREFIX", "%q must hold no { or } but one {hash tag} around at least one character (e.g. {gk}: every key in one Redis Cluster slot)", c.RedisKeyPrefix)
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
		c.checkPace,
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
			switch c.LateTakesSlots {
			case lateOff, lateCheck, lateOn:
				return nil
			}
			return bad("LATE_TAKES_SLOTS", "%q is not off, check or on", c.LateTakesSlots)
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
		c.checkAdminTokens,
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

// maxAcceptUnsigned bounds how far ahead RETRY_ACCEPT_UNSIGNED_UNTIL may be:
// a rollout plus the longest DEFER_HORIZON. A later time would leave the
// retry tiers open to unsigned events for longer than any transition needs.
const maxAcceptUnsigned = maxDeferHorizon + 7*24*time.Hour

// checkAcceptUnsigned checks RETRY_ACCEPT_UNSIGNED_UNTIL as of now: an RFC
// 3339 time, with RETRY_SECRET, at most maxAcceptUnsigned ahead. A time in
// the past is valid: the transition is over.
func (c *Config) checkAcceptUnsigned(now time.Time) error {
	if c.RetryAcceptUnsignedUntil == "" {
		return nil
	}
	until, err := time.Parse(time.RFC3339, c.RetryAcceptUnsignedUntil)
	switch {
	case err != nil:
		return bad("RETRY_ACCEPT_UNSIGNED_UNTIL", "%q is not an RFC 3339 time (e.g. 2026-12-31T00:00:00Z)", c.RetryAcceptUnsignedUntil)
	case c.RetrySecret == "":
		return bad("RETRY_ACCEPT_UNSIGNED_UNTIL", "set without %s_RETRY_SECRET: without a secret nothing is checked", EnvPrefix)
	case until.Sub(now) > maxAcceptUnsigned:
		return bad("RETRY_ACCEPT_UNSIGNED_UNTIL", "%s is more than %v ahead: the transition needs a rollout plus DEFER_HORIZON", c.RetryAcceptUnsignedUntil, maxAcceptUnsigned)
	}
	return nil
}

// checkRetrySecret checks RETRY_SECRET and RETRY_SECRET_PREVIOUS. The
// messages never show a secret, nor its length.
func (c *Config) checkRetrySecret() error {
	if c.RetrySecret != "" && len(c.RetrySecret) < route.MinSecretBytes {
		return bad("RETRY_SECRET", "must be at least %d bytes (e.g. openssl rand -base64 32)", route.MinSecretBytes)
	}
	if err := c.checkAcceptUnsigned(time.Now()); err != nil {
		return err
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

// oneTag reports whether prefix holds exactly one "{", then exactly one "}",
// with at least one character between: one hash tag (limit.OneSlot).
func oneTag(prefix string) bool {
	return strings.Count(prefix, "{") == 1 && strings.Count(prefix, "}") == 1 && limit.OneSlot(prefix)
}
