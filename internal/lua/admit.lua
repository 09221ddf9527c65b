-- admit: batch admission for one or more tenants, each with one or more rules
-- and n events, in one call. For each tenant it
--   1. admits the first k of n events that fit in the current window of every
--      rule (all rules or none for each event) and counts them there; an
--      event costs an event rule 1, a byte or unit rule its cost (see Costs);
--   2. reserves slots for the rest, in event order, in the earliest future
--      windows where every rule has room, up to the horizon: a reserved event
--      is counted in the windows that contain its due time, so reservations
--      go before newer live events;
--   3. reports what did not fit within the horizon as rejected.
-- Window keys are hashes {count, expire} (expire = the window's logical end,
-- unix ms), kept for their rule's retention period after they end, as in
-- aligned_incr (the caller sizes it to the window: see limit.retention).
-- All times are unix ms from the caller's clock, passed in ARGV.
--
-- Window kinds per rule:
--   "a"  fixed step: windows base + i*step (aligned seconds and minutes; the
--        caller passes the current window's start as base)
--   "e"  explicit boundaries: b1 <= now < b2 < ... , the last > horizon end
--        (aligned hours, days, weeks, months in a time zone: DST-aware)
--   "t"  ttl: the window starts at the tenant's first event and lasts step.
--        While deferred demand exists, windows chain back to back from that
--        anchor (anchor + i*step); the chain lives in <rule key>:anchor as
--        {start, until}, until = end of the last window that holds a count.
--        Once now >= until the next event starts a new window at now.
--
-- A frontier key per tenant and rule set remembers the earliest future time
-- that may still have room: windows only fill up, so later calls start
-- their search there instead of rescanning full windows.
--
-- KEYS, per tenant in order: the frontier key, then one key per rule: the
--   rule's key prefix <prefix>:{<tenant>}:<rule>; windows are <that>:<start ms>.
--   All keys of a tenant share the {<tenant>} hash tag, so they sit in one
--   Cluster slot. The key layout is owned by internal/limit/keys.go: this
--   script only adds its two suffixes to a rule key (wkey, anchor_key, below:
--   limit.WindowSep and limit.AnchorSuffix), and TestAdmitScriptKeys checks
--   that the keys it writes are the ones keys.go builds.
--   Then, with a capacity, its keys (see capacity.lua); then, when the
--   caller names the call's source partition, the replay record key, last
--   (see Replay record below).
-- ARGV[1] now (unix ms)      ARGV[2] horizon end (now + horizon, unix ms)
-- ARGV[3] most windows one tenant may scan
-- ARGV[4] number of rule descriptors   ARGV[5] number of tenants
--   then per rule descriptor (each distinct rule once per call, whatever the
--   number of tenants it applies to):
--     limit, kind, step ms, base ms, retention ms, number of boundaries,
--     boundaries...
--   then one argument holding every tenant's record, a JSON array of numbers:
--   number of rules, n events, then per rule: descriptor index (1-based),
--   cached ttl chain start, cached chain end. (One cjson.decode costs the
--   script less than a tonumber per number.)
--   Costs: after the last tenant's record, the same array holds, for each
--   tenant with a rule that counts bytes or units (and only for those, so a
--   call of event rules alone carries nothing more): its number in the call
--   (1-based), then per rule the cost list it counts by (0: none, the rule
--   counts events, each 1; 1 or 2: the lists that follow), then its lists of
--   n costs each, in event order: whole numbers, each at most the limit of
--   every rule that counts by it (the caller rejects the others); and last
--   the negated index (1-based) in the array where these costs begin. The
--   events of such a tenant are admitted and placed as a prefix: an event
--   goes only where every rule has room for its cost, and no event goes
--   before an earlier one of its tenant.
--   The cached chain (0 0 when unknown; used only for a tenant with one ttl
--   rule) is what an earlier reply said the tenant's <rule key>:anchor held:
--   a chain is never moved before its end, so while now < end its start is
--   still the anchor's and the anchor need not be read. The end may since have
--   grown; the script reads the anchor before writing it, and before trusting
--   the cache to open a window (a lost anchor then starts a new chain).
--   Then, with a source partition, the replay arguments (see Replay record).
--   Then, with a capacity, its arguments (see capacity.lua).
-- Reply: one flat array, per tenant in order:
--   admitted, reservations, due_1, count_1, until_1, ..., rejected, full_until,
--   then chain start, chain end per rule for ttl rules
--   where until_i is the end of the reserved slot (the earliest end of the
--   windows it was counted in), and full_until is, when events were rejected
--   because every window up to the horizon is full, the first time at which a
--   window might have room (0 otherwise). The chain end may be lower than the
--   anchor's (another caller extended it); it is never higher.
--   A tenant whose keys failed it is instead: -1, the key, what is wrong
--   with it ("has the wrong type", "holds a count that is not an integer").
--   With a source partition the reply ends with the replayed events (see
--   Replay record).
--
-- Failures. Redis does not roll a script back, so the script keeps a journal
-- of its writes and takes them back itself: a call never half-applies. (The
-- one count of a tenant decided in the fast path is not journaled, to keep
-- that path short: it is found again from the tenant's record and reply.)
--   - An error of a tenant's own key (WRONGTYPE; a count that is not an
--     integer or would overflow) is that tenant's failure: what the call
--     wrote for the tenant is taken back, the reply says which key, and the
--     other tenants go on. No extra command checks a key beforehand: the
--     read or write that meets it fails without effect.
--   - Any other error (OOM, READONLY, MISCONF, which Redis raises only
--     before a call's first write; a cluster slot on the move; a bug) takes
--     back everything the call wrote and ends it with that error, so the
--     caller can retry the batch without counting any event twice.
--
-- Lua numbers are doubles: whole milliseconds below 2^53 are exact.

local now = tonumber(ARGV[1])
local hend = tonumber(ARGV[2])
local maxscan = tonumber(ARGV[3])
local ndescs = tonumber(ARGV[4])
local ntenants = tonumber(ARGV[5])

local counts = {}
local none = {} -- an empty list, never written
local out = {}

-- The journal of the call's writes, newest last, three slots each: op, key,
-- arg. op 1: the key did not hold a count before (undo: DEL); op 2: the
-- count grew by -arg (undo: HINCRBY arg); op 3: an anchor that held arg,
-- {start, until} or false (undo: put it back); op 4: a hash field grew by
-- -arg[2] (undo: HINCRBY arg[1] arg[2]); op 5: the field arg did not exist
-- (undo: HDEL). (Ops 4 and 5 are the capacity's.)
local journal = {}
local jn = 0

local function note(op, key, arg)
  journal[jn + 1], journal[jn + 2], journal[jn + 3] = op, key, arg
  jn = jn + 3
end

-- undo takes back the journal's writes after mark, newest first. It writes
-- only keys the call wrote, so it cannot meet a key of the wrong type.
local function undo(mark)
  while jn > mark do
    local op, key, arg = journal[jn - 2], journal[jn - 1], journal[jn]
    counts[key] = nil -- capacity: a shared key is read again after an undo
    if op == 2 then
      redis.call("HINCRBY", key, "count", arg)
    elseif op == 4 then -- capacity: a field grew by -arg[2]
      redis.call("HINCRBY", key, arg[1], arg[2])
    elseif op == 5 then -- capacity: a field did not exist
      redis.call("HDEL", key, arg)
    elseif op == 3 and arg then
      redis.call("HSET", key, "start", arg[1], "until", arg[2])
      redis.call("PEXPIRE", key, string.format("%.0f", tonumber(arg[2]) - now + 1000))
    else
      redis.call("DEL", key)
    end
    jn = jn - 3
  end
end

-- fault words an error of a key as a reply says it, or nil when the error
-- is not the key's own (see Failures above).
local function fault(err)
  if string.find(err, "WRONGTYPE", 1, true) then
    return "has the wrong type"
  elseif string.find(err, "hash value is not an integer", 1, true) then
    return "holds a count that is not an integer"
  elseif string.find(err, "increment or decrement would overflow", 1, true) then
    return "holds a count that would overflow"
  end
  return nil
end

-- cur is the key of the last command that may fail on a tenant's key: an
-- error of redis.call does not name its key, and a failure's reply does.
local cur = nil

-- wkey is the key of the window starting at s of the rule whose key prefix
-- is prefix (limit.WindowSep in internal/limit/keys.go). Times are whole
-- numbers below 1e14, which Lua writes without exponent or decimals.
local function wkey(prefix, s)
  return prefix .. ":" .. s
end

-- anchor_key is the key of rule r's ttl chain (limit.AnchorSuffix in
-- internal/limit/keys.go).
local function anchor_key(r)
  return r.key .. ":anchor"
end

-- incr adds by to a window's count and journals it.
local function incr(key, by)
  cur = key
  local c = redis.call("HINCRBY", key, "count", by)
  if c == by then
    note(1, key, false)
  else
    note(2, key, -by)
  end
  return c
end

-- opened gives a window just opened by incr its logical end e and its
-- physical expiry, e plus its rule's retention ret.
local function opened(key, e, ret)
  redis.call("HSET", key, "expire", e)
  redis.call("PEXPIRE", key, e - now + ret)
end

-- count_of reads a window's live count once per call and caches it.
local function count_of(key)
  local c = counts[key]
  if c == nil then
    cur = key
    local v = redis.call("HMGET", key, "count", "expire")
    local e = tonumber(v[2])
    c = 0
    if e and now < e and v[1] then
      c = tonumber(v[1])
      if not c or c % 1 ~= 0 then
        error({key = key, why = "holds a count that is not an integer"})
      end
    end
    counts[key] = c
  end
  return c
end

-- @capacity.lua (the shared capacity's part is joined here: lua.go)

-- add counts `by` events in the window [s, e) of rule r.
local function add(r, s, e, by)
  if r.cap then -- capacity
    return cap_add(r, s, e, by)
  end
  local key = wkey(r.key, s)
  local c = count_of(key)
  if c == 0 then
    redis.call("HSET", key, "count", by, "expire", e)
    redis.call("PEXPIRE", key, e - now + r.ret)
    journal[jn + 1], journal[jn + 2], journal[jn + 3] = 1, key, false
  else
    cur = key
    redis.call("HINCRBY", key, "count", by)
    journal[jn + 1], journal[jn + 2], journal[jn + 3] = 2, key, -by
  end
  jn = jn + 3
  counts[key] = c + by
  if e > r.maxend then
    r.maxend = e
  end
end

-- win returns the window [s, e) of rule r that holds time t, or nil when t is
-- past the boundaries given. Calls for one rule come with t not decreasing.
local function win(r, t)
  if r.kind == "e" then
    local b = r.bounds
    local i = r.hint
    while i < #b and b[i + 1] <= t do
      i = i + 1
    end
    if i >= #b or t < b[i] then
      return nil
    end
    r.hint = i
    return b[i], b[i + 1]
  end
  local s = r.base + math.floor((t - r.base) / r.step) * r.step
  return s, s + r.step
end

-- anchor reads rule r's ttl chain from Redis: it continues while now is
-- before its end; otherwise the next window starts a new chain at now. The
-- anchor as read is kept in r.old, for the journal.
local function anchor(r)
  cur = anchor_key(r)
  local v = redis.call("HMGET", cur, "start", "until")
  local st, un = tonumber(v[1]), tonumber(v[2])
  r.cached = false
  r.old = v
  if st and un and now < un then
    r.base, r.chainend = st, un
  else
    r.base, r.chainend = now, now
  end
end

-- Rule descriptors, parsed once per call.
local descs = {}
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
    ret = tonumber(ARGV[a + 4]), bounds = bounds, hint = 1, cs = 0, ce = 0,
  }
  if d.kind ~= "t" then
    -- The current window is the same for every tenant of an aligned rule.
    d.cs, d.ce = win(d, now)
  end
  descs[di] = d
  a = a + 6 + nb
end

-- The tenants' records (see above).
local recs = cjson.decode(ARGV[a])

-- weights[ti] holds, for a tenant with costs (see Costs above), per rule
-- its cost list (a table: the j-th event costs w[ri][j]; rules that count
-- by one list share it), or false for an event rule.
local weights = {}
if (recs[#recs] or 0) < 0 then
  local p, q = -recs[#recs], 1 -- the first costs, the first record
  for ti = 1, ntenants do
    if recs[p] == ti then
      local nrules, n = recs[q], recs[q + 1]
      local w, lists = {}, {}
      for ri = 1, nrules do
        local l = recs[p + ri]
        if l > 0 and not lists[l] then
          local list, at = {}, p + nrules + (l - 1) * n
          for j = 1, n do
            list[j] = recs[at + j]
          end
          lists[l] = list
        end
        w[ri] = l > 0 and lists[l]
      end
      weights[ti] = w
      p = p + 1 + nrules + #lists * n
    end
    q = q + 2 + 3 * recs[q]
  end
end

-- Replay record (G9: count once). When the caller names where the call's
-- events were consumed from, the arguments after the tenants' records are
--   ARGV[a+1] low: the source partition's committed offset as the caller
--             knows it (no replay reaches below it), or "" when the call
--             names no source (then nothing below applies and no key is added)
--   ARGV[a+2] the record's lifetime (ms)
--   ARGV[a+3] ARGV[a+4] lo and hi: the lowest and the highest offset of the
--             call's events
--   ARGV[a+5] the events' offsets minus lo, a JSON array of one array per
--             tenant, in the call's order (each tenant's events in order)
-- and the last key is the record: <prefix>:replay:<topic>:<partition> (on
-- Redis Cluster <prefix>:{<tenant>}:replay:<topic>:<partition>, so that it
-- shares the tenant's slot). An event whose offset the record holds gets
-- the decision recorded for it and counts nothing; the others are decided
-- as above (a tenant's n is then the number of its new events) and their
-- decisions are appended to the record, which forgets offsets below low.
--
-- The record is a string of chunks, one per call that decided something:
--   "<lo> <hi> <l1> <l2>\n" then l1 bytes of offsets and l2 of exceptions
-- lo and hi are that call's, offsets its ARGV[a+5] (without the replayed
-- events, if any), and exceptions a JSON array holding, for each tenant
-- whose new events were not all admitted, its number in the call, then its
-- reply's admitted, reservations, (due, count, until) per reservation,
-- rejected and full_until; or its number and -1 when it failed (a failure
-- counted nothing, so it is not recorded). A call without replays stores
-- its offsets argument as it came: only the exceptions are built.
-- A chunk whose hi is below low is dropped when the record is written.
--
-- The reply then ends, after every tenant's part, with the number of
-- replayed events and, per replayed event: its position in the call's event
-- order (0-based), its decision (1 admit, 2 defer, 3 reject: the horizon
-- is full, 4 reject: the scan limit was reached), due and until (defer).
local low = ARGV[a + 1]
local rkey = nil
if low ~= "" then
  low = tonumber(low)
  rkey = KEYS[#KEYS]
end
cap_parse(a + (rkey and 6 or 2)) -- capacity: its arguments follow

-- chunks_of returns the chunks of record rec: {lo, hi, h (where the header
-- starts), s (where the offsets start), l1, l2}. A damaged record is read
-- up to the damage.
local function chunks_of(rec)
  local cs, i = {}, 1
  while i <= #rec do
    local lo, hi, l1, l2, s = string.match(rec, "^(%d+) (%d+) (%d+) (%d+)\n()", i)
    if not lo then
      break
    end
    local c = {lo = tonumber(lo), hi = tonumber(hi), h = i, s = s, l1 = tonumber(l1), l2 = tonumber(l2)}
    i = s + c.l1 + c.l2
    if i - 1 > #rec then
      break
    end
    cs[#cs + 1] = c
  end
  return cs
end

-- The recorded decision of an admitted event, shared.
local admitted_once = {1, 0, 0}

-- learn adds the decisions of chunk c of record rec to found, by offset:
-- {code, due, until} as the reply gives them.
local function learn(rec, c, found)
  local offs = cjson.decode(string.sub(rec, c.s, c.s + c.l1 - 1))
  local ex = cjson.decode(string.sub(rec, c.s + c.l1, c.s + c.l1 + c.l2 - 1))
  local exc, i = {}, 1
  while i <= #ex do
    if ex[i + 1] == -1 then
      exc[ex[i]] = false
      i = i + 2
    else
      exc[ex[i]] = i + 1
      i = i + 5 + 3 * ex[i + 2]
    end
  end
  local lo = c.lo
  for ti = 1, #offs do
    local l, x = offs[ti], exc[ti]
    if x == nil then
      for j = 1, #l do
        found[lo + l[j]] = admitted_once
      end
    elseif x then
      local j, nres = 1, ex[x + 1]
      for _ = 1, ex[x] do
        found[lo + l[j]] = admitted_once
        j = j + 1
      end
      for r = 0, nres - 1 do
        local d = {2, ex[x + 2 + 3 * r], ex[x + 4 + 3 * r]}
        for _ = 1, ex[x + 3 + 3 * r] do
          found[lo + l[j]] = d
          j = j + 1
        end
      end
      local d = {4, 0, 0}
      if ex[x + 3 + 3 * nres] > 0 then
        d[1] = 3
      end
      for _ = 1, ex[x + 2 + 3 * nres] do
        found[lo + l[j]] = d
        j = j + 1
      end
    end
  end
end

-- unreplayed returns the cost lists w of a tenant (see weights) without
-- the costs of its replayed events: those of its offsets l (minus clo)
-- that found holds. Rules that share a list share the new one.
local function unreplayed(w, l, found, clo)
  local out, made = {}, {}
  for ri = 1, #w do
    local c = w[ri]
    if c and not made[c] then
      local f = {}
      for j = 1, #l do
        if not found[clo + l[j]] then
          f[#f + 1] = c[j]
        end
      end
      made[c] = f
    end
    out[ri] = c and made[c]
  end
  return out
end

-- replays looks the call's events up in the chunks that may hold them: it
-- returns the replayed ones (position, code, due, until each) and the
-- offsets of the others (as in ARGV[a+5]), and sets each tenant's n in
-- recs to its new events. It returns nil when no chunk's offsets overlap
-- the call's.
local function replays(rec, chunks)
  local clo, chi = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local found = nil
  for _, c in ipairs(chunks) do
    if c.lo <= chi and c.hi >= clo then
      found = found or {}
      learn(rec, c, found)
    end
  end
  if not found then
    return nil
  end
  local offs = cjson.decode(ARGV[a + 5])
  local rep, fresh = {}, {}
  local pos, p = 0, 1
  for ti = 1, ntenants do
    local l, keep = offs[ti], {}
    for j = 1, #l do
      local d = found[clo + l[j]]
      if d then
        local r = #rep
        rep[r + 1], rep[r + 2], rep[r + 3], rep[r + 4] = pos, d[1], d[2], d[3]
      else
        keep[#keep + 1] = l[j]
      end
      pos = pos + 1
    end
    fresh[ti] = keep
    recs[p + 1] = #keep
    if weights[ti] and #keep < #l then
      weights[ti] = unreplayed(weights[ti], l, found, clo)
    end
    p = p + 2 + 3 * recs[p]
  end
  return rep, fresh
end

-- exceptions returns the exceptions of a decided call (see Replay record).
local function exceptions()
  local ex, o, p = {}, 1, 1
  for ti = 1, ntenants do
    local nrules, n = recs[p], recs[p + 1]
    if out[o] == -1 then
      ex[#ex + 1], ex[#ex + 2] = ti, -1
      o = o + 3
    else
      local w = 4 + 3 * out[o + 1]
      if out[o] ~= n then
        ex[#ex + 1] = ti
        for i = o, o + w - 1 do
          ex[#ex + 1] = out[i]
        end
      end
      o = o + w
      if descs[recs[p + 2]].kind == "t" then
        o = o + 2 * nrules
      end
    end
    p = p + 2 + 3 * nrules
  end
  return ex
end

-- The record as read, its chunks, the replayed events and what the call
-- records of its own (see replay_phase).
local record, chunks, replayed = "", none, none
local rec_offs, nfresh = nil, 0

-- replay_phase reads the record and takes the replayed events out of the
-- call. A record key of the wrong type is taken for an empty record (the
-- write replaces it).
local function replay_phase()
  local v = redis.pcall("GET", rkey)
  if type(v) == "string" then
    record = v
  end
  chunks = chunks_of(record)
  rec_offs, nfresh = ARGV[a + 5], 1
  local rep, fresh = replays(record, chunks)
  if rep and #rep > 0 then
    replayed, nfresh = rep, 0
    for ti = 1, #fresh do
      nfresh = nfresh + #fresh[ti]
    end
    if nfresh > 0 then
      rec_offs = cjson.encode(fresh) -- (an empty list comes out as {}: read back the same)
    end
  end
end

-- keep_record writes the record: the chunks that may still be replayed and
-- this call's, when the call decided something new or a chunk was dropped.
local function keep_record()
  local parts, dropped = {}, false
  for _, c in ipairs(chunks) do
    if c.hi >= low then
      parts[#parts + 1] = string.sub(record, c.h, c.s + c.l1 + c.l2 - 1)
    else
      dropped = true
    end
  end
  if nfresh > 0 then
    local x = cjson.encode(exceptions())
    parts[#parts + 1] = ARGV[a + 3] .. " " .. ARGV[a + 4] .. " " .. #rec_offs .. " " .. #x .. "\n" .. rec_offs .. x
  elseif not dropped then
    return
  end
  if #parts == 0 then
    redis.call("DEL", rkey)
  else
    redis.call("SET", rkey, table.concat(parts), "PX", ARGV[a + 2])
  end
end

-- reply appends a tenant's decision to out: admitted, the reservations
-- (due, count, until each), rejected, full_until, then the chains of its
-- ttl rules.
local function reply(admitted, res, rest, full, rules)
  local o = #out
  out[o + 1] = admitted
  out[o + 2] = #res / 3
  for i = 1, #res do
    out[o + 2 + i] = res[i]
  end
  o = o + 2 + #res
  out[o + 1] = rest
  out[o + 2] = full
  o = o + 2
  for ri = 1, #rules do
    local r = rules[ri]
    if r.kind == "t" then
      out[o + 1] = r.base
      out[o + 2] = r.chainend
      o = o + 2
    end
  end
end

-- rules_of returns the state of a tenant's rules, whose record entries
-- start at recs[q] and keys at KEYS[k], and whose costs are w (nil: none):
-- ttl rules with their chain, from the cache for a tenant with one rule and
-- no costs while the chain runs, else from the anchor; every rule with its
-- current window [cs, ce) and its cost list (cost: see weights).
local function rules_of(k, q, nrules, w)
  local rules = {}
  for ri = 1, nrules do
    local d, cst, cend = descs[recs[q]], recs[q + 1], recs[q + 2]
    local r = {
      limit = d.limit, kind = d.kind, step = d.step, base = d.base,
      ret = d.ret, bounds = d.bounds, key = KEYS[k + ri - 1], hint = 1, maxend = 0,
      cached = false, chainend = 0, cs = 0, ce = 0, ts = 0, te = 0,
      cost = w and w[ri], room = 0, take = 0,
    }
    if r.kind == "t" then
      if nrules == 1 and not w and cend > now then
        r.base, r.chainend, r.cached = cst, cend, true
      else
        anchor(r)
      end
    end
    r.cs, r.ce = win(r, now)
    rules[ri] = r
    q = q + 3
  end
  if ncap > 0 then -- capacity: the tenant (cap_ti, see run) shares it
    cap_rules(rules, cap_ti)
  end
  return rules
end

-- admit_one admits what fits of n events of a one-rule tenant in the
-- current window and counts them there: it counts all n (c: the count the
-- fast path already made) and gives back what did not fit, one call when
-- everything fits. A current window's key is never past its expiry (keys
-- carry their window's start), so the count read is live.
local function admit_one(r, n, c)
  local key = wkey(r.key, r.cs)
  c = c or incr(key, n)
  if c == n and r.cached then
    -- The window was empty and the chain is known only from the cache:
    -- check the anchor before counting there.
    local cst = r.base
    anchor(r)
    if r.base ~= cst then
      -- The chain is gone (lost keys): undo (the window held nothing
      -- before) and count in the chain that starts now.
      redis.call("DEL", key)
      r.cs, r.ce = win(r, now)
      key = wkey(r.key, r.cs)
      c = incr(key, n)
    end
  end
  if c == n then
    opened(key, r.ce, r.ret)
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
  -- (No need to remember the count: with one rule the search below starts
  -- after the current window.)
  if admitted > 0 and r.ce > r.maxend then
    r.maxend = r.ce
  end
  return admitted
end

-- fit returns how many of a tenant's events from the pos-th on, at most k,
-- fit in order in the room of every rule (r.room), and sets each rule's
-- take to what they cost it: 1 an event for an event rule, their costs for
-- a rule with a cost list.
local function fit(rules, pos, k)
  for _, r in ipairs(rules) do
    if not r.cost and r.room < k then
      k = r.room
    end
  end
  if k < 0 then
    k = 0
  end
  for _, r in ipairs(rules) do
    local c = r.cost
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
    local c = r.cost
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

-- blocked returns the latest end of the windows [r.ts, r.te) whose room
-- left (r.room less what was just taken: r.take for a rule with costs,
-- take for an event rule) is less than the pos-th event costs their rule
-- (1 for every rule when there is no such event): the earliest time at
-- which that event may fit, or 0.
local function blocked(rules, pos, take, next)
  local jump = 0
  for _, r in ipairs(rules) do
    local need, left = 1, r.room - take
    if r.cost then
      left = r.room - r.take
      if next then
        need = r.cost[pos]
      end
    end
    if need > left and r.te > jump then
      jump = r.te
    end
  end
  return jump
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

-- admit_all admits, for a tenant with several rules or with costs, the
-- first of n events that fit in the current window of every rule, and
-- counts them there.
local function admit_all(rules, n)
  for _, r in ipairs(rules) do
    r.room = room_of(r, r.cs) -- capacity: was r.limit - count_of(wkey(r.key, r.cs))
  end
  local admitted = fit(rules, 1, n)
  if admitted > 0 then
    for _, r in ipairs(rules) do
      if r.take > 0 then
        add(r, r.cs, r.ce, r.take)
      end
    end
  end
  return admitted
end

-- reserve reserves rest events, the pos-th on, in order, in the earliest
-- windows from first on where every rule has room for them (w: the
-- tenant has costs), up to the horizon, and moves the tenant's frontier
-- (key fkey). It returns the reservations (due, count, until each), what
-- is left and where the search stopped.
local function reserve(rules, fkey, rest, first, pos, w)
  local res = none
  local t = first
  if rest > 0 then
    res = {}
    cur = fkey
    local fr = tonumber(redis.call("GET", fkey))
    if fr and fr > t then
      t = fr
    end
  end
  local scans = 0
  while rest > 0 and t <= hend and scans < maxscan do
    scans = scans + 1
    -- The windows of every rule that hold t (kept in r.ts, r.te), their
    -- room (r.room), the least room, the earliest end.
    local minroom, untilt = math.huge, math.huge
    local past = false
    for _, r in ipairs(rules) do
      local s, e = win(r, t)
      if not s then
        past = true
        break
      end
      r.ts, r.te = s, e
      local room = room_of(r, s) -- capacity: was r.limit - count_of(wkey(r.key, s))
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
    -- Event rules alone: as many as the least room (fit, inline).
    local take = rest
    if w then
      take = fit(rules, pos, rest)
    elseif minroom < take then
      take = minroom > 0 and minroom or 0
    end
    if take > 0 then
      for _, r in ipairs(rules) do
        local by = r.cost and r.take or take
        if by > 0 then
          add(r, r.ts, r.te, by)
        end
      end
      res[#res + 1] = t
      res[#res + 1] = take
      res[#res + 1] = untilt
      rest, pos = rest - take, pos + take
    end
    -- On past the windows too full for the next event; when all are
    -- placed, past those they filled, for the next call.
    local jump = blocked(rules, pos, take, rest > 0)
    if jump > 0 then
      t = jump
    end
  end
  if t > first then
    redis.call("SET", fkey, string.format("%.0f", t), "PX", string.format("%.0f", t - now + 1000))
    note(1, fkey, false) -- a frontier is a hint: none is always safe
  end
  return res, rest, t
end

-- keep_chains keeps ttl chains alive while any of their windows holds a
-- count. A cached chain end may be behind the anchor's: read it before
-- extending.
local function keep_chains(rules)
  for ri = 1, #rules do
    local r = rules[ri]
    if r.kind == "t" and r.maxend > r.chainend then
      local akey = anchor_key(r)
      if r.cached then
        cur = akey
        r.old = redis.call("HMGET", akey, "start", "until")
        local un = tonumber(r.old[2])
        if un and un > r.chainend then
          r.chainend = un
        end
      end
      if r.maxend > r.chainend then
        local v = r.old
        note(3, akey, tonumber(v[1]) and tonumber(v[2]) and v or false)
        redis.call("HSET", akey, "start", string.format("%.0f", r.base), "until", string.format("%.0f", r.maxend))
        redis.call("PEXPIRE", akey, string.format("%.0f", r.maxend - now + 1000))
        r.chainend = r.maxend
      end
    end
  end
end

-- decide decides the n events of the tenant whose record starts at recs[p],
-- keys at KEYS[k] and costs are w (nil: none; c: what the fast path
-- counted, if anything), and appends its reply to out.
local function decide(k, p, nrules, n, c, w)
  local fkey = KEYS[k]
  local rules = rules_of(k + 1, p + 2, nrules, w)
  -- 1. admit into the current windows.
  local admitted
  if nrules == 1 and not w and ncap == 0 then -- capacity: not alone
    admitted = admit_one(rules[1], n, c)
  else
    admitted = admit_all(rules, n)
  end
  local first = math.huge
  for ri = 1, #rules do -- capacity: its rules too (#rules, was nrules)
    if rules[ri].ce < first then
      first = rules[ri].ce
    end
  end
  -- 2. reserve the rest in the earliest future windows with room.
  local res, rest, t = reserve(rules, fkey, n - admitted, first, admitted + 1, w)
  keep_chains(rules)
  if ncap > 0 then -- capacity: what the tenant was refused now
    cap_done(rules, n, admitted)
  end
  -- 3. what is left is rejected.
  local full = 0
  if rest > 0 and t > hend then
    full = t
  end
  reply(admitted, res, rest, full, rules)
end

-- Where the tenant in decide stands: {its number, its record (recs[at[2]]),
-- its first key (KEYS[at[3]]), where its writes (journal) and its reply
-- (out) begin}, for a failure in decide. A table, not locals: the embedded
-- Lua of make demo (gopher-lua) does not keep a local shared with a closure
-- once an error has unwound it. (A failure in the fast path raises its own.)
local at = {0, 0, 0, 0, 0}

-- slow[ti] is true for the tenants that went to decide or failed: the
-- others were decided in the fast path, whose one count is not journaled
-- (see undo_call).
local slow = {}

-- idle replies for a tenant without new events (the ti-th, record at
-- recs[p], reply at out[o + 1]): nothing decided, its ttl chains as cached.
local function idle(ti, p, o)
  slow[ti] = true -- nothing to take back
  out[o + 1], out[o + 2], out[o + 3], out[o + 4] = 0, 0, 0, 0
  if descs[recs[p + 2]].kind == "t" then
    o = o + 4
    for q = p + 3, p + 3 * recs[p], 3 do
      out[o + 1], out[o + 2] = recs[q], recs[q + 1]
      o = o + 2
    end
  end
  return true
end

-- run decides the tenants from the ti-th on (record at recs[p], first key
-- KEYS[k]). An error stops it at the failing tenant, which the loop below
-- fails alone, or the whole call with it.
--
-- Fast path, inline (most tenants take it, and here a Lua call or a table
-- write shows): a tenant with one rule whose current window is known
-- without reading Redis (aligned; ttl with a cached chain that already
-- covers the current window) is counted optimistically, by the events'
-- total cost for a rule with costs; when everything fits and no window
-- opens in a cached chain, that is the whole decision. Otherwise decide
-- goes on from the count made (with costs, from the count taken back).
local function run(ti, p, k)
  local recs, descs, out, journal, keys = recs, descs, out, journal, KEYS -- registers, not upvalues
  for ti = ti, ntenants do
    local nrules, n = recs[p], recs[p + 1]
    local mark, o = jn, #out
    local c, done = nil, false
    local w = weights[ti]
    if n == 0 then
      -- Every event of the tenant was replayed: nothing to decide.
      done = idle(ti, p, o)
    elseif nrules == 1 and ncap == 0 then -- capacity: no fast path
      local d, cst, cend = descs[recs[p + 2]], recs[p + 3], recs[p + 4]
      local cs, ce = nil, nil
      if d.kind ~= "t" then
        cend = nil
        cs, ce = d.cs, d.ce
      elseif cend > now then
        cs = cst + math.floor((now - cst) / d.step) * d.step
        ce = cs + d.step
      end
      local by = n -- what the events cost the rule
      if w then
        by = total(w[1], n, d.limit)
      end
      if cs and (not cend or ce <= cend) and by <= d.limit then
        local key = keys[k + 1] .. ":" .. cs -- wkey, inline
        c = redis.pcall("HINCRBY", key, "count", by)
        if type(c) == "table" then -- it wrote nothing
          error({key = key, why = fault(c.err), msg = c.err, at = {ti, p, k, mark, o}})
        end
        if c <= d.limit and (c ~= by or not cend) then
          if c == by then
            opened(key, ce, d.ret)
          end
          out[o + 1], out[o + 2], out[o + 3], out[o + 4] = n, 0, 0, 0
          if cend then
            out[o + 5], out[o + 6] = cst, cend
          end
          done = true
        elseif w then
          -- Costs are decided from the counts as they were: take this back.
          if c == by then
            redis.call("DEL", key)
          else
            redis.call("HINCRBY", key, "count", -by)
          end
          c = nil
        else
          journal[jn + 1], journal[jn + 2], journal[jn + 3] = c == n and 1 or 2, key, -n -- incr, inline
          jn = jn + 3
        end
      end
    end
    if not done then
      slow[ti] = true
      at[1], at[2], at[3], at[4], at[5] = ti, p, k, mark, o
      cap_ti = ti -- capacity
      decide(k, p, nrules, n, c, w)
    end
    k, p = k + 1 + nrules, p + 2 + 3 * nrules
  end
end

-- undo_call takes back every write of the call: the journal's, and the
-- count of each tenant decided in the fast path, n events (or their total
-- cost) in the window that holds now, found from the tenants' records and
-- replies in out.
local function undo_call()
  undo(0)
  local p, k, o = 1, 1, 1
  for ti = 1, ntenants do
    if out[o] == nil then
      return -- ti and the tenants after it were not decided
    end
    local nrules, n = recs[p], recs[p + 1]
    local d = descs[recs[p + 2]]
    if not slow[ti] then
      local cs = d.cs
      if d.kind == "t" then
        cs = recs[p + 3] + math.floor((now - recs[p + 3]) / d.step) * d.step
      end
      local key = wkey(KEYS[k + 1], cs)
      local by = n
      if weights[ti] then
        by = total(weights[ti][1], n, d.limit)
      end
      if redis.call("HINCRBY", key, "count", -by) <= 0 then
        redis.call("DEL", key)
      end
    end
    if out[o] == -1 then
      o = o + 3
    else
      o = o + 4 + 3 * out[o + 1]
      if d.kind == "t" then
        o = o + 2 * nrules
      end
    end
    k, p = k + 1 + nrules, p + 2 + 3 * nrules
  end
end

-- failure returns the key and the fault of a tenant's failure e, or nil and
-- the error when e is not a tenant's key's own. (Redis 7 raises command
-- errors as strings, Redis 6 as {err = ...}.)
local function failure(e)
  local key, msg = cur, e
  if type(e) == "table" then
    if e.why then
      return e.key, e.why
    end
    key, msg = e.key or cur, e.msg or e.err
  end
  msg = tostring(msg)
  local why = fault(msg)
  if why and key then
    return key, why
  end
  return nil, msg
end

-- finish records the call's decisions and ends the reply with the
-- replayed events; a failure to write the record takes the call back.
local function finish()
  if rkey then
    local ok, e = pcall(keep_record)
    if not ok then
      undo_call()
      return redis.error_reply(tostring(type(e) == "table" and (e.err or e.msg) or e))
    end
  end
  local o = #out
  out[o + 1] = #replayed / 4
  for i = 1, #replayed do
    out[o + 1 + i] = replayed[i]
  end
  return out
end

if rkey then
  replay_phase()
end
local ti, p, k = 1, 1, 1
while true do
  local ok, e = pcall(run, ti, p, k)
  if ok then
    return finish()
  end
  local key, why = failure(e)
  if not key then
    undo_call()
    return redis.error_reply(why)
  end
  local pos = type(e) == "table" and e.at or at
  local mark, o = pos[4], pos[5]
  ti, p, k = pos[1], pos[2], pos[3]
  undo(mark)
  for i = #out, o + 1, -1 do
    out[i] = nil
  end
  out[o + 1], out[o + 2], out[o + 3] = -1, key, why
  slow[ti] = true
  local nrules = recs[p]
  ti, p, k = ti + 1, p + 2 + 3 * nrules, k + 1 + nrules
end
