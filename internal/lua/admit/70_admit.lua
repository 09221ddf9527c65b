-- admit: admitting a tenant's first events into the current windows.
--
-- Contract. Given a tenant's rule states (rules_of) and n events, admit_one
-- (one rule, no costs) and admit_all (several rules, or costs) count the
-- first k events that fit in the current window of every rule, all rules
-- or none for each event, and return k. Their writes are journaled. A
-- current window's key is never past its expiry (keys carry their window's
-- start), so a count read there is live.

-- admit_one admits what fits of n events of a one-rule tenant in the
-- current window and counts them there: it counts all n (c: the count the
-- fast path already made) and gives back what did not fit, one call when
-- everything fits.
local function admit_one(r, n, c)
  local key = wkey(r.key, r.cur_start)
  c = c or incr(key, n)
  if c == n and r.chain_cached then
    -- The window was empty and the chain is known only from the cache:
    -- check the anchor before counting there.
    local cached_start = r.base
    anchor(r)
    if r.base ~= cached_start then
      -- The chain is gone (lost keys): undo (the window held nothing
      -- before) and count in the chain that starts now.
      redis.call("DEL", key)
      r.cur_start, r.cur_end = win(r, now)
      key = wkey(r.key, r.cur_start)
      c = incr(key, n)
    end
  end
  if c == n then
    opened(key, r.cur_end, r.retention)
  end
  local admitted = r.limit - (c - n)
  if admitted > n then
    admitted = n
  elseif admitted < 0 then
    admitted = 0
  end
  if admitted < n then
    incr(key, admitted - n)
  end
  -- (No need to remember the count: with one rule the search starts after
  -- the current window.)
  if admitted > 0 and r.cur_end > r.counted_until then
    r.counted_until = r.cur_end
  end
  return admitted
end

-- What fast_many (90_run.lua) counted for the tenant it last ran for, per
-- rule: the window's key, what it counted there (by), the window's end
-- when it opened there (else false), the rule's descriptor, and the count
-- made. Arrays kept for the whole call, so that the fast path of a tenant
-- with several rules makes no table.
local made_key, made_by, made_end, made_d, made_c = {}, {}, {}, {}, {}

-- admit_made admits, for a tenant with several rules, the first of n
-- events that fit in the current window of every rule, from the counts the
-- fast path made (made_*, above): each count is brought from its count
-- made to what the events admitted take, one HINCRBY a rule at most. A
-- window the fast path opened and nothing admitted takes is deleted. (A
-- window opened in a cached ttl chain never comes here: fast_many takes
-- its counts back.)
local function admit_made(rules, n)
  for ri, r in ipairs(rules) do
    if r.cap then -- 35_capacity.lua: not counted by the fast path
      r.room = room_of(r, r.cur_start, 1)
    else
      r.room = r.limit - (made_c[ri] - made_by[ri])
    end
  end
  local admitted = fit(rules, 1, n)
  for ri, r in ipairs(rules) do
    local take = r.take
    if r.cap then
      if take > 0 then
        add(r, r.cur_start, r.cur_end, take)
      end
    else
      local key, by, c = made_key[ri], made_by[ri], made_c[ri]
      if take ~= by then
        incr(key, take - by)
      end
      counts[key] = c - by + take
      if made_end[ri] then
        if take > 0 then
          opened(key, made_end[ri], r.retention)
        else
          redis.call("DEL", key)
        end
      end
      if take > 0 and r.cur_end > r.counted_until then
        r.counted_until = r.cur_end
      end
    end
  end
  return admitted
end

-- admit_all admits, for a tenant with several rules or with costs, the
-- first of n events that fit in the current window of every rule, and
-- counts them there. A current window that is empty in a chain known only
-- from the cache may be of a chain that is gone (lost keys): the anchor is
-- read first, as admit_one does, and a chain that is gone starts at now.
local function admit_all(rules, n)
  for _, r in ipairs(rules) do
    if r.cap then -- 35_capacity.lua
      r.room = room_of(r, r.cur_start, 1)
    else
      local c = count_of(wkey(r.key, r.cur_start))
      if c == 0 and r.chain_cached then
        local cached_start = r.base
        anchor(r)
        if r.base ~= cached_start then
          r.cur_start, r.cur_end = win(r, now)
          c = count_of(wkey(r.key, r.cur_start))
        end
      end
      r.room = r.limit - c
    end
  end
  local admitted = fit(rules, 1, n)
  if admitted > 0 then
    for _, r in ipairs(rules) do
      if r.take > 0 then
        add(r, r.cur_start, r.cur_end, r.take)
      end
    end
  end
  return admitted
end
