-- override_expire: delete the live overrides whose expiry has passed, at
-- most ARGV[2] of them, each with its own version and audit entry.
--
-- KEYS: as override_write (records, version, audit, expiries, floors, floor
-- sums); an expired override's floors leave KEYS[5] and KEYS[6] with it.
-- ARGV[1] now (unix ms)   ARGV[2] most overrides deleted by this call
-- ARGV[3] who (the audit's name for the expiry)
-- ARGV[4] audit entries kept at most   ARGV[5] audit MINID (unix ms)
-- Reply: the number deleted. Work: O(ARGV[2]) commands.
local due = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, tenant in ipairs(due) do
  local cur = redis.call('HGET', KEYS[1], tenant)
  redis.call('ZREM', KEYS[4], tenant)
  if cur then
    local sp = string.find(cur, ' ', 1, true)
    local v = redis.call('INCR', KEYS[2])
    redis.call('HDEL', KEYS[1], tenant)
    local f = redis.call('HGET', KEYS[5], tenant)
    if f then
      for w, n in string.gmatch(f, '(%S+)=(%d+)') do
        redis.call('HINCRBY', KEYS[6], w, -tonumber(n))
      end
      redis.call('HDEL', KEYS[5], tenant)
    end
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'v', v, 'tenant', tenant, 'op', 'expire',
      'by', ARGV[3], 'at', ARGV[1], 'why', 'expired', 'before', string.sub(cur, sp + 1),
      'bv', string.sub(cur, 1, sp - 1), 'after', '')
  end
end
if #due > 0 then
  redis.call('XTRIM', KEYS[3], 'MINID', '~', ARGV[5])
end
return #due
