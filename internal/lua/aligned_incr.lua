-- aligned_incr: the seed's aligned-window counter. The key names the window
-- (it carries the window's start); the hash holds `count` and the logical
-- `expire` (the window's end). The count resets when the logical expiry has
-- passed, even while the key still exists; the key itself lives on for a
-- retention period after the window ends, so past windows stay queryable.
-- Times are unix milliseconds from the caller's clock (the one time source).
--
-- KEYS[1]  window key, <prefix>:{<tenant>}:<rule>:<window start ms>
-- ARGV[1]  logical expiry: the window's end, unix ms
-- ARGV[2]  physical time to live in ms (window end - now + retention)
-- ARGV[3]  now, unix ms
-- Reply    {count, expire}
local key = KEYS[1]
local expire = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local now = tonumber(ARGV[3])

if redis.call("EXISTS", key) == 1 then
  local cur = tonumber(redis.call("HGET", key, "expire"))
  if cur and now < cur then
    return {redis.call("HINCRBY", key, "count", 1), cur}
  end
end
redis.call("HSET", key, "count", 1, "expire", expire)
redis.call("PEXPIRE", key, ttl)
return {1, expire}
