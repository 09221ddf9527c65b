-- release: gives back the slots of deferred events that missed them. A
-- deferred event counts in the windows that hold its due time (admit.lua);
-- when it comes back after its slot ended (a crash, a broker restart), it is
-- checked again as new, and without this its first slot would stay spent:
-- the window counts would run ahead of the events. Each call takes back one
-- slot, once: a marker key per trip makes a repeated call (a retried call,
-- a redelivered batch) take nothing back.
--
-- KEYS[1]   the trip's marker key, <prefix>:{<tenant>}:released:<trip>
-- KEYS[2..] the windows the slot was counted in, <rule key>:<start ms>
--           (all keys of one tenant: one Cluster slot)
-- ARGV[1]   the marker's time to live, ms
-- ARGV[2..] what the event counted in each window, index-aligned with
--           KEYS[2..]
-- Reply     1 if the slot was taken back, 0 if the marker was already set.
--           A window that is gone, holds no integer count, or counts less
--           than the event is left as it is.
if not redis.call("SET", KEYS[1], "1", "NX", "PX", ARGV[1]) then
  return 0
end
for i = 2, #KEYS do
  local by = tonumber(ARGV[i])
  local ok, c = pcall(redis.call, "HGET", KEYS[i], "count")
  c = ok and tonumber(c)
  if c and by and c >= by and by > 0 then
    redis.call("HINCRBY", KEYS[i], "count", -by)
  end
end
return 1
