-- replay: the replay record of a source partition (G9: count once).
--
-- Contract. When the caller names where the call's events were consumed
-- from, the arguments after the tenants' records (ARGV[arg_recs]) are
--   ARGV[arg_recs+1] low: the source partition's committed offset as the
--             caller knows it (no replay reaches below it), or "" when the
--             call names no source (then nothing below applies and no key
--             is added)
--   ARGV[arg_recs+2] the record's lifetime (ms)
--   ARGV[arg_recs+3] ARGV[arg_recs+4] lo and hi: the lowest and the highest
--             offset of the call's events
--   ARGV[arg_recs+5] the events' offsets minus lo, a JSON array of one
--             array per tenant, in the call's order (each tenant's events in
--             order)
--   ARGV[arg_recs+6] the record's bound in bytes (see Bound)
-- and the last key is the record (limit.keys.replay: the deployment's
-- scope, the topic, its partition and Kafka's topic ID; on Redis Cluster
-- under the tenant's hash tag, so that it shares the tenant's slot). An
-- event whose offset the record holds gets
-- the decision recorded for it and counts nothing; the others are decided
-- as the header says (a tenant's n is then the number of its new events)
-- and their decisions are appended to the record, which forgets offsets
-- below low. replay_phase runs before any tenant is decided, keep_record
-- after all are.
--
-- The record is a string of chunks, one per call that decided something:
--   "<lo> <hi> <l1> <l2>\n" then l1 bytes of offsets and l2 of exceptions
-- lo and hi are that call's, offsets its offsets argument (without the
-- replayed events, if any), and exceptions a JSON array holding, for each
-- tenant whose new events were not all admitted, its number in the call,
-- then its reply's admitted, reservations, (due, count, until) per
-- reservation, rejected and full_until; or its number and -1 when it failed
-- (a failure counted nothing, so it is not recorded). A call without
-- replays stores its offsets argument as it came: only the exceptions are
-- built. A chunk whose hi is below low is dropped when the record is written.
--
-- The reply then ends, after every tenant's part, with the number of
-- replayed events and, per replayed event: its position in the call's event
-- order (0-based), its decision (1 admit, 2 defer, 3 reject: the horizon
-- is full, 4 reject: the scan limit was reached, which records written by
-- earlier versions of this script may hold), due and until (defer); and
-- last the record's highest offset once the call is done (the highest hi
-- of its chunks, -1 when it holds none), so that the caller can drop the
-- record once its commits pass it (limit.replaySweep).
--
-- Bound. The chunks kept (hi >= low) hold at most ARGV[arg_recs+6] bytes
-- before a call adds its own: a call that would add a chunk to a record
-- already at its bound decides nothing, writes nothing and fails with an
-- error starting "GKREPLAYFULL" (the caller retries the batch once its
-- commits have moved low past the oldest chunks). A call whose events are
-- all in the record adds nothing and is never refused. So a record holds
-- at most its bound plus one call's chunk, and every call's read and
-- rewrite of it is bounded by that, whatever happens to the commits.

