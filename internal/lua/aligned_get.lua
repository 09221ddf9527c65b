-- aligned_get: the seed's read-only "current access count" for an aligned
-- window (also used for the windows that admit.lua writes, which share the
-- same hash layout).
--
-- KEYS[1]  window key
-- ARGV[1]  now, unix ms
-- Reply    {count, expire}; {0, now} when absent or expired
local key = KEYS[1]
local now = tonumber(ARGV[1])
local v = redis.call("HMGET", key, "count", "expire")
local count, expire = tonumber(v[1]), tonumber(v[2])
if count and expire and now < expire then
  return {count, expire}
end
return {0, now}
