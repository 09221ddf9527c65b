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
--     x       what was booked above the level, in the ramp (see Entitlement)
--     cl      the capacity in force in the window, fixed at its first call
--             while current (cap_fix: a paced or capped capacity)
--     lv, sf, wc  the window's level, what the satisfied ask and the capped
--             weight (see Entitlement)
--     t:<tenant>, r:<tenant>  what that tenant booked and was refused there
--     q:<tenant>  what it is predicted to ask there (see Demand)
-- ARGV, after the replay arguments, only when a capacity is set (the last
--   ARGV is then "cap:<the index of the first of them>"):
--   number of capacity rules, the index in KEYS of the first capacity key,
--   the start and the end of the ramp (per mille of the window), the tenants' fields (a
--   JSON array of strings, in call order), the tenants' shares (a JSON
--   array: per tenant its weight, then its floor for each capacity rule),
--   then per capacity rule: limit, step ms, the current window's start ms,
--   retention ms, the sum of the named tenants' floors.
-- Reply: nothing of its own (the capacity is one more rule of each tenant).
--
-- Demand: what a tenant asks of a window is predicted, before the window
--   starts, as what it reserved there plus what it sent (admitted or
--   refused) while the window before was current: field q:<tenant> of the
--   window's hash. (The events a tenant sends in a window are what it sent
--   in the one before, for a steady sender; and its reserved events are
--   already there.) Per window a second hash, <capacity key>/demand:<start
--   ms> (limit.CapacityDemandSuffix), keeps the histogram of these demands
--   by normalised demand x = q / weight: field <k> (the bucket of x: whole
--   numbers below 1024, then 1% wide) holds, packed in one integer,
--   W * 2^32 + D, with D the summed demand and W the summed weight of the
--   tenants in that bucket (one HINCRBY moves a tenant in or out of a
--   bucket); a tenant with a floor f also adds -(w * 2^32 + min(q, f)) at
--   the bucket of min(q, f) / w, and min(q, f) to field fm, so that
--     G(lv) = fm + sum over buckets below lv of D + lv * sum above of W
--   is sum_i min(q_i, max(f_i, w_i * lv)), what the tenants would book at
--   level lv. Bounds: |D| < 2^31 and |W| < 2^21 per bucket. The hash has at
--   most about 2,400 fields, whatever the number of tenants, and lives as
--   long as its window. A tenant's call adds its events to q there (and
--   moves its entry: one to three HINCRBY); a reservation in a future
--   window adds to q there.
--
-- Entitlement: tenant i may book in window s at most
--   e_i(s) = max(floor_i, weight_i * level)
-- where level is the water level of the current window (per unit of
-- weight), fixed when the window gets its first call (field lv): the
-- weighted water level of the window's predicted demand, G(lv) = C,
-- solved exactly (up to the 1% buckets above 1024) by one walk of its
-- histogram (O(buckets), not O(tenants)); sf and wc keep what the
-- satisfied ask and the capped weight. When the window before had capped
-- tenants too, the level taken is the mean of that and its level (damped:
-- a consumer that lags decides late, in one window, what it stalled on in
-- the window before, and an undamped level follows each such burst).
-- When nobody is capped, the level is the largest normalised demand plus
-- the spare (C - G) shared by the active weight a of the window before;
-- with no history (lv 0) it is the equal share C / a of the window's
-- active weight so far.
-- In the current window the level holds until ramp_lo of the window has
-- passed; from then on the capped tenants may share what is spare, the
-- capacity not booked less what the satisfied tenants are still expected
-- to ask in the rest of the window ((1 - phase) * sf), split by weight
-- (wc), each the same part (field x: what they took above the level, is
-- counted as spare): work-conserving without taking the room of light
-- tenants' late events. From ramp_hi on, floors are no longer kept apart,
-- and when nobody is capped anyone may take what is left. In a future
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
local capd = {}   -- per capacity rule: limit, step, cs, ce, retention, ffloor, key, lv, sf, wc
local capn = none -- per tenant: its name in fields
local caps = none -- per tenant: weight, floor per rule (flat)
local ramp_lo, ramp_hi = 0.9, 0.98
local cap_ti = 0  -- the tenant being decided (run sets it)