local arg_low, arg_life, arg_lo, arg_hi, arg_offs = arg_recs + 1, arg_recs + 2, arg_recs + 3, arg_recs + 4, arg_recs + 5
local arg_bound = arg_recs + 6
local low = ARGV[arg_low]
local rkey = nil -- the record's key, when the call names a source
if low ~= "" then
  low = tonumber(low)
  rkey = KEYS[#KEYS]
end

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
-- without returns the cost lists of a tenant (see cost_lists; lists_of,
-- of nlists rules) without the j-th cost of each list for every drop[j]:
-- its replayed events here, its claims that keep their slot in
-- 85_late.lua. Rules that share a list share the new one.
local function without(lists_of, nlists, drop)
  local kept, made = {}, {}
  for ri = 1, nlists do
    local c = lists_of[ri]
    if c and not made[c] then
      local f = {}
      for j = 1, #c do
        if not drop[j] then
          f[#f + 1] = c[j]
        end
      end
      made[c] = f
    end
    kept[ri] = c and made[c]
  end
  return kept
end

-- replays looks the call's events up in the chunks that may hold them: it
-- returns the replayed ones (position, code, due, until each) and the
-- offsets of the others (as in the offsets argument), and sets each
-- tenant's n in recs to its new events. It returns nil when no chunk's
-- offsets overlap the call's.
local function replays(rec, chunks)
  local clo, chi = tonumber(ARGV[arg_lo]), tonumber(ARGV[arg_hi])
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
  local offs = cjson.decode(ARGV[arg_offs])
  local rep, fresh = {}, {}
  local pos = 0
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
    recs[rec_at[ti] + 1] = #keep
    if cost_at[ti] and #keep < #l then
      local drop = {}
      for j = 1, #l do
        drop[j] = found[clo + l[j]] and true
      end
      cost_lists[ti] = without(costs_of(ti), recs[rec_at[ti]] + ncap, drop)
    end
  end
  return rep, fresh
end

-- add_exception appends tenant ti's exception to ex, if it has one (see
-- above): its part of the reply starts at out[out_at[ti]].
local function add_exception(ex, ti)
  local o, n = out_at[ti], recs[rec_at[ti] + 1]
  if out[o] == -1 then
    ex[#ex + 1], ex[#ex + 2] = ti, -1
  elseif out[o] ~= n then
    ex[#ex + 1] = ti
    for i = o, o + 3 + 3 * out[o + 1] do
      ex[#ex + 1] = out[i]
    end
  end
end

-- exceptions returns the exceptions of a decided call.
local function exceptions()
  local ex = {}
  for ti = 1, ntenants do
    add_exception(ex, ti)
  end
  return ex
end

-- The record as read, its chunks, the replayed events and what the call
-- records of its own (see replay_phase); rec_hi is the highest offset of
-- the record as written (-1: none).
local record, chunks, replayed = "", none, none
local rec_offs, nfresh = nil, 0
local rec_hi = -1

-- replay_phase reads the record and takes the replayed events out of the
-- call. A record key of the wrong type is taken for an empty record (the
-- write replaces it). It returns an error (see Bound) when the call would
-- add a chunk to a record at its bound; it writes nothing.
local function replay_phase()
  local v = redis.pcall("GET", rkey)
  if type(v) == "string" then
    record = v
  end
  chunks = chunks_of(record)
  rec_offs, nfresh = ARGV[arg_offs], 1
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
  local kept = 0
  for _, c in ipairs(chunks) do
    if c.hi >= low then
      kept = kept + (c.s - c.h) + c.l1 + c.l2
      rec_hi = math.max(rec_hi, c.hi)
    end
  end
  local bound = tonumber(ARGV[arg_bound])
  if nfresh > 0 and kept >= bound then
    return "GKREPLAYFULL replay record " .. rkey .. " holds " .. kept .. " bytes of decisions at or above the committed offset " ..
      low .. " (bound " .. bound .. "): nothing decided until commits move past them"
  end
end

-- keep_record writes the record: the chunks that may still be replayed and
-- this call's, when the call decided something new or a chunk was dropped;
-- ex, when given, is exceptions() (the compact reply finds them on its way).
local function keep_record(ex)
  local parts, dropped = {}, false
  for _, c in ipairs(chunks) do
    if c.hi >= low then
      parts[#parts + 1] = string.sub(record, c.h, c.s + c.l1 + c.l2 - 1)
    else
      dropped = true
    end
  end
  if nfresh > 0 then
    local x = cjson.encode(ex or exceptions())
    parts[#parts + 1] = ARGV[arg_lo] .. " " .. ARGV[arg_hi] .. " " .. #rec_offs .. " " .. #x .. "\n" .. rec_offs .. x
    rec_hi = math.max(rec_hi, tonumber(ARGV[arg_hi]))
  elseif not dropped then
    return
  end
  if #parts == 0 then
    redis.call("DEL", rkey)
  else
    redis.call("SET", rkey, table.concat(parts), "PX", ARGV[arg_life])
  end
end
