-- capacity: the shared capacity (G12). It adds to every tenant's rules
-- (rules_of, 40_decode.lua) one rule per capacity rule, on global keys, whose
-- room (room_of, used by 70_admit.lua and 80_reserve.lua) is the tenant's
-- fair entitlement in the window, bounded by what the capacity has left;
-- the search treats them as any other rule. It wraps add (30_windows.lua)
-- so that a booking in a capacity window is also the tenant's, and after a
-- tenant's decision (decide, 90_run.lua) cap_done records what it was
-- refused. Without a capacity (ncap 0) nothing here runs, and 90_run.lua's
-- fast path is used as before.
--
-- KEYS: the capacity rules' key prefixes <prefix>:cap:<counter> (limit's
--   keys.capacity), at KEYS[first] onwards (see ARGV); windows are
--   <that>:<start ms>, hashes of
--     count   what all tenants booked there (admitted or reserved)
--     expire  the window's end (unix ms), as every window key
--     a       the active weight: the summed weight of the tenants that booked
--             there or sent events while it was the current window
--     fb      what was booked under named tenants' floors
--     <tenant field>  what that tenant booked there
-- ARGV, after the replay arguments, only when a capacity is set (the last
--   ARGV is then "cap:<the index of the first of them>"):
--   number of capacity rules, the index in KEYS of the first capacity key,
--   the end of the ramp (per mille of the window), the tenants' fields (a
--   JSON array of strings, in call order), the tenants' shares (a JSON
--   array: per tenant its weight, then its floor for each capacity rule),
--   then per capacity rule: limit, step ms, the current window's start ms,
--   retention ms, the sum of the named tenants' floors.
-- Reply: nothing of its own (the capacity is one more rule of each tenant).
--
-- Entitlement: tenant i may book in window s at most
--   e_i(s) = max(floor_i, weight_i * level)
-- where level is the water level of the current window (per unit of
-- weight), fixed when the window gets its first call (field lv) from the
-- window before it: each tenant active there is either satisfied (what it
-- booked and was refused there, d, fitted under max(floor, weight * lv)),
-- held at its floor, or capped (field sf sums the d of the satisfied and the
-- floors of the held, field wc the weights of the capped), so
--   lv = (C - sf) / wc      (C / a when no tenant was capped)
-- is a Newton step towards the water level, exact once the sets of
-- satisfied and capped tenants stop changing; the level taken is the mean
-- of it and the level before (damped), and never under the equal share
-- C / a. In the current window the level holds until ramp_lo of the window
-- has passed, then rises linearly to three times itself at ramp_hi: what
-- the others left goes to the tenants with events, all at one level
-- (work-conserving); from ramp_hi on anyone may take what is left. In a future
-- window a tenant may reserve at most half its share at the current level
-- (at least one event), so that a tenant arriving later finds room from
-- the next window on. Bookings above a tenant's floor leave room for the
-- named tenants' floors not yet used in the window (field fb: booked under
-- floors), except from ramp_hi on. Every booking counts in the window's
-- count, which never passes C: the fairness only ever narrows the room.
--
-- Per tenant the window's hash holds t:<tenant> (booked) and, once it has
-- sent events while the window was current, r:<tenant> (refused: events
-- decided then that did not go there); a sums the weights of those tenants.

local ncap = 0
local capd = {}   -- per capacity rule: limit, step, cs, ce, retention, ffloor, key, lv
local capn = none -- per tenant: its name in fields
local caps = none -- per tenant: weight, floor per rule (flat)
local ramp_lo, ramp_hi = 0.8, 0.97
local cap_ti = 0  -- the tenant being decided (run sets it)

-- cap_parse reads the capacity arguments from ARGV[at] on, when present.
local function cap_parse(at)
  if ARGV[at] == nil then
    return
  end
  ncap = tonumber(ARGV[at])
  local first = tonumber(ARGV[at + 1])
  ramp_lo, ramp_hi = tonumber(ARGV[at + 2]) / 1000, tonumber(ARGV[at + 3]) / 1000
  capn = cjson.decode(ARGV[at + 4])
  caps = cjson.decode(ARGV[at + 5])
  at = at + 6
  for ci = 1, ncap do
    local step, cs = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
    capd[ci] = {
      limit = tonumber(ARGV[at]), step = step, cs = cs, ce = cs + step,
      retention = tonumber(ARGV[at + 3]), ffloor = tonumber(ARGV[at + 4]),
      key = KEYS[first + ci - 1], lv = false,
    }
    at = at + 5
  end
end

