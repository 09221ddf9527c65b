-- replay_drop: deletes the replay record KEYS[1] (see admit/60_replay.lua)
-- once every decision it holds is at an offset below ARGV[1], the source
-- partition's committed offset as the caller knows it: no replay reaches
-- below it, so the record protects nothing any more. A record that holds a
-- chunk at or above it (decisions of a later call, this owner's or the
-- partition's next owner's), or that cannot be read whole, is left as it
-- is: it expires with its lifetime. Reply: 1 when the record was deleted,
-- 0 otherwise.
-- The work is bounded by the record, which admit bounds (see its Bound).
local rec = redis.pcall("GET", KEYS[1])
if type(rec) ~= "string" then
  return 0
end
local low = tonumber(ARGV[1])
local i = 1
while i <= #rec do
  local hi, l1, l2, s = string.match(rec, "^%d+ (%d+) (%d+) (%d+)\n()", i)
  if not hi or tonumber(hi) >= low then
    return 0
  end
  i = s + tonumber(l1) + tonumber(l2)
end
redis.call("DEL", KEYS[1])
return 1
