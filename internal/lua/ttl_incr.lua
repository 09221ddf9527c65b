-- ttl_incr: the seed's first script. Counts one hit in a window that starts at
-- the key's first hit and lasts a fixed time (the key's TTL).
--
-- KEYS[1]  counter key
-- ARGV[1]  window length in seconds
-- Reply    {count, seconds left until the count resets}
local key = KEYS[1]
local ttl = tonumber(ARGV[1])

if redis.call("EXISTS", key) == 1 then
  local count = redis.call("INCR", key)
  local left = redis.call("TTL", key)
  if left < 0 then
    -- A key without expiry can only come from outside this script; give it one.
    redis.call("EXPIRE", key, ttl)
    left = ttl
  end
  return {count, left}
end
redis.call("SET", key, 1, "EX", ttl)
return {1, ttl}
