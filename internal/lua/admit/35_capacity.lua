-- capacity: the shared capacity (G12). It adds to every tenant's rules
-- (rules_of, 40_decode.lua) one rule per capacity rule, on global keys, whose
-- room (room_of, used by 70_admit.lua and 80_reserve.lua) is the tenant's
-- fair entitlement in the window, bounded by what the capacity has left;
-- the search treats them as any other rule. It wraps add (30_windows.lua)
-- so that a booking in a capacity window is also the tenant's, and after a
-- tenant's decision (decide, 90_run.lua) cap_done records what it was
-- refused. Without a capacity (ncap 0) nothing here runs, and 90_run.lua's
-- fast path is used as before; with one, fast_many's (see Cost).
--
-- KEYS: the capacity rules' key prefixes <prefix>:cap:<counter> (limit's
--   keys.capacity), at KEYS[first] onwards (see ARGV); windows are
--   <that>:<start ms>, hashes of
--     count   what all tenants booked there (admitted or reserved)
--     expire  the window's end (unix ms), as every window key
--     a       the active weight: the summed weight of the tenants that booked
--             there or sent events while it was the current window
--     fb      what was booked under named tenants' floors
--     fu      what named tenants use of their floors: booked or predicted
--             to ask, each at most its floor (see Floors)
--     x       what was booked above the level, in the ramp (see Entitlement)
--     ht      65 bytes of no meaning: the hash is a hash table (see HT)
--     cl      the capacity in force in the window, fixed at its first call
--             while current (cap_fix: a paced or capped capacity)
--     lv, sf, wc  the window's level, what the satisfied ask and the capped
--             weight (see Entitlement)
--     t:<tenant>, r:<tenant>  what that tenant booked and was refused there
--     q:<tenant>  what it is predicted to ask there (see Demand)
-- ARGV, after the replay arguments, only when a capacity is set (the last
--   ARGV is then "cap:<the index of the first of them>", and ":general"
--   after it when a test asks for the general path alone, see cap_one):
--   number of capacity rules, the index in KEYS of the first capacity key,
--   the start of the ramp, the end of its margins and the ramp's end (ramp_lo,
--   ramp_mid, ramp_hi: per mille of the window), the tenants' fields (a
--   JSON array of strings, in call order), the tenants' shares (a JSON
--   array: per tenant its weight, then its floor for each capacity rule),
--   then per capacity rule: limit, step ms, the current window's start ms,
--   retention ms, the sum of the named tenants' floors, its measure (0
--   events; 1 bytes, 2 units: limit.Measure), the most all tenants may
--   reserve in a window not yet current (0: the limit; see Paced).
--   Measures: a capacity of bytes or units counts, in every field below, an
--   event as its cost (its bytes or units), like a tenant's rule of that
--   measure: every tenant of the call then has costs (50_costs.lua's
--   records, where each tenant's list per capacity rule follows its own
--   rules'), and floors, demand, levels and entitlements are in that
--   measure. A tenant may book one event at least in a window, whatever its
--   entitlement there: the cost of its next event to place (for events, in
--   a future window, 1), so that an event larger than a tenant's share is
--   still placed (in a future window, one every k windows: see Big
--   events; fairness is then at the grain of one event); and from
--   ramp_hi on, one event over its part of what is spare, so that the
--   spare is not left in pieces smaller than the events. The caller
--   rejects an event that costs more than the capacity: no window could
--   hold it.
-- Reply: nothing of its own (the capacity is one more rule of each tenant).
--
-- Big events: an event that costs more than half a tenant's share (the
--   most it may reserve in a future window, see Entitlement) is booked
--   there by the one event at least, in a window where the tenant booked
--   nothing in the k - 1 windows before (from the current one on), k =
--   ceil(cost / share), at most BIGK: one event every k windows, its share
--   at the grain of its events. Such a search marks the largest of these
--   events in field bg of the current window and of the next; a tenant's
--   reservation within its half share (not its one event) in a future
--   window then leaves bg room there when the window has it. (Without it
--   the floods' half shares left C - their sum in every window up to the
--   horizon, under a big event's cost, and the current window's room went
--   to them first: under 1000B/1s beside one flood, events of 800 bytes
--   were placed 20 times of 90. TestCapacityBigEventsPlaced.) The current
--   window keeps no such room: what a big event leaves there is booked.
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
--   bucket); for a capacity of bytes or units, whose demands pass 2^31,
--   not packed: D in field <k> and W in field w<k>; a tenant with a floor
--   f also adds -(w * 2^32 + min(q, f)) at
--   the bucket of min(q, f) / w, and min(q, f) to field fm, so that
--     G(lv) = fm + sum over buckets below lv of D + lv * sum above of W
--   is sum_i min(q_i, max(f_i, w_i * lv)), what the tenants would book at
--   level lv. Bounds: |D| < 2^31 and |W| < 2^21 per bucket. The hash has at
--   most about 2,400 fields, whatever the number of tenants, and lives as
--   long as its window. A tenant's call adds its events to q there (and
--   moves its entry: one to three buckets); a reservation in a future
--   window adds to q there.
--
-- Cost: the call keeps its own view of the capacity's hashes (hc, hd) and
--   writes it back at its end (cap_flush, from 90_run.lua's finish): each
--   window is read once, one HMGET of its shared fields and of the fields
--   of every tenant of the call that the call uses there (the current
--   window: t and r; the next: q; and the other of t and q of a tenant
--   with a floor, see Floors; another window: the fields of the tenant
--   that books there), and written once, one HSET of what changed (and a
--   PEXPIRE, with its histogram's, when the call gave it its end); a
--   histogram's buckets moved by the call's tenants are summed and written
--   once (one HINCRBY for one or two buckets, else one HMGET and one HSET).
--   The writes are journaled in the view alone (ops 6 and 7, capold): a
--   tenant's failure takes them back there, and a failed call has written
--   none of them. A tenant whose capacity rules all have room for its n
--   events (cap_quick) and whose own rules too is decided in 90_run.lua's
--   fast path (fast_many), without a decision's tables; the others go to
--   decide from the counts made. (TestCapacityCommands: 1.09x the
--   commands of the same batches without a capacity; each tenant's own
--   commands took 6.9x.) What such a tenant books then (cap_book) is not
--   journaled (settled): nothing takes it back alone. Per call and tenant
--   the work is Lua's and the fields': a window is a hash table from its
--   first call (field ht, see HT), whole numbers go to Redis as strings
--   (num), and the call's tenants' fields are read without hc_load's
--   bookkeeping (hc_fresh). (callgrind, TestCapacityCommands' batches: 30.1
--   M instructions a call before these, 20.2 M after; 5.0 M without a
--   capacity.) Most tenants (one rule of their own, one capacity rule)
--   take cap_one (90_run.lua): cap_quick, fast_many and cap_book inlined
--   in one function, 14.0 M a call (TestCapacityFastPathSame holds the
--   two paths to the same decisions and writes).
--
-- Entitlement: tenant i may book in window s at most
--   e_i(s) = max(floor_i, weight_i * level)
-- where level is the water level of the current window (per unit of
-- weight), fixed when the window gets its first call (field lv): the
-- weighted water level, G(lv) = C, of the window's predicted demand,
-- solved exactly (up to the 1% buckets above 1024) for the window's
-- capacity C by one walk of its histogram (O(buckets), not O(tenants));
-- sf and wc keep what the satisfied ask and the capped weight. The level
-- taken is the mean of that and the level of the window before (damped: a
-- consumer that lags decides late, in one window, what it stalled on in
-- the window before, and the demand predicted swings), the level before
-- moved by the change of the capacity spread over the capped weight
-- before, (C - cl before) / wc before, so that a change of the capacity is
-- followed at once; undamped when the window before had no capped tenant,
-- or when the summed weight in the histogram is over 125% of the window
-- before's (new tenants: at a start, or tenants that start flooding, whose
-- level the one before is not; a burst of the same tenants' demand is
-- damped). (The mean with the level before alone lagged each change of
-- the capacity, and halved, a window at a time, the error of a level set
-- before tenants were capped.)
-- When nobody is capped, the level is the largest normalised demand plus
-- the spare (C - G) shared by the active weight a of the window before;
-- with no history (lv 0) it is the equal share C / a of the window's
-- active weight so far.
-- In the current window the level holds until ramp_lo (half) of the window
-- has passed; from then on the capped tenants may share what is spare, the
-- capacity not booked less what the satisfied tenants are still expected
-- to ask in the rest of the window ((1 - phase) * sf, and until ramp_mid a
-- margin, cap_rest; each then takes above the level at most what is spare
-- and not taken yet, rounded up: a level fixed from a prediction that
-- missed leaves what the satisfied do not ask, and a ramp of the last 10%
-- gave it back only from what the capped sent there,
-- TestCapacityRampShortfall), split by weight
-- (wc, at most the window's active weight a: the parts of capped tenants
-- that sent nothing in the window would be lost), each the same part
-- (field x: what they took above the level, is counted as spare), rounded
-- up (the fractions of the capped tenants' entitlements, up to an event
-- each, are then booked by the first to come): work-conserving without
-- taking the room of light tenants' late events. From ramp_hi on, floors
-- are no longer kept apart, and when nobody is capped anyone may take what
-- is left. In a future
-- window a tenant may reserve at most half its share at the current level
-- (at least one event), so that a tenant arriving later finds room from
-- the next window on; when nobody was predicted capped in the current
-- window (no history, or a demand grown past the prediction: the level
-- is then no share), at most half its share at the equal share of the
-- window's active weight, the call's tenants counted (cap_active).
-- Bookings above a tenant's floor leave room for the other named
-- tenants' floors as far as they ask for them (see Floors), except from
-- ramp_hi on. Every booking counts in the window's
-- count, which never passes C: the fairness only ever narrows the room.
--
-- Floors: a named tenant's floor f is kept apart from the others in a
--   window only for what the tenant may still ask of it there: min(f, q)
--   less what it booked (b), when positive, q its predicted demand there
--   (field q:<tenant>, see Demand). Field fu sums, over the named
--   tenants, min(f, max(b, q)), and fb sums min(f, b): fu - fb is what
--   is kept for them all, exactly (a tenant that booked past its
--   prediction keeps nothing). Every change of a floored tenant's t: or q:
--   in a window moves fu there (cap_add, cap_ask, cap_one, 87_advance.lua's
--   unbook), from fields the call reads anyway or with them (the current
--   window's read takes the q: of the call's tenants with a floor, the
--   next window's their t:, see tenant_fields). So a floor its tenant is not
--   predicted to use goes to the others (work-conserving, as the level,
--   which counts min(f, q), already was), and a tenant that asks gets its
--   floor against floods. The trade-off: a tenant with a floor that starts
--   sending in a window where nothing was predicted for it finds there
--   what the others left (its entitlement bounds it as ever), and its
--   floor from the next window on, where what it sent and what it
--   reserved (up to its floor, as in any future window) are predicted.
--   (Kept whatever the demand, until ramp_hi, an idle floor left that
--   much of the capacity unbooked in every window where its tenant asked
--   nothing: TestCapacityFloorAsked, TestCapacityBacklogLeavesNewcomer.)
--   A window written before fu was kept (an older release) holds none: a
--   floor is kept there only as far as its tenant's changes since.
--
-- Paced: under a paced capacity (limit.Limiter.PaceReservations) the call
--   passes resv, the most that all tenants together may reserve in a window
--   not yet current (the pacing's floor, at least an eighth of the limit).
--   A reservation is final, and a window's capacity in force is at least
--   what it holds at its first call (cap_fix): without the bound, the
--   windows after a cut held the old rate's reservations, up to half of it,
--   while the pacing set the floor to drain its backlog. There a tenant may
--   reserve at most its entitlement, max(floor, weight * level), times
--   resv / C (at least one event, as above; its half share if less), and
--   the window's count never passes resv.
--
-- Per tenant the window's hash holds t:<tenant> (booked) and, once it has
-- sent events while the window was current, r:<tenant> (refused: events
-- decided then that did not go there); a sums the weights of those tenants.

local ncap = 0
local capd = {}   -- per capacity rule: limit, step, cs, ce, retention, ffloor, key, lv, sf, wc
local capn = none -- per tenant: its name in fields
local capt, capr, capq = {}, {}, {} -- per tenant: its fields t:, r:, q:
local caps = none -- per tenant: weight, floor per rule (flat)
local ramp_lo, ramp_mid, ramp_hi = 0.5, 0.9, 0.98
local cap_ti = 0  -- the tenant being decided (cap_rules sets it)
local cap_fast = true -- every capacity rule's limit is at least 1: run
                      -- counts a tenant's own rules as fast_many does
-- cap_cost(ti, ci, n, most) returns what the first n events of the ti-th
-- tenant cost capacity rule ci (n for events), or more than most when that
-- passes most: set by 50_costs.lua, which reads the costs.
local cap_cost = false

-- The histogram's packing (see Demand): W * HP + D.
local HP = 4294967296
local HB = 1024 -- buckets are whole numbers below HB, then 1% wide
local HLOG = math.log(1.01)

-- BIGK bounds the spacing of a big event's windows (see Big events).
local BIGK = 16

-- cap_parse reads the capacity arguments from ARGV[at] on, when present.
local function cap_parse(at)
  if ARGV[at] == nil then
    return
  end
  ncap = tonumber(ARGV[at])
  local first = tonumber(ARGV[at + 1])
  ramp_lo, ramp_mid = tonumber(ARGV[at + 2]) / 1000, tonumber(ARGV[at + 3]) / 1000
  ramp_hi = tonumber(ARGV[at + 4]) / 1000
  capn = cjson.decode(ARGV[at + 5])
  for i, n in ipairs(capn) do
    capt[i], capr[i], capq[i] = "t:" .. n, "r:" .. n, "q:" .. n
  end
  caps = cjson.decode(ARGV[at + 6])
  at = at + 7
  for ci = 1, ncap do
    local step, cs = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
    capd[ci] = {
      limit = tonumber(ARGV[at]), step = step, cs = cs, ce = cs + step,
      retention = tonumber(ARGV[at + 3]), ffloor = tonumber(ARGV[at + 4]),
      key = KEYS[first + ci - 1], lv = false, sf = 0, wc = 0,
      dprefix = KEYS[first + ci - 1] .. "/demand",
      bycost = tonumber(ARGV[at + 5]) ~= 0, -- bytes or units (see Measures)
      mu = tonumber(ARGV[at + 5]), -- the measure: 0 events, 1 bytes, 2 units
      resv = tonumber(ARGV[at + 6]), -- 0, or the bound of a paced window (see Paced)
    }
    if capd[ci].limit < 1 then
      cap_fast = false -- decide admits nothing, and counts nothing first
    end
    at = at + 7
  end
end

-- cap_general: the caller (a test) asks that every tenant go through the
-- general path (no cap_one, 90_run.lua), tail "cap:<at>:general".
local cap_general = false
do
  local tail = ARGV[#ARGV]
  if string.sub(tail, 1, 4) == "cap:" then
    local at, mode = string.match(tail, "^cap:(%d+)(.*)$")
    cap_general = mode == ":general"
    cap_parse(tonumber(at))
  end
end

-- The call's view of the capacity's hashes (see Cost): hc[key] is a
-- window's entry, {key, v = its fields as the call knows them (false:
-- absent; BAD: not a number), o = as read (the fields hc_load read; not
-- those of hc_fresh), dl = the fields written, in order,
-- wend and ret = its end and retention once the call gave it an end, hkey =
-- its demand histogram's key once the call moved a demand there, bad =
-- true once a field read there is not a number}; hkeys
-- lists them in the order read. hd[key] holds the deltas of a demand
-- histogram's buckets (field -> packed delta), hdl its keys in order.
local hc, hkeys, hd, hdl = {}, {}, {}, {}

-- scan: the state of the searches' window reads. scan.reads and
-- scan.left: the take scan's (85_late.lua); scan.need: below. (A table:
-- the script's main chunk is near Lua's limit of local variables, lower
-- in miniredis's gopher-lua.)
local scan = {reads = 128, left = 0, need = false}

-- scan.need returns what reading rule r's window starting at s costs the
-- budget, and the window's key: nothing when the call has read it; one for
-- a window of a rule of the tenant; for a capacity window, one for its
-- shared fields (two for the next window: every tenant's q: with them,
-- cap_state) and one for the tenant's fields there, one HMGET each. A
-- full future capacity window needs no tenant's fields (see Full windows):
-- the callers give that one back when cap_room did not read them
-- (80_reserve.lua, take_read; 87_advance.lua's moves keep it).
scan.need = function(r, s)
  local key = wkey(r.key, s)
  if r.cap then
    local e = hc[key]
    if e == nil then
      return s == r.cap.ce and 3 or 2, key
    elseif e.v[r.tf] == nil then
      return 1, key
    end
    return 0, key
  end
  return counts[key] == nil and 1 or 0, key
end

local BAD = {}
local NIL = {} -- a field the call had not read, on capold
-- capold: per write of ops 6 and 7, newest last, what undo needs (the
-- field's value before; the delta), so that the journal makes no table.
local capold = {}
-- settled: the writes being made are a decided tenant's last (cap_book),
-- which nothing takes back alone: they are not journaled. (A failed call
-- writes none of the view; a later tenant's failure takes back its own
-- writes, whose capold holds the values these left.)
local settled = false
local SHARED = {"count", "expire", "a", "fb", "fu", "lv", "sf", "wc", "x", "cl", "bg"}
local CHUNK = 1000 -- fields per HMGET or HSET (Lua's unpack has a limit)
-- HT, the value of a window's field ht, written with its first fields, is
-- longer than hash-max-listpack-value (64 by default): Redis then keeps the
-- window as a hash table from the start. A small hash is a listpack (up to
-- hash-max-listpack-entries fields, 128 or 512), whose every lookup scans
-- it: with a field or two per tenant, a call's HMGET and HSET of a few
-- hundred tenants' fields scanned it a few hundred times (callgrind:
-- lpFind was 17% of Redis's instructions in TestCapacityCommands' calls).
local HT = string.rep("-", 65)

-- hc_load reads the fields of e that the call does not know yet, one HMGET
-- (per CHUNK fields).
local function hc_load(e, fields)
  local miss, seen, v = {}, {}, e.v
  for _, f in ipairs(fields) do
    if v[f] == nil and not seen[f] then
      miss[#miss + 1] = f
      seen[f] = true
    end
  end
  local i = 1
  while i <= #miss do
    local j = math.min(#miss, i + CHUNK - 1)
    cur = e.key
    local got = redis.call("HMGET", e.key, unpack(miss, i, j))
    for m = i, j do
      local raw, x = got[m - i + 1], false
      if raw then
        x = tonumber(raw)
        if not x then
          x, e.bad = BAD, true
        end
      end
      v[miss[m]], e.o[miss[m]] = x, x
    end
    i = j + 1
  end
end

-- hc_fresh reads fields of e that the call has not read, each once in
-- fields (the call's tenants' fields of a window it reads the first time),
-- one HMGET per CHUNK fields, without the bookkeeping of hc_load: it keeps
-- no value as read (o), so cap_flush writes each of them that the call
-- wrote (the same value again when a write was taken back).
local function hc_fresh(e, fields)
  local v, key, n = e.v, e.key, #fields
  local i = 1
  while i <= n do
    local j = math.min(n, i + CHUNK - 1)
    cur = key
    local got = redis.call("HMGET", key, unpack(fields, i, j))
    for m = i, j do
      local raw = got[m - i + 1]
      if raw then
        local x = tonumber(raw)
        if not x then
          x, e.bad = BAD, true
        end
        v[fields[m]] = x
      else
        v[fields[m]] = false
      end
    end
    i = j + 1
  end
end

-- hc_num returns field f of e (loaded), 0 when absent; a value that is not
-- a number is the failure of the tenant that uses it.
local function hc_num(e, f)
  local x = e.v[f]
  if x == nil then
    hc_load(e, {f})
    x = e.v[f]
  end
  if x == BAD then
    error({key = e.key, why = "holds a count that is not an integer"})
  end
  return x or 0
end

-- hc_put sets field f of e to x in the call's view, journaled (op 6); the
-- call's end writes it (cap_flush).
local function hc_put(e, f, x)
  if f == "count" and type(e.v.count) == "number" and x < e.v.count then
    for ci = 1, ncap do
      capd[ci].ff = false -- a window may have room again (see Full windows)
    end
  end
  if not settled then
    note(6, e.key, f)
    local old = e.v[f]
    if old == nil then
      old = NIL
    end
    capold[#capold + 1] = old
  end
  e.v[f] = x
  if not e.dirty[f] then
    e.dirty[f] = true
    e.dl[#e.dl + 1] = f
  end
end

local function hc_add(e, f, by)
  local x = e.v[f]
  if x == nil or x == BAD then
    x = hc_num(e, f) -- reads it, or fails
  end
  hc_put(e, f, (x or 0) + by)
end

-- tenant_fields returns the capacity's per-tenant fields of the call's
-- tenants that it reads in the current window (cur true: t and r, and q
-- of a tenant with a floor) or in the next (q, and t of a tenant with a
-- floor: see Floors), made once a call.
local tenant_fields
do
  local lists = false
  tenant_fields = function(cur)
    if not lists then
      local c, x = {}, {}
      for i = 1, #capt do
        c[#c + 1], c[#c + 2] = capt[i], capr[i]
        x[#x + 1] = capq[i]
        local base = (i - 1) * (1 + ncap)
        for ci = 1, ncap do
          if caps[base + 1 + ci] > 0 then
            c[#c + 1], x[#x + 1] = capq[i], capt[i]
            break
          end
        end
      end
      lists = {c, x}
    end
    if cur then
      return lists[1]
    end
    return lists[2]
  end
end

-- cap_state returns the call's entry of the capacity window key of rule d
-- starting at s, read once per call: its shared fields, and with them the
-- fields of every tenant of the call that the call will use there (the
-- current window: t and r; the next: q; see tenant_fields), one HMGET for
-- all.
local function cap_state(key, s, d)
  local e = hc[key]
  if e == nil then
    e = {key = key, v = {}, o = {}, dl = {}, dirty = {}, wend = false, ret = 0, hkey = false}
    hc_load(e, SHARED)
    e.ends = type(e.v.expire) == "number" -- read: no write takes it back
    if d and s == d.cs then
      hc_fresh(e, tenant_fields(true))
    elseif d and s == d.ce then
      hc_fresh(e, tenant_fields(false))
    end
    hc[key] = e -- only once read: a failed read is tried again
    hkeys[#hkeys + 1] = key
    counts[key] = e -- a window the call has read (reserve's budget)
  end
  return e
end

-- cap_win returns the entry of r's capacity window starting at s (the
-- current and the next are kept on the rule's descriptor).
local function cap_win(r, s)
  local d = r.cap
  local e
  if s == d.cs then
    e = d.scur
    if not e then
      e = cap_state(wkey(d.key, s), s, d)
      d.scur = e
    end
  elseif s == d.ce then
    e = d.snext
    if not e then
      e = cap_state(wkey(d.key, s), s, d)
      d.snext = e
    end
  else
    e = cap_state(wkey(d.key, s), s, d)
  end
  return e
end

-- cap_tenant loads, when the call does not know field f ("t:<tenant>" or
-- "q:<tenant>") of e, the tenant's fields there (a window neither current
-- nor next: one HMGET).
local function cap_tenant(e, f)
  if e.v[f] == nil then
    local name = string.sub(f, 3)
    hc_load(e, {"t:" .. name, "r:" .. name, "q:" .. name})
  end
end

-- cap_booked returns what the tenant of capacity rule r booked in the
-- window e, false when it has no field there.
local function cap_booked(r, e)
  local tf = r.tf
  local b = e.v[tf]
  if b == nil then
    cap_tenant(e, tf)
    b = e.v[tf]
  end
  if b == BAD then
    error({key = e.key, why = "holds a count that is not an integer"})
  end
  return b
end

-- floor_moved returns by how much what a tenant with floor f uses of it in
-- a window, min(f, max(booked, asked)), moves as the tenant goes from
-- booked b0 and asking q0 there to b1 and q1: what field fu moves by (see
-- Floors).
local function floor_moved(f, b0, q0, b1, q1)
  if q0 > b0 then
    b0 = q0
  end
  if q1 > b1 then
    b1 = q1
  end
  return math.min(f, b1) - math.min(f, b0)
end

-- cap_touch gives a window e that has no end yet its end we; the call's end
-- gives it its physical expiry (cap_flush).
local function cap_touch(r, e, we)
  if not e.ends and type(e.v.expire) ~= "number" then
    hc_put(e, "expire", we)
    e.wend, e.ret = we, r.retention
  end
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

-- hmove adds the packed delta by to field f (a bucket, or fm) of the demand
-- histogram key, in the call's view, journaled (op 7); the call's end
-- writes the sums (cap_flush).
local function hmove(key, f, by)
  if by ~= 0 then
    local h = hd[key]
    if not h then
      h = {}
      hd[key] = h
      hdl[#hdl + 1] = key
    end
    h[f] = (h[f] or 0) + by
    if not settled then
      note(7, key, f)
      capold[#capold + 1] = by
    end
  end
end

-- hentry adds sign times a tenant's entry (weight w, demand d) to bucket k
-- of the demand histogram key: packed in one field, or for a capacity of
-- bytes or units (packed false) in two (see Demand).
local hentry
do
  local wfields = {} -- bucket k's field of weights, "w<k>", made once a call
  hentry = function(key, k, sign, w, d, packed)
    if packed then
      hmove(key, numbers[k] or num(k), sign * (w * HP + d))
    else
      hmove(key, numbers[k] or num(k), sign * d)
      local wf = wfields[k]
      if not wf then
        wf = "w" .. num(k)
        wfields[k] = wf
      end
      hmove(key, wf, sign * w)
    end
  end
end

-- cap_demand moves the entry of r's tenant in the demand histogram key
-- from demand d0 to d1 >= d0 (see Demand): one bucket when
-- its bucket stays, two when it changes (and, for a tenant with a floor,
-- up to three more while its demand is under its floor).
local function cap_demand(r, key, d0, d1)
  if d0 == d1 then
    return
  end
  local w, packed = r.w, not r.cap.bycost
  local k1 = bucket(d1 / w)
  if d0 > 0 then
    local k0 = bucket(d0 / w)
    if k0 == k1 then
      hmove(key, num(k1), d1 - d0)
    else
      hentry(key, k0, -1, w, d0, packed)
      hentry(key, k1, 1, w, d1, packed)
    end
  else
    hentry(key, k1, 1, w, d1, packed)
  end
  if r.f > 0 then
    local m0, m1 = math.min(d0, r.f), math.min(d1, r.f)
    if m0 ~= m1 then
      if m0 > 0 then
        hentry(key, bucket(m0 / w), 1, w, m0, packed)
      end
      hentry(key, bucket(m1 / w), -1, w, m1, packed)
      hmove(key, "fm", m1 - m0)
    end
  end
end

-- cap_hist adds the buckets of the demand histogram key (with the call's
-- pending moves) to ds and ws (per bucket: demand, weight) and returns its
-- fm; nil when it is empty. packed: the buckets' layout (see Demand).
local function cap_hist(key, packed, ds, ws)
  local v = redis.call("HGETALL", key)
  local vals, pend = {}, hd[key] or none
  for i = 1, #v, 2 do
    vals[v[i]] = (tonumber(v[i + 1]) or 0) + (pend[v[i]] or 0)
  end
  for f, x in pairs(pend) do
    if vals[f] == nil then
      vals[f] = x
    end
  end
  local fm, any = 0, false
  for f, val in pairs(vals) do
    local k = tonumber(f)
    if val ~= 0 then
      any = true
    end
    if f == "fm" then
      fm = val
    elseif not packed then
      -- D in <k>, W in w<k>.
      if not k then
        k = tonumber(string.sub(f, 2))
        if k and string.sub(f, 1, 1) == "w" and val ~= 0 then
          ws[k] = (ws[k] or 0) + val
          ds[k] = ds[k] or 0
        end
      elseif val ~= 0 then
        ds[k] = (ds[k] or 0) + val
        ws[k] = ws[k] or 0
      end
    elseif k and val ~= 0 then
      local w = math.floor((val + HP / 2) / HP)
      ds[k], ws[k] = (ds[k] or 0) + (val - w * HP), (ws[k] or 0) + w
    end
  end
  if not any then
    return nil
  end
  return fm
end

-- cap_part reads the demand histogram key (see cap_hist): {demand per
-- bucket, weight per bucket, fm}, false when it is empty.
local function cap_part(key, packed)
  local ds, ws = {}, {}
  local fm = cap_hist(key, packed, ds, ws)
  return fm and {ds, ws, fm}
end

-- cap_weight returns the summed weight of the tenants in the demand
-- histogram part (cap_part; a tenant with a floor counts only in part).
local function cap_weight(part)
  local w = 0
  for _, x in pairs(part[2]) do
    w = w + x
  end
  return w
end

-- cap_solve returns the water level for capacity C of the demand
-- histogram part (G(lv) = C, see Demand; cap_part), what the satisfied
-- asked and the capped weight there; when nobody was capped, the largest
-- normalised demand plus the spare per unit of the active weight a.
local function cap_solve(part, C, a)
  local ds, ws, fm = part[1], part[2], part[3]
  local ks = {}
  for k in pairs(ds) do
    ks[#ks + 1] = k
  end
  table.sort(ks)
  local above = 0
  for _, k in ipairs(ks) do
    above = above + ws[k]
  end
  local below = fm
  for _, k in ipairs(ks) do
    if above > 1e-9 and below + bucket_lo(k) * above >= C then
      return (C - below) / above, below, above
    end
    below, above = below + ds[k], above - ws[k]
  end
  if above > 1e-9 then
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
  if st.v.cl then
    return hc_num(st, "cl")
  end
  local cl = math.max(hc_num(st, "count"), r.cap.limit)
  cap_touch(r, st, r.cap.ce)
  hc_put(st, "cl", cl)
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
  local st = cap_win(r, d.cs)
  local lv = st.v.lv
  if type(lv) ~= "number" then
    lv = false
  end
  d.cl = cap_fix(r, key, st)
  if not lv then
    local p = cap_state(wkey(r.key, d.cs - d.step), d.cs - d.step, d)
    local sf, wc = 0, 0
    local cur = cap_part(dkey(r, d.cs), not d.bycost)
    if not cur then
      lv = 0 -- no history: the equal share (cap_room)
    else
      -- Solved for this window's capacity on its demand, then damped
      -- when the window before had capped tenants too: the mean with the
      -- level before (a consumer that lags sends a window late what it
      -- stalled on, and the demand predicted swings), moved by the change
      -- of the capacity spread over the capped weight before (a change of
      -- the capacity is followed at once); undamped when the weight in the
      -- histogram is over 125% of the window before's (new tenants: at a
      -- start, or tenants that start flooding, whose level the one before
      -- is not).
      lv, sf, wc = cap_solve(cur, d.cl, hc_num(p, "a"))
      local plv, pwc, pcl = p.v.lv, hc_num(p, "wc"), p.v.cl
      if wc > 0 and type(plv) == "number" and plv > 0 and pwc > 0 then
        local prev = cap_part(dkey(r, d.cs - d.step), not d.bycost)
        if prev and cap_weight(cur) <= 1.25 * cap_weight(prev) then
          if type(pcl) == "number" then
            plv = plv + (d.cl - pcl) / pwc
          end
          if plv > 0 then
            lv = (lv + plv) / 2
          end
        end
      end
    end
    cap_touch(r, st, d.ce)
    lv = tonumber(string.format("%.6f", lv))
    hc_put(st, "lv", lv)
    hc_put(st, "sf", math.floor(sf + 0.5))
    hc_put(st, "wc", wc)
  end
  d.lv, d.sf, d.wc = lv, hc_num(st, "sf"), hc_num(st, "wc")
  return lv
end

-- cap_mark reads what r's tenant booked and was refused in the current
-- window, fixes the window's level, and marks the tenant active there at
-- its first call.
local function cap_mark(r)
  local st = cap_win(r, r.cur_start)
  cap_booked(r, st)
  cap_level(r)
  local rf = r.rf
  hc_num(st, rf) -- loaded (cap_state), or read now
  if st.v[rf] == false then
    cap_touch(r, st, r.cur_end)
    hc_put(st, rf, 0)
    hc_add(st, "a", r.w)
  end
end

-- cap_rules appends to rules the capacity rules of the ti-th tenant, whose
-- cost lists are costs (nil: none; else per rule, its own then the
-- capacity's, a list or false), reads what it booked and was refused in
-- the current windows, and marks it active there at its first call.
local function cap_rules(rules, ti, costs)
  cap_ti = ti
  local base = (ti - 1) * (1 + ncap)
  local own = #rules
  for ci = 1, ncap do
    local d = capd[ci]
    local r = {
      limit = d.limit, kind = "a", step = d.step, base = d.cs, retention = d.retention,
      bounds = none, key = d.key, bound_at = 1, counted_until = 0, chain_cached = false,
      chain_end = 0, cur_start = d.cs, cur_end = d.ce, at_start = 0, at_end = 0, costs = false, anchor_read = none,
      room = 0, take = 0, cap = d, field = capn[ti], tf = capt[ti], rf = capr[ti], qf = capq[ti],
      w = caps[base + 1], f = caps[base + 1 + ci],
    }
    if costs then
      r.costs = costs[own + ci]
    end
    cap_mark(r)
    rules[#rules + 1] = r
  end
end

-- cap_ask adds by to what r's tenant asks of its window [s, e) (field
-- q:<tenant>, see Demand) and moves its entry in that window's demand
-- histogram.
local function cap_ask(r, s, e, by)
  local st = cap_win(r, s)
  cap_touch(r, st, e)
  local f = r.qf
  cap_tenant(st, f)
  local q0 = hc_num(st, f)
  hc_put(st, f, q0 + by)
  if r.f > 0 then
    local b = cap_booked(r, st) or 0
    local moved = floor_moved(r.f, b, q0, b, q0 + by)
    if moved ~= 0 then
      hc_add(st, "fu", moved)
    end
  end
  if not st.hkey then
    st.hkey = dkey(r, s)
  end
  cap_demand(r, st.hkey, q0, q0 + by)
end

-- cap_sum returns what n events of r's tenant, from the (at+1)-th on, cost
-- capacity rule r: n for events, else their costs (see Measures).
local function cap_sum(r, at, n)
  local c = r.costs
  if not c then
    return n
  end
  local s = 0
  for j = at + 1, at + n do
    s = s + c[j]
  end
  return s
end

-- cap_done records, after a tenant's decision of n events of which admitted
-- went to the current windows, what it was refused there, and adds the n
-- events it sent now to what it asks of the next window (in the
-- capacity's measure).
local function cap_done(rules, n, admitted)
  for _, r in ipairs(rules) do
    if r.cap then
      if n > admitted then
        hc_add(cap_win(r, r.cur_start), r.rf, cap_sum(r, admitted, n - admitted))
      end
      cap_ask(r, r.cur_end, r.cur_end + r.step, cap_sum(r, 0, n))
    end
  end
end

-- cap_rest returns what the satisfied tenants of rule d are still expected
-- to ask in the rest of its current window: (1 - phi) * sf, and before
-- ramp_mid a margin of two standard deviations of as many independent
-- arrivals, 2 * sqrt((1 - phi) * sf), so that the ramp, from ramp_lo on,
-- does not take the room of light tenants whose events come in lumps (see
-- Entitlement). Once a call (phi is the call's).
local function cap_rest(d, phi)
  local rest = d.rest
  if not rest then
    rest = (1 - phi) * d.sf
    if phi < ramp_mid then
      rest = rest + 2 * math.sqrt(rest)
    end
    d.rest = rest
  end
  return rest
end

-- cap_active returns the active weight of r's current window, at least
-- the summed weight of the call's tenants: those decided after the tenant
-- are active there too, though not marked yet (a future window's bound,
-- see Entitlement).
local cap_callw = false
local function cap_active(r)
  if not cap_callw then
    cap_callw = 0
    for i = 1, #capn do
      cap_callw = cap_callw + caps[(i - 1) * (1 + ncap) + 1]
    end
  end
  return math.max(cap_callw, hc_num(cap_win(r, r.cap.cs), "a"))
end

-- Full windows: a future capacity window whose count reached what it may
-- hold (B: the limit, or resv when paced) has no room for any tenant, and
-- cap_room says so from its shared fields alone, without reading the
-- tenant's there (one HMGET of every tenant that looks at it: 500 new
-- tenants of one call under CAPACITY=10/1s walked the full windows ahead
-- of each other, 12,303 HMGETs and 463 ms of Redis CPU in one call;
-- TestBoundedCapacityManyTenants). The call remembers, per capacity rule,
-- one run of consecutive future windows it found full, [d.ff, d.ft): the
-- search (80_reserve.lua) jumps over it in one step. Counts only grow in
-- a call but for a backlog's moves and a tenant's writes taken back, which
-- forget the run (hc_put, on_undo). The run nearest now is kept.
local cap_room
do
  -- cap_full records that the future window of d starting at s is full.
  local function cap_full(d, s)
    local ff, ft = d.ff, d.ft
    if ff and s >= ff and s <= ft then
      if s == ft then
        d.ft = s + d.step
      end
    elseif ff and s + d.step == ff then
      d.ff = s
    elseif not ff or s < ff then
      d.ff, d.ft = s, s + d.step
    end
  end

-- cap_room returns the room of capacity rule r's tenant in the window
-- starting at s: its entitlement less what it booked there, at most what
-- the capacity has left (less the floors it must leave). pos is the
-- tenant's next event to place (nil in the fast path's check): a future
-- window's entitlement is at least its cost (one event), and so is the
-- current window's for a capacity of bytes or units.
cap_room = function(r, s, pos)
  local d = r.cap
  local st = cap_win(r, s)
  local b = false -- what the tenant booked there, read when needed
  local C, lv = r.limit, d.lv
  if s == d.cs then
    C = d.cl -- cap_fix
  end
  if lv == 0 then
    lv = C / math.max(1, hc_num(cap_win(r, d.cs), "a"))
  end
  local c = hc_num(st, "count")
  local B = C
  if s ~= d.cs and d.resv > 0 and d.resv < C then
    B = d.resv -- paced (see Paced)
  end
  local e, protect = 0, true
  local left = false -- in the ramp: the most it may take (see Entitlement)
  local big = false -- a future window: leave room for a big event waiting
  local one = 1 -- the next event's cost
  if r.costs and pos then
    one = r.costs[pos] or 1
  end
  if s == d.cs then
    b = cap_booked(r, st) or 0 -- read with the window (tenant_fields)
    local phi = (now - s) / r.step
    protect = phi < ramp_hi
    local up = false
    if phi > ramp_lo and d.wc > 0 then
      -- What is spare, shared by the capped (see Entitlement): counted
      -- as if none had taken its part yet (x: what they took above the
      -- level), so that each gets the same part, rounded up: the parts'
      -- fractions, up to an event a capped tenant, are not left unbooked.
      -- Split by the capped weight, at most the window's active weight:
      -- the parts of capped tenants that sent nothing here would be lost.
      -- Before ramp_mid, what a tenant takes above the level is at most
      -- what is spare and not taken yet, rounded up (left): the parts
      -- rounded up do not take the satisfied tenants' expected rest.
      local rest = cap_rest(d, phi)
      local spare = C - (c - hc_num(st, "x")) - rest
      if spare > 0 then
        lv, up = lv + spare / math.max(1, math.min(d.wc, hc_num(st, "a"))), true
      end
      if spare > 0 and phi < ramp_mid then
        left = C - c - rest - 1e-9
        left = math.max(0, left - left % 1 + 1) -- math.ceil, at least 0
        local base = math.max(r.f, math.floor(r.w * d.lv + 1e-9))
        if b < base then
          left = left + base - b
        end
      end
    elseif not protect then
      lv = C
    end
    if up then
      e = math.ceil(r.w * lv - 1e-9)
    else
      e = math.floor(r.w * lv + 1e-9)
    end
    if one > 1 and one > e then
      e = one -- bytes or units: one event at least (see Measures)
    end
    if one > 1 and not protect and b + one > e then
      -- Bytes or units, from ramp_hi on: one event over its part of the
      -- spare, so that what is left is not lost in pieces smaller than
      -- the events (see Measures).
      e = b + one
    end
  else
    if d.wc == 0 then
      -- Nobody was predicted capped here (no history, or a demand that
      -- grew past the prediction: the level is then the largest demand
      -- and the spare, no share): at most the equal share of the tenants
      -- active in the window so far.
      lv = math.min(lv, C / cap_active(r))
    end
    e = math.floor(r.w * lv / 2 + 1e-9)
    big = true
    if one > e then
      -- One event at least (see Measures), which the room left for big
      -- events does not narrow; it marks the event waiting when it is the
      -- largest (see Big events), in the current window and the next, so
      -- that the mark holds while the tenant keeps sending.
      e, big = one, false
      local k = math.min(BIGK, math.ceil(one / math.max(1e-9, r.w * lv)))
      if B <= c then
        k = 0 -- a full window: no room whatever the tenant booked before
      end
      for j = 1, k - 1 do
        local p = s - j * r.step
        if p < d.cs then
          break
        end
        -- Its reads count against the call's budget (scan.need); past
        -- it, the window is taken as booked: no room.
        local need = scan.need(r, p)
        if need > budget then
          e = 0
          break
        end
        budget = budget - need
        if (cap_booked(r, cap_win(r, p)) or 0) > 0 then
          e = 0 -- one event every k windows: its share (see Big events)
          break
        end
      end
      if pos and one > hc_num(cap_win(r, d.cs), "bg") then
        hc_put(cap_win(r, d.cs), "bg", one)
        local nx = cap_win(r, d.ce)
        cap_touch(r, nx, d.ce + r.step)
        if one > hc_num(nx, "bg") then
          hc_put(nx, "bg", one)
        end
      end
    end
  end
  if r.f > e then
    e = r.f
  end
  if not b then
    -- A future window: what the tenant booked there is read only when
    -- the window has room (one HMGET of its fields): a full one has none
    -- for anybody, and the searches remember it (see Full windows).
    if B <= c then
      cap_full(d, s)
      return B - c
    end
    b = cap_booked(r, st) or 0
  end
  if B < C then
    -- Paced: a window not yet current holds at most resv in all, and a
    -- tenant's part of it is its entitlement's (see Paced).
    local part = math.floor(math.max(r.f, r.w * lv) * B / C + 1e-9)
    if part < e then
      e = math.max(part, math.min(e, one))
    end
  end
  local room, free = e - b, B - c
  if left and left < room then
    room = left
  end
  if big then
    local bg = hc_num(cap_win(r, d.cs), "bg")
    if bg > 0 and free >= bg then
      free = free - bg -- leave a window that has room for it that room
    end
  end
  if protect and d.ffloor > 0 then
    -- The others' floors as far as they ask (see Floors): fu - fb less
    -- what is kept for the tenant itself, min(f, q) - b when positive.
    local others = hc_num(st, "fu") - hc_num(st, "fb")
    if r.f > b then
      cap_tenant(st, r.qf)
      local kept = math.min(r.f, hc_num(st, r.qf)) - b
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
  return room
end
end

-- room_of returns the room of rule r in its window starting at s (pos:
-- the tenant's next event to place, in a search).
local function room_of(r, s, pos)
  if r.cap then
    return cap_room(r, s, pos)
  end
  return r.limit - count_of(wkey(r.key, s))
end

-- cap_add books `by` events of r's tenant in capacity window [s, e); in a
-- future window it moves the tenant's demand there (in the current window
-- cap_done does, with what it was refused).
local function cap_add(r, s, e, by)
  local st = cap_win(r, s)
  cap_touch(r, st, e)
  local b = cap_booked(r, st) or 0
  hc_add(st, "count", by)
  hc_put(st, r.tf, b + by)
  if r.f > 0 then
    local under = math.min(b + by, r.f) - math.min(b, r.f)
    if under > 0 then
      hc_add(st, "fb", under)
    end
    cap_tenant(st, r.qf)
    local q = hc_num(st, r.qf) -- before cap_ask moves it
    local moved = floor_moved(r.f, b, q, b + by, q)
    if moved ~= 0 then
      hc_add(st, "fu", moved)
    end
  end
  if s ~= r.cur_start then
    cap_ask(r, s, e, by)
  elseif r.cap.lv > 0 then
    -- What it took above its entitlement at the level (the ramp's part).
    local base = math.max(r.f, math.floor(r.w * r.cap.lv + 1e-9))
    local over = math.max(0, b + by - base) - math.max(0, b - base)
    if over > 0 then
      hc_add(st, "x", over)
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

-- cap_quick returns, for the ti-th tenant and its n events, the state of
-- its capacity rules (marked active, as cap_rules does; one table per rule
-- for the whole call, valid until the next tenant's) when every one has
-- room for all n events in its current window, else false: then run
-- (90_run.lua) decides the tenant in the fast path, and cap_book books the
-- events in the capacity, without the tables of a decision (rules_of).
local cap_quick
do
  local quick = {} -- per capacity rule, cap_quick's state, made once per call
  cap_quick = function(ti, n)
    local base = (ti - 1) * (1 + ncap)
    local qs = quick
    for ci = 1, ncap do
      local d = capd[ci]
      local r = qs[ci]
      if not r then
        r = {
          key = d.key, cap = d, cur_start = d.cs, cur_end = d.ce, step = d.step,
          retention = d.retention, limit = d.limit,
        }
        qs[ci] = r
      end
      r.field, r.tf, r.rf, r.qf = capn[ti], capt[ti], capr[ti], capq[ti]
      r.w, r.f = caps[base + 1], caps[base + 1 + ci]
      cap_mark(r)
      local room = cap_room(r, d.cs)
      r.need = cap_cost(ti, ci, n, room) -- what the n events cost it
      if room < r.need then
        return false
      end
    end
    return qs
  end
end

-- cap_book books the events admitted in the fast path in the capacity
-- rules qs (cap_quick: what they cost each, r.need), and adds them to what
-- the tenant asks of the next window (cap_add, cap_done).
local function cap_book(qs)
  -- Settled unless a field it may read is not a number (e.bad): then a
  -- failure takes its writes back as any tenant's.
  settled = true
  for ci = 1, ncap do
    local d = capd[ci]
    if d.scur.bad or not d.snext or d.snext.bad then
      settled = false
    end
  end
  for ci = 1, ncap do
    local r = qs[ci]
    cap_add(r, r.cur_start, r.cur_end, r.need)
    cap_ask(r, r.cur_end, r.cur_end + r.step, r.need)
  end
  settled = false
end

-- undo (20_journal.lua) takes back a write of the call's view (ops 6 and
-- 7) there alone: Redis has not seen it yet. A window read before any
-- other undone write is read again after it.
on_undo = function(op, key, arg)
  if op == 6 or op == 7 then
    local old = capold[#capold]
    capold[#capold] = nil
    if op == 6 then
      if old == NIL then
        old = nil
      end
      if arg == "count" then
        for ci = 1, ncap do
          capd[ci].ff = false -- see Full windows
        end
      end
      hc[key].v[arg] = old
    else
      hd[key][arg] = hd[key][arg] - old
    end
    return true
  end
  counts[key] = nil
  return false
end

-- fmt writes a field's value as Redis takes it: whole numbers as such, a
-- level with six decimals. (cap_flush passes whole numbers as num's
-- strings, kept per call: Redis 7.0 writes a number passed to redis.call
-- with %.17g, about 2,000 instructions each, and a call's tenants' counts
-- repeat: 3% of a call's instructions in TestCapacityCommands.)
local function fmt(x)
  if x % 1 == 0 then
    return string.format("%d", x)
  end
  return string.format("%.6f", x)
end

-- hset writes the field-value pairs of args to key, CHUNK pairs a command.
local function hset(key, args)
  local i = 1
  while i <= #args do
    local j = math.min(#args, i + 2 * CHUNK - 1)
    redis.call("HSET", key, unpack(args, i, j))
    i = j + 1
  end
end

-- cap_flush writes what the call changed in the capacity's hashes, at its
-- end (90_run.lua's finish): per window one HSET of every field written
-- (and a PEXPIRE for a window the call gave an end, with its histogram);
-- per demand histogram, each bucket moved: one HINCRBY each for one or two
-- buckets, else one HMGET and one HSET.
local function cap_flush()
  for _, key in ipairs(hdl) do
    local h, fs = hd[key], {}
    for f, by in pairs(h) do
      if by ~= 0 then
        fs[#fs + 1] = f
      end
    end
    table.sort(fs)
    if #fs <= 2 then
      for _, f in ipairs(fs) do
        redis.call("HINCRBY", key, f, h[f])
      end
    else
      local args = {}
      local i = 1
      while i <= #fs do
        local j = math.min(#fs, i + CHUNK - 1)
        local got = redis.call("HMGET", key, unpack(fs, i, j))
        for m = i, j do
          args[#args + 1] = fs[m]
          local x = (tonumber(got[m - i + 1]) or 0) + h[fs[m]]
          args[#args + 1] = numbers[x] or num(x) -- a string (see fmt)
        end
        i = j + 1
      end
      hset(key, args)
    end
  end
  for _, key in ipairs(hkeys) do
    local e = hc[key]
    local args, v, o, dl, na = {}, e.v, e.o, e.dl, 0
    for i = 1, #dl do
      local f = dl[i]
      local x = v[f]
      if x and x ~= BAD and x ~= o[f] then
        if x % 1 ~= 0 then
          x = fmt(x) -- a level, with six decimals
        else
          x = numbers[x] or num(x)
        end
        args[na + 1], args[na + 2] = f, x
        na = na + 2
      end
    end
    if #args > 0 then
      local fresh = e.wend and type(o.expire) ~= "number"
      if fresh and type(v.expire) ~= "number" then
        -- The tenant that gave it an end was taken back; another wrote here.
        args[#args + 1] = "expire"
        args[#args + 1] = fmt(e.wend)
      end
      if fresh then
        args[#args + 1] = "ht"
        args[#args + 1] = HT
      end
      hset(key, args)
      if fresh then
        local ttl = num(e.wend - now + e.ret)
        redis.call("PEXPIRE", key, ttl)
        if e.hkey and hd[e.hkey] then
          redis.call("PEXPIRE", e.hkey, ttl)
        end
      end
    end
  end
end
