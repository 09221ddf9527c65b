-- decode: the rule descriptors and the tenants' records of the call.
--
-- Contract. descs[i] is the i-th rule descriptor (ARGV, see the header):
-- limit, kind, step, base, retention, bounds, and for an aligned rule its
-- current window [cur_start, cur_end), the same for every tenant. recs is
-- the tenants' records array; each tenant's offsets are computed here once:
-- its record starts at recs[rec_at[ti]] (number of rules, n events, then per
-- rule: descriptor index, cached chain start, cached chain end), its keys at
-- KEYS[key_at[ti]] (the frontier, then one key per rule). n of a tenant may
-- change once, when replayed events are taken out (60_replay.lua). arg_recs
-- is the ARGV index of the records, the replay arguments follow it.
-- rules_of builds the state of a tenant's rules for deciding it.

local descs = {}
local arg_recs -- ARGV index of the tenants' records
do
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
      retention = tonumber(ARGV[a + 4]), bounds = bounds, bound_at = 1,
      cur_start = 0, cur_end = 0,
    }
    if d.kind ~= "t" then
      d.cur_start, d.cur_end = win(d, now)
    end
    descs[di] = d
    a = a + 6 + nb
  end
  arg_recs = a
end

local recs = cjson.decode(ARGV[arg_recs])

-- Where each tenant's record and keys start.
local rec_at, key_at = {}, {}
do
  local p, k = 1, 1
  for ti = 1, ntenants do
    rec_at[ti], key_at[ti] = p, k
    local nrules = recs[p]
    p, k = p + 2 + 3 * nrules, k + 1 + nrules
  end
end

-- rules_of returns the state of tenant ti's rules, whose costs are costs
-- (nil: none; else per rule its cost list or false): ttl rules with their
-- chain, from the caller's cache while the cached chain runs (admit_all
-- and admit_one check the anchor before they open a window on the
-- strength of the cache), else from the anchor; every rule with its
-- current window [cur_start, cur_end). The fields:
--   limit, kind, step, base, retention, bounds, bound_at  as its descriptor
--     (base: for a ttl rule, its chain's start)
--   key            its rule key
--   costs          its cost list, or false: it counts events
--   chain_cached, chain_end, anchor_read  its ttl chain (see anchor)
--   counted_until  the latest end of a window the call counted in
--   at_start, at_end  the window that holds the search's time (reserve)
--   room, take     room left there, and what the events placed take of it
local function rules_of(ti, costs)
  local rules = {}
  local q, k = rec_at[ti] + 2, key_at[ti] + 1
  local nrules = recs[rec_at[ti]]
  for ri = 1, nrules do
    local d, chain_start, chain_end = descs[recs[q]], recs[q + 1], recs[q + 2]
    local r = {
      limit = d.limit, kind = d.kind, step = d.step, base = d.base,
      retention = d.retention, bounds = d.bounds, bound_at = 1,
      key = KEYS[k + ri - 1], costs = costs and costs[ri],
      chain_cached = false, chain_end = 0, anchor_read = none, counted_until = 0,
      cur_start = 0, cur_end = 0, at_start = 0, at_end = 0, room = 0, take = 0,
    }
    if r.kind == "t" then
      if chain_end > now then
        r.base, r.chain_end, r.chain_cached = chain_start, chain_end, true
      else
        anchor(r)
      end
    end
    r.cur_start, r.cur_end = win(r, now)
    rules[ri] = r
    q = q + 3
  end
  if ncap > 0 then -- the shared capacity (35_capacity.lua)
    cap_rules(rules, ti, costs)
  end
  return rules
end
