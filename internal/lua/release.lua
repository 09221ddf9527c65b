-- release: gives back the slots of deferred events that missed them. A
-- deferred event counts in the windows that hold its due time (admit.lua);
-- when it comes back after its slot ended (a crash, a broker restart), it is
-- checked again as new, and without this its first slot would stay spent:
-- the window counts would run ahead of the events. Each call takes back one
-- slot, once: a marker key per trip makes a repeated call (a retried call,
-- a redelivered batch) take nothing back.
--
-- A slot that a late event took (admit/85_late.lua: the tenant's record of
-- takes holds some under its due time) is not the event's to give back: the
-- late event was forwarded in it, uncounted. The event gives its slot up
-- instead, as a claim that finds its slot taken does: the take is used up by
-- what the event costs in the take's measure (at most what it holds), and no
-- window counts less. (Given back, the window would count one event less
-- than it forwarded, and a coarser window still current could then take one
-- event over its limit.)
--
-- KEYS[1]   the trip's marker key, <prefix>:{<tenant>}:released:<trip>
-- KEYS[2]   the tenant's record of takes, <prefix>:{<tenant>}:taken
-- KEYS[3..] the windows the slot was counted in, <rule key>:<start ms>
--           (all keys of one tenant: one Cluster slot)
-- ARGV[1]   the marker's time to live, ms
-- ARGV[2]   the slot's due time (unix ms): its field in the record of takes
-- ARGV[3], ARGV[4]  the event's bytes and units (its cost to a take of them)
-- ARGV[5]   1 when the slot's window has not started (an event admitted or
--           moved early): takes may still come there, so it uses up no take;
--           when its pool holds one, nothing is given back either (reply 3)
-- ARGV[6..] what the event counted in each window, index-aligned with
--           KEYS[3..]
-- Reply     1 if the slot was taken back, 2 if it gave up a take instead, 3
--           if it was left as it was (early, beside a take), 0 if the marker
--           was already set. A window that is gone, holds no
--           integer count, or counts less than the event is left as it is;
--           a record that cannot be read, or a pool that holds no integer,
--           holds no take.
if not redis.call("SET", KEYS[1], "1", "NX", "PX", ARGV[1]) then
  return 0
end
local f = ARGV[2]
local ok, v = pcall(redis.call, "HMGET", KEYS[2], f, f .. "/m", f .. "/0", f .. "/1", f .. "/2")
-- int reads a field of the record: 0 unless it holds an integer.
local function int(x)
  return x and string.find(x, "^%-?%d+$") and tonumber(x) or 0
end
local pool = ok and int(v[1]) or 0
if pool > 0 and ARGV[5] == "1" then
  -- Early, beside a take: given back, the window could count fewer than
  -- its takes hold; used up, its count would look free to take again
  -- while the taker uses the slot. Kept as it is, it is only stricter.
  return 3
end
if pool > 0 then
  local cost = {[0] = 1, tonumber(ARGV[3]) or 0, tonumber(ARGV[4]) or 0}
  local mark = int(v[2])
  local used = 0
  if mark == 3 then
    for mu = 0, 2 do
      local sub = int(v[mu + 3])
      local c = math.min(cost[mu], sub)
      if c > 0 then
        redis.call("HINCRBY", KEYS[2], f .. "/" .. mu, -c)
        used = used + c
      end
    end
    used = math.min(used, pool)
  else
    used = math.min(cost[mark] or 1, pool)
  end
  if used > 0 then
    redis.call("HINCRBY", KEYS[2], f, -used)
  end
  return 2
end
-- A window's fields r1 and r2 (the bytes and units reserved in a finest
-- window whose rule counts events: internal/lua/admit/85_late.lua,
-- Reserved), and s0, s1 and s2 at the slot's due time (what a home window
-- holds reserved there in each measure: Segments), lose the event's cost
-- too, down to 0 at most.
local rf = {"r1", "r2", "s0:" .. f, "s1:" .. f, "s2:" .. f}
local rcost = {int(ARGV[3]), int(ARGV[4]), 1, int(ARGV[3]), int(ARGV[4])}
for i = 3, #KEYS do
  local by = tonumber(ARGV[i + 3])
  local c
  ok, c = pcall(redis.call, "HMGET", KEYS[i], "count", unpack(rf))
  if ok then
    for j, x in ipairs(rf) do
      local d = math.min(int(c[j + 1]), rcost[j])
      if d > 0 then
        redis.call("HINCRBY", KEYS[i], x, -d)
      end
    end
    c = tonumber(c[1])
  else
    c = nil
  end
  if c and by and c >= by and by > 0 then
    redis.call("HINCRBY", KEYS[i], "count", -by)
  end
end
return 1