-- The histogram's packing (see Demand): W * HP + D.
local HP = 4294967296
local HB = 1024 -- buckets are whole numbers below HB, then 1% wide
local HLOG = math.log(1.01)

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
      key = KEYS[first + ci - 1], lv = false, sf = 0, wc = 0, hlive = {},
      dprefix = KEYS[first + ci - 1] .. "/demand",
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
    local v = redis.call("HMGET", key, "count", "expire", "a", "fb", "lv", "sf", "wc", "x", "cl")
    st = {
      c = tonumber(v[1]) or 0, live = v[2] ~= false, a = tonumber(v[3]) or 0,
      fb = tonumber(v[4]) or 0, lv = tonumber(v[5]), sf = tonumber(v[6]) or 0,
      wc = tonumber(v[7]) or 0, x = tonumber(v[8]) or 0, cl = tonumber(v[9]),
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

-- dkey is the key of the demand histogram of r's window starting at s.
local function dkey(r, s)
  return wkey(r.cap.dprefix, s)
end

-- bucket returns the histogram bucket of normalised demand x >= 0, and
-- bucket_lo the least x in bucket k.
local function bucket(x)
  if x < HB then
    return math.floor(x)
  end
  return HB + math.floor(math.log(x / HB) / HLOG + 1e-9)
end

local function bucket_lo(k)
  if k < HB then
    return k
  end
  return HB * math.exp((k - HB) * HLOG)
end

-- hmove adds the packed delta by to bucket k of the demand histogram key,
-- and journals it.
local function hmove(key, k, by)
  if by ~= 0 then
    local f = num(k)
    redis.call("HINCRBY", key, f, string.format("%d", by))
    note(4, key, {f, string.format("%d", -by)})
  end
end

-- cap_demand moves the entry of r's tenant in the demand histogram of its
-- window [s, e) from demand d0 to d1 >= d0 (see Demand): one HINCRBY when
-- its bucket stays, two when it changes (and, for a tenant with a floor,
-- up to three more while its demand is under its floor).
local function cap_demand(r, s, e, d0, d1)
  if d0 == d1 then
    return
  end
  local key = wkey(r.cap.dprefix, s)
  local w = r.w
  cur = key
  local k1 = bucket(d1 / w)
  if d0 > 0 then
    local k0 = bucket(d0 / w)
    if k0 == k1 then
      hmove(key, k1, d1 - d0)
    else
      hmove(key, k0, -(w * HP + d0))
      hmove(key, k1, w * HP + d1)
    end
  else
    hmove(key, k1, w * HP + d1)
  end
  if r.f > 0 then
    local m0, m1 = math.min(d0, r.f), math.min(d1, r.f)
    if m0 ~= m1 then
      if m0 > 0 then
        hmove(key, bucket(m0 / w), w * HP + m0)
      end
      hmove(key, bucket(m1 / w), -(w * HP + m1))
      cap_hincr(key, "fm", m1 - m0)
    end
  end
  if not r.cap.hlive[key] then
    redis.call("PEXPIRE", key, num(e - now + r.retention))
    r.cap.hlive[key] = true
  end
end

-- cap_solve returns the water level of the demand histogram of window key
-- for capacity C (G(lv) = C, see Demand), what the satisfied asked and the
-- capped weight there; nil when the histogram is empty; when nobody was
-- capped, the largest normalised demand plus the spare per unit of the
-- active weight a.
local function cap_solve(key, C, a)
  local v = redis.call("HGETALL", key)
  local ks, ds, ws, fm = {}, {}, {}, 0
  for i = 1, #v, 2 do
    local val = tonumber(v[i + 1])
    if v[i] == "fm" then
      fm = val
    elseif val ~= 0 then
      local k = tonumber(v[i])
      local w = math.floor((val + HP / 2) / HP)
      ks[#ks + 1] = k
      ds[k], ws[k] = val - w * HP, w
    end
  end
  if #ks == 0 and fm == 0 then
    return nil
  end
  table.sort(ks)
  local above = 0
  for _, k in ipairs(ks) do
    above = above + ws[k]
  end
  local below = fm
  for _, k in ipairs(ks) do
    if above > 0 and below + bucket_lo(k) * above >= C then
      return (C - below) / above, below, above
    end
    below, above = below + ds[k], above - ws[k]
  end
  if above > 0 then
    return (C - below) / above, below, above
  end
  local top = 1
  if #ks > 0 then
    top = bucket_lo(ks[#ks] + 1)
  end
  return top + math.max(0, C - below) / math.max(1, a), below, 0
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
    local sf, wc
    lv, sf, wc = cap_solve(dkey(r, d.cs), d.cl, p.a)
    if not lv then
      lv, sf, wc = 0, 0, 0 -- no history: the equal share (cap_room)
    elseif wc > 0 and p.lv and p.lv > 0 and p.wc > 0 then
      -- Damped: the mean with the level before, against bursts of
      -- arrivals (a consumer that lags sends a window late what it
      -- stalled on), when both windows had capped tenants.
      lv = (lv + p.lv) / 2
    end
    cap_touch(r, key, d.ce, st)
    redis.call("HSET", key, "lv", string.format("%.6f", lv), "sf", num(math.floor(sf + 0.5)), "wc", num(wc))
    st.lv, st.sf, st.wc = lv, math.floor(sf + 0.5), wc
  end
  d.lv, d.sf, d.wc = lv, st.sf, st.wc
  return lv
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

-- cap_ask adds by to what r's tenant asks of its window [s, e) (field
-- q:<tenant>, see Demand) and moves its entry in that window's demand
-- histogram.
local function cap_ask(r, s, e, by)
  local key = wkey(r.key, s)
  cap_touch(r, key, e, cap_state(key))
  cur = key
  local q = redis.call("HINCRBY", key, "q:" .. r.field, by)
  note(4, key, {"q:" .. r.field, -by})
  cap_demand(r, s, e, q - by, q)
end

-- cap_done records, after a tenant's decision of n events of which admitted
-- went to the current windows, what it was refused there, and adds the n
-- events it sent now to what it asks of the next window.
local function cap_done(rules, n, admitted)
  for _, r in ipairs(rules) do
    if r.cap then
      local key = wkey(r.key, r.cur_start)
      if n > admitted then
        cap_hincr(key, "r:" .. r.field, n - admitted)
      end
      cap_ask(r, r.cur_end, r.cur_end + r.step, n)
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
  if lv == 0 then
    lv = C / math.max(1, cap_state(wkey(r.key, d.cs)).a)
  end
  local e, protect = 0, true
  if s == d.cs then
    local phi = (now - s) / r.step
    protect = phi < ramp_hi
    if phi > ramp_lo and d.wc > 0 then
      -- What is spare, shared by the capped (see Entitlement): counted
      -- as if none had taken its part yet (x: what they took above the
      -- level), so that each gets the same part.
      local spare = C - (st.c - st.x) - (1 - phi) * d.sf
      if spare > 0 then
        lv = lv + spare / d.wc
      end
    elseif not protect then
      lv = C
    end
    e = math.floor(r.w * lv + 1e-9)
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

-- cap_add books `by` events of r's tenant in capacity window [s, e); in a
-- future window it moves the tenant's demand there (in the current window
-- cap_done does, with what it was refused).
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
  if s ~= r.cur_start then
    cap_ask(r, s, e, by)
  elseif r.cap.lv > 0 then
    -- What it took above its entitlement at the level (the ramp's part).
    local base = math.max(r.f, math.floor(r.w * r.cap.lv + 1e-9))
    local over = math.max(0, b + by - base) - math.max(0, b - base)
    if over > 0 then
      cap_hincr(key, "x", over)
      st.x = st.x + over
    end
  end
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
