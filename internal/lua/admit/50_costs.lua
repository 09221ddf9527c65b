-- costs: what each event costs each rule, and how many events fit a room.
--
-- Contract. cost_lists[ti] holds, for a tenant with costs (see Costs in the
-- header), per rule its cost list (the j-th event costs list[j]; rules that
-- count by one list share it) or false for an event rule; it is nil for a
-- tenant of event rules alone, whose every event costs each rule 1. total
-- sums a prefix of a list without passing 2^53; fit places events in the
-- rooms of a tenant's rules, in order, all rules or none for each event;
-- blocked tells how far a search must move on for the next event to fit.

local cost_lists = {}
if (recs[#recs] or 0) < 0 then
  local p = -recs[#recs] -- the first costs
  for ti = 1, ntenants do
    if recs[p] == ti then
      local q = rec_at[ti]
      local nrules, n = recs[q], recs[q + 1]
      local lists_of, lists = {}, {}
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
      p = p + 1 + nrules + #lists * n
    end
  end
end

-- total returns the cost of the first n events of cost list c, or more
-- than most when it passes most (the sum stops there: a sum of costs
-- could pass 2^53, past which Lua's numbers are not whole).
local function total(c, n, most)
  local s = 0
  for j = 1, n do
    s = s + c[j]
    if s > most then
      return s
    end
  end
  return s
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
