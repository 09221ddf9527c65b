-- takes_until: the fleet's bound on the slots late events took (see
-- admit/85_late.lua): KEYS[1] holds a time in unix ms at or after the end
-- of every window a take was recorded in under the key prefix, so that an
-- event back inside a slot due later cannot have lost it. ARGV[1]: a time to raise it
-- to (a Retrier about to take slots, or one that took some; 0: read only).
-- ARGV[2]: the value it starts at when absent (never set, or lost): the
-- caller's now plus its deferral horizon, since takes of a release that kept
-- no bound, or made before the key was lost, may be due up to that far.
-- Reply: the value, after the raise. One key, a few commands.
local v = tonumber(redis.call("GET", KEYS[1]))
if not v then
  v = tonumber(ARGV[2])
  redis.call("SET", KEYS[1], v)
end
local at = tonumber(ARGV[1])
if at > v then
  v = at
  redis.call("SET", KEYS[1], v)
end
return v
