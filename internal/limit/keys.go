package limit

import (
	"encoding/base64"
	"strconv"
	"strings"
	"time"
)

// Key layout. This file is the one owner of the layout of the counter keys;
// admit.lua receives the rule keys (and frontier keys) in KEYS and builds a
// rule's window and anchor keys from its rule key with the two suffixes below
// (wkey and anchor_key in internal/lua/admit/30_windows.lua). TestAdmitScriptKeys runs the script against a
// real Redis and holds the keys it writes to the keys built here.
//
//	<prefix>:{<tenant>}:<counter>             rule key (keys.rule)
//	<rule key>:<window start ms>              a window's count (keys.window)
//	<rule key>:anchor                         a ttl chain (keys.anchor)
//	<prefix>:{<tenant>}:frontier:<rule set>   search frontier (keys.frontier)
//	<prefix>:{<tenant>}:taken                 slots taken by late events (keys.taken)
//	<prefix>:cap:<counter>                    capacity rule key (keys.capacity)
//	<capacity key>:<window start ms>          a capacity window (admit/35_capacity.lua)
//	<capacity key>/demand:<window start ms>   its demand histogram (CapacityDemandSuffix)
//
// <counter> is the rule's window as written ("1m" for the rule "1000/1m"), then
// "/bytes" for a byte rule ("10MiB/1m") or "/units" for a unit rule ("500u/1m"),
// then "/ttl" for ttl windows (see Rule.Counter). The limit is not part of the key: a tenant has
// one rule per measure and window, and when an operator changes a limit, the new limit
// applies to what the window already counted (raising 5/1m to 50/1m
// mid-window admits 45 more, lowering it to 2/1m admits none). The tenant
// sits in a {hash tag} so that all keys of a tenant live in one Redis Cluster
// slot and one script call can touch them all; a prefix with a tag of its
// own ("{gk}") puts every key in one slot (OneSlot).
//
// Tenants are opaque bytes. A tenant made only of [A-Za-z0-9._@-] is written
// as is; any other is written as "~" and its unpadded base64url form. Plain
// names never start with "~", so two tenants never share a key, and the hash
// tag never holds a brace.

// The suffixes that turn a rule key into the keys of its windows and of its
// ttl chain. admit.lua writes the same two by hand; TestAdmitScriptKeys
// fails if the two drift apart.
const (
	// WindowSep joins a rule key and a window's start in unix ms:
	// <rule key>:<start ms>.
	WindowSep = ":"
	// AnchorSuffix ends the key of a rule's ttl chain: <rule key>:anchor.
	AnchorSuffix = ":anchor"
	// CapacityDemandSuffix turns a capacity rule key into the prefix of its
	// windows' demand histograms: <capacity key>/demand:<start ms>
	// (35_capacity.lua's dkey; outside the pattern <capacity key>:*).
	CapacityDemandSuffix = "/demand"
	// TakenSuffix ends the key of a tenant's record of slots taken by late
	// events: <prefix>:{<tenant>}:taken, a hash of takes by due time
	// (admit/85_late.lua builds it from a rule key, record_key).
	TakenSuffix = ":taken"
)

// encodeTenant returns the tenant's form inside the hash tag.
func encodeTenant(tenant string) string {
	if tenant != "" && plain(tenant) {
		return tenant
	}
	return "~" + base64.RawURLEncoding.EncodeToString([]byte(tenant))
}

func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9',
			c == '.', c == '_', c == '@', c == '-':
		default:
			return false
		}
	}
	return true
}

// OneSlot reports whether every key under prefix lives in one Redis Cluster
// slot: prefix holds a hash tag, a "{" followed later by a "}" with at least
// one byte between (Redis hashes only the first such tag of a key, so the
// tenants' own tags after it no longer count).
func OneSlot(prefix string) bool {
	i := strings.IndexByte(prefix, '{')
	return i >= 0 && strings.IndexByte(prefix[i+1:], '}') > 0
}

// keys builds the counter keys of one limiter. It is a value type.
type keys struct {
	prefix string
	kind   WindowKind
	// scope names the deployment in replay record keys (Options.ReplayScope).
	scope string
}

func (k keys) tenant(tenant string) string {
	return k.prefix + ":{" + encodeTenant(tenant) + "}"
}

// rule returns the prefix of a rule's window keys: <prefix>:{<tenant>}:<counter>.
func (k keys) rule(tenant string, r Rule) string {
	s := k.tenant(tenant) + ":" + r.Counter()
	if k.kind == TTL {
		s += "/ttl"
	}
	return s
}

