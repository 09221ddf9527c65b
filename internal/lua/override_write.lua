-- override_write: set or delete one tenant's live override, compare-and-set
-- on its version, and append the change to the audit stream, atomically.
--
-- KEYS[1] records: hash, tenant -> "<version> <record JSON>"
-- KEYS[2] version: the last version given out (a counter); every change
--         takes the next one, so versions order all changes
-- KEYS[3] audit: stream of changes, one entry per version
-- KEYS[4] expiries: sorted set, tenant scored by its expiry (unix ms)
-- All four share one {hash tag} (internal/override/keys.go).
-- ARGV[1] tenant   ARGV[2] expected version: the tenant's current one (0: it
--         has none), or -1 to write whatever is there (never sent by the API)
-- ARGV[3] op: "set" or "delete"   ARGV[4] record JSON (set; "" for delete)
-- ARGV[5] expiry, unix ms (0: none)   ARGV[6] who (token name)
-- ARGV[7] when, unix ms   ARGV[8] why
-- ARGV[9] audit entries kept at most (approximate: MAXLEN ~)
-- ARGV[10] audit entries older than this (unix ms) are trimmed (MINID ~)
-- Reply: {1, version} written; {0, current version} stale (nothing written);
--   {-1, 0} delete of a tenant without an override (nothing written).
-- Work: O(1) Redis commands, and the trims' amortised work.
local tenant, expected, op = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local cur = redis.call('HGET', KEYS[1], tenant)
local curver, curjson = 0, ''
if cur then
  local sp = string.find(cur, ' ', 1, true)
  curver = tonumber(string.sub(cur, 1, sp - 1))
  curjson = string.sub(cur, sp + 1)
end
if expected >= 0 and curver ~= expected then
  return {0, curver}
end
if op == 'delete' and not cur then
  return {-1, 0}
end
local v = redis.call('INCR', KEYS[2])
local after = ''
if op == 'set' then
  after = ARGV[4]
  redis.call('HSET', KEYS[1], tenant, v .. ' ' .. after)
  if tonumber(ARGV[5]) > 0 then
    redis.call('ZADD', KEYS[4], ARGV[5], tenant)
  else
    redis.call('ZREM', KEYS[4], tenant)
  end
else
  redis.call('HDEL', KEYS[1], tenant)
  redis.call('ZREM', KEYS[4], tenant)
end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[9], '*', 'v', v, 'tenant', tenant, 'op', op,
  'by', ARGV[6], 'at', ARGV[7], 'why', ARGV[8], 'before', curjson, 'bv', curver, 'after', after)
redis.call('XTRIM', KEYS[3], 'MINID', '~', ARGV[10])
return {1, v}
