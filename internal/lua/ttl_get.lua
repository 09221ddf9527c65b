-- ttl_get: the seed's read-only "current access count" for ttl windows.
--
-- KEYS[1]  counter key
-- Reply    {count, seconds left until the count resets}; {0, 0} when absent
local key = KEYS[1]
local count = redis.call("GET", key)
if not count then
  return {0, 0}
end
local left = redis.call("TTL", key)
if left < 0 then
  left = 0
end
return {tonumber(count), left}
