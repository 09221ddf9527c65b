-- windows: the keys, reads and writes of windows, and ttl chains.
--
-- Contract. A rule's state (see rules_of in 40_decode.lua) names its windows
-- by their start and end, unix ms. wkey and anchor_key build keys from a
-- rule key exactly as internal/limit/keys.go does (limit.WindowSep,
-- limit.AnchorSuffix; TestAdmitScriptKeys holds the two together).
-- count_of reads a window's live count once per call (a count past its
-- logical end is 0) and raises a tenant's failure for a count that is not
-- an integer; add and incr write counts and journal them; win finds the
-- window of a rule that holds a time, for times that do not decrease;
-- anchor reads a ttl chain; keep_chains extends the chains of the windows
-- the call counted in. Window reads of the searches are counted against the
-- budget by their caller (80_reserve.lua), not here.

-- counts[key] is a window's count as the call knows it (read or written).
local counts = {}

-- num writes a whole number as Redis takes it, once per call for each
-- number: Lua's own conversion (%.14g) costs a float formatting each time,
-- and the same window starts, ends and expiries recur for every tenant.
-- Whole numbers below 1e14 (all times here) are written the same way.
local numbers = {}
local function num(x)
  local s = numbers[x]
  if not s then
    s = string.format("%d", x)
    numbers[x] = s
  end
  return s
end

-- wkey is the key of the window starting at s of the rule whose key is
-- prefix: <rule key>:<start ms>.
local function wkey(prefix, s)
  return prefix .. ":" .. num(s)
end

-- anchor_key is the key of rule r's ttl chain: <rule key>:anchor.
local function anchor_key(r)
  return r.key .. ":anchor"
end

-- incr adds by to a window's count and journals it.
local function incr(key, by)
  cur = key
  local c = redis.call("HINCRBY", key, "count", by)
  if c == by then
    note(1, key, false)
  else
    note(2, key, -by)
  end
  return c
end

-- opened gives a window just opened by incr its logical end e and its
-- physical expiry, e plus its rule's retention.
local function opened(key, e, retention)
  redis.call("HSET", key, "expire", num(e))
  redis.call("PEXPIRE", key, num(e - now + retention))
end

-- count_of reads a window's live count once per call and caches it.
local function count_of(key)
  local c = counts[key]
  if c == nil then
    cur = key
    local v = redis.call("HMGET", key, "count", "expire")
    local e = tonumber(v[2])
    c = 0
    if e and now < e and v[1] then
      c = tonumber(v[1])
      if not c or c % 1 ~= 0 then
        error({key = key, why = "holds a count that is not an integer"})
      end
    end
    counts[key] = c
  end
  return c
end

-- add counts `by` in the window [s, e) of rule r, and journals it.
local function add(r, s, e, by)
  local key = wkey(r.key, s)
  local c = count_of(key)
  if c == 0 then
    redis.call("HSET", key, "count", by, "expire", num(e))
    redis.call("PEXPIRE", key, num(e - now + r.retention))
    journal[jn + 1], journal[jn + 2], journal[jn + 3] = 1, key, false
  else
    cur = key
    redis.call("HINCRBY", key, "count", by)
    journal[jn + 1], journal[jn + 2], journal[jn + 3] = 2, key, -by
  end
  jn = jn + 3
  counts[key] = c + by
  if e > r.counted_until then
    r.counted_until = e
  end
end

-- win returns the window [s, e) of rule r that holds time t, or nil when t
-- is past the boundaries given. Calls for one rule come with t not
-- decreasing (r.bound_at only moves on).
local function win(r, t)
  if r.kind == "e" then
    local b = r.bounds
    local i = r.bound_at
    while i < #b and b[i + 1] <= t do
      i = i + 1
    end
    if i >= #b or t < b[i] then
      return nil
    end
    r.bound_at = i
    return b[i], b[i + 1]
  end
  local s = r.base + math.floor((t - r.base) / r.step) * r.step
  return s, s + r.step
end

-- anchor reads rule r's ttl chain from Redis: it continues while now is
-- before its end; otherwise the next window starts a new chain at now. The
-- anchor as read is kept in r.anchor_read, for the journal.
local function anchor(r)
  cur = anchor_key(r)
  local v = redis.call("HMGET", cur, "start", "until")
  local st, un = tonumber(v[1]), tonumber(v[2])
  r.chain_cached = false
  r.anchor_read = v
  if st and un and now < un then
    r.base, r.chain_end = st, un
  else
    r.base, r.chain_end = now, now
  end
end

-- keep_chains keeps ttl chains alive while any of their windows holds a
-- count. A cached chain end may be behind the anchor's: read it before
-- extending.
local function keep_chains(rules)
  for ri = 1, #rules do
    local r = rules[ri]
    if r.kind == "t" and r.counted_until > r.chain_end then
      local akey = anchor_key(r)
      if r.chain_cached then
        cur = akey
        r.anchor_read = redis.call("HMGET", akey, "start", "until")
        local un = tonumber(r.anchor_read[2])
        if un and un > r.chain_end then
          r.chain_end = un
        end
      end
      if r.counted_until > r.chain_end then
        local v = r.anchor_read
        note(3, akey, tonumber(v[1]) and tonumber(v[2]) and v or false)
        redis.call("HSET", akey, "start", string.format("%.0f", r.base), "until", string.format("%.0f", r.counted_until))
        redis.call("PEXPIRE", akey, string.format("%.0f", r.counted_until - now + 1000))
        r.chain_end = r.counted_until
      end
    end
  end
end
