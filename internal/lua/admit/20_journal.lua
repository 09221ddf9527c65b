-- journal: the call's writes, to take them back (see Failures).
--
-- Contract. Every write of a count or an anchor is noted here, newest last,
-- except the one count of each one-rule tenant decided in the fast path
-- (90_run.lua, found again from the tenant's record and reply by
-- undo_call). undo(mark)
-- takes back the writes noted after mark, newest first; it writes only keys
-- the call wrote, so it cannot meet a key of the wrong type. cur names the
-- key of the last command that may fail on a tenant's key (an error of
-- redis.call does not name its key); failure(e) tells a tenant's own
-- failure (a key of the wrong type, a count that is not an integer or
-- would overflow) from any other error.

-- Three slots per write: op, key, arg. op 1: the key did not hold a count
-- before (undo: DEL); op 2: the count grew by -arg (undo: HINCRBY arg);
-- op 3: an anchor that held arg, {start, until} or false (undo: put it back);
-- op 4: a hash field grew by -arg[2] (undo: HINCRBY arg[1] arg[2]); op 5: the
-- field arg did not exist (undo: HDEL); op 6: a field arg[1] of a capacity
-- window held arg[2], op 7: a demand histogram's field arg[1] moved by
-- arg[2], both in the call's view of the capacity's hashes alone (undo:
-- on_undo, which 35_capacity.lua sets).
local journal = {}
local jn = 0
-- on_undo, when set, is told each write undo takes back (op, key, arg), and
-- returns true when it took it back itself (35_capacity.lua: the writes it
-- keeps in the call until its end); otherwise it forgets what the call
-- read of that key.
local on_undo = false

local function note(op, key, arg)
  journal[jn + 1], journal[jn + 2], journal[jn + 3] = op, key, arg
  jn = jn + 3
end

-- undo takes back the journal's writes after mark, newest first.
local function undo(mark)
  while jn > mark do
    local op, key, arg = journal[jn - 2], journal[jn - 1], journal[jn]
    if on_undo and on_undo(op, key, arg) then
      -- A write the call kept to itself until its end (35_capacity.lua).
    elseif op == 2 then
      redis.call("HINCRBY", key, "count", arg)
    elseif op == 4 then
      redis.call("HINCRBY", key, arg[1], arg[2])
    elseif op == 5 then
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
-- is not the key's own (see Failures).
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

-- cur is the key of the last command that may fail on a tenant's key.
local cur = nil

-- failure returns the key and the fault of a tenant's failure e, or nil and
-- the error when e is not a tenant's key's own. (Redis 7 raises command
-- errors as strings, Redis 6 as {err = ...}; the script's own raise
-- {key, why}, and the fast path's {key, why, msg, at}.)
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
