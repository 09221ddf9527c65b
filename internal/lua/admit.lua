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
-- unix ms), kept for their rule's retention period after they end, as in
-- aligned_incr (the caller sizes it to the window: see limit.retention).
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
-- ARGV[3] most windows one tenant may scan
-- ARGV[4] number of rule descriptors   ARGV[5] number of tenants
--   then per rule descriptor (each distinct rule once per call, whatever the
--   number of tenants it applies to):
--     limit, kind, step ms, base ms, retention ms, number of boundaries,
--     boundaries...
--   then one argument holding every tenant's record, a JSON array of numbers:
--   number of rules, n events, then per rule: descriptor index (1-based),
--   cached ttl chain start, cached chain end. (One cjson.decode costs the
--   script less than a tonumber per number.)
--   The cached chain (0 0 when unknown; used only for a tenant with one ttl
--   rule) is what an earlier reply said the tenant's <rule key>:anchor held:
--   a chain is never moved before its end, so while now < end its start is
--   still the anchor's and the anchor need not be read. The end may since have
--   grown; the script reads the anchor before writing it, and before trusting
--   the cache to open a window (a lost anchor then starts a new chain).
-- Reply: one flat array, per tenant in order:
--   admitted, reservations, due_1, count_1, until_1, ..., rejected, full_until,
--   then chain start, chain end per rule for ttl rules
--   where until_i is the end of the reserved slot (the earliest end of the
--   windows it was counted in), and full_until is, when events were rejected
--   because every window up to the horizon is full, the first time at which a
--   window might have room (0 otherwise). The chain end may be lower than the
--   anchor's (another caller extended it); it is never higher.
-- Lua numbers are doubles: whole milliseconds below 2^53 are exact.

local now = tonumber(ARGV[1])
local hend = tonumber(ARGV[2])
local maxscan = tonumber(ARGV[3])
local ndescs = tonumber(ARGV[4])
local ntenants = tonumber(ARGV[5])

local counts = {}
local none = {} -- an empty list, never written

-- wkey is the key of the window starting at s of the rule whose key prefix
-- is prefix. Times are whole numbers below 1e14, which Lua writes without
-- exponent or decimals.
local function wkey(prefix, s)
  return prefix .. ":" .. s
end

-- anchor_key is the key of rule r's ttl chain.
local function anchor_key(r)
  return r.key .. ":anchor"
end

-- opened gives a window just opened by HINCRBY its logical end e and its
-- physical expiry, e plus its rule's retention ret.
local function opened(key, e, ret)
  redis.call("HSET", key, "expire", e)
  redis.call("PEXPIRE", key, e - now + ret)
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
  local key = wkey(r.key, s)
  local c = count_of(key)
  if c == 0 then
    redis.call("HSET", key, "count", by, "expire", e)
    redis.call("PEXPIRE", key, e - now + r.ret)
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

-- anchor reads rule r's ttl chain from Redis: it continues while now is
-- before its end; otherwise the next window starts a new chain at now.
local function anchor(r)
  local v = redis.call("HMGET", anchor_key(r), "start", "until")
  local st, un = tonumber(v[1]), tonumber(v[2])
  r.cached = false
  if st and un and now < un then
    r.base, r.chainend = st, un
  else
    r.base, r.chainend = now, now
  end
end

-- Rule descriptors, parsed once per call.
local descs = {}
local a = 6
for di = 1, ndescs do
  local nb = tonumber(ARGV[a + 5])
  local bounds = {}
  for bi = 1, nb do
    bounds[bi] = tonumber(ARGV[a + 5 + bi])
  end
  local d = {
    limit = tonumber(ARGV[a]), kind = ARGV[a + 1],
    step = tonumber(ARGV[a + 2]), base = tonumber(ARGV[a + 3]),
    ret = tonumber(ARGV[a + 4]), bounds = bounds, hint = 1, cs = 0, ce = 0,
  }
  if d.kind ~= "t" then
    -- The current window is the same for every tenant of an aligned rule.
    d.cs, d.ce = win(d, now)
  end
  descs[di] = d
  a = a + 6 + nb
end

