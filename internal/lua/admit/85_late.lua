-- late: deferred events that missed their slot keep their place.
--
-- Contract. After the replay arguments (the last is ARGV[arg_recs+1] when
-- the call names no source, ARGV[arg_recs+6] otherwise) the call may carry one more
-- argument, the late argument (absent, or "", for a source batch): a JSON
-- array [take, c_1, ..., c_ntenants, then the claims' due times] for a
-- batch read back from the first retry tier. c_ti is how many of tenant
-- ti's events are claims: its last c_ti events, each an event that came
-- back inside its reserved slot (the window that holds now). The tenant's
-- other events are late: they missed their slot. The due times (unix ms,
-- 0 when not known) are each claim's gk-due, tenant by tenant in the
-- call's order, c_ti for tenant ti.
--
-- A tenant qualifies when each measure its rules count (events, bytes or
-- units: see Costs) has a rule of its finest windows (under a capacity,
-- see Capacity), and either it has one rule of ttl windows and there is
-- no capacity (a slot is then a window of its chain: a chain is never
-- moved before its end, which a window holding a reservation keeps
-- ahead), or its rules are of aligned windows and nest in its finest
-- rule, the one with the shortest current window (finest_of: every
-- boundary of another rule's windows is a boundary of the finest rule's, so
-- each finest window lies inside one window of every rule; one rule always
-- nests). Then every due time of a reservation is the start of a finest
-- window (a search only stops on window boundaries), and the reservation's
-- slot, until the earliest end of the windows holding its due, is that
-- finest window: a finest window's count is the slots reserved in it, each
-- one counted in a window of every rule that holds the whole finest window.
-- (Rules that do not nest, e.g. 10s and 15s, do not qualify: a 10s window
-- would then hold slots of two 15s windows, and an event taking "a slot
-- of the window" might use one counted in the other. They take by
-- segments instead: see Segments.)
--
-- Taking (take = 1). A qualifying tenant's late events that the current
-- windows have no room for take, in order, the slots of the tenant's
-- reservations in the earliest finest windows before its first time when
-- every rule has room that start at least late_ms.take_margin after now: they
-- take at most the window's count less what was taken there, and what
-- they take is added to the tenant's record of takes (record_key,
-- limit.TakenSuffix: a hash of takes by due time, living until a minute
-- after the end of the last window taken in), under the window's start.
-- They are deferred to that window (a reservation in the
-- reply whose until is negated, -e: the caller marks the events as having
-- taken their slot, and the replay record keeps it so). No count moves:
-- they use the slots the reservations had counted, in every rule's window.
-- What they do not take
-- is reserved as usual, from where the take scan stopped on. Every window
-- read counts against the budget as in reserve (see Budget); with several
-- rules the scan also reads at most scan.reads windows, and leaves the
-- tenants after it their share, as reserve does.
--
-- Claims. A tenant's claims that are not in the replay record read the
-- record of takes (claim_pools): the field of their own due time, and,
-- when the tenant qualifies, the field of its finest window that holds now
-- (a slot reserved under rules whose finest window was shorter, and taken
-- under the rules now: their due times differ) and that window's field
-- "taken" (where an earlier version of this script recorded takes). So a
-- claim finds the take of its slot whatever the tenant's rules are now: a
-- change of rules between a take and its claims (a finer rule added, a
-- byte rule, a capacity) no longer hides it. The last claims first, each
-- that finds a take there had its slot taken: the take is used up
-- (journaled), and those d claims are decided after the
-- tenant's late events, at its first free slot: they take no slot in turn
-- (a displaced event taking the next window's slot would shift the whole
-- queue by one, exact but one more deferral per window of backlog: in the
-- fault suite's mix, 7,568 events took a slot, most of them displaced). The other claims keep their slot: they
-- are taken out of the call (like replayed events, so a replay checks them
-- again, and finds the same: takes are only added while their window is in
-- the future, and a claim's window holds now) and reported in the reply's
-- replayed list with code 5 (keep: forward uncounted). Claims cost one
-- HMGET of the record per tenant and call (and a second one, of the pools'
-- marks, when a pool holds some), and one HGET of a window for a
-- qualifying tenant. A record (or a window's "taken") that is not a hash,
-- or holds a value that is not an integer where a claim reads it, fails
-- the tenant alone, as a broken window key does (claim_failed): what its
-- claims used up is taken back and all its events fail.
--
-- Costs. A tenant whose rules count bytes (or units), all of them, takes
-- and gives up slots in that measure: a future finest window's count is
-- then the bytes reserved in it (counted in a window of every rule that
-- holds it), a late event takes its cost of them (its events in order, as
-- many as fit what is left there), and a claim gives up its own cost. A
-- claim's slot is taken while its pool holds any: the last claim may give
-- up more than was taken (the window then forwards less than it counted,
-- never more). A take of a measure is recorded under its due time f, as
-- one of events, and marked in the field f/m (1 bytes, 2 units; absent or
-- 0 events): a replica of an earlier version reads it as takes of events
-- and gives up one claim a byte or unit, more than needed, never too few.
-- A claim gives up 1 of a pool whose measure its tenant no longer counts;
-- a take is not added beside takes of another measure (the rules changed
-- between them). Rules of several measures (2/1m and 100B/1m) qualify when
-- each measure has a rule of the finest windows (each window of one nests
-- in the other's): what is reserved in a finest window is known in each
-- measure from such a rule, or, for events, from a finest rule of bytes or
-- units (see Lower bound), or, without a capacity, from what reserve
-- records there (see Reserved: 100B/1m beside 2/10s). A late
-- event then takes where every measure has its cost left, each measure's
-- take is recorded in its own pool, f/0, f/1 or f/2, f holds their sum
-- and is marked 3, and a claim gives up its cost in each measure (1 for
-- events) while f holds any: the last claims may give up more than was
-- taken, in one measure or both.
--
-- Lower bound. Where a finest window's count of bytes or units is not 0,
-- at least one event is reserved there (costs are never negative: a
-- count above 0 holds a reservation): a take there may count one event,
-- though more may be reserved. So a tenant whose finest
-- rule counts bytes or units qualifies with rules of events that are not
-- of the finest windows (10000B/1m beside 100/1h) or under a capacity of
-- events as long as its finest rule or longer (1000/1m beside 10MiB/1m),
-- and under a capacity of bytes or units whose windows are the finest
-- beside rules of events (10MiB/1s beside 1000/1m), or of events and its
-- measure (400B/10s beside 10000B/1m,100/1h): its late events
-- take one slot of
-- events in each window, where their bytes fit what was reserved there
-- (by[0] = 0, the pool of events counted by the bound, in take_slots).
-- Its claims give up their cost of each measure as under Costs, the
-- capacity's cost list giving the bytes of a tenant whose rules count
-- none. The bound does not hold the other way: an event's bytes may be 0,
-- so the bytes reserved in a window are never known from its events.
--
-- Reserved. A qualifying tenant whose finest rule counts events and some
-- measure mu (bytes or units) only in coarser windows, its own (2/10s
-- beside 100B/1m) or a capacity's (400B/1h beside 100/1m, see Capacity;
-- the capacity's cost list then gives the costs; rec_of) has reserve add what each
-- reservation costs in mu to the field r<mu> of the finest window holding
-- it (beside its count: it lives and ends with that window). r<mu> is then
-- what the window holds reserved in mu, and a take there counts it as a
-- rule of mu of the finest windows would (ms: a {rec} in take_slots; the
-- read is an HGET of a window the scan has read). A reservation that leaves
-- its window before it starts gives its cost back with its count
-- (internal/lua/release.lua: a slot given back after a raise, or missed;
-- 87_advance.lua: a move into idle capacity);
-- one placed elsewhere as a displaced claim leaves a window that holds now,
-- where nothing is taken any more. A window reserved in before this (or by
-- a replica of an earlier version) holds no r<mu>: nothing is taken there,
-- as before. Rolling out from a version that does not write r<mu>, a slot
-- given back early by an older replica leaves r<mu> higher than what is
-- reserved: roll out with LATE_TAKES_SLOTS=check, as for Costs.
--
-- Capacity. Under a capacity (35_capacity.lua: one rule more per capacity
-- rule, on shared keys, whose count of a tenant in a window is what it
-- booked there, t:<tenant>) a tenant of aligned rules qualifies in two
-- cases (cap_finest). When the capacity's windows are as long as its
-- finest rule's or longer, every capacity rule nests in the finest rule
-- and counts a measure that a rule of the tenant's of the finest windows
-- counts, or has the finest rule's windows (a finest window's
-- reservations in its measure are then what the tenant booked there: 400B/1m
-- beside 100/1m), or counts events where the finest rule counts bytes or
-- units (see Lower bound), or bytes or units where it counts events (see
-- Reserved): a slot is then a finest window of the tenant's, whose count
-- holds its reservations, each booked in the capacity window holding it
-- by the same cost. When the capacity's finest rule has shorter windows,
-- it is the finest of all: every other rule, the tenant's and the
-- capacity's, nests in it, and all the tenant's rules count the
-- capacity's measure, or events where it counts bytes or units (see Lower
-- bound); a slot is then a capacity window, and its count of
-- the tenant's reservations is what the tenant booked there (in a window
-- not yet current, reservations alone). Either way the take scan's room
-- in a capacity window is the tenant's (room_of, as reserve reads it: a
-- window where the event could be reserved ends the scan), a take moves
-- no booking (the late event is the same tenant's and uses the slot its
-- claim booked), and the displaced claim is placed again as any event,
-- booked in the capacity where it goes. A capacity window's read costs
-- the budget one for its shared fields and one for the tenant's there,
-- which a full window does not need (scan.need). A backlog's moves into idle capacity
-- (87_advance.lua) leave an event whose slot was taken where it is, and
-- its tenant's events after it.
--
-- Segments. A tenant that does not qualify, whose rules are all aligned,
-- the capacity's too (its own rules do not nest, 2/10s beside 3/15s; a
-- capacity's windows and its own do not, 2/4s beside 100/6s; or what a
-- measure reserves in a slot is not known, 2/10s of a capacity beside
-- 10000B/1m), takes by segments. A reservation's due time is always a
-- bound of some rule's windows (a search stops only there), and its slot
-- is the segment from there to the next bound of any rule, the tenant's or
-- the capacity's (reserve's until: the earliest end of the windows
-- holding it). A segment lies inside one window of every rule, so a late
-- event forwarded in it uses the reserved slot in every rule. What a
-- segment holds reserved reserve records, in each measure a rule counts
-- (events: 1 each), in the fields s<mu>:<due> of the tenant's home window
-- (rec_of: its own rule of events, else of the shortest windows; its
-- window holds the whole segment; a reservation of 0 bytes opens a home
-- of bytes, so that it expires). The take scan (seg_slots) walks the
-- segments from first on, reading the window of every rule that holds
-- each (as coarser does), and, where some rule has no room, the home
-- window's fields at the segment's start, which cost the budget (and
-- scan.reads) one as a window's read, and, when they hold any, the record
-- of takes there (one HMGET each). Takes are recorded as
-- under Costs, marked 3 with a pool of each measure, and a claim finds
-- the take under its own due time. A reservation that leaves its slot
-- before it starts takes its cost off the record (internal/lua/release.lua;
-- 87_advance.lua's moves, which take off at most what it holds, even in
-- the current window: takes come after now). Windows reserved in before
-- this (or by a replica of an earlier version) hold no record, and
-- nothing is taken there: roll out as for Reserved.
--
-- late_ms.take_margin keeps takes off windows about to start, so that a
-- claim of that window, read by a replica whose clock runs a little ahead,
-- never misses a take made after it; late_ms.record_life is how long the
-- record of takes lives past the end of the last window taken in (as a
-- window key's retention: a clock that lags, a claim a little late). (One
-- table: the script's main chunk is near Lua's 200 locals.)

