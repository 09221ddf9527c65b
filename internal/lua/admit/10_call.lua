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
-- The work of a call is bounded by its batch (G11), never by the horizon or
-- the windows' length: see Budget.
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
--   Then, when the caller names the call's source partition, the replay
--   record key, last (see Replay record below).
-- ARGV[1] now (unix ms)      ARGV[2] horizon end (now + horizon, unix ms)
-- ARGV[3] the call's budget of window reads (see Budget)
-- ARGV[4] number of rule descriptors   ARGV[5] number of tenants, negated
--   when the caller asks for the full reply (see Reply)
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
--   call of event rules alone carries nothing more; a capacity of bytes or
--   units gives every tenant costs): its number in the call
--   (1-based), then per rule the cost list it counts by (0: none, the rule
--   counts events, each 1; 1 or 2: the lists that follow; with a capacity,
--   its own rules and then each capacity rule), then its lists of
--   n costs each, in event order: whole numbers, each at most the limit of
--   every rule that counts by it (the caller rejects the others); and last
--   the negated index (1-based) in the array where these costs begin. The
--   events of such a tenant are admitted and placed as a prefix: an event
--   goes only where every rule has room for its cost, and no event goes
--   before an earlier one of its tenant.
--   The cached chain (0 0 when unknown; ttl rules only) is what an earlier reply said the tenant's <rule key>:anchor held:
--   a chain is never moved before its end, so while now < end its start is
--   still the anchor's and the anchor need not be read. The end may since have
--   grown; the script reads the anchor before writing it, and before trusting
--   the cache to open a window (a lost anchor then starts a new chain).
--   Then, with a source partition, the replay arguments (see Replay record).
-- Reply (compact, the default): m, the number of tenants listed, then the
--   sum of the new events of the others, then per listed tenant: its number
--   in the call (1-based) and its part of the full reply (below); then the
--   replay part as in the full reply. A tenant not listed had every new event
--   admitted (its admitted = its n, none reserved or rejected, full_until 0)
--   and its ttl chains are the cached ones it was sent: the caller has all
--   of its full part already. (Within limits most tenants are such: the
--   full reply's four to six numbers each cost the caller far more to read
--   than the one pass that leaves them out costs here, and Redis about as
--   much to send; the pass also finds the replay record's exceptions, see
--   finish in 90_run.lua. Issue 23.)
-- Full reply (ARGV[5] negated): one flat array, per tenant in order:
--   admitted, reservations, due_1, count_1, until_1, ..., rejected, full_until,
--   then chain start, chain end per rule for ttl rules
--   where until_i is the end of the reserved slot (the earliest end of the
--   windows it was counted in), or due_i itself when nothing was reserved
--   (the budget was spent: see Budget), and full_until is, when events were rejected
--   because every window up to the horizon is full, the first time at which a
--   window might have room (0 otherwise; past the horizon end for a tenant
--   with an event rule of limit 0, whose events are rejected without a
--   window read). The chain end may be lower than the
--   anchor's (another caller extended it); it is never higher.
--   A tenant whose keys failed it is instead: -1, the key, what is wrong
--   with it ("has the wrong type", "holds a count that is not an integer").
--   With a source partition the reply ends with the replayed events and
--   the record's highest offset (see Replay record).
--
-- Failures. Redis does not roll a script back, so the script keeps a journal
-- of its writes and takes them back itself: a call never half-applies. (The
-- one count of a one-rule tenant decided in the fast path is not journaled,
-- to keep that path short: it is found again from the tenant's record and
-- reply.)
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
-- Budget. The deferral searches of all the call's tenants together read at
-- most ARGV[3] windows that the call has not read before (HMGET; the
-- current windows that admission reads are not counted: they are at most
-- one per tenant and rule). Once it is spent, a tenant's search stops where
-- it is, at t, and the events it has not placed are deferred to t without
-- a reservation (a reply entry due = until = t, counting nothing): windows
-- before t have no room for the next of them, so they come back no earlier
-- than one could fit and are then checked as new. The tenant's frontier
-- moves to t, so that the next call goes on from there. A tenant whose
-- search starts after the budget is spent reads no window. Nothing is
-- counted wrongly and no event is lost; only a reservation waits.
-- A flood's search must not spend the reads of the light tenants after it
-- in the call: each tenant's search may take its first near reads per rule
-- (80_reserve.lua) while any budget is left, but past them it stops once
-- the budget is down to what the tenants after it may need, near reads
-- each, at most a quarter of ARGV[3] (keep_most). The last tenant may take
-- all that is left. (With 512 reads and no such share, the flooding
-- tenants of the fault suite's mix spent most calls' budget and the light
-- tenants after them waited unreserved behind the retry tier's backlog.)
--
-- A frontier lives until the time it names (plus a second), at most a
-- minute when its tenant got nothing in the call (no admission, no
-- reservation): its only use is to spare the next search the windows
-- already found full, and a lost frontier costs at most a search that the
-- budget bounds.
--
-- Lua numbers are doubles: whole milliseconds below 2^53 are exact.
--
-- The script is joined from these parts, in this order (internal/lua/lua.go),
-- each an idea with its contract in its header:
--   10_call.lua     this contract; the call's scalar arguments; the reply
--   20_journal.lua  the journal of the call's writes, and failures
--   30_windows.lua  window keys, reads and writes; ttl chains
--   40_decode.lua   rule descriptors, tenant records, each tenant's offsets
--   50_costs.lua    cost lists, and how many events fit a room
--   60_replay.lua   the replay record (G9)
--   70_admit.lua    admitting into the current windows
--   80_reserve.lua  reserving in future windows, within the budget
--   87_advance.lua  moving a deferred backlog into idle capacity
--   90_run.lua      deciding each tenant, the fast path, the reply, failures
-- A part may use what the parts before it define, never what follows.

-- The call's scalar arguments.
local now = tonumber(ARGV[1])
local hend = tonumber(ARGV[2]) -- the horizon's end
local budget = tonumber(ARGV[3]) -- window reads left for the searches (see Budget)
local keep_most = math.floor(budget / 4) -- the most a search leaves to those after it
local ndescs = tonumber(ARGV[4])
local ntenants = tonumber(ARGV[5])
local full_reply = ntenants < 0 -- (see Reply)
if full_reply then
  ntenants = -ntenants
end

-- The longest life of a frontier of a tenant that got nothing (see Budget).
local idle_frontier_ms = 60000

-- An empty list, never written.
local none = {}

-- The reply, built tenant by tenant (see Reply): out_at[ti] is where
-- tenant ti's part starts, once it is decided.
local out = {}
local out_at = {}
