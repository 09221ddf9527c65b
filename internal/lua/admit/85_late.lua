-- late: deferred events that missed their slot keep their place.
--
-- Contract. After the replay arguments (the last is ARGV[arg_recs+1] when
-- the call names no source, ARGV[arg_recs+6] otherwise) the call may carry one more
-- argument, the late argument (absent, or "", for a source batch): a JSON
-- array [take, c_1, ..., c_ntenants] for a batch read back from the first
-- retry tier. c_ti is how many of tenant ti's events are claims: its last
-- c_ti events, each an event that came back inside its reserved slot (the
-- window that holds now). The tenant's other events are late: they missed
-- their slot.
--
-- A tenant qualifies when it has one rule, of aligned windows, counting
-- events (no costs), and the call has no capacity: then a slot is one
-- window, and the slot a reservation holds is the window of its due time.
--
-- Taking (take = 1). A qualifying tenant's late events that the current
-- window has no room for take, in order, the slots of the tenant's
-- reservations in the earliest full windows before its first window with
-- room that start at least take_margin_ms after now: the window's field
-- "taken" grows by what they take, at most its count minus what was taken
-- there before, and they are deferred to that window (a reservation in the
-- reply whose until is negated, -e: the caller marks the events as having
-- taken their slot, and the replay record keeps it so). The window's count does not move:
-- they use the slots the reservations had counted. What they do not take
-- is reserved as usual, from the first window with room on. Every window
-- read counts against the budget as in reserve (see Budget).
--
-- Claims. A qualifying tenant's claims that are not in the replay record
-- read the field "taken" of the current window: d = min(taken, claims) of
-- them, the last ones (the latest deferred in the batch), had their slot
-- taken; taken shrinks by d (journaled) and those d are decided after the
-- tenant's late events, at its first free slot: they take no slot in turn
-- (a displaced event taking the next window's slot would shift the whole
-- queue by one, exact but one more deferral per window of backlog: in the
-- fault suite's mix, 7,568 events took a slot, most of them displaced). The other claims keep their slot: they
-- are taken out of the call (like replayed events, so a replay checks them
-- again, and finds the same: taken only grows while the window is in the
-- future, and a claim's window holds now) and reported in the reply's
-- replayed list with code 5 (keep: forward uncounted). A tenant that does
-- not qualify keeps all its claims, reading nothing.
--
-- take_margin_ms keeps takes off windows about to start, so that a claim of
-- that window, read by a replica whose clock runs a little ahead, never
-- misses a take made after it.

local take_margin_ms = 1000

-- The call's late argument: take, and claims per tenant (0: none).
local take = false
local claims = nil
-- displaced[ti]: how many of tenant ti's claims had their slot taken (the
-- last of its events in the call; they do not take slots in turn).
local displaced = {}
do
  local at = arg_recs + 1
  if rkey then
    at = arg_recs + 6
  end
  local a = ARGV[at + 1]
  if a and string.sub(a, 1, 1) == "[" then -- (else a capacity's arguments, or none)
    local v = cjson.decode(a)
    take = v[1] == 1
    claims = {}
    for ti = 1, ntenants do
      claims[ti] = v[ti + 1] or 0
    end
  end
end

-- qualifies reports whether tenant ti (its record at recs[p]) may take or
-- give up slots (see above).
local function qualifies(ti, p)
  return ncap == 0 and recs[p] == 1 and not cost_at[ti] and descs[recs[p + 2]].kind ~= "t"
end

-- taken_key is the key of tenant ti's window that holds now (its one rule).
local function taken_key(ti)
  local p = rec_at[ti]
  return wkey(KEYS[key_at[ti] + 1], descs[recs[p + 2]].cur_start)
end

-- claim_phase decides the claims of every tenant (see Claims): it runs
-- after replay_phase and before the first tenant is decided. It rebuilds
-- the replayed list in position order with the kept claims in it, takes
-- them out of their tenants' n and of the offsets the record keeps.
local function claim_phase()
  if not claims then
    return
  end
  local offs = rkey and cjson.decode(ARGV[arg_offs]) or nil
  local rep_at = {} -- position -> index in replayed
  for i = 1, #replayed, 4 do
    rep_at[replayed[i]] = i
  end
  local rep, fresh, kept_any = {}, {}, false
  local pos = 0
  for ti = 1, ntenants do
    local p = rec_at[ti]
    local n0 = offs and #offs[ti] or recs[p + 1]
    local c = math.min(claims[ti], n0)
    -- The claims not replayed, and how many of them keep their slot.
    local live = 0
    for j = n0 - c + 1, n0 do
      if not rep_at[pos + j - 1] then
        live = live + 1
      end
    end
    local keep = live
    if live > 0 and qualifies(ti, p) then
      local key = taken_key(ti)
      -- A broken key keeps the claims: the tenant's decision meets it.
      local v = redis.pcall("HGET", key, "taken")
      local tk = type(v) == "string" and tonumber(v) or 0
      local d = math.min(tk, live)
      if d > 0 then
        redis.call("HINCRBY", key, "taken", -d)
        note(4, key, {"taken", d})
        keep = live - d
        displaced[ti] = d
      end
    end
    local l, k = {}, 0
    for j = 1, n0 do
      local at = pos + j - 1
      local ri = rep_at[at]
      if ri then
        rep[#rep + 1], rep[#rep + 2], rep[#rep + 3], rep[#rep + 4] = at, replayed[ri + 1], replayed[ri + 2], replayed[ri + 3]
      elseif j > n0 - c and k < keep then
        k = k + 1
        rep[#rep + 1], rep[#rep + 2], rep[#rep + 3], rep[#rep + 4] = at, 5, 0, 0
      elseif offs then
        l[#l + 1] = offs[ti][j]
      end
    end
    if keep > 0 then
      recs[p + 1] = recs[p + 1] - keep
      kept_any = true
    end
    fresh[ti] = l
    pos = pos + n0
  end
  if not kept_any then
    return
  end
  replayed = rep
  if rkey then
    nfresh = 0
    for ti = 1, ntenants do
      nfresh = nfresh + #fresh[ti]
    end
    if nfresh > 0 then
      rec_offs = cjson.encode(fresh)
    end
  end
end

-- take_slots gives the late events of tenant ti (rest of them, the pos-th
-- on, after admission; not its displaced claims, which follow them) the
-- slots of the tenant's reservations in the full windows from first on
-- (see Taking). It returns the takes (due, count,
-- until each, as reserve's), what is left, and where reserve goes on.
local function take_slots(ti, rules, rest, first, pos)
  rest = math.min(rest, recs[rec_at[ti] + 1] - (displaced[ti] or 0) - pos + 1)
  if not take or rest < 1 or not qualifies(ti, rec_at[ti]) then
    return none, rest, first
  end
  local r = rules[1]
  local res = {}
  local t = first
  while rest > 0 and t <= hend do
    local s, e = win(r, t)
    if not s then
      break
    end
    local key = wkey(r.key, s)
    if counts[key] == nil then
      if budget < 1 then
        break
      end
      budget = budget - 1
    end
    local c = count_of(key)
    if c < r.limit then
      break -- room: reserve goes on from here
    end
    if s >= now + take_margin_ms then
      cur = key
      local tk = tonumber(redis.call("HGET", key, "taken")) or 0
      local k = math.min(rest, c - tk)
      if k > 0 then
        redis.call("HINCRBY", key, "taken", k)
        note(4, key, {"taken", -k})
        res[#res + 1], res[#res + 2], res[#res + 3] = s, k, -e
        rest, pos = rest - k, pos + k
      end
    end
    t = e
  end
  return res, rest, t
end
