-- costs: what each event costs each rule, and how many events fit a room.
--
-- Contract. cost_at[ti] is where a tenant with costs (see Costs in the
-- header) has them in recs, nil for a tenant of event rules alone, whose
-- every event costs each rule 1. costs_of(ti) returns, for a tenant with
-- costs, per rule its cost list (the j-th event costs list[j]; rules that
-- count by one list share it) or false for an event rule, made on first use
-- and kept in cost_lists[ti] (the fast paths need only cost_total, and make
-- no table); nil for a tenant without costs. total sums a prefix of a list
-- without passing 2^53, cost_total the cost of a tenant's first n events to
-- one rule; fit places events in the rooms of a tenant's rules, in order,
-- all rules or none for each event; blocked tells how far a search must
-- move on for the next event to fit. With a capacity (ncap > 0), a tenant's
-- costs list after its own rules' lists one per capacity rule, and
-- cap_cost (35_capacity.lua) is what its events cost one of them.

local cost_lists = {}
-- cost_at[ti]: where tenant ti's costs begin in recs (its number in the
-- call); cost_n[ti]: its n events then (before any replay).
local cost_at, cost_n = {}, {}
if (recs[#recs] or 0) < 0 then
  local p = -recs[#recs] -- the first costs
  for ti = 1, ntenants do
    if recs[p] == ti then
      local q = rec_at[ti]
      local nrules, n = recs[q] + ncap, recs[q + 1]
      cost_at[ti], cost_n[ti] = p, n
      local nlists = 0 -- the lists are numbered 1, 2, ... in the rules' order of use
      for ri = 1, nrules do
        if recs[p + ri] > nlists then
          nlists = recs[p + ri]
        end
      end
      p = p + 1 + nrules + nlists * n
    end
  end
end

-- costs_of returns tenant ti's cost lists (see above), made once.
local function costs_of(ti)
  local lists_of = cost_lists[ti]
  local p = cost_at[ti]
  if lists_of or not p then
    return lists_of
  end
  local n, nrules = cost_n[ti], recs[rec_at[ti]] + ncap
  local lists = {}
  lists_of = {}
  for ri = 1, nrules do
    local l = recs[p + ri]
    if l > 0 and not lists[l] then
      local list, at = {}, p + nrules + (l - 1) * n
      for j = 1, n do
        list[j] = recs[at + j]
      end
      lists[l] = list
    end
    lists_of[ri] = l > 0 and lists[l]
  end
  cost_lists[ti] = lists_of
  return lists_of
end

-- total returns the sum of c[at + 1] to c[at + n], the costs of n events,
-- or more than most when it passes most (the sum stops there: a sum of
-- costs could pass 2^53, past which Lua's numbers are not whole).
local function total(c, at, n, most)
  local s = 0
  for j = at + 1, at + n do
    s = s + c[j]
    if s > most then
      return s
    end
  end
  return s
end

-- cost_total returns what the first n events of tenant ti (a tenant with
-- costs) cost its ri-th rule (n for an event rule), or more than most when
-- that passes most, from its lists once they are made, else from recs.
local function cost_total(ti, ri, n, most)
  local lists_of = cost_lists[ti]
  if lists_of then
    local c = lists_of[ri]
    return c and total(c, 0, n, most) or n
  end
  local p = cost_at[ti]
  local l = recs[p + ri]
  if l == 0 then
    return n
  end
  return total(recs, p + recs[rec_at[ti]] + ncap + (l - 1) * cost_n[ti], n, most)
end

-- What the first n events of the ti-th tenant cost capacity rule ci, its
-- rule after its own (see Costs in the header).
cap_cost = function(ti, ci, n, most)
  if not cost_at[ti] then
    return n
  end
  return cost_total(ti, recs[rec_at[ti]] + ci, n, most)
end

-- fit returns how many of a tenant's events from the pos-th on, at most k,
-- fit in order in the room of every rule (r.room), and sets each rule's
-- take to what they cost it: 1 an event for an event rule, their costs for
-- a rule with a cost list.
local function fit(rules, pos, k)
  for _, r in ipairs(rules) do
    if not r.costs and r.room < k then
      k = r.room
    end
  end
  if k < 0 then
    k = 0
  end
  for _, r in ipairs(rules) do
    local c = r.costs
    if c then
      local s, j = 0, 0
      while j < k and s + c[pos + j] <= r.room do
        s = s + c[pos + j]
        j = j + 1
      end
      k = j
    end
  end
  for _, r in ipairs(rules) do
    r.take = k
    local c = r.costs
    if c then
      local s = 0
      for j = pos, pos + k - 1 do
        s = s + c[j]
      end
      r.take = s
    end
  end
  return k
end

-- blocked returns the latest end of the windows [r.at_start, r.at_end)
-- whose room left (r.room less what was just taken: r.take for a rule with
-- costs, take for an event rule) is less than the pos-th event costs their
-- rule (1 for every rule when there is no such event, next false): the
-- earliest time at which that event may fit, or 0.
local function blocked(rules, pos, take, next)
  local jump = 0
  for _, r in ipairs(rules) do
    local need, left = 1, r.room - take
    if r.costs then
      left = r.room - r.take
      if next then
        need = r.costs[pos]
      end
    end
    if need > left and r.at_end > jump then
      jump = r.at_end
    end
  end
  return jump
end
