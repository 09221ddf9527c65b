-- advance: a deferred backlog moves into idle capacity (issue 24).
--
-- Contract. After the replay arguments (at the place of 85_late.lua's late
-- argument, which a call carries one or the other of) the call may carry the
-- advance argument, "A" and a JSON array with one array per tenant, in the
-- call's order: the due times (gk-due, unix ms) of the tenant's events, in
-- event order. Such a call (limit.Limiter.Advance) decides no new event: its
-- events are deferred events that wait in a retry tier before their due time,
-- each holding a reserved slot (counted in the window of each of its
-- tenant's rules that holds its due time, the capacity's included), given
-- per tenant in due order, from the head of its waiting events, with their
-- costs as any call's (50_costs.lua: a tenant with a rule or a capacity of
-- bytes or units). An event costs each rule what admission counts: 1 for a
-- rule of events, its bytes or units for one of bytes or units (its cost
-- below). For each tenant, in order, and while the tenant qualifies, an
-- event is moved:
--   - its due time is after now, and the windows of its slot still hold it
--     (every own rule's window count at least its cost, the capacity
--     window's count and the tenant's t:<tenant> there at least its cost);
--   - every own rule's current window has room for its cost (count + cost
--     at most the limit), and every capacity rule's current window too, in
--     the capacity's measure: the tenant's room there (cap_room: its
--     entitlement, at the level and the ramp, less what it booked; at most
--     what the capacity has left, less the floors not used), and, from the
--     ramp's start (ramp_lo) on, the idle room: C - count less what the
--     other tenants are still expected to book there (their water-filling
--     allocations, the satisfied ones' predicted demand and the capped
--     ones' entitlement at the level, beyond what they booked; with
--     cap_rest's margin until ramp_mid). Before the ramp a tenant that
--     starts sending in the window takes its entitlement first;
-- then its booking moves by its cost: counted in the current windows (the
-- capacity's through cap_add, as an admission), taken out of its slot's
-- windows (the own rules' counts, journaled; the capacity window's count,
-- t:<tenant>, fb under a floor and the tenant's predicted demand
-- q:<tenant> with its histogram entry, and fu (35_capacity.lua's Floors),
-- in the call's view: cap_add's and cap_ask's bookings taken back). A window a rule's slot shares with
-- the current one moves nothing. The tenant's first event that does not
-- move ends its turn (G4: a tenant's events leave in order); so does the
-- budget (ARGV[3]): each read of a slot's window that the call has not made
-- (an own rule's window; a capacity window's shared fields, and the
-- tenant's fields there) costs one, and so does the read of a tenant's
-- record of takes (below); a tenant whose next event's slot would pass it
-- moves no more. Besides, a call reads what admission reads
-- (the current windows: each tenant's own, the capacity's with the call's
-- tenants' fields) and its tenants' q: there, one HMGET: at most its
-- budget and one read per tenant and own rule, plus a few.
-- A tenant qualifies when its rules are aligned (kinds "a" and "e"), of
-- any measure. An event whose slot a late event took (85_late.lua: its
-- tenant's record of takes holds some under its due time, or under the
-- start of its window of one of the tenant's rules) does not move, and
-- ends its tenant's turn: its slot's windows count the late event, which
-- comes back there uncounted, and its own claim gives up the slot when it
-- comes back (moved, the windows would count one event less than they
-- forward). That read is one HMGET per tenant that has an event that may
-- move.
--
-- Reply and record. A moved event is admitted (counted now, in the windows
-- it is forwarded in: the caller forwards it now with gk-due rewritten to
-- now); its decision is recorded in the replay record as an admission, so
-- that a replay of the call (the same source and offsets) gets it back and
-- counts nothing (G9). An event that does not move keeps its slot: it is
-- reported in the replayed list with code 5 (keep, as 85_late.lua's claims)
-- and is not recorded, so a later call may move it. A tenant's reply part
-- is then its moved events, all admitted; a tenant that failed (a broken
-- key) is reported as in any call, its events kept.

local advance = false -- per tenant: its events' due times
do
  local at = arg_recs + 1
  if rkey then
    at = arg_recs + 6
  end
  local a = ARGV[at + 1]
  if a and string.sub(a, 1, 2) == "A[" then
    advance = cjson.decode(string.sub(a, 2))
  end
end

-- adv.fresh: per tenant the due times of its events not replayed; moved:
-- how many of them each tenant moved (nil: it failed); read: the tenants'
-- q: fields in the current capacity windows are read.
local adv = {fresh = false, moved = {}, read = false}

local advance_run
do
  -- fresh_dues returns per tenant the due times of its events that the
  -- replay record does not hold, in order.
  local function fresh_dues()
    if adv.fresh then
      return adv.fresh
    end
    local rep_at = {}
    for i = 1, #replayed, 4 do
      rep_at[replayed[i]] = true
    end
    local f, pos = {}, 0
    for ti = 1, ntenants do
      local l, d = {}, advance[ti] or none
      for j = 1, #d do
        if not rep_at[pos + j - 1] then
          l[#l + 1] = d[j]
        end
      end
      f[ti] = l
      pos = pos + #d
    end
    adv.fresh = f
    return f
  end

  -- slot_of returns the start of r's window that holds due (nil past the
  -- boundaries given).
  local function slot_of(r, due)
    if r.cap then
      local d = r.cap
      return d.cs + math.floor((due - d.cs) / d.step) * d.step
    end
    return (win(r, due))
  end

  -- may_read reports whether r's window starting at s may be read, and
  -- takes what that costs from the budget (scan.need, 85_late.lua).
  local function may_read(r, s)
    local need = scan.need(r, s)
    if need > budget then
      return false
    end
    budget = budget - need
    return true
  end

  -- idle returns the room of capacity rule r's current window that nobody
  -- is expected to take, from ramp_lo of the window on (before it, none:
  -- a tenant that starts sending in the window takes what it is entitled
  -- to first): C - count, less what the other tenants' water-filling
  -- allocations there (the satisfied ones' predicted demand sf, the capped
  -- weight wc at the level) leave to book beyond what they booked, and
  -- before ramp_mid cap_rest's margin on the satisfied ones' rest. r's
  -- tenant is taken out of sf or wc: its own predicted demand there is the
  -- backlog that moves.
  local function idle(r)
    local d = r.cap
    local phi = (now - d.cs) / d.step
    if phi < ramp_lo then
      return 0
    end
    local st = cap_win(r, d.cs)
    cap_tenant(st, r.qf)
    local q, b, lv = hc_num(st, r.qf), cap_booked(r, st) or 0, d.lv
    local sf, wc = d.sf, d.wc
    if lv > 0 and q > math.max(r.f, r.w * lv) then
      wc = math.max(0, wc - r.w) -- capped
    else
      sf = math.max(0, sf - q) -- satisfied
    end
    local c = hc_num(st, "count")
    local rest = math.max(0, sf + wc * lv - (c - b))
    if phi < ramp_mid then
      rest = rest + 2 * math.sqrt((1 - phi) * sf)
    end
    return d.cl - c - rest
  end

  -- unbook takes an event of cost by of r's tenant out of its capacity
  -- window starting at s: the count, what the tenant booked there (under
  -- its floor too, and what it uses of its floor) and what it is predicted
  -- to ask there (cap_add and cap_ask taken back).
  local function unbook(r, s, by)
    local st = cap_win(r, s)
    local b = cap_booked(r, st) or 0
    hc_add(st, "count", -by)
    hc_put(st, r.tf, b - by)
    if r.f > 0 then
      local under = math.min(b, r.f) - math.min(b - by, r.f)
      if under > 0 then
        hc_add(st, "fb", -under)
      end
    end
    cap_tenant(st, r.qf)
    local q0 = hc_num(st, r.qf)
    if r.f > 0 then
      local moved = floor_moved(r.f, b, q0, b - by, math.max(0, q0 - by))
      if moved ~= 0 then
        hc_add(st, "fu", moved)
      end
    end
    if q0 > 0 then
      local q1 = math.max(0, q0 - by)
      hc_put(st, r.qf, q1)
      if not st.hkey then
        st.hkey = dkey(r, s)
      end
      if q1 == 0 and r.f == 0 then
        -- Out of the histogram (cap_demand would leave its weight there).
        hentry(st.hkey, bucket(q0 / r.w), -1, r.w, q0, not r.cap.bycost)
      else
        cap_demand(r, st.hkey, q0, q1)
      end
    end
  end

  -- cost_of returns what tenant's j-th event costs rule r: its cost in
  -- r's list (bytes or units), 1 for a rule of events.
  local function cost_of(r, j)
    local c = r.costs
    if c then
      return c[j]
    end
    return 1
  end

  -- movable reports whether the j-th event, of due time due, may move
  -- (see above), with the slot's window of each rule in slot.
  local function movable(rules, j, due, slot)
    if not due or due <= now then
      return false
    end
    for ri, r in ipairs(rules) do
      local s = slot_of(r, due)
      slot[ri] = s
      if not s or s < r.cur_start then
        return false
      end
      if s ~= r.cur_start then
        if not may_read(r, s) then
          return false
        end
        local c = cost_of(r, j)
        if r.cap then
          local st = cap_win(r, s)
          if (cap_booked(r, st) or 0) < c or hc_num(st, "count") < c then
            return false
          end
          if cap_room(r, r.cur_start) < c or idle(r) < c then
            return false
          end
        elseif count_of(wkey(r.key, s)) < c or count_of(wkey(r.key, r.cur_start)) + c > r.limit then
          return false
        end
      end
    end
    return true
  end

  -- advance_one moves tenant ti's events (due times dues, n of them) while
  -- they may move, each by its cost, and returns how many moved. An event
  -- whose slot a late event took (a take recorded under its due time, or
  -- its window of an own rule) does not move, nor do the tenant's events
  -- after it: its window's counts hold the late event, and its claim,
  -- when it comes back, gives up its slot (85_late.lua's Claims).
  local function advance_one(ti, n, dues)
    -- taken_at returns the set of the fields of tenant ti's record of takes
    -- (85_late.lua) that hold some, of those its events (due times dues, n
    -- of them) may be under: each one's due time and the start of its
    -- window of each own rule (where a take under other rules went); false
    -- when the record cannot be read. One HMGET.
    local function taken_at(ti, rules, n, dues)
      local fields, seen = {}, {}
      local function field(s)
        if s and not seen[s] then
          seen[s] = true
          fields[#fields + 1] = num(s)
        end
      end
      for _, r in ipairs(rules) do
        if not r.cap then
          local at = r.bound_at -- (win walks a calendar rule's bounds on)
          for j = 1, n do
            if dues[j] and dues[j] > now then
              field((win(r, dues[j])))
            end
          end
          r.bound_at = at
        end
      end
      for j = 1, n do
        if dues[j] and dues[j] > now then
          field(dues[j])
        end
      end
      local held = {}
      if #fields == 0 then
        return held
      end
      local v = redis.pcall("HMGET", record_key(ti), unpack(fields))
      if type(v) ~= "table" or v.err then
        return false
      end
      for i, f in ipairs(fields) do
        if (tonumber(v[i]) or 0) > 0 then
          held[f] = true
        end
      end
      return held
    end

    local costs = cost_at[ti] and costs_of(ti)
    local rules = rules_of(ti, costs)
    for _, r in ipairs(rules) do
      if r.kind == "t" then
        return 0
      end
    end
    local slot, m = {}, 0
    local held = nil -- taken_at, read at the first event that may move
    local rec = rec_of(ti, rec_at[ti]) -- (85_late.lua, Reserved, Segments)
    for j = 1, n do
      if not movable(rules, j, dues[j], slot) then
        break
      end
      if held == nil then
        -- One HMGET, against the budget as a window's read.
        if budget < 1 then
          break
        end
        budget = budget - 1
        held = taken_at(ti, rules, n, dues)
      end
      if not held or held[num(dues[j])] then
        break
      end
      local hit = false
      for ri, r in ipairs(rules) do
        if not r.cap and held[num(slot[ri])] then
          hit = true
        end
      end
      if hit then
        break
      end
      for ri, r in ipairs(rules) do
        local s = slot[ri]
        if s ~= r.cur_start then
          local c = cost_of(r, j)
          if r.cap then
            cap_add(r, r.cur_start, r.cur_end, c)
            unbook(r, s, c)
          else
            add(r, r.cur_start, r.cur_end, c)
            local key = wkey(r.key, s)
            counts[key] = incr(key, -c)
          end
        end
      end
      if rec and (rec.seg or slot[rec[1]] ~= rules[rec[1]].cur_start) then
        -- Its slot's finest window no longer holds its cost reserved; nor
        -- does its home window at its due time (a segment's take comes
        -- after now, even in the current window: Segments).
        local key = wkey(rules[rec[1]].key, slot[rec[1]])
        for _, fr in ipairs(rec[2]) do
          local c = cost_of(rules[fr[2]], j)
          local f = rec.seg and fr[1] .. num(dues[j]) or fr[1]
          if c > 0 then
            cur = key
            -- Down to 0 at most (release.lua's rule): a record that holds
            -- less than the event's cost loses what it holds, and one
            -- that held nothing is left without the field.
            local left = redis.call("HINCRBY", key, f, -c)
            if left < 0 then
              c = c + left
              if c > 0 then
                redis.call("HINCRBY", key, f, -left)
              else
                redis.call("HDEL", key, f)
              end
            end
            if c > 0 then
              note(4, key, {f, c})
            end
          end
        end
      end
      m = m + 1
    end
    return m
  end

  -- keep_moved rebuilds the replayed list and the record's offsets once
  -- every tenant is decided: the events that did not move are kept (code
  -- 5, not recorded), the moved ones recorded as admitted.
  local function keep_moved()
    local offs = rkey and cjson.decode(ARGV[arg_offs]) or nil
    local rep_at = {}
    for i = 1, #replayed, 4 do
      rep_at[replayed[i]] = i
    end
    local rep, kept, pos, total = {}, {}, 0, 0
    for ti = 1, ntenants do
      local n0, m = #(advance[ti] or none), adv.moved[ti]
      local l, k = {}, 0
      for j = 1, n0 do
        local at = pos + j - 1
        local ri = rep_at[at]
        if ri then
          rep[#rep + 1], rep[#rep + 2], rep[#rep + 3], rep[#rep + 4] = at, replayed[ri + 1], replayed[ri + 2], replayed[ri + 3]
        else
          k = k + 1
          if m == nil or k <= m then
            if offs then
              l[#l + 1] = offs[ti][j]
            end
          else
            rep[#rep + 1], rep[#rep + 2], rep[#rep + 3], rep[#rep + 4] = at, 5, 0, 0
          end
        end
      end
      if m then
        recs[rec_at[ti] + 1] = m
      end
      kept[ti] = l
      total = total + #l
      pos = pos + n0
    end
    replayed = rep
    if rkey then
      nfresh = total
      if total > 0 then
        rec_offs = cjson.encode(kept)
      end
    end
  end

  -- advance_run decides the tenants from the first-th on (90_run.lua's
  -- run, for an advance call: at and slow are its).
  advance_run = function(first, at, slow)
    local fresh = fresh_dues()
    if not adv.read then
      -- Every tenant's q: in the current capacity windows, one HMGET
      -- (idle reads them; admission's cap_state reads t: and r: alone).
      adv.read = true
      for ci = 1, ncap do
        local d = capd[ci]
        hc_fresh(cap_state(wkey(d.key, d.cs), d.cs, d), capq)
      end
    end
    for ti = first, ntenants do
      local n = recs[rec_at[ti] + 1]
      local mark, o = jn, #out
      out_at[ti] = o + 1
      slow[ti] = true
      at[1], at[2], at[3] = ti, mark, o
      local m = 0
      if n > 0 and ncap > 0 then
        m = advance_one(ti, n, fresh[ti])
      end
      adv.moved[ti] = m
      out[o + 1], out[o + 2], out[o + 3], out[o + 4] = m, 0, 0, 0
    end
    keep_moved()
  end
end
