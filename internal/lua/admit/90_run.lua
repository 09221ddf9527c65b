-- run: deciding each tenant, and the call's end.
--
-- Contract. Each tenant is decided in the call's order: admitted into the
-- current windows (70_admit.lua), its next events reserved (80_reserve.lua),
-- the rest rejected; its reply is appended to out at out_at[ti]. Most
-- tenants take the fast path in run, one HINCRBY. A tenant's failure takes
-- back what the call wrote for it and the other tenants go on; any other
-- error takes back the whole call (see Failures). The replay record is read
-- before the first tenant and written after the last (60_replay.lua).

-- reply appends a tenant's decision to out: admitted, the reservations
-- (due, count, until each), rejected, full_until, then the chains of its
-- ttl rules.
local function reply(admitted, res, rest, full, rules)
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
  for ri = 1, #rules do
    local r = rules[ri]
    if r.kind == "t" then
      out[o + 1] = r.base
      out[o + 2] = r.chain_end
      o = o + 2
    end
  end
end

-- decide decides the n events of tenant ti, whose costs are costs (nil:
-- none; c: what the fast path counted, if anything: a count for one rule,
-- true for several when fast_many counted (made_*, 70_admit.lua)), and
-- appends its reply to out.
local function decide(ti, n, c, costs)
  local fkey = KEYS[key_at[ti]]
  local rules = rules_of(ti, costs)
  -- 0. an event rule of limit 0 admits nothing, ever: no window to read.
  for _, r in ipairs(rules) do
    if not r.costs and r.limit < 1 then
      reply(0, none, n, hend + 1, rules)
      return
    end
  end
  -- 1. admit into the current windows.
  local admitted
  if #rules == 1 and not costs then
    admitted = admit_one(rules[1], n, c)
  elseif c then
    admitted = admit_made(rules, n)
  else
    admitted = admit_all(rules, n)
  end
  local first = math.huge
  for _, r in ipairs(rules) do
    if r.cur_end < first then
      first = r.cur_end
    end
  end
  -- 2. reserve the rest in the earliest future windows with room, leaving
  -- the tenants after it their near reads (see Budget).
  local keep = math.min(keep_most, near * (ntenants - ti))
  rules.rec = rec_of(ti, rec_at[ti]) -- (85_late.lua, Reserved, Segments)
  -- Late events first take the slots of later reservations (85_late.lua).
  local took, left, from = take_slots(ti, rules, n - admitted, first, admitted + 1, keep)
  local taken = 0
  for i = 2, #took, 3 do
    taken = taken + took[i]
  end
  local res, rest, t = reserve(rules, fkey, n - admitted - taken, from, admitted + taken + 1, costs, keep)
  if #took > 0 then
    for i = 1, #res do
      took[#took + 1] = res[i]
    end
    res = took
  end
  keep_chains(rules)
  if ncap > 0 then -- what the tenant was refused now (35_capacity.lua)
    cap_done(rules, n, admitted)
  end
  -- 3. what is left is rejected.
  local full = 0
  if rest > 0 and t > hend then
    full = t
  end
  reply(admitted, res, rest, full, rules)
end

-- Where the tenant in decide stands: {its number, where its writes
-- (journal) and its reply (out) begin}, for a failure in decide. A table,
-- not locals: the embedded Lua of make demo (gopher-lua) does not keep a
-- local shared with a closure once an error has unwound it. (A failure in
-- the fast path raises its own.)
local at = {0, 0, 0}

-- slow[ti] is true for the tenants that went to decide or failed: the
-- others were decided in the fast path, whose one count is not journaled
-- (see undo_call).
local slow = {}

-- idle replies for tenant ti, without new events, at out[o + 1]: nothing
-- decided, its ttl chains as cached.
local function idle(ti, o)
  slow[ti] = true -- nothing to take back
  out[o + 1], out[o + 2], out[o + 3], out[o + 4] = 0, 0, 0, 0
  local p = rec_at[ti]
  if descs[recs[p + 2]].kind == "t" then
    o = o + 4
    for q = p + 3, p + 3 * recs[p], 3 do
      out[o + 1], out[o + 2] = recs[q], recs[q + 1]
      o = o + 2
    end
  end
  return true
end

-- chains_hold reports whether the anchors of the ttl rules whose windows
-- fast_many opened for the tenant whose record is at recs[p] and keys at
-- KEYS[k] (made_*: see 70_admit.lua) still hold the cached chains.
local function chains_hold(p, k, nrules)
  for ri = 1, nrules do
    if made_d[ri].kind == "t" and made_c[ri] == made_by[ri] then
      cur = KEYS[k + ri] .. ":anchor" -- anchor_key
      local v = redis.call("HMGET", cur, "start", "until")
      local un = tonumber(v[2])
      if tonumber(v[1]) ~= recs[p + 3 * ri] or not un or un <= now then
        return false
      end
    end
  end
  return true
end

-- fast_many is the fast path of a tenant with several rules (ti, record at
-- recs[p], keys at KEYS[k], n events, costs: cost_total): when the
-- current window of every rule is known without reading Redis (aligned;
-- ttl with a cached chain that covers it) and the events' cost fits each
-- rule's whole limit, it counts them there optimistically, one HINCRBY per
-- rule, journaled, and keeps what it counted in made_* (70_admit.lua: no
-- table is made per tenant). When everything fits (a window opened in a
-- cached chain only once its anchor is read and still holds the chain), it
-- writes the tenant's reply at out[o + 1] and returns true. When a rule
-- has no room for them all, it returns false and true (what it counted is
-- in made_*, for admit_made), unless a window opened in a cached chain:
-- then, as when a cached chain is gone, it takes the counts back, leaves
-- the counts as they were in counts (admit_all then reads no window again)
-- and returns false alone.
local function fast_many(ti, p, k, nrules, n, o, capok)
  local recs, descs, keys = recs, descs, KEYS
  local costs = cost_at[ti] -- the tenant has costs
  local ttl = false -- a rule has ttl windows
  for ri = 1, nrules do
    local q = p - 1 + 3 * ri
    local d = descs[recs[q]]
    local cs, ce = d.cur_start, d.cur_end
    if d.kind == "t" then
      local chain_start, chain_end = recs[q + 1], recs[q + 2]
      if chain_end <= now then
        return false
      end
      cs = chain_start + math.floor((now - chain_start) / d.step) * d.step
      ce = cs + d.step
      if ce > chain_end then
        return false
      end
      ttl = true
    end
    local by = n
    if costs then
      by = cost_total(ti, ri, n, d.limit)
    end
    if by > d.limit then
      return false
    end
    made_key[ri], made_by[ri], made_end[ri], made_d[ri] = keys[k + ri] .. ":" .. num(cs), by, ce, d
  end
  local mark, over, opened_cached = jn, false, false
  for ri = 1, nrules do
    local key, by = made_key[ri], made_by[ri]
    cur = key
    local c = redis.call("HINCRBY", key, "count", num(by)) -- a string: see fmt (35_capacity.lua)
    if c == by then
      journal[jn + 1], journal[jn + 2], journal[jn + 3] = 1, key, false -- note, inline
      if ttl and made_d[ri].kind == "t" then
        opened_cached = true
      end
    else
      journal[jn + 1], journal[jn + 2], journal[jn + 3] = 2, key, -by
      made_end[ri] = false
    end
    jn = jn + 3
    if c > made_d[ri].limit then
      over = true
    end
    made_c[ri] = c
  end
  if opened_cached and (over or not chains_hold(p, k, nrules)) then
    undo(mark)
    for ri = 1, nrules do
      counts[made_key[ri]] = made_c[ri] - made_by[ri]
    end
    return false
  elseif over or (ncap > 0 and not capok) then -- a capacity: decide goes on (admit_made)
    return false, true
  end
  for ri = 1, nrules do
    local e = made_end[ri]
    if e then
      opened(made_key[ri], e, made_d[ri].retention)
    end
  end
  out[o + 1], out[o + 2], out[o + 3], out[o + 4] = n, 0, 0, 0
  if descs[recs[p + 2]].kind == "t" then
    o = o + 4
    for q = p + 3, p + 3 * nrules, 3 do
      out[o + 1], out[o + 2] = recs[q], recs[q + 1]
      o = o + 2
    end
  end
  return true
end

-- cap_one is the fast path of a tenant with one rule of its own under one
-- capacity rule (ti, record at recs[p], keys at KEYS[k], n
-- events, its writes from journal mark on, its reply at out[o + 1]):
-- cap_quick, fast_many and cap_book of the tenant in one function, on the
-- call's view of the current and next capacity windows, without their
-- tables and calls (a Lua call, a table write or a math function costs
-- Redis hundreds of instructions, and this runs for most tenants of a
-- call: see Cost in 35_capacity.lua). It does what they do, in the same
-- order and with the same results, once the call has read both windows
-- and fixed the level and no field read there is not a number; otherwise,
-- or when the capacity has no room for all n events, or the events cost
-- more than the tenant's rule's whole limit, it returns nil and run takes
-- the general path (cap_mark, which it may have done, does nothing twice).
-- Else it returns as fast_many does: true when the tenant is decided (its
-- count, as the one-rule fast path's, not journaled: undo_call finds it),
-- false and true when its rule has no room (made_*: decide goes on).
-- Whole numbers are floored as x - x % 1, which is math.floor(x) exactly.
local one_r = {w = 0, f = 0, cap = false} -- cap_demand's view of the tenant
local function cap_one(ti, p, k, n, mark, o)
  local cd = capd[1]
  local cw, nw = cd.scur, cd.snext
  if not (cw and nw and cd.lv and nw.hkey) or cw.bad or nw.bad then
    return nil
  end
  local cv, nv = cw.v, nw.v
  if not (cw.ends or type(cv.expire) == "number") or not (nw.ends or type(nv.expire) == "number") then
    return nil -- cap_touch would give one its end
  end
  -- The tenant's current window, as fast_many finds it.
  local d = descs[recs[p + 2]]
  local cs, ce, ttl = d.cur_start, d.cur_end, d.kind == "t"
  if ttl then
    local chain_start, chain_end = recs[p + 3], recs[p + 4]
    if chain_end <= now then
      return nil
    end
    cs = (now - chain_start) / d.step
    cs = chain_start + (cs - cs % 1) * d.step
    ce = cs + d.step
    if ce > chain_end then
      return nil
    end
  end
  local tf, rf, qf = capt[ti], capr[ti], capq[ti]
  local b, rv, q0 = cv[tf], cv[rf], nv[qf]
  local c, a = cv.count, cv.a
  if b == nil or rv == nil or q0 == nil or c == nil or a == nil then
    return nil -- not read (see cap_tenant, hc_num)
  end
  b, q0, c = b or 0, q0 or 0, c or 0
  local w, f = caps[ti + ti - 1], caps[ti + ti]
  local qc, bn = 0, 0 -- with a floor: what it asks of the current window, booked in the next
  if f > 0 then
    qc, bn = cv[qf], nv[tf]
    if qc == nil or bn == nil then
      return nil -- not read (see tenant_fields)
    end
    qc, bn = qc or 0, bn or 0
  end
  local cdirty, cdl = cw.dirty, cw.dl
  -- cap_mark: active in the window from its first call (journaled).
  if rv == false then
    local key = cw.key
    journal[jn + 1], journal[jn + 2], journal[jn + 3] = 6, key, rf
    journal[jn + 4], journal[jn + 5], journal[jn + 6] = 6, key, "a"
    jn = jn + 6
    local co = #capold
    capold[co + 1], capold[co + 2] = false, a
    cv[rf] = 0
    if not cdirty[rf] then
      cdirty[rf] = true
      cdl[#cdl + 1] = rf
    end
    a = (a or 0) + w
    cv.a = a
    if not cdirty.a then
      cdirty.a = true
      cdl[#cdl + 1] = "a"
    end
  end
  a = a or 0
  -- cap_room of the current window (no next event: one is 1).
  local C, lv0 = cd.cl, cd.lv
  local lv = lv0
  if lv == 0 then
    lv = C / (a > 1 and a or 1)
  end
  local phi = (now - cd.cs) / cd.step
  local protect = phi < ramp_hi
  local e, left
  if phi > ramp_lo and cd.wc > 0 then
    local rest = cd.rest or cap_rest(cd, phi)
    local spare = C - (c - (cv.x or 0)) - rest
    if spare > 0 then
      local wa = cd.wc
      if a < wa then
        wa = a
      end
      lv = lv + spare / (wa > 1 and wa or 1)
      e = -(w * lv - 1e-9) -- math.ceil
      e = -(e - e % 1)
    end
    if spare > 0 and phi < ramp_mid then
      -- At most what is spare and not taken, rounded up, above the level.
      left = C - c - rest - 1e-9
      left = left - left % 1 + 1
      if left < 0 then
        left = 0
      end
      local base = w * lv0 + 1e-9
      base = base - base % 1
      if f > base then
        base = f
      end
      if b < base then
        left = left + base - b
      end
    end
  elseif not protect then
    lv = C
  end
  if not e then
    e = w * lv + 1e-9
    e = e - e % 1
  end
  if f > e then
    e = f
  end
  local room, free = e - b, C - c
  if left and left < room then
    room = left
  end
  if protect and cd.ffloor > 0 then
    -- The others' floors as far as they ask (cap_room).
    local others = (cv.fu or 0) - (cv.fb or 0)
    if f > b then
      local kept = (qc < f and qc or f) - b
      if kept > 0 then
        others = others - kept
      end
    end
    if others > 0 then
      free = free - others
    end
  end
  if free < room then
    room = free
  end
  local need = n
  local costs = cost_at[ti]
  if costs then
    need = cap_cost(ti, 1, n, room)
  end
  if room < need then
    return nil
  end
  -- fast_many's count of the tenant's own rule.
  local by = n
  if costs then
    by = cost_total(ti, 1, n, d.limit)
  end
  if by > d.limit then
    return nil
  end
  local key = KEYS[k + 1] .. ":" .. (numbers[cs] or num(cs))
  local cnt = redis.pcall("HINCRBY", key, "count", numbers[by] or num(by))
  if type(cnt) == "table" then -- it wrote nothing
    error({key = key, why = fault(cnt.err), msg = cnt.err, at = {ti, mark, o}})
  end
  local over, opened_cached = cnt > d.limit, ttl and cnt == by
  if over or opened_cached then
    -- fast_many's count, journaled, and what it made (made_*): decide
    -- goes on from it (admit_made), or from scratch when the window
    -- opened in a cached chain and the anchor does not hold it.
    local m = jn
    if cnt == by then
      journal[jn + 1], journal[jn + 2], journal[jn + 3] = 1, key, false
    else
      journal[jn + 1], journal[jn + 2], journal[jn + 3] = 2, key, -by
    end
    jn = jn + 3
    made_key[1], made_by[1], made_end[1], made_d[1], made_c[1] = key, by, cnt == by and ce, d, cnt
    if opened_cached and (over or not chains_hold(p, k, 1)) then
      undo(m)
      counts[key] = cnt - by
      return false
    elseif over then
      return false, true
    end
  else
    slow[ti] = false -- its count is found again by undo_call
  end
  if cnt == by then
    opened(key, ce, d.retention)
  end
  out[o + 1], out[o + 2], out[o + 3], out[o + 4] = n, 0, 0, 0
  if ttl then
    out[o + 5], out[o + 6] = recs[p + 3], recs[p + 4]
  end
  -- cap_book: settled (no field read there is not a number), not journaled.
  cv.count = c + need
  if not cdirty.count then
    cdirty.count = true
    cdl[#cdl + 1] = "count"
  end
  cv[tf] = b + need
  if not cdirty[tf] then
    cdirty[tf] = true
    cdl[#cdl + 1] = tf
  end
  if lv0 > 0 then
    local base = w * lv0 + 1e-9
    base = base - base % 1
    if f > base then
      base = f
    end
    local over = need
    if b < base then
      over = b + need - base
    end
    if over > 0 then
      cv.x = (cv.x or 0) + over
      if not cdirty.x then
        cdirty.x = true
        cdl[#cdl + 1] = "x"
      end
    end
  end
  if f > 0 then
    -- cap_add's fb and fu, and cap_ask's fu in the next window (settled:
    -- not journaled, as cap_demand below).
    settled = true
    local under = (b + need < f and b + need or f) - (b < f and b or f)
    if under > 0 then
      hc_add(cw, "fb", under)
    end
    local by = floor_moved(f, b, qc, b + need, qc)
    if by ~= 0 then
      hc_add(cw, "fu", by)
    end
    by = floor_moved(f, bn, q0, bn, q0 + need)
    if by ~= 0 then
      hc_add(nw, "fu", by)
    end
    settled = false
  end
  -- cap_ask: what it asks of the next window, and its demand there.
  local q1 = q0 + need
  nv[qf] = q1
  local ndirty = nw.dirty
  if not ndirty[qf] then
    ndirty[qf] = true
    local ndl = nw.dl
    ndl[#ndl + 1] = qf
  end
  if f > 0 or cd.bycost then
    one_r.w, one_r.f, one_r.cap = w, f, cd
    settled = true
    cap_demand(one_r, nw.hkey, q0, q1)
    settled = false
  elseif q1 ~= q0 then
    -- cap_demand, events without a floor (hmove, settled): one bucket, or
    -- two.
    local hk = nw.hkey
    local h = hd[hk]
    if not h then
      h = {}
      hd[hk] = h
      hdl[#hdl + 1] = hk
    end
    local k1 = q1 / w
    if k1 < HB then
      k1 = k1 - k1 % 1
    else
      k1 = bucket(k1)
    end
    local s1 = numbers[k1] or num(k1)
    if q0 > 0 then
      local k0 = q0 / w
      if k0 < HB then
        k0 = k0 - k0 % 1
      else
        k0 = bucket(k0)
      end
      if k0 == k1 then
        h[s1] = (h[s1] or 0) + (q1 - q0)
      else
        local s0 = numbers[k0] or num(k0)
        h[s0] = (h[s0] or 0) - (w * HP + q0)
        h[s1] = (h[s1] or 0) + (w * HP + q1)
      end
    else
      h[s1] = (h[s1] or 0) + (w * HP + q1)
    end
  end
  return true
end

-- run decides the tenants from the first-th on. An error stops it at the
-- failing tenant, which the loop at the end fails alone, or the whole call
-- with it.
--
-- Fast path, inline (most tenants take it, and here a Lua call or a table
-- write shows): a tenant with one rule whose current window is known
-- without reading Redis (aligned; ttl with a cached chain that already
-- covers the current window) is counted optimistically, by the events'
-- total cost for a rule with costs; when everything fits and no window
-- opens in a cached chain, that is the whole decision. Otherwise decide
-- goes on from the count made (with costs, from the count taken back).
local function run(first)
  if advance then
    return advance_run(first, at, slow) -- a call that moves a backlog (87_advance.lua)
  end
  local recs, descs, out, journal, keys = recs, descs, out, journal, KEYS -- registers, not upvalues
  for ti = first, ntenants do
    local p, k = rec_at[ti], key_at[ti]
    local nrules, n = recs[p], recs[p + 1]
    local mark, o = jn, #out
    out_at[ti] = o + 1
    if claim_failed[ti] then
      -- Its record of takes is broken (85_late.lua): the tenant fails.
      error({key = claim_failed[ti][1], why = claim_failed[ti][2], at = {ti, mark, o}})
    end
    local c, done = nil, false
    local costs = cost_at[ti] -- the tenant has costs (costs_of: its lists)
    if n == 0 then
      -- Every event of the tenant was replayed: nothing to decide.
      done = idle(ti, o)
    elseif ncap > 0 then
      -- A capacity (35_capacity.lua): the tenant's own rules are counted
      -- as in fast_many; when every capacity rule has room for all n
      -- events (cap_quick) and so have its own rules, that is the whole
      -- decision (cap_book books them); otherwise decide goes on from
      -- those counts.
      slow[ti] = true
      if cap_fast then
        local one = nil
        if ncap == 1 and nrules == 1 and not cap_general then
          one, c = cap_one(ti, p, k, n, mark, o)
        end
        if one ~= nil then
          done = one
        else
          at[1], at[2], at[3] = ti, mark, o
          local qs = cap_quick(ti, n)
          done, c = fast_many(ti, p, k, nrules, n, o, qs)
          if done then
            cap_book(qs)
          end
        end
      end
    elseif nrules == 1 then
      local d, chain_start, chain_end = descs[recs[p + 2]], recs[p + 3], recs[p + 4]
      local cs, ce = nil, nil -- the current window, when known
      if d.kind ~= "t" then
        chain_end = nil
        cs, ce = d.cur_start, d.cur_end
      elseif chain_end > now then
        cs = chain_start + math.floor((now - chain_start) / d.step) * d.step
        ce = cs + d.step
      end
      local by = n -- what the events cost the rule
      if costs then
        by = cost_total(ti, 1, n, d.limit)
      end
      if cs and (not chain_end or ce <= chain_end) and by <= d.limit then
        local key = keys[k + 1] .. ":" .. num(cs) -- wkey, inline
        c = redis.pcall("HINCRBY", key, "count", by)
        if type(c) == "table" then -- it wrote nothing
          error({key = key, why = fault(c.err), msg = c.err, at = {ti, mark, o}})
        end
        if c <= d.limit and (c ~= by or not chain_end) then
          if c == by then
            opened(key, ce, d.retention)
          end
          out[o + 1], out[o + 2], out[o + 3], out[o + 4] = n, 0, 0, 0
          if chain_end then
            out[o + 5], out[o + 6] = chain_start, chain_end
          end
          done = true
        elseif costs then
          -- Costs are decided from the counts as they were: take this back.
          if c == by then
            redis.call("DEL", key)
          else
            redis.call("HINCRBY", key, "count", -by)
          end
          c = nil
        else
          journal[jn + 1], journal[jn + 2], journal[jn + 3] = c == n and 1 or 2, key, -n -- incr, inline
          jn = jn + 3
        end
      end
    else
      -- Several rules: the fast path's counts are journaled.
      slow[ti] = true
      at[1], at[2], at[3] = ti, mark, o
      done, c = fast_many(ti, p, k, nrules, n, o)
    end
    if not done then
      slow[ti] = true
      at[1], at[2], at[3] = ti, mark, o
      decide(ti, n, c, costs and costs_of(ti))
    end
  end
end

-- undo_call takes back every write of the call: the journal's, and the
-- count of each tenant decided in the fast path, n events (or their total
-- cost) in the window that holds now, found from the tenant's record.
local function undo_call()
  undo(0)
  for ti = 1, ntenants do
    if out_at[ti] == nil or out[out_at[ti]] == nil then
      return -- ti and the tenants after it were not decided
    end
    if not slow[ti] then
      local p = rec_at[ti]
      local n, d = recs[p + 1], descs[recs[p + 2]]
      local cs = d.cur_start
      if d.kind == "t" then
        cs = recs[p + 3] + math.floor((now - recs[p + 3]) / d.step) * d.step
      end
      local key = wkey(KEYS[key_at[ti] + 1], cs)
      local by = n
      if cost_at[ti] then
        by = cost_total(ti, 1, n, d.limit)
      end
      if redis.call("HINCRBY", key, "count", -by) <= 0 then
        redis.call("DEL", key)
      end
    end
  end
end

-- compact returns the compact reply's head (see Reply): the tenants whose
-- part of the full reply (in out) the caller does not have already, each
-- with its number; the others' new events are all admitted and their ttl
-- chains are as sent (the full part's numbers equal the record's: n, then
-- zeros, then the cached chains). It returns the replay record's
-- exceptions too, the tenants listed whose events were not all admitted
-- (60_replay.lua's exceptions(), found on the way).
local function compact()
  local recs, descs, out = recs, descs, out
  local c, m, sum = {0, 0}, 0, 0
  local ex = {}
  for ti = 1, ntenants do
    local o, p = out_at[ti], rec_at[ti]
    local n = recs[p + 1]
    local same = out[o] == n and out[o + 1] == 0 and out[o + 2] == 0
    if same and descs[recs[p + 2]].kind == "t" then
      local q = o + 4
      for r = p + 3, p + 3 * recs[p], 3 do
        if out[q] ~= recs[r] or out[q + 1] ~= recs[r + 1] then
          same = false
          break
        end
        q = q + 2
      end
    end
    if same then
      sum = sum + n
    else
      m = m + 1
      local e = #out
      if ti < ntenants then
        e = out_at[ti + 1] - 1
      end
      local k = #c
      c[k + 1] = ti
      for i = o, e do
        c[k + 2 + i - o] = out[i]
      end
      add_exception(ex, ti) -- 60_replay.lua
    end
  end
  c[1], c[2] = m, sum
  return c, ex
end

-- finish records the call's decisions and ends the reply with the
-- replayed events; a failure to write the record takes the call back.
local function finish()
  local r, ex = out, nil
  if not full_reply then
    r, ex = compact()
  end
  if rkey then
    local ok, e = pcall(keep_record, ex)
    if not ok then
      undo_call()
      return redis.error_reply(tostring(type(e) == "table" and (e.err or e.msg) or e))
    end
  end
  if ncap > 0 then
    cap_flush() -- the capacity's writes, kept until now (35_capacity.lua)
  end
  local o = #r
  r[o + 1] = #replayed / 4
  for i = 1, #replayed do
    r[o + 1 + i] = replayed[i]
  end
  r[#r + 1] = rec_hi
  return r
end

if rkey then
  local full = replay_phase()
  if full then
    return redis.error_reply(full)
  end
end
do
  -- The claims' writes (the takes they use up) are journaled: a tenant
  -- whose record of takes is broken fails alone (claim_failed), and any
  -- other failure there takes them back and fails the call.
  local ok, e = pcall(claim_phase) -- 85_late.lua
  if not ok then
    undo(0)
    local key, why = failure(e)
    return redis.error_reply(key and (key .. " " .. why) or tostring(why))
  end
end
local ti = 1
while true do
  local ok, e = pcall(run, ti)
  if ok then
    return finish()
  end
  settled = false -- (35_capacity.lua) a failure's writes are journaled
  local key, why = failure(e)
  if not key then
    undo_call()
    return redis.error_reply(why)
  end
  local pos = type(e) == "table" and e.at or at
  local mark, o = pos[2], pos[3]
  ti = pos[1]
  undo(mark)
  for i = #out, o + 1, -1 do
    out[i] = nil
  end
  out[o + 1], out[o + 2], out[o + 3] = -1, key, why
  out_at[ti] = o + 1
  slow[ti] = true
  ti = ti + 1
end