-- The tenants' records (see above): p is the read position.
local recs = cjson.decode(ARGV[a])
local p = 1
local out = {}
local k = 1
for ti = 1, ntenants do
  local nrules, n = recs[p], recs[p + 1]
  local p0 = p + 2 -- the tenant's rule records
  p = p0 + 3 * nrules
  local fkey = KEYS[k]

  -- Fast path, for a tenant with one rule whose current window is known
  -- without reading Redis (aligned; ttl with a cached chain that already
  -- covers the current window): count optimistically; when everything fits
  -- and no window opens in a cached chain, that is the whole decision.
  -- Otherwise pre keeps the count for the general path below.
  local pre, done = nil, false
  if nrules == 1 then
    local di, cst, cend = recs[p0], recs[p0 + 1], recs[p0 + 2]
    local d = descs[di]
    local cs, ce = nil, nil
    if d.kind ~= "t" then
      cend = nil
      cs, ce = d.cs, d.ce
    else
      if cend > now then
        cs = cst + math.floor((now - cst) / d.step) * d.step
        ce = cs + d.step
      end
    end
    if cs and (not cend or ce <= cend) then
      local key = wkey(KEYS[k + 1], cs)
      local c = redis.call("HINCRBY", key, "count", n)
      if c <= d.limit and (c ~= n or not cend) then
        if c == n then
          opened(key, ce, d.ret)
        end
        local o = #out
        out[o + 1] = n
        out[o + 2] = 0
        out[o + 3] = 0
        out[o + 4] = 0
        if cend then
          out[o + 5] = cst
          out[o + 6] = cend
        end
        k = k + 2
        done = true
      else
        pre = c
      end
    end
  end

  if not done then
    k = k + 1
    local rules = {}
    for ri = 1, nrules do
      local q = p0 + 3 * (ri - 1)
      local di, cst, cend = recs[q], recs[q + 1], recs[q + 2]
      local d = descs[di]
      local r = {
        limit = d.limit, kind = d.kind, step = d.step, base = d.base,
        ret = d.ret, bounds = d.bounds, key = KEYS[k], hint = 1, maxend = 0,
        cached = false, chainend = 0, cs = 0, ce = 0, ts = 0, te = 0,
      }
      if r.kind == "t" then
        if nrules == 1 and cend > now then
          r.base, r.chainend, r.cached = cst, cend, true
        else
          anchor(r)
        end
      end
      k = k + 1
      rules[ri] = r
    end

    -- 1. admit into the current windows.
    local admitted = n
    for ri = 1, nrules do
      local r = rules[ri]
      r.cs, r.ce = win(r, now)
    end
    if nrules == 1 then
      -- One rule: count optimistically and give back what did not fit, one
      -- call when it fits. A current window's key is never past its expiry
      -- (keys carry their window's start), so the count read is live.
      local r = rules[1]
      local key = wkey(r.key, r.cs)
      local c = pre or redis.call("HINCRBY", key, "count", n)
      if c == n and r.cached then
        -- The window was empty and the chain is known only from the cache:
        -- check the anchor before counting there.
        local cst = r.base
        anchor(r)
        if r.base ~= cst then
          -- The chain is gone (lost keys): undo (the window held nothing
          -- before) and count in the chain that starts now.
          redis.call("DEL", key)
          r.cs, r.ce = win(r, now)
          key = wkey(r.key, r.cs)
          c = redis.call("HINCRBY", key, "count", n)
        end
      end
      if c == n then
        opened(key, r.ce, r.ret)
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
      -- (No need to remember the count: with one rule the search below
      -- starts after the current window.)
      if admitted > 0 and r.ce > r.maxend then
        r.maxend = r.ce
      end
    else
      for _, r in ipairs(rules) do
        local room = r.limit - count_of(wkey(r.key, r.cs))
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
    local first = math.huge
    for ri = 1, nrules do
      local ce = rules[ri].ce
      if ce < first then
        first = ce
      end
    end
    -- 2. reserve the rest in the earliest future windows with room.
    local rest = n - admitted
    local res = none
    local t = first
    if rest > 0 then
      res = {}
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
        local room = r.limit - count_of(wkey(r.key, s))
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
            if r.limit - count_of(wkey(r.key, r.ts)) <= 0 and r.te > jump then
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

    -- Keep ttl chains alive while any of their windows holds a count. A
    -- cached chain end may be behind the anchor's: read it before extending.
    for ri = 1, nrules do
      local r = rules[ri]
      if r.kind == "t" and r.maxend > r.chainend then
        local akey = anchor_key(r)
        if r.cached then
          local un = tonumber(redis.call("HGET", akey, "until"))
          if un and un > r.chainend then
            r.chainend = un
          end
        end
        if r.maxend > r.chainend then
          redis.call("HSET", akey, "start", string.format("%.0f", r.base), "until", string.format("%.0f", r.maxend))
          redis.call("PEXPIRE", akey, string.format("%.0f", r.maxend - now + 1000))
          r.chainend = r.maxend
        end
      end
    end

    local full = 0
    if rest > 0 and t > hend then
      full = t
    end
    local o = #out
    out[o + 1] = admitted
    out[o + 2] = #res / 3
    for i = 1, #res do
      out[o + 2 + i] = res[i]
    end
    o = o + 2 + #res
    out[o + 1] = rest
    out[o + 2] = full
    o = o + 2
    for ri = 1, nrules do
      local r = rules[ri]
      if r.kind == "t" then
        out[o + 1] = r.base
        out[o + 2] = r.chainend
        o = o + 2
      end
    end
  end
end
return out