local late_ms = {take_margin = 1000, record_life = 60000}

-- The call's late argument: take, claims per tenant (0: none), and each
-- tenant's claims' due times (claim_due[ti][j]: its j-th claim's, 0 when
-- not known).
local take = false
local claims = nil
local claim_due = {}
-- displaced[ti]: how many of tenant ti's claims had their slot taken (the
-- last of its events in the call; they do not take slots in turn).
local displaced = {}
-- claim_failed[ti]: {key, fault} when tenant ti's claims met a broken record
-- of takes (a pool that holds no integer): its claims' writes are taken
-- back and every event of the tenant fails, as on a broken window key
-- (90_run.lua), while the batch's other tenants are decided.
local claim_failed = {}
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
    local q = ntenants + 2
    for ti = 1, ntenants do
      claims[ti] = v[ti + 1] or 0
      local ds = {}
      for j = 1, claims[ti] do
        ds[j] = v[q] or 0
        q = q + 1
      end
      claim_due[ti] = ds
    end
  end
end

-- nested reports whether every boundary of descriptor dr's windows, after
-- the start of df's window that holds now and before the end of df's window
-- that holds the horizon's end, is a boundary of df's windows: then each
-- window of df lies inside one window of dr, over every time a take or a
-- claim of the call may look at. Its work is bounded by the descriptors'
-- boundaries (the call's arguments), or by as many steps of dr, which is
-- at least as long as df's current window (see finest_of).
local nested
do
  -- is_bound reports whether time b is a boundary of the windows of
  -- descriptor d (aligned: "a" or "e"); bset is d's boundaries as a set, for
  -- "e" (made by nested).
  local function is_bound(d, bset, b)
    if d.kind == "a" then
      return (b - d.base) % d.step == 0
    end
    return bset[b] == true
  end

  nested = function(dr, df)
    if dr.kind == "a" and df.kind == "a" then
      return dr.step % df.step == 0 and (dr.base - df.base) % df.step == 0
    end
    local bset = nil
    local lim
    if df.kind == "e" then
      bset = {}
      for _, b in ipairs(df.bounds) do
        bset[b] = true
      end
      lim = df.bounds[#df.bounds]
    else
      lim = df.base + (math.floor((hend - df.base) / df.step) + 1) * df.step
    end
    if dr.kind == "a" then
      if dr.step < df.cur_end - df.cur_start then
        return false
      end
      local b = dr.cur_start
      while b < lim do
        if b > df.cur_start and not is_bound(df, bset, b) then
          return false
        end
        b = b + dr.step
      end
      return true
    end
    for _, b in ipairs(dr.bounds) do
      if b > df.cur_start and b < lim and not is_bound(df, bset, b) then
        return false
      end
    end
    return true
  end
end

-- finest_of returns, for the tenant whose record is at recs[p], the number
-- (1-based, in its record's order) of its rule with the shortest current
-- window when every other rule nests in it (nested), else nil. A window of
-- that rule then lies inside one window of each other rule: the slot of a
-- reservation is the finest window of its due time, and the finest window
-- is all the slots it counts.
local finest_of
do
  -- finest[set]: the finest rule of a rule set (its descriptor indices, as
  -- "d1,d2,..."), or false when the set's rules do not nest in it.
  local finest = {}

  finest_of = function(p)
    local nrules = recs[p]
    if nrules == 1 then
      return 1
    end
    local ds = {}
    for ri = 1, nrules do
      ds[ri] = recs[p - 1 + 3 * ri]
    end
    local set = table.concat(ds, ",")
    local fi = finest[set]
    if fi == nil then
      fi = 1
      for ri = 2, nrules do
        local d, f = descs[ds[ri]], descs[ds[fi]]
        if d.cur_end - d.cur_start < f.cur_end - f.cur_start then
          fi = ri
        end
      end
      for ri = 1, nrules do
        if ri ~= fi and not nested(descs[ds[ri]], descs[ds[fi]]) then
          fi = false
          break
        end
      end
      finest[set] = fi
    end
    return fi or nil
  end
end

-- measure_of returns the measure the rule of key counts, as a record of
-- takes marks it (see Costs): 1 bytes, 2 units (limit.Measure's key suffix
-- in the rule's counter, after the tenant's hash tag), 0 events.
local function measure_of(key)
  local counter = string.match(key, "}:([^}]*)$") or ""
  if string.find(counter, "/bytes", 1, true) then
    return 1
  elseif string.find(counter, "/units", 1, true) then
    return 2
  end
  return 0
end

-- qualifies returns, when tenant ti (its record at recs[p]) may take or
-- give up slots (see above), the number of its finest rule (finest_of;
-- under a capacity whose rule is the finest, its number after the
-- tenant's rules, as rules_of appends it: see cap_finest), the measure
-- every one of its rules counts (measure_of), or 3 for rules of several
-- measures, and then by: for each measure, a rule of it whose windows are
-- the finest rule's (see Costs; under a capacity, one of the capacity's
-- rules after the tenant's; 0 for events counted by the Lower bound);
-- else nil.
local qualifies
do
  -- cap_finest returns, for a tenant whose finest rule has descriptor df and
  -- counts measure fm (m: what all its rules count, 3 for several, by[mu]
  -- its rule of measure mu of the finest windows, 0 for events known from
  -- the finest rule's count alone: see Lower bound), whether the call's
  -- capacity rules let it take slots (see Capacity), the number of the
  -- capacity rule that is the finest of all (nil: df's rule is), and the
  -- measures a take then counts besides the tenant's (add[mu]: the number of
  -- the rule, after the tenant's, that counts it, or 0, see Lower bound).
  -- A capacity rule whose windows are shorter than df's is the finest when
  -- every other rule, the tenant's and the capacity's, nests in it and
  -- counts its measure, or events when it counts bytes or units (a finest
  -- window's reservations are then the tenant's booking there, t:<tenant>,
  -- and at least one event where that is not 0); else every capacity rule
  -- nests in df and counts a measure that a rule of the tenant of the
  -- finest windows counts, or has df's windows (a take then counts its
  -- measure by the tenant's booking there), or counts events when df's rule
  -- counts bytes or units. own lists the descriptors of the tenant's rules.
  -- Kept per rule set and measures (key).
  local cap_finest
  do
    local known = {}
    local function desc_of(d)
      return {kind = "a", step = d.step, base = d.cs, cur_start = d.cs, cur_end = d.ce}
    end
    cap_finest = function(key, df, own, m, by, fm, nr)
      local v = known[key] -- false: no; else {the finest capacity rule or 0, add}
      if v ~= nil then
        if not v then
          return false
        end
        return true, v[1] ~= 0 and v[1] or nil, v[2]
      end
      local cf = 1
      for ci = 2, ncap do
        if capd[ci].step < capd[cf].step then
          cf = ci
        end
      end
      local ok, fine, add = true, nil, {}
      if capd[cf].step < df.cur_end - df.cur_start then
        fine = cf
        local dc, mf = desc_of(capd[cf]), capd[cf].mu
        -- Events beside bytes or units: at least one a window with any.
        local function counts(mu)
          if mu == 0 and mf > 0 then
            add[0] = 0
          end
          return mu == mf or mu == 0
        end
        if m == 3 then
          for mu in pairs(by) do
            ok = ok and counts(mu)
          end
        else
          ok = counts(m) -- (a capacity's rules count one measure)
        end
        for ci = 1, ncap do
          ok = ok and (ci == cf or nested(desc_of(capd[ci]), dc))
        end
        for _, d in ipairs(own) do
          ok = ok and nested(d, dc)
        end
        if add[0] then
          add[mf] = nr + cf
        end
      else
        -- The rules of df's windows first: a take counts their measure by
        -- the tenant's booking there, and a coarser rule of it then nests.
        local inside, same = {}, {}
        for ci = 1, ncap do
          local dd = desc_of(capd[ci])
          inside[ci] = nested(dd, df)
          same[ci] = inside[ci] and nested(df, dd)
        end
        for pass = 1, 2 do
          for ci = 1, ncap do
            local d = capd[ci]
            if same[ci] == (pass == 1) then
              ok = ok and inside[ci]
              if ok and not (d.mu == m or (by and by[d.mu] ~= nil) or add[d.mu]) then
                if same[ci] then
                  add[d.mu] = nr + ci
                elseif d.mu == 0 and fm > 0 then
                  add[0] = 0
                elseif fm == 0 then
                  add[d.mu] = -(nr + ci) -- recorded in the finest window (see Reserved)
                else
                  ok = false
                end
              end
            end
          end
        end
      end
      known[key] = ok and {fine or 0, add} or false
      return ok, ok and fine or nil, add
    end
  end

  qualifies = function(ti, p)
    local nr = recs[p]
    local m = 0
    local q = cost_at[ti]
    if q then
      local l = recs[q + 1]
      for ri = 2, nr do
        if recs[q + ri] ~= l then
          m = 3
        end
      end
      if m == 0 and l > 0 then
        m = measure_of(KEYS[key_at[ti] + 1])
      end
    end
    for x = p + 2, p - 1 + 3 * nr, 3 do
      if descs[recs[x]].kind == "t" then
        -- One ttl rule: a slot is a window of its chain (several chains
        -- start apart; a capacity's aligned windows would not nest).
        if nr == 1 and ncap == 0 then
          return 1, m
        end
        return nil
      end
    end
    local fi = finest_of(p)
    if not fi then
      return nil
    end
    local df = descs[recs[p - 1 + 3 * fi]]
    local fm = m
    local by = nil
    if m == 3 then
      fm = measure_of(KEYS[key_at[ti] + fi])
      local need = {}
      by = {}
      for ri = 1, nr do
        local mu = measure_of(KEYS[key_at[ti] + ri])
        need[mu] = need[mu] or ri
        if not by[mu] and (ri == fi or nested(df, descs[recs[p - 1 + 3 * ri]])) then
          by[mu] = ri -- its windows are the finest's (each nests in the other)
        end
      end
      for mu, ri in pairs(need) do
        if not by[mu] then
          if mu == 0 and fm > 0 then
            by[0] = 0 -- see Lower bound
          elseif fm == 0 then
            by[mu] = -ri -- see Reserved
          else
            return nil
          end
        end
      end
    end
    if ncap > 0 then
      local key, own = {m, fm}, {}
      for ri = 1, nr do
        key[ri + 2], own[ri] = recs[p - 1 + 3 * ri], descs[recs[p - 1 + 3 * ri]]
      end
      for mu = 0, 2 do
        key[#key + 1] = by and by[mu] or -1
      end
      local ok, cf, add = cap_finest(table.concat(key, ","), df, own, m, by, fm, nr)
      if not ok then
        return nil
      end
      if next(add) then
        -- A take counts the capacity's measure, or events, too.
        if cf then
          by = {}
        elseif not by then
          by = {[m] = fi}
        end
        for mu, ri in pairs(add) do
          if by[mu] == nil then
            by[mu] = ri
          end
        end
        m = 3
      end
      if cf then
        return nr + cf, m, by -- (one measure, the capacity's, unless by)
      end
    end
    return fi, m, by
  end
end

-- rec_of returns, for tenant ti (its record at recs[p]), what reserve
-- records of its reservations: {fi, list of {field, rule number,
-- measure}}, with each field a measure's and a rule of that measure whose
-- costs it adds (events: 1 each), in the window of rule fi that holds the
-- reservation; false when nothing. For a qualifying tenant (see Reserved)
-- fi is its finest rule and each field "r<mu>" of a measure mu that no rule
-- of the finest windows counts; for one that does not qualify, of aligned
-- windows (see Segments), seg is true, fi is its home rule (its own rule
-- of events, else of bytes or units, of the shortest windows) and each field "s<mu>:" of a measure mu that a
-- rule of its own or the capacity's counts, to which reserve appends the
-- reservation's due time. Kept per rule set and measures.
local rec_of
do
  local known = {}
  rec_of = function(ti, p)
    local nr = recs[p]
    if nr == 1 and ncap == 0 then
      return false -- (one rule qualifies, of one measure)
    end
    local k
    if not cost_at[ti] and nr <= 4 and ndescs < 9000 then
      -- Rules of events alone: a number of the descriptors (no string
      -- made per tenant: decide calls this for every tenant it decides;
      -- exact while (ndescs + 1)^4 is below 2^53).
      k = 0
      for ri = nr, 1, -1 do
        k = k * (ndescs + 1) + recs[p - 1 + 3 * ri]
      end
    else
      k = {cost_at[ti] and 1 or 0}
      for ri = 1, nr do
        k[#k + 1] = recs[p - 1 + 3 * ri]
        k[#k + 1] = KEYS[key_at[ti] + ri]:match("}:([^}]*)$") or ""
      end
      k = table.concat(k, ",")
    end
    local v = known[k]
    if v == nil then
      v = false
      local fi, _, by = qualifies(ti, p)
      if fi and by and cost_at[ti] then
        local list = {}
        for mu, ri in pairs(by) do
          if ri < 0 then
            list[#list + 1] = {"r" .. mu, -ri, mu}
          end
        end
        if #list > 0 then
          v = {fi, list}
        end
      elseif not fi then
        -- Segments: every rule aligned, a measure once each.
        local home, list, seen = nil, {}, {}
        local function count(mu, ri)
          if not seen[mu] then
            seen[mu] = true
            list[#list + 1] = {"s" .. mu .. ":", ri, mu}
          end
        end
        for ri = 1, nr do
          local d = descs[recs[p - 1 + 3 * ri]]
          if d.kind == "t" then
            list = nil
            break
          end
          -- The home rule: of events if any (every reservation writes
          -- its window), then of the shortest windows.
          local mu, len = measure_of(KEYS[key_at[ti] + ri]), d.cur_end - d.cur_start
          local better = not home
          if home and (mu == 0) ~= home[3] then
            better = mu == 0
          elseif home then
            better = len < home[2]
          end
          if better then
            home = {ri, len, mu == 0}
          end
          count(mu, ri)
        end
        if list then
          for ci = 1, ncap do
            count(capd[ci].mu, nr + ci)
          end
          v = {home[1], list, seg = true}
        end
      end
      known[k] = v
    end
    return v
  end
end

-- taken_key is the key of tenant ti's window that holds now of its rule
-- number fi (its finest), and that window's start.
local function taken_key(ti, fi)
  local p = rec_at[ti]
  if fi > recs[p] then
    -- A capacity rule (its window's fields hold no takes).
    return nil, capd[fi - recs[p]].cs
  end
  local s = descs[recs[p - 1 + 3 * fi]].cur_start
  return wkey(KEYS[key_at[ti] + fi], s), s
end

-- record_key is the key of tenant ti's record of takes (limit.TakenSuffix):
-- its tenant key (a rule key up to its hash tag's closing brace: a counter
-- holds none) and ":taken".
local function record_key(ti)
  return string.match(KEYS[key_at[ti] + 1], "^(.*})") .. ":taken"
end


-- claim_pools reads what the claims of tenant ti (fi: its finest rule
-- when it qualifies, else nil) may find taken: pools[f] for the record's
-- field f (a due time), in the measure marks[f] (its field f/m, see
-- Costs; for 3, subs[f][mu] are its pools of each measure mu), and legacy, the field "taken" of its finest window that holds
-- now (where a take of an earlier version is). It returns the pools, the
-- marks, the record's key, the finest window's key and start (nil without
-- fi).
local function claim_pools(ti, fi, dues)
  local rk = record_key(ti)
  local fields, seen = {}, {}
  local wk, ws = nil, nil
  if fi and (fi > recs[rec_at[ti]] or descs[recs[rec_at[ti] - 1 + 3 * fi]].kind ~= "t") then
    -- (A ttl rule: its window that holds now is the chain's, not known
    -- here; a claim's own due time is its window's start.)
    wk, ws = taken_key(ti, fi)
    fields[1], seen[ws] = num(ws), true
    if ncap > 0 then
      wk = nil -- (no version that wrote "taken" took slots under a capacity)
    end
  end
  for _, d in ipairs(dues) do
    if d > 0 and not seen[d] then
      seen[d] = true
      fields[#fields + 1] = num(d)
    end
  end
  local pools, marks = {}, {}
  -- A value that is not an integer, or a key of the wrong type, fails the
  -- tenant (claim_failed).
  local function int_of(x, key)
    if not x then
      return 0
    end
    if not string.find(x, "^%-?%d+$") then
      error({key = key, why = "holds a count that is not an integer"})
    end
    return tonumber(x)
  end
  cur = rk
  local v = #fields > 0 and redis.call("HMGET", rk, unpack(fields))
  -- The marks and pools by measure of the fields that hold some (most hold
  -- none): f/m, f/0, f/1, f/2 for each.
  local held, subs = {}, {}
  for i, f in ipairs(fields) do
    pools[f], marks[f] = int_of(v[i], rk), 0
    if pools[f] > 0 then
      held[#held + 1], held[#held + 2], held[#held + 3], held[#held + 4] = f .. "/m", f .. "/0", f .. "/1", f .. "/2"
    end
  end
  v = #held > 0 and redis.call("HMGET", rk, unpack(held))
  for i = 1, #held, 4 do
    local f = string.sub(held[i], 1, -3)
    marks[f] = int_of(v[i], rk)
    subs[f] = {[0] = int_of(v[i + 1], rk), int_of(v[i + 2], rk), int_of(v[i + 3], rk)}
  end
  local legacy = 0
  if wk then
    cur = wk
    legacy = int_of(redis.call("HGET", wk, "taken"), wk)
  end
  return pools, marks, subs, legacy, rk, wk, ws
end

-- claim_phase decides the claims of every tenant (see Claims): it runs
-- after replay_phase and before the first tenant is decided. It rebuilds
-- the replayed list in position order with the kept claims in it, takes
-- them out of their tenants' n and of the offsets the record keeps.
local function claim_phase()
  -- claim_costs returns, for tenant ti, its current cost list of each
  -- measure it counts by cost (by measure_of: per[m][j] is what its j-th
  -- event costs it), empty for a tenant without costs.
  local function claim_costs(ti)
    local per = {}
    local lists_of = costs_of(ti)
    if lists_of then
      local nr = recs[rec_at[ti]]
      for ri = 1, nr do
        if lists_of[ri] then
          per[measure_of(KEYS[key_at[ti] + ri])] = lists_of[ri]
        end
      end
      for ci = 1, ncap do
        -- A capacity's measure that no rule of the tenant counts.
        local mu = capd[ci].mu
        if lists_of[nr + ci] and not per[mu] then
          per[mu] = lists_of[nr + ci]
        end
      end
    end
    return per
  end

  -- use_up takes from tenant's record of takes rk (and its finest window
  -- wk, for a take of an earlier version) what its claims used up.
  local function use_up(rk, used, wk, used_legacy)
    for f, k in pairs(used) do
      if k > 0 then -- (-0 is "-0" to Redis: not an integer)
        cur = rk
        redis.call("HINCRBY", rk, f, -k)
        note(4, rk, {f, k})
      end
    end
    if used_legacy > 0 then
      cur = wk
      redis.call("HINCRBY", wk, "taken", -used_legacy)
      note(4, wk, {"taken", used_legacy})
    end
  end

  -- settle decides tenant ti's live claims (live: their numbers among its
  -- events, dues: their due times, at: their places in its cost lists): it
  -- marks in gone those whose slot was taken, uses up the takes they find
  -- (use_up), and returns how many they are.
  local function settle(ti, p, live, dues, at, gone)
    local pools, marks, subs, legacy, rk, wk, ws = claim_pools(ti, qualifies(ti, p), dues)
    local d = 0
    local used, used_legacy = {}, 0
    local own = ws and num(ws)
    local per = claim_costs(ti)
    for x = #live, 1, -1 do
      -- The pool of the claim's due time, else of the finest window that
      -- holds now, gives up what the claim costs its measure (at most
      -- what it holds; 1 for events, or for a measure the tenant counts
      -- no more): the claim is gone.
      local f = dues[x] > 0 and num(dues[x]) or own
      if not (f and pools[f] > 0) then
        f = own
      end
      if f and pools[f] > 0 and marks[f] == 3 then
        -- Takes of several measures: each pool gives up what the claim
        -- costs it, and f holds their sum.
        local sub, left = subs[f], 0
        for mu = 0, 2 do
          if sub[mu] > 0 then
            local c = per[mu]
            c = math.min(mu > 0 and c and c[at[live[x]]] or 1, sub[mu])
            local sf = f .. "/" .. mu
            sub[mu], used[sf] = sub[mu] - c, (used[sf] or 0) + c
          end
          left = left + sub[mu]
        end
        left = math.min(left, pools[f]) -- (pools that outgrew f: a record an older replica used)
        pools[f], used[f] = left, (used[f] or 0) + pools[f] - left
      elseif f and pools[f] > 0 then
        local c = per[marks[f]]
        c = math.min(c and c[at[live[x]]] or 1, pools[f])
        pools[f], used[f] = pools[f] - c, (used[f] or 0) + c
      elseif legacy > 0 then
        f, legacy, used_legacy = false, legacy - 1, used_legacy + 1
      else
        f = nil
      end
      if f ~= nil then
        gone[live[x]] = true
        d = d + 1
      end
    end
    use_up(rk, used, wk, used_legacy)
    return d
  end

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
    -- The claims not replayed (live), their due times, and which of them
    -- had their slot taken (gone[j]), the last first.
    local live, dues = {}, {}
    for j = n0 - c + 1, n0 do
      if not rep_at[pos + j - 1] then
        live[#live + 1] = j
        dues[#dues + 1] = claim_due[ti][j - n0 + claims[ti]] or 0
      end
    end
    local gone, d = {}, 0
    -- at[j]: the place of the j-th event in its tenant's cost lists, which
    -- hold no replayed event (60_replay.lua).
    local at, k = {}, 0
    for j = cost_at[ti] and 1 or n0 + 1, n0 do
      if not rep_at[pos + j - 1] then
        k = k + 1
        at[j] = k
      end
    end
    if #live > 0 then
      local mark = jn
      local ok, e = pcall(settle, ti, p, live, dues, at, gone)
      if ok then
        d = e
      else
        local key, why = failure(e)
        if not key then
          error(e, 0) -- not the tenant's own: the call fails
        end
        undo(mark)
        claim_failed[ti] = {key, why}
        live, gone, c = {}, {}, 0 -- its claims are decided (failed) with it
      end
    end
    if d > 0 then
      displaced[ti] = d
    end
    local keep = #live - d
    local l, drop = {}, {}
    for j = 1, n0 do
      local q = pos + j - 1
      local ri = rep_at[q]
      if ri then
        rep[#rep + 1], rep[#rep + 2], rep[#rep + 3], rep[#rep + 4] = q, replayed[ri + 1], replayed[ri + 2], replayed[ri + 3]
      elseif j > n0 - c and not gone[j] then
        rep[#rep + 1], rep[#rep + 2], rep[#rep + 3], rep[#rep + 4] = q, 5, 0, 0
        if at[j] then
          drop[at[j]] = true
        end
      elseif offs then
        l[#l + 1] = offs[ti][j]
      end
    end
    if keep > 0 then
      recs[p + 1] = recs[p + 1] - keep
      kept_any = true
      if cost_at[ti] then
        -- The claims kept leave the cost lists too: a claim whose slot was
        -- taken may come after one kept.
        cost_lists[ti] = without(costs_of(ti), recs[p] + ncap, drop)
      end
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

-- scan.reads is the most windows a take scan of a tenant with several
-- rules reads that the call had not read (besides the budget and what it
-- leaves to the tenants after it, keep: see Budget), so that its search
-- keeps most of the budget. The search jumps over a full window of a
-- coarser rule with one read; the take scan walks the finest rule's
-- windows in it, which hold the slots (a full coarser window that holds
-- now cannot be skipped: the part of its count in finest windows ahead is
-- not known). 128 walks the rest of a full minute of a 1s rule, of an hour
-- of a 1m rule, or of a day of a 1h rule, twice over.

-- take_read returns the count of rule r's window starting at rs, counting
-- a read the call had not made against the budget (and, for a tenant with
-- several rules, against scan.left and what it leaves to the tenants after
-- it, keep), or nil when the scan may read it no more.
-- For a capacity rule it returns the tenant's room there for its pos-th
-- event (room_of), as reserve reads it; a read costs scan.need, less the
-- tenant's fields of a full window that room_of did not read, unless the
-- caller reads them (booked: take_slots, where a capacity rule is the
-- finest, reads what the tenant booked there).
local function take_read(r, rs, several, keep, pos, booked)
  local need, key = scan.need(r, rs)
  if need > 0 then
    if budget < need or (several and (scan.left < need or budget - need < keep)) then
      return nil
    end
    budget, scan.left = budget - need, scan.left - need
  end
  if r.cap then
    local room = room_of(r, rs, pos)
    if need > 0 and not booked and hc[key].v[r.tf] == nil then
      -- A full window: cap_room did not read the tenant's fields.
      budget, scan.left = budget + 1, scan.left + 1
    end
    return room
  end
  return count_of(key)
end

-- coarser returns, for the finest window [s, e) at t of a tenant's rules
-- (fi: the finest; c: that window's count), whether every other rule has
-- room at t for the pos-th event (what it costs each rule), and where
-- the scan goes on: e, or the end of a full window of
-- a coarser rule that starts at first or later once the finest windows
-- read in it (seen_at, seen: per rule, its window's start and their count)
-- count as much as it does (a rule of another measure than the finest's,
-- r.mu, is never skipped); nil when the scan may read no more.
local function coarser(rules, fi, t, e, c, pos, first, seen_at, seen, several, keep)
  local room, next_t = true, e
  for ri, r in ipairs(rules) do
    if ri ~= fi and r.cap then
      -- A capacity rule: the tenant's room in its window (never skipped).
      local rs = win(r, t)
      local cr = take_read(r, rs, several, keep, pos, r.pool)
      if not cr then
        return nil
      end
      if cr < (r.costs and r.costs[pos] or 1) then
        room = false
      end
    elseif ri ~= fi then
      local rs, re = win(r, t)
      local cr = rs and take_read(r, rs, several, keep)
      if not cr then
        return nil
      end
      if seen_at[ri] ~= rs then
        seen_at[ri], seen[ri] = rs, 0
      end
      if r.mu == rules[fi].mu then
        seen[ri] = seen[ri] + c
      end
      if cr + (r.costs and r.costs[pos] or 1) > r.limit then
        room = false
        if rs >= first and seen[ri] >= cr and re > next_t and r.mu == rules[fi].mu then
          next_t = re
        end
      end
    end
  end
  return room, next_t
end

-- take_slots gives the late events of tenant ti (rest of them, the pos-th
-- on, after admission; not its displaced claims, which follow them) the
-- slots of the tenant's reservations in its finest rule's windows from
-- first on, before its first time when every rule has room (see Taking).
-- A finest window is skipped without a read once the finest windows read
-- in a full window of a coarser rule that starts at first or later count
-- as much as that window: the rest of it holds no slot. It returns the
-- takes (due, count, until each, as reserve's), what is left, and where
-- reserve goes on.
local take_slots
do
  -- take_fit returns how many of the late events, the pos-th on (rest of
  -- them), fit in order what a slot has left of each measure (left[i], of
  -- rule ms[i]: its costs, 1 an event without), and what they take of each.
  local function take_fit(ms, left, rest, pos)
    local k, us, ok = 0, {}, true
    for i = 1, #ms do
      us[i] = 0
    end
    while ok and k < rest do
      for i, r in ipairs(ms) do
        if us[i] + (r.costs and r.costs[pos + k] or 1) > left[i] then
          ok = false
        end
      end
      if ok then
        for i, r in ipairs(ms) do
          us[i] = us[i] + (r.costs and r.costs[pos + k] or 1)
        end
        k = k + 1
      end
    end
    return k, us
  end

  -- record_take adds a take to tenant's record of takes rk under the field
  -- fs of its due time: marked m (its field fs/m held mk), us[i] of measure
  -- mus[i] in that measure's pool when mus is given (m is then 3), else us[1]
  -- of measure m, and their sum in fs; the record lives record_life past the
  -- end e of the slot (see Taking, Costs).
  local function record_take(rk, fs, mk, m, mus, us, e)
    local fm = fs .. "/m"
    if mk ~= m then
      redis.call("HINCRBY", rk, fm, m - mk)
      note(4, rk, {fm, mk - m})
    end
    local u = us[1]
    if mus then
      u = 0
      for i, mu in ipairs(mus) do
        if us[i] > 0 then
          local sf = fs .. "/" .. mu
          redis.call("HINCRBY", rk, sf, us[i])
          note(4, rk, {sf, -us[i]})
          u = u + us[i]
        end
      end
    end
    if u > 0 then
      redis.call("HINCRBY", rk, fs, u)
      note(4, rk, {fs, -u})
    end
    if redis.call("PTTL", rk) < e - now + late_ms.record_life then
      redis.call("PEXPIRE", rk, num(e - now + late_ms.record_life))
    end
  end

  -- seg_slots is take_slots for a tenant that does not qualify, whose rules
  -- are aligned (see Segments; rec: rec_of's, with seg): from first on,
  -- before its first time when every rule has room, each segment [t, e)
  -- whose windows are all read within the budget (as coarser reads them)
  -- gives its reservations at t, what the home window records there less
  -- what was taken there, to the late events, in order, as many as fit in
  -- every measure. Takes are recorded as under Costs (f/m 3, a pool of each
  -- measure, f their sum). It returns what take_slots returns.
  local function seg_slots(ti, rules, rest, first, pos, keep, rec)
    local home, list = rules[rec[1]], rec[2]
    scan.left = scan.reads
    local res, rk = {}, nil
    local t = first
    while rest > 0 and t <= hend do
      -- The windows of every rule that hold t: their room for the pos-th
      -- event, and the segment's end e, the earliest of their ends.
      local room, e, hs = true, math.huge, nil
      for _, r in ipairs(rules) do
        local s, we = win(r, t)
        local c = s and take_read(r, s, true, keep, pos, false)
        if not c then
          return res, rest, t
        end
        local cost = r.costs and r.costs[pos] or 1
        if (r.cap and c < cost) or (not r.cap and c + cost > r.limit) then
          room = false
        end
        if we < e then
          e = we
        end
        if r == home then
          hs = s
        end
      end
      if room then
        break -- room: reserve goes on from here
      end
      if t >= now + late_ms.take_margin then
        -- The home window's record costs the budget one, as a window's read
        -- (a later tenant walks for nothing the capacity windows that those
        -- before it read full).
        if budget < 1 or scan.left < 1 or budget - 1 < keep then
          return res, rest, t
        end
        budget, scan.left = budget - 1, scan.left - 1
        -- Reserved at t in each measure (ins), then what was taken there.
        local fs, fields = num(t), {}
        for i, fr in ipairs(list) do
          fields[i] = fr[1] .. fs
        end
        cur = wkey(home.key, hs)
        local v = redis.call("HMGET", cur, unpack(fields))
        local ins, any = {}, false
        for i = 1, #list do
          ins[i] = tonumber(v[i]) or 0
          any = any or ins[i] > 0
        end
        local w = nil
        if any then
          rk = rk or record_key(ti)
          cur = rk
          w = redis.call("HMGET", rk, fs, fs .. "/m", fs .. "/0", fs .. "/1", fs .. "/2")
        end
        local pool = w and tonumber(w[1]) or 0
        local mk = w and tonumber(w[2]) or 0
        -- (Takes of one measure alone there: the tenant's rules changed.)
        if any and not (pool > 0 and mk ~= 3) then
          local left, ms, mus = {}, {}, {}
          for i, fr in ipairs(list) do
            left[i] = ins[i] - (pool > 0 and tonumber(w[3 + fr[3]]) or 0)
            ms[i], mus[i] = rules[fr[2]], fr[3]
          end
          local k, us = take_fit(ms, left, rest, pos)
          if k > 0 then
            record_take(rk, fs, mk, 3, mus, us, e)
            res[#res + 1], res[#res + 2], res[#res + 3] = t, k, -e
            rest, pos = rest - k, pos + k
          end
        end
      end
      t = e
    end
    return res, rest, t
  end

  take_slots = function(ti, rules, rest, first, pos, keep)
    rest = math.min(rest, recs[rec_at[ti] + 1] - (displaced[ti] or 0) - pos + 1)
    local fi, m, by = nil, 0, nil
    if take and rest > 0 then
      fi, m, by = qualifies(ti, rec_at[ti])
      if not fi and rules.rec and rules.rec.seg then
        return seg_slots(ti, rules, rest, first, pos, keep, rules.rec)
      end
    end
    if not fi then
      return none, rest, first
    end
    local f = rules[fi]
    -- What a take counts, by measure: mus[i] and the rule of its finest
    -- windows, ms[i] (one for a tenant of one measure).
    -- (lb: events known only to be at least one where f counts any, see
    -- Lower bound.)
    local mus, ms, lb = {m}, {f}, {}
    if by then
      mus, ms = {}, {}
      for mu, ri in pairs(by) do
        local r = ri == 0 and lb or rules[ri]
        if ri < 0 then
          -- What the finest window holds reserved of mu (see Reserved).
          r = {rec = "r" .. mu, costs = rules[-ri].costs}
        end
        mus[#mus + 1], ms[#ms + 1] = mu, r
      end
      for _, r in ipairs(rules) do
        r.mu = r.cap and r.cap.mu or measure_of(r.key)
        r.pool = false
      end
      for _, r in ipairs(ms) do
        r.pool = true -- (take_read: coarser reads what the tenant booked)
      end
    end
    local several = #rules > 1
    scan.left = scan.reads
    local seen_at, seen = {}, {}
    local res = {}
    local rk = nil -- the record of takes' key
    local t = first
    while rest > 0 and t <= hend do
      local s, e = win(f, t)
      local c, room
      if f.cap then
        -- A capacity rule is the finest: its window's count of the tenant's
        -- reservations is what the tenant booked there.
        local cr = take_read(f, s, several, keep, pos, true)
        if not cr then
          break
        end
        c, room = cap_booked(f, cap_win(f, s)) or 0, cr >= (f.costs and f.costs[pos] or 1)
      else
        c = s and take_read(f, s, several, keep)
        if not c then
          break
        end
        room = c + (f.costs and f.costs[pos] or 1) <= f.limit
      end
      local next_t = e
      if several then
        local others
        others, next_t = coarser(rules, fi, t, e, c, pos, first, seen_at, seen, several, keep)
        if others == nil then
          break
        end
        room = room and others
      end
      if room then
        break -- room: reserve goes on from here
      end
      if s >= now + late_ms.take_margin and c > 0 then
        -- What was taken there: in the record, and in the window by an
        -- earlier version.
        local tk = 0
        if m == 0 and not f.cap then
          cur = wkey(f.key, s)
          tk = tonumber(redis.call("HGET", cur, "taken")) or 0
        end
        local fs, fm = num(s), num(s) .. "/m"
        rk = rk or record_key(ti)
        cur = rk
        local pool = tonumber(redis.call("HGET", rk, fs)) or 0
        local mk = nil -- the measure of the takes there (read when needed)
        if pool > 0 then
          mk = tonumber(redis.call("HGET", rk, fm)) or 0
        end
        -- What was taken there by measure (tks), and what each measure's rule
        -- counts there (cs): none where takes of another measure are left
        -- (the tenant's rules changed since).
        local tks, cs = {}, {}
        local ok = not (mk and mk ~= m)
        if ok and by then
          for mu = 0, 2 do
            tks[mu] = pool > 0 and tonumber(redis.call("HGET", rk, fs .. "/" .. mu)) or 0
            ok = ok and (tks[mu] == 0 or by[mu] ~= nil)
          end
          for i, r in ipairs(ms) do
            if r == f then
              cs[i] = c
            elseif r == lb then
              cs[i] = c > 0 and 1 or 0
            elseif r.rec then
              cur = wkey(f.key, s)
              cs[i] = tonumber(redis.call("HGET", cur, r.rec)) or 0
            elseif r.cap then
              cs[i] = cap_booked(r, cap_win(r, s)) or 0 -- (its window is df's)
            else
              cs[i] = count_of(wkey(r.key, s)) -- read by coarser
            end
          end
        else
          tks[m], cs[1] = tk + pool, c
        end
        -- k events in order, of cost us[i] to each measure: as many as the
        -- slots left there hold.
        local left = {}
        for i = 1, #ms do
          left[i] = cs[i] - tks[mus[i]]
        end
        local k, us = 0, nil
        if ok then
          k, us = take_fit(ms, left, rest, pos)
        end
        if k > 0 then
          mk = mk or tonumber(redis.call("HGET", rk, fm)) or 0
          record_take(rk, fs, mk, m, by and mus, us, e)
          res[#res + 1], res[#res + 2], res[#res + 3] = s, k, -e
          rest, pos = rest - k, pos + k
        end
      end
      t = next_t
    end
    return res, rest, t
  end
end