do
  local tail = ARGV[#ARGV]
  if string.sub(tail, 1, 4) == "cap:" then
    cap_parse(tonumber(string.sub(tail, 5)))
  end
end

-- cap_state returns a capacity window's shared state, read once per call
-- (counts caches it; undo forgets it).
local function cap_state(key)
  local st = counts[key]
  if st == nil then
    cur = key
    local v = redis.call("HMGET", key, "count", "expire", "a", "fb", "lv", "sf", "wc", "cl")
    st = {
      c = tonumber(v[1]) or 0, live = v[2] ~= false, a = tonumber(v[3]) or 0,
      fb = tonumber(v[4]) or 0, lv = tonumber(v[5]), sf = tonumber(v[6]) or 0,
      wc = tonumber(v[7]) or 0, cl = tonumber(v[8]),
    }
    counts[key] = st
  end
  return st
end

-- cap_booked returns what the tenant of capacity rule r booked in the
-- window key, false when it has no field there.
local function cap_booked(r, key)
  local b = r.b[key]
  if b == nil then
    cur = key
    b = tonumber(redis.call("HGET", key, "t:" .. r.field)) or false
    r.b[key] = b
  end
  return b
end

-- cap_touch gives a window key that does not exist yet its end e and its
-- physical expiry; the journal deletes it on undo.
local function cap_touch(r, key, e, st)
  if not st.live then
    cur = key
    redis.call("HSET", key, "expire", e)
    redis.call("PEXPIRE", key, e - now + r.retention)
    note(1, key, false)
    st.live = true
  end
end

-- cap_hincr adds by to field of window key and journals it.
local function cap_hincr(key, field, by)
  cur = key
  redis.call("HINCRBY", key, field, by)
  note(4, key, {field, -by})
end

-- cap_fix returns the capacity in force in r's current window (field cl),
-- fixing it at the window's first call while current: the limit of this
-- call (a paced or capped capacity, limit's Pacer, is passed like a fixed
-- one), or what the window already holds if more (reservations made before
-- a cut are kept). Every replica then uses the same capacity for the whole
-- window; a future window's bookings are bounded by the limit of their call.
local function cap_fix(r, key, st)
  if st.cl then
    return st.cl
  end
  local cl = math.max(st.c, r.cap.limit)
  cap_touch(r, key, r.cap.ce, st)
  cur = key
  redis.call("HSET", key, "cl", cl)
  st.cl = cl
  return cl
end

-- cap_level returns the level of r's current window, fixing it at the
-- window's first call (see Entitlement).
local function cap_level(r)
  local d = r.cap
  if d.lv then
    return d.lv
  end
  local key = wkey(r.key, d.cs)
  local st = cap_state(key)
  local lv = st.lv
  d.cl = cap_fix(r, key, st)
  if not lv then
    local p = cap_state(wkey(r.key, d.cs - d.step))
    local equal = d.cl / math.max(1, p.a, st.a)
    if p.wc > 0 then
      -- A Newton step on sum(min(d, w * lv)) = C, damped (the mean with
      -- the level before: the demand a window sees depends on its level,
      -- and undamped steps oscillate), and never under the equal share,
      -- which the answer is never under (sum(min(d, w * lv)) <= a * lv).
      lv = (d.cl - p.sf) / p.wc
      if p.lv then
        lv = (lv + p.lv) / 2
      end
      lv = math.max(lv, equal)
    else
      lv = equal
    end
    cap_touch(r, key, d.ce, st)
    redis.call("HSET", key, "lv", string.format("%.6f", lv))
    st.lv = lv
  end
  d.lv = lv
  return lv
end

-- cap_class returns what a tenant with booked b and refused rr adds to a
-- window of level lv: to sf (satisfied: its demand; held: its floor) and
-- to wc (capped: its weight).
local function cap_class(r, lv, b, rr)
  local wl = r.w * lv
  if b + rr <= math.max(r.f, wl) then
    return b + rr, 0
  elseif r.f >= wl then
    return r.f, 0
  end
  return 0, r.w
end

-- cap_rules appends to rules the capacity rules of the ti-th tenant, reads
-- what it booked and was refused in the current windows, and marks it
-- active there at its first call.
local function cap_rules(rules, ti)
  local base = (ti - 1) * (1 + ncap)
  for ci = 1, ncap do
    local d = capd[ci]
    local r = {
      limit = d.limit, kind = "a", step = d.step, base = d.cs, retention = d.retention,
      bounds = none, key = d.key, bound_at = 1, counted_until = 0, chain_cached = false,
      chain_end = 0, cur_start = d.cs, cur_end = d.ce, at_start = 0, at_end = 0, costs = false, anchor_read = none,
      room = 0, take = 0, cap = d, field = capn[ti],
      w = caps[base + 1], f = caps[base + 1 + ci], b = {},
    }
    local key = wkey(r.key, r.cur_start)
    cur = key
    local v = redis.call("HMGET", key, "t:" .. r.field, "r:" .. r.field)
    r.b[key] = tonumber(v[1]) or false
    r.b0, r.r0 = tonumber(v[1]) or 0, tonumber(v[2])
    cap_level(r)
    if not r.r0 then
      local st = cap_state(key)
      cap_touch(r, key, r.cur_end, st)
      redis.call("HSET", key, "r:" .. r.field, 0)
      note(5, key, "r:" .. r.field)
      cap_hincr(key, "a", r.w)
      st.a = st.a + r.w
    end
    rules[#rules + 1] = r
  end
end

-- cap_done records, after a tenant's decision of n events of which admitted
-- went to the current windows, what it was refused there and its class.
local function cap_done(rules, n, admitted)
  for _, r in ipairs(rules) do
    if r.cap then
      local key = wkey(r.key, r.cur_start)
      local lv = r.cap.lv
      local b1, r1 = r.b[key] or 0, (r.r0 or 0) + n - admitted
      if n > admitted then
        cap_hincr(key, "r:" .. r.field, n - admitted)
      end
      local f0, w0 = 0, 0
      if r.r0 then
        f0, w0 = cap_class(r, lv, r.b0, r.r0)
      end
      local f1, w1 = cap_class(r, lv, b1, r1)
      local st = cap_state(key)
      if f1 ~= f0 then
        cap_hincr(key, "sf", f1 - f0)
        st.sf = st.sf + f1 - f0
      end
      if w1 ~= w0 then
        cap_hincr(key, "wc", w1 - w0)
        st.wc = st.wc + w1 - w0
      end
    end
  end
end

-- cap_room returns the room of capacity rule r's tenant in the window
-- starting at s: its entitlement less what it booked there, at most what
-- the capacity has left (less the floors it must leave).
local function cap_room(r, s)
  local key = wkey(r.key, s)
  local st = cap_state(key)
  local b = cap_booked(r, key) or 0
  local d = r.cap
  local C, lv = r.limit, d.lv
  if s == d.cs then
    C = d.cl -- cap_fix
  end
  local e, protect = 0, true
  if s == d.cs then
    local phi = (now - s) / r.step
    if phi >= ramp_hi then
      e, protect = C, false
    else
      if phi > ramp_lo then
        lv = lv * (1 + 2 * (phi - ramp_lo) / (ramp_hi - ramp_lo))
      end
      e = math.floor(r.w * lv + 1e-9)
    end
  else
    e = math.max(1, math.floor(r.w * lv / 2 + 1e-9))
  end
  if r.f > e then
    e = r.f
  end
  local room, free = e - b, C - st.c
  if protect and d.ffloor > 0 then
    local others = d.ffloor - st.fb - math.max(0, r.f - b)
    if others > 0 then
      free = free - others
    end
  end
  if free < room then
    room = free
  end
  return room
end

-- room_of returns the room of rule r in its window starting at s.
local function room_of(r, s)
  if r.cap then
    return cap_room(r, s)
  end
  return r.limit - count_of(wkey(r.key, s))
end

-- cap_add books `by` events of r's tenant in capacity window [s, e).
local function cap_add(r, s, e, by)
  local key = wkey(r.key, s)
  local st = cap_state(key)
  cap_touch(r, key, e, st)
  local b = cap_booked(r, key)
  cap_hincr(key, "count", by)
  st.c = st.c + by
  cur = key
  redis.call("HINCRBY", key, "t:" .. r.field, by)
  if b == false then
    note(5, key, "t:" .. r.field)
    b = 0
  else
    note(4, key, {"t:" .. r.field, -by})
  end
  r.b[key] = b + by
  if r.f > 0 then
    local under = math.min(b + by, r.f) - math.min(b, r.f)
    if under > 0 then
      cap_hincr(key, "fb", under)
      st.fb = st.fb + under
    end
  end
end

-- add (30_windows.lua) books in a capacity window through cap_add.
local count_add = add
add = function(r, s, e, by)
  if r.cap then
    return cap_add(r, s, e, by)
  end
  return count_add(r, s, e, by)
end

-- A shared window read before an undo is read again after it.
on_undo = function(key)
  counts[key] = nil
end
