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

-- admit_all admits, for a tenant with several rules or with costs, the
-- first of n events that fit in the current window of every rule, and
-- counts them there.
local function admit_all(rules, n)
  for _, r in ipairs(rules) do
    r.room = room_of(r, r.cur_start) -- 35_capacity.lua
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
