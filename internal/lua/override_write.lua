-- override_write: set or delete one tenant's live override, compare-and-set
-- on its version, checking the floors of all tenants against the capacity,
-- and append the change to the audit stream, atomically.
--
-- KEYS[1] records: hash, tenant -> "<version> <record JSON>"
-- KEYS[2] version: the last version given out (a counter); every change
--         takes the next one, so versions order all changes
-- KEYS[3] audit: stream of changes, one entry per version
-- KEYS[4] expiries: sorted set, tenant scored by its expiry (unix ms)
-- KEYS[5] floors: hash, tenant -> the floors of its override
--         ("<window>=<floor> ...", "" for a share without floors), for every
--         override that sets a share and is not shadow
-- KEYS[6] floor sums: hash, window -> the sum of KEYS[5]'s floors there; its
--         field "*built" says KEYS[5] and KEYS[6] hold every override (the
--         store builds them from KEYS[1] when it is missing)
-- All six share one {hash tag} (internal/override/keys.go).
-- ARGV[1] tenant   ARGV[2] expected version: the tenant's current one (0: it
--         has none), or -1 to write whatever is there (never sent by the API)
-- ARGV[3] op: "set" or "delete"   ARGV[4] record JSON (set; "" for delete)
-- ARGV[5] expiry, unix ms (0: none)   ARGV[6] who (token name)
-- ARGV[7] when, unix ms   ARGV[8] why
-- ARGV[9] audit entries kept at most (approximate: MAXLEN ~)
-- ARGV[10] audit entries older than this (unix ms) are trimmed (MINID ~)
-- ARGV[11] the tenant's floors after the write, as KEYS[5] holds them, or
--          "-": no share in force (a delete, a shadow override, rules alone)
-- ARGV[12] W: capacity rules to check the floors against (0: no check)
-- ARGV[13 .. 12+3W] per capacity rule: its window, its limit, the tenant's
--          floor there in LIMITS (what it has without an override's share)
-- ARGV[13+3W] N: tenants with floors in LIMITS, then N groups of 1+W
--          arguments: the tenant, its floor per capacity rule
-- The check: a tenant's floor in force is its override's (KEYS[5]) or else
-- its floor in LIMITS. A write that raises the tenant's floor of a capacity
-- rule is refused if the floors of all tenants would then sum over its limit;
-- one that does not raise it is taken (a way back from floors over the limit).
-- Reply: {1, version} written; {0, current version} stale (nothing written);
--   {-1, 0} delete of a tenant without an override (nothing written);
--   {-2, i, sum} the floors of capacity rule i would sum to sum, over its
--   limit (nothing written); {-3, 0} KEYS[5] and KEYS[6] not built (nothing
--   written).
-- Work: O(1 + N) Redis commands, and the trims' amortised work.
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

local function floors(e)
  local t = {}
  if e then
    for w, n in string.gmatch(e, '(%S+)=(%d+)') do
      t[w] = tonumber(n)
    end
  end
  return t
end
local newf = ARGV[11]
if newf == '-' then
  newf = nil
end
local oldf = redis.call('HGET', KEYS[5], tenant) or nil
local W = tonumber(ARGV[12])
if W > 0 then
  if redis.call('HEXISTS', KEYS[6], '*built') == 0 then
    return {-3, 0}
  end
  -- The floors of LIMITS in force: those of the tenants without an
  -- override's share.
  local at = 13 + 3 * W
  local sums = {}
  for i = 1, W do
    sums[i] = 0
  end
  for j = 0, tonumber(ARGV[at]) - 1 do
    local g = at + 1 + j * (1 + W)
    if redis.call('HEXISTS', KEYS[5], ARGV[g]) == 0 then
      for i = 1, W do
        sums[i] = sums[i] + tonumber(ARGV[g + i])
      end
    end
  end
  local of, nf = floors(oldf), floors(newf)
  for i = 1, W do
    local w, limit, inlimits = ARGV[10 + 3 * i], tonumber(ARGV[11 + 3 * i]), tonumber(ARGV[12 + 3 * i])
    local total = sums[i] + (tonumber(redis.call('HGET', KEYS[6], w)) or 0)
    local old, new = inlimits, inlimits
    if oldf then
      old = of[w] or 0
    end
    if newf then
      new = nf[w] or 0
    end
    if new > old and total - old + new > limit then
      return {-2, i, total - old + new}
    end
  end
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
if oldf or newf then
  for w, n in pairs(floors(oldf)) do
    redis.call('HINCRBY', KEYS[6], w, -n)
  end
  for w, n in pairs(floors(newf)) do
    redis.call('HINCRBY', KEYS[6], w, n)
  end
  if newf then
    redis.call('HSET', KEYS[5], tenant, newf)
  else
    redis.call('HDEL', KEYS[5], tenant)
  end
end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[9], '*', 'v', v, 'tenant', tenant, 'op', op,
  'by', ARGV[6], 'at', ARGV[7], 'why', ARGV[8], 'before', curjson, 'bv', curver, 'after', after)
redis.call('XTRIM', KEYS[3], 'MINID', '~', ARGV[10])
return {1, v}
