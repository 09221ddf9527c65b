-- reserve: reserving a tenant's next events in future windows.
--
-- Contract. reserve places the events that admission left, in order, in
-- the earliest windows up to the horizon where every rule has room for
-- them, counting each in the windows that hold its due time, and moves the
-- tenant's frontier (see the header). It reads at most what is left of the
-- call's budget of windows (see Budget): when that runs out, the events not
-- placed are deferred, unreserved, to where the search stopped. What it
-- leaves is rejected by its caller.

-- near is the window reads of a tenant's search that it may always take
-- while the budget lasts, per rule: enough for a tenant a little over its
-- limit (the next window of each rule, and one more; twice that of a
-- capacity rule, whose windows cost two reads: scan.need). Past them, a
-- search leaves the call's last reads to the tenants after it (see
-- Budget). A search jumps over the full capacity windows the call found
-- (see Full windows, 35_capacity.lua) in one step.
local near = 2

-- reserve reserves rest events, the pos-th on, in order, in the earliest
-- windows from first on where every rule has room for them (costs: the
-- tenant's cost lists, nil for event rules alone), up to the horizon, and
-- moves the tenant's frontier (key fkey). Past its near reads it reads no
-- window while the budget is keep or less. It returns the reservations
-- (due, count, until each), what is left and where the search stopped.
local function reserve(rules, fkey, rest, first, pos, costs, keep)
  local res = none
  local t = first
  -- Reads taken without regard to keep: a capacity rule's (every tenant
  -- has the ncap of them, rules_of) count twice, its and the tenant's
  -- fields.
  local mine = near * (#rules + ncap)
  local got = pos > 1 -- the tenant got something in the call
  if rest > 0 then
    res = {}
    cur = fkey
    local fr = tonumber(redis.call("GET", fkey))
    if fr and fr > t then
      t = fr
    end
  end
  local spent = false
  while rest > 0 and t <= hend do
    -- The windows of every rule that hold t (at_start, at_end), their room,
    -- the least room, the earliest end.
    local minroom, untilt = math.huge, math.huge
    local past = false
    for _, r in ipairs(rules) do
      local s, e = win(r, t)
      if not s then
        past = true
        break
      end
      r.at_start, r.at_end = s, e
      local need, key = scan.need(r, s)
      if need > 0 then
        if budget < need or (mine < need and budget - need < keep) then
          spent = true
          break
        end
        budget, mine = budget - need, mine - need
      end
      local room = room_of(r, s, pos) -- 35_capacity.lua
      if need > 0 and r.cap and hc[key].v[r.tf] == nil then
        -- A full window: cap_room did not read the tenant's fields.
        budget, mine = budget + 1, mine + 1
      end
      r.room = room
      if room < minroom then
        minroom = room
      end
      if e < untilt then
        untilt = e
      end
    end
    if past then
      t = hend + 1
      break
    end
    if spent then
      break
    end
    -- Event rules alone: as many as the least room (fit, inline).
    local take = rest
    if costs then
      take = fit(rules, pos, rest)
    elseif minroom < take then
      take = minroom > 0 and minroom or 0
    end
    if take > 0 then
      for _, r in ipairs(rules) do
        local by = r.costs and r.take or take
        if by > 0 then
          add(r, r.at_start, r.at_end, by)
        end
      end
      local rec = rules.rec
      if rec then
        -- What the finest window now holds reserved of the measures that
        -- no rule of its windows counts (85_late.lua, Reserved), or what
        -- the home window holds reserved at t (Segments).
        local h = rules[rec[1]]
        local key = wkey(h.key, h.at_start)
        if rec.seg and count_of(key) == 0 then
          add(h, h.at_start, h.at_end, 0) -- (a home of bytes: opened, to expire)
        end
        for _, fr in ipairs(rec[2]) do
          local by = costs and rules[fr[2]].take or take
          if by > 0 then
            local f = rec.seg and fr[1] .. num(t) or fr[1]
            cur = key
            redis.call("HINCRBY", key, f, by)
            note(4, key, {f, -by})
          end
        end
      end
      res[#res + 1] = t
      res[#res + 1] = take
      res[#res + 1] = untilt
      rest, pos = rest - take, pos + take
      got = true
    end
    -- On past the windows too full for the next event; when all are
    -- placed, past those they filled, for the next call.
    local jump = blocked(rules, pos, take, rest > 0)
    if take == 0 then
      -- Over the run of full capacity windows the call knows of (see Full
      -- windows, 35_capacity.lua), in one step.
      for _, r in ipairs(rules) do
        local d = r.cap
        if d and d.ff and r.at_start >= d.ff and r.at_start < d.ft and d.ft > jump then
          jump = d.ft
        end
      end
    end
    if jump > 0 then
      t = jump
    end
  end
  if spent then
    -- Deferred, unreserved: they come back at t and are checked as new.
    res[#res + 1] = t
    res[#res + 1] = rest
    res[#res + 1] = t
    rest = 0
  end
  if t > first then
    local life = t - now
    if not got and life > idle_frontier_ms then
      life = idle_frontier_ms
    end
    redis.call("SET", fkey, string.format("%.0f", t), "PX", string.format("%.0f", life + 1000))
    note(1, fkey, false) -- a frontier is a hint: none is always safe
  end
  return res, rest, t
end