// window returns the key of the window of r starting at start. admit.lua
// builds the same key from the rule key it is given (wkey).
func (k keys) window(tenant string, r Rule, start time.Time) string {
	return k.rule(tenant, r) + WindowSep + strconv.FormatInt(start.UnixMilli(), 10)
}

// anchor returns the key of the ttl chain of r: <rule key>:anchor. admit.lua
// builds the same key from the rule key it is given (anchor_key).
func (k keys) anchor(tenant string, r Rule) string {
	return k.rule(tenant, r) + AnchorSuffix
}

// taken returns the key of the tenant's record of slots taken by late
// events (TakenSuffix): it does not depend on the tenant's rules.
func (k keys) taken(tenant string) string {
	return k.tenant(tenant) + TakenSuffix
}

// takesUntil returns the key of the fleet's bound on the due times of the
// slots late events took (Limiter.TakesUntil): <prefix>:takes-until.
func (k keys) takesUntil() string {
	return k.prefix + ":takes-until"
}

// frontier returns the key of the tenant's search frontier for a rule set.
// set is the rule set's ruleSetID(k.kind, rules).
func (k keys) frontier(tenant, set string) string {
	return k.tenant(tenant) + ":frontier:" + set
}

// capacity returns the prefix of a capacity rule's window keys,
// <prefix>:cap:<counter>, global (no tenant's hash tag); a capacity window's
// hash holds a field per tenant (capacityField).
func (k keys) capacity(r Rule) string {
	return k.prefix + ":cap:" + r.Counter()
}

// capacityField is the field of what a tenant booked in a capacity window's
// hash: "t:" and its encoded name, apart from the window's own fields
// (35_capacity.lua's header); "r:" and the name holds what it was refused.
func capacityField(tenant string) string { return "t:" + encodeTenant(tenant) }

// replay returns the key of the replay record of a source partition on a
// single Redis, where one script call decides a whole batch:
// <prefix>:replay:[<scope>:]<topic>:<partition>[:<topic id>], the scope
// being Options.ReplayScope (the consumer group) and the topic ID Kafka's
// (Source.TopicID), so that neither another deployment nor a topic
// re-created under the same name ever finds these decisions. Kafka topic
// names hold only [A-Za-z0-9._-] and topic IDs are base64url, so the key is
// unambiguous whatever the scope holds.
func (k keys) replay(src Source) string {
	return k.prefix + ":replay:" + k.replaySuffix(src)
}

func (k keys) replaySuffix(src Source) string {
	s := src.Topic + ":" + strconv.Itoa(src.Partition)
	if k.scope != "" {
		s = k.scope + ":" + s
	}
	if src.TopicID != "" {
		s += ":" + src.TopicID
	}
	return s
}

// tenantReplay returns the key of the replay record of a tenant's events of
// a source partition, for Redis Cluster, where each script call decides one
// tenant and touches only its slot: <prefix>:{<tenant>}:replay:<as replay>.
// Deleted once commits pass it (replaySweep).
func (k keys) tenantReplay(tenant string, src Source) string {
	return k.tenant(tenant) + ":replay:" + k.replaySuffix(src)
}

// ruleSetID names a rule set, for frontier keys and the local cache.
func ruleSetID(kind WindowKind, rules []Rule) string {
	parts := make([]string, len(rules))
	for i, r := range rules {
		parts[i] = r.String()
	}
	return string(kind) + ":" + strings.Join(parts, ",")
}

// Key lifetimes. A window key lives until its window ends plus a retention,
// counted from the end of the window it names, so a slot reserved in a
// future window keeps its key at least that long too.
//
// Windows of a day or longer keep the seed's retention (Options.Retention,
// default 7 days): a day's count stays queryable for a week, a handful of
// keys per tenant and rule. Shorter windows keep 24 windows' length, at
// least a minute and at most Options.Retention: a tenant then holds about 25
// keys per rule whatever the window's length (a 1s rule kept for 7 days would
// hold 604,800), a flood of made-up tenants leaves keys that are gone within
// minutes of a one-second or one-minute window, and an hourly rule still keeps
// its last day. The minute is the margin a key keeps past its window's end so
// that a replica whose clock lags, or a usage query at the boundary, never
// finds a window it still counts in already gone (a lost key restarts its
// count and would let the limit be passed).
const (
	minRetention    = time.Minute
	retentionFactor = 24
)

// retention returns how long the keys of r's windows live after their
// window ends, given the configured retention (Options.Retention).
func retention(r Rule, configured time.Duration) time.Duration {
	w := r.Length()
	if w >= 24*time.Hour {
		return configured
	}
	return min(configured, max(minRetention, retentionFactor*w))
}
