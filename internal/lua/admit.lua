-- admit: batch admission for one or more tenants, each with one or more rules
-- and n events, in one call. For each tenant it
--   1. admits the first k of n events that fit in the current window of every
--      rule (all rules or none for each event) and counts them there;
--   2. reserves slots for the rest, in event order, in the earliest future
--      windows where every rule has room, up to the horizon: a reserved event
--      is counted in the windows that contain its due time, so reservations
--      go before newer live events;
--   3. reports what did not fit within the horizon as rejected.
-- Window keys are hashes {count, expire} (expire = the window's logical end,
-- unix ms), kept for a retention period after they end, as in aligned_incr.
-- All times are unix ms from the caller's clock, passed in ARGV.
--
-- Window kinds per rule:
--   "a"  fixed step: windows base + i*step (aligned seconds and minutes; the
--        caller passes the current window's start as base)
--   "e"  explicit boundaries: b1 <= now < b2 < ... , the last > horizon end
--        (aligned hours, days, weeks, months in a time zone: DST-aware)
--   "t"  ttl: the window starts at the tenant's first event and lasts step.
--        While deferred demand exists, windows chain back to back from that
--        anchor (anchor + i*step); the chain lives in <rule key>:anchor as
--        {start, until}, until = end of the last window that holds a count.
--        Once now >= until the next event starts a new window at now.
--
-- A frontier key per tenant and rule set remembers the earliest future time
-- that may still have room: windows only fill up, so later calls start
-- their search there instead of rescanning full windows.
--
-- KEYS, per tenant in order: the frontier key, then one key per rule: the
--   rule's key prefix <prefix>:{<tenant>}:<rule>; windows are <that>:<start ms>.
--   All keys of a tenant share the {<tenant>} hash tag, so they sit in one
--   Cluster slot.
-- ARGV[1] now (unix ms)      ARGV[2] horizon end (now + horizon, unix ms)
-- ARGV[3] retention (ms)     ARGV[4] most windows one tenant may scan
-- ARGV[5] number of tenants
--   then per tenant: n events, number of rules, then per rule:
--   limit, kind, step ms, base ms, number of boundaries, boundaries...
-- Reply: one array per tenant, in order:
--   {admitted, reservations, due_1, count_1, until_1, ..., rejected, full_until}
--   where until_i is the end of the reserved slot (the earliest end of the
--   windows it was counted in), and full_until is, when events were rejected
--   because every window up to the horizon is full, the first time at which a
--   window might have room (0 otherwise).

local now = tonumber(ARGV[1])
local hend = tonumber(ARGV[2])
local retention = tonumber(ARGV[3])
local maxscan = tonumber(ARGV[4])
local ntenants = tonumber(ARGV[5])

local counts = {}

local function wkey(r, s)
  return r.key .. ":" .. string.format("%.0f", s)
end

-- count_of reads a window's live count once per call and caches it.
local function count_of(key)
  local c = counts[key]
  if c == nil then
    local v = redis.call("HMGET", key, "count", "expire")
    local e = tonumber(v[2])
    c = 0
    if e and now < e then
      c = tonumber(v[1]) or 0
    end
    counts[key] = c
  end
  return c
end

-- add counts `by` events in the window [s, e) of rule r.
local function add(r, s, e, by)
  local key = wkey(r, s)
  local c = count_of(key)
  if c == 0 then
    redis.call("HSET", key, "count", by, "expire", e)
    redis.call("PEXPIRE", key, e - now + retention)
  else
    redis.call("HINCRBY", key, "count", by)
  end
  counts[key] = c + by
  if e > r.maxend then
    r.maxend = e
  end
end

-- win returns the window [s, e) of rule r that holds time t, or nil when t is
-- past the boundaries given. Calls for one rule come with t not decreasing.
local function win(r, t)
  if r.kind == "e" then
    local b = r.bounds
    local i = r.hint
    while i < #b and b[i + 1] <= t do
      i = i + 1
    end
    if i >= #b or t < b[i] then
      return nil
    end
    r.hint = i
    return b[i], b[i + 1]
  end
  local s = r.base + math.floor((t - r.base) / r.step) * r.step
  return s, s + r.step
end

local out = {}
local a = 6
local k = 1
for ti = 1, ntenants do
  local n = tonumber(ARGV[a])
  local nrules = tonumber(ARGV[a + 1])
  a = a + 2
  local fkey = KEYS[k]
  k = k + 1
  local rules = {}
  for ri = 1, nrules do
    local r = {
      limit = tonumber(ARGV[a]), kind = ARGV[a + 1],
      step = tonumber(ARGV[a + 2]), base = tonumber(ARGV[a + 3]),
      key = KEYS[k], bounds = {}, hint = 1, maxend = 0,
    }
    local nb = tonumber(ARGV[a + 4])
    for bi = 1, nb do
      r.bounds[bi] = tonumber(ARGV[a + 4 + bi])
    end
    a = a + 5 + nb
    k = k + 1
    if r.kind == "t" then
      r.anchor = r.key .. ":anchor"
      local v = redis.call("HMGET", r.anchor, "start", "until")
      local st, un = tonumber(v[1]), tonumber(v[2])
      if st and un and now < un then
        r.base, r.chainend = st, un
      else
        r.base, r.chainend = now, now
      end
    end
    rules[ri] = r
  end

  -- 1. admit into the current windows.
  local admitted = n
  local first = math.huge
  for _, r in ipairs(rules) do
    r.cs, r.ce = win(r, now)
    if r.ce < first then
      first = r.ce
    end
  end
  if nrules == 1 then
    -- One rule: count optimistically and give back what did not fit, one
    -- call when it fits. A current window's key is never past its expiry
    -- (keys carry their window's start), so the count read is live.
    local r = rules[1]
    local key = wkey(r, r.cs)
    local c = redis.call("HINCRBY", key, "count", n)
    if c == n then
      redis.call("HSET", key, "expire", r.ce)
      redis.call("PEXPIRE", key, r.ce - now + retention)
    end
    local before = c - n
    admitted = r.limit - before
    if admitted > n then
      admitted = n
    elseif admitted < 0 then
      admitted = 0
    end
    if admitted < n then
      redis.call("HINCRBY", key, "count", admitted - n)
    end
    counts[key] = before + admitted
    if admitted > 0 and r.ce > r.maxend then
      r.maxend = r.ce
    end
  else
    for _, r in ipairs(rules) do
      local room = r.limit - count_of(wkey(r, r.cs))
      if room < admitted then
        admitted = room
      end
    end
    if admitted < 0 then
      admitted = 0
    end
    if admitted > 0 then
      for _, r in ipairs(rules) do
        add(r, r.cs, r.ce, admitted)
      end
    end
  end

  -- 2. reserve the rest in the earliest future windows with room.
  local rest = n - admitted
  local res = {}
  local t = first
  if rest > 0 then
    local fr = tonumber(redis.call("GET", fkey))
    if fr and fr > t then
      t = fr
    end
  end
  local scans = 0
  while rest > 0 and t <= hend and scans < maxscan do
    scans = scans + 1
    local minroom, jump, untilt = math.huge, 0, math.huge
    local past = false
    for _, r in ipairs(rules) do
      local s, e = win(r, t)
      if not s then
        past = true
        break
      end
      r.ts, r.te = s, e
      local room = r.limit - count_of(wkey(r, s))
      if room < minroom then
        minroom = room
      end
      if room <= 0 and e > jump then
        jump = e
      end
      if e < untilt then
        untilt = e
      end
    end
    if past then
      t = hend + 1
      break
    end
    if minroom > 0 then
      local take = minroom
      if rest < take then
        take = rest
      end
      for _, r in ipairs(rules) do
        add(r, r.ts, r.te, take)
      end
      res[#res + 1] = t
      res[#res + 1] = take
      res[#res + 1] = untilt
      rest = rest - take
      if take == minroom then
        jump = 0
        for _, r in ipairs(rules) do
          if r.limit - count_of(wkey(r, r.ts)) <= 0 and r.te > jump then
            jump = r.te
          end
        end
        t = jump
      end
    else
      t = jump
    end
  end
  if t > first then
    redis.call("SET", fkey, string.format("%.0f", t), "PX", string.format("%.0f", t - now + 1000))
  end

  -- Keep ttl chains alive while any of their windows holds a count.
  for _, r in ipairs(rules) do
    if r.kind == "t" and r.maxend > r.chainend then
      redis.call("HSET", r.anchor, "start", string.format("%.0f", r.base), "until", string.format("%.0f", r.maxend))
      redis.call("PEXPIRE", r.anchor, string.format("%.0f", r.maxend - now + 1000))
    end
  end

  local full = 0
  if rest > 0 and t > hend then
    full = t
  end
  local reply = {admitted, #res / 3}
  for i = 1, #res do
    reply[#reply + 1] = res[i]
  end
  reply[#reply + 1] = rest
  reply[#reply + 1] = full
  out[ti] = reply
end
return out
