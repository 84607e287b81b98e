-- beatless: claim a batch of firings, pending for a lease or (atomic) committed with
-- the commands that enqueue each one won and, if asked, a note of each one won. Loaded
-- after prelude.lua and notes.lua.
--
-- KEYS[1]      {prefix}last: hash, one field per address, the last firing won there:
--              v=1|{firing id}|{occurrence_ms}|{claimed_ms}|{node}; its layout has a
--              version of its own, independent of the claim records' version
-- KEYS[2]      {prefix}epoch: v=2|{started_ms}|{token}|{replid}|{cause}, the store's
--              identity: written by the first claim that finds it absent (cause 'new'),
--              and again, with a new token, by the first claim on a promoted replica
--              (cause 'failover', see below); replid is the master_replid of the server
--              that last ran a claim. A v=1|{started_ms}|{token} record (an earlier
--              beatless) is rewritten in place as v=2, its token kept. Its layout has a
--              version of its own, independent of the claim records' version
-- KEYS[2 + i]  {prefix}claim:{firing id}: the claim record of request i (see prelude.lua)
-- KEYS[2 + n + j]  {prefix}claim:{run id}: the j-th distinct run-lease record the requests
--              name (a claim record too, held pending by workers while a run of the
--              address is in progress; see beatless.node.runs); read only
-- KEYS[2 + n + J + l]  the l-th of L hashes of a namespace's live revisions (kept notes,
--              see _kept.py) that the requests' live checks read; read only
-- KEYS[#KEYS - 2K + 2k - 1]  notes only: {prefix}notes:{digest}, the hash of the k-th
--              distinct kind of the requests' notes (see notes.lua)
-- KEYS[#KEYS - 2K + 2k]      notes only: {prefix}notes-expiry:{digest} of the same kind
--
-- ARGV[1]   claim record format version
-- ARGV[2]   expiry slack in ms: how long Redis keeps a committed record past until_ms
-- ARGV[3]   node
-- ARGV[4]   lease_ms
-- ARGV[5]   tolerance_ms (10 s)
-- ARGV[6]   how long the last-winner hash outlives the last win, in ms
-- ARGV[7]   where the firing id starts in a claim key
-- ARGV[8]   '1' to claim and enqueue (atomic), '0' for a pending claim (two-phase),
--           followed by 'w' when every claim of the namespace is acknowledged by a replica
--           before it counts as won (the store's wait option): a failover then forgets
--           only the pending claims, not the absent ones; and by 'h' when the caller holds
--           off (it re-seeds, see base.py "Re-seeding"): a firing nobody holds and released
--           before the caller's own horizon (ARGV[9], ARGV[10]) is answered R and nothing is
--           written, rather than F (a failover's horizon still answers F)
-- ARGV[9]   the epoch token the caller last saw, '' if none
-- ARGV[10]  the caller's forgetting horizon from an earlier epoch change, '' if none
-- ARGV[11]  a fresh random token, for the epoch record if it is absent
-- ARGV[12]  n, the number of requests, or {n}|{L} with L live revision hashes
-- ARGV[12 + i]      request i:
--                   {occurrence_ms}|{max_late_ms}|{memory_ms}|{release_ms}|{tag}|{run}|
--                   {live}|{revision}|{address}
--                   where run is j for the run-lease record KEYS[2 + n + j], 0 for none,
--                   and -1 for a record in another slot that the caller read just before
--                   this script (running.lua) and found held (Redis Cluster: see
--                   redis_cluster.py); live is '' for no live check, else {l}:{field}:
--                   the field of the l-th live revision hash holding the revision after
--                   the claim's own (see "Live revisions" below); revision is the live
--                   revision the claim carries, kept in the record ('' for none: see
--                   prelude.lua); one argument rather than
--                   eight makes a large batch cheaper to send
-- ARGV[12 + n + i]  atomic only: the JSON list of commands that enqueue request i
-- ARGV[13 + 2n]     notes only (atomic, and absent without notes, as are the notes'
--                   keys): note record format version
-- ARGV[14 + 2n]     notes only: K, the number of kinds of notes
-- ARGV[14 + 2n + 3i - 2]  notes only: request i's note: {k}|{ttl_ms}|{keep}, k its kind's
--                   number, keep 0 for unbounded; '' (and '' for the next two) for none
-- ARGV[14 + 2n + 3i - 1]  notes only: the note's key
-- ARGV[14 + 2n + 3i]      notes only: the note's value, a template (see below)
--                   or, for an item of batch note g: '@{g}', '', and the item's start
-- ARGV[15 + 5n]     notes only: G, the number of batch notes
-- ARGV[15 + 5n + 3g - 2]  notes only: batch note g: {k}|{ttl_ms}|{keep}
-- ARGV[15 + 5n + 3g - 1]  notes only: the prefix of its key
-- ARGV[15 + 5n + 3g]      notes only: its value, a template with {{items}} and {{at_ms}}
--
-- Live revisions. A request with a live check is stale when its field exists (a value
-- v=1|{json}; another form is not read) and the first "fence_ms": of the value is at or
-- before its occurrence (none: stale). A stale request that would be won or renewed is
-- answered S and writes nothing; each field is read once per script.
--
-- Returns {letters, epoch record}: one letter per request, W won, T takeover, L lost,
-- H held, X late, E early, S stale, F forgotten, R re-seeding, C corrupt, A foreign (a live claim of another
-- task: its record's tag and the request's are both set and differ), O overlap (the
-- firing would be won, but its run-lease record is a live pending claim: a run of its
-- address is in progress; the firing is written committed and its commands are not
-- run; a run-lease record that cannot be read holds nothing). A firing won
-- atomically is written committed and its commands run in this script: it is in the
-- queue if and only if it was won. When the epoch token is not the one the caller saw
-- (the store lost its memory), the horizon is the new epoch's start + tolerance: a
-- firing nobody holds and released before the horizon is written committed, its
-- commands are not run, and it is answered F.
--
-- Failover. A claim reads the server's replication ids (INFO replication). When the
-- epoch record names another master_replid and this server continued another history
-- (master_replid2 is set: it is a replica that was promoted), the server may lack the
-- last claims its old primary granted: the record is written again with a new token,
-- cause 'failover', started now. While it stands, for every caller (one that never saw
-- the old primary too), a firing released before its start + tolerance that nobody holds
-- is answered F, as above, and so is one whose record is a pending claim whose lease ran
-- out (its commit may have been lost with the old primary): neither is sent again. With
-- 'w' in ARGV[8] an absent record is judged as usual (a claim counts as won only once a
-- replica has it). A server whose replid changed without a history it continued (a
-- restart, which keeps or loses its data on its own terms) has the replid updated in
-- place, with no change of identity.
--
-- A request's note is written only when its letter is W, T, O or F, from now (its
-- ttl_ms, and its kind swept and bounded by the last keep of the notes written, as
-- notes.lua and a post do), with these placeholders of its value replaced:
-- {{outcome}} by won, takeover, skipped_overlap or forgotten, {{at_ms}} by now and
-- {{lateness_ms}} by now - release_ms. A request answered any other letter writes none.
-- A request whose note is an item of batch note g adds, for the same letters, its item
-- closed with ,"{outcome}",{lateness_ms}] to the batch; each batch that got an item is
-- written once, after the requests, under its key prefix .. '.' .. the id of its first
-- firing noted, with {{items}} replaced by its items joined by commas and {{at_ms}} by
-- now.

local SLACK, node, lease = tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local tolerance, id_from = tonumber(ARGV[5]), tonumber(ARGV[7])
local atomic = string.sub(ARGV[8], 1, 1) == '1'
local waits = string.find(ARGV[8], 'w', 2, true) ~= nil
local holds = string.find(ARGV[8], 'h', 2, true) ~= nil
local count, lives = string.match(ARGV[12], '^(%d+)|?(%d*)$')
local n = tonumber(count)
local noting = ARGV[13 + 2 * n] ~= nil
-- The key before the first kind of notes' keys, and before the first live revision hash.
local kinds_from = #KEYS - 2 * (noting and tonumber(ARGV[14 + 2 * n]) or 0)
local lives_from = kinds_from - (tonumber(lives) or 0)

-- This server's replication ids: its history's, and the one it continued when it was
-- promoted ('' if none: it started a history of its own).
local function replication()
  local info = redis.call('INFO', 'replication')
  local id = string.match(info, 'master_replid:(%x+)') or ''
  local continued = string.match(info, 'master_replid2:(%x+)') or ''
  if not string.find(continued, '[^0]') then continued = '' end
  return id, continued
end

-- The epoch record, its start, its token and whether a failover began it; written first
-- if absent, again if this server is a promoted replica, in place if its replid is new.
local function current_epoch()
  local record = redis.call('GET', KEYS[2])
  local id, continued = replication()
  if not record then
    record = string.format('v=2|%d|%s|%s|new', now, ARGV[11], id)
    redis.call('SET', KEYS[2], record)
    return record, now, ARGV[11], false
  end
  local version, started, rest = string.match(record, '^v=(%d+)|(%d+)|(.+)$')
  if not version then
    error({err = 'BEATLESS unreadable epoch record at ' .. KEYS[2] .. ': ' .. record})
  end
  local token, replid, cause = rest, '', 'new'
  if version ~= '1' then
    token, replid, cause = string.match(rest, '^([^|]+)|(%x*)|(%a+)$')
    if not token then
      error({err = 'BEATLESS unreadable epoch record at ' .. KEYS[2] .. ': ' .. record})
    end
  end
  if replid == id then
    return record, tonumber(started), token, cause == 'failover'
  end
  if replid ~= '' and continued ~= '' then
    started, token, cause = now, ARGV[11], 'failover'
  end
  record = string.format('v=2|%d|%s|%s|%s', started, token, id, cause)
  redis.call('SET', KEYS[2], record)
  return record, tonumber(started), token, cause == 'failover'
end

local epoch, started, token, failover = current_epoch()
local forgot_before = tonumber(ARGV[10]) or false
if ARGV[9] ~= '' and token ~= ARGV[9] and not (failover and waits) then
  forgot_before = started + tolerance
end
-- The caller's own horizon, which a caller that re-seeds holds off before.
local held_off_before = holds and forgot_before
if failover and not waits then
  forgot_before = math.max(forgot_before or 0, started + tolerance)
end
-- A failover's horizon for firings nobody holds: always forgotten, never held off.
local failover_before = failover and not waits and started + tolerance
-- A failover's horizon for pending claims whose lease ran out: their commits may be lost.
local lost_before = failover and started + tolerance

local last = {}
local function record_last()
  redis.call('HSET', KEYS[1], unpack(last))
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
  last = {}
end

local function win(i, key, r)
  if not atomic then
    return write(key, 'pending', now + lease, r.memory, r.tag, node, lease + r.memory,
      r.revision)
  end
  for _, command in ipairs(cjson.decode(ARGV[12 + n + i])) do
    redis.call(unpack(command))
  end
  return write(key, 'committed', now + r.memory, r.memory, r.tag, node, r.memory + SLACK,
    r.revision)
end

-- Every record the batch reads (claims and run leases), updated as the batch writes.
local held

-- Whether the request's run-lease record is held: a live pending claim.
local function running(r)
  if r.run == 0 then return false end
  if r.run < 0 then return true end
  local h = held[KEYS[2 + n + r.run]]
  return h and h ~= CORRUPT and h.state == 'pending' and h.until_ms >= now
end

-- The fence of each live revision field read, by its {l}:{field}; false when absent.
local fences = {}

-- Whether the request's live revision is older than one in force at its occurrence.
local function stale(r)
  if r.live == '' then return false end
  local fence = fences[r.live]
  if fence == nil then
    local l, field = string.match(r.live, '^(%d+):(.+)$')
    local value = redis.call('HGET', KEYS[lives_from + tonumber(l)], field)
    fence = false
    if value and string.sub(value, 1, 4) == 'v=1|' then
      fence = tonumber(string.match(value, '"fence_ms":(%-?%d+)')) or -math.huge
    end
    fences[r.live] = fence
  end
  return fence and r.occurrence >= fence
end

-- The letter for a firing nobody holds live: refused, stale, forgotten, overlapping or won.
local function decide_free(i, key, h, r)
  if now - r.occurrence > r.max_late + tolerance then return 'X' end
  if r.release - now > tolerance then return 'E' end
  if stale(r) then return 'S' end
  local lost = h and lost_before and h.state == 'pending' and r.release < lost_before
  if not h and held_off_before and r.release < held_off_before
      and not (failover_before and r.release < failover_before) then
    return 'R'
  end
  if lost or (not h and forgot_before and r.release < forgot_before) then
    return 'F', write(key, 'committed', now + r.memory, r.memory, r.tag, node,
      r.memory + SLACK, r.revision)
  end
  if running(r) then
    return 'O', write(key, 'committed', now + r.memory, r.memory, r.tag, node,
      r.memory + SLACK, r.revision)
  end
  last[#last + 1] = r.address
  last[#last + 1] = string.format('v=1|%s|%d|%d|%s', string.sub(key, id_from), r.occurrence,
    now, node)
  if #last >= 1000 then record_last() end
  return (h and h.state == 'pending') and 'T' or 'W', win(i, key, r)
end

local function decide(i, key, h, r)
  if h == CORRUPT then return 'C' end
  if not h or h.until_ms < now then return decide_free(i, key, h, r) end
  if h.tag ~= r.tag and h.tag ~= '' and r.tag ~= '' then return 'A' end
  if h.state == 'committed' then return 'L' end
  if h.node == node and not atomic then
    if stale(r) then return 'S' end
    return 'W', write(key, 'pending', now + lease, r.memory, r.tag, node, lease + r.memory,
      r.revision)
  end
  return 'H'
end

-- The words that replace {{outcome}}, by the letters that write a note.
local NOTED = {W = 'won', T = 'takeover', O = 'skipped_overlap', F = 'forgotten'}
-- The keep of each kind written, by the index of its hash in KEYS.
local bounds = {}

-- The items of each batch note written to, by its number, and its first firing's id.
local batches = {}

local function add_item(i, g, letter, r)
  local batch = batches[g]
  if not batch then
    batch = {first = string.sub(KEYS[i + 2], id_from)}
    batches[g] = batch
  end
  batch[#batch + 1] = ARGV[14 + 2 * n + 3 * i] .. ',"' .. NOTED[letter] .. '",' ..
    string.format('%d', now - r.release) .. ']'
end

local function write_batches()
  local from = 15 + 5 * n
  for g, batch in pairs(batches) do
    local at = from + 3 * g - 2
    local k, ttl, keep = string.match(ARGV[at], '^(%d+)|(%d+)|(%d+)$')
    local value = string.gsub(ARGV[at + 2], '{{([%w_]+)}}',
      {items = table.concat(batch, ','), at_ms = string.format('%d', now)})
    local hash = kinds_from + 2 * tonumber(k) - 1
    write_note(KEYS[hash], KEYS[hash + 1], ARGV[13 + 2 * n], now,
      ARGV[at + 1] .. '.' .. batch.first, ttl, value)
    keep = tonumber(keep)
    bounds[hash] = keep > 0 and keep or bounds[hash] or 0
  end
end

local function note(i, letter, r)
  local at = 14 + 2 * n + 3 * i - 2
  if string.byte(ARGV[at], 1) == 64 then  -- '@': an item of a batch note
    return add_item(i, tonumber(string.sub(ARGV[at], 2)), letter, r)
  end
  local k, ttl, keep = string.match(ARGV[at], '^(%d+)|(%d+)|(%d+)$')
  if not k then return end
  local fields = {outcome = NOTED[letter], at_ms = string.format('%d', now),
    lateness_ms = string.format('%d', now - r.release)}
  local value = string.gsub(ARGV[at + 2], '{{([%w_]+)}}', fields)
  local hash = kinds_from + 2 * tonumber(k) - 1
  write_note(KEYS[hash], KEYS[hash + 1], ARGV[13 + 2 * n], now, ARGV[at + 1], ttl, value)
  keep = tonumber(keep)
  bounds[hash] = keep > 0 and keep or bounds[hash] or 0
end

local out = {}
held = read_all(3, lives_from)
for i = 1, n do
  local key = KEYS[i + 2]
  local occurrence, max_late, memory, release, tag, run, live, revision, address =
    string.match(ARGV[12 + i],
      '^(%-?%d+)|(%d+)|(%d+)|(%-?%d+)|(%x*)|(%-?%d+)|([%d:]*)|(%d*)|(.*)$')
  local r = {occurrence = tonumber(occurrence), max_late = tonumber(max_late),
    memory = tonumber(memory), release = tonumber(release), tag = tag, run = tonumber(run),
    live = live, revision = revision, address = address}
  local letter, written = decide(i, key, held[key], r)
  out[i] = letter
  if written then held[key] = written end
  if noting and NOTED[letter] then note(i, letter, r) end
end
if #last > 0 then record_last() end
if noting then write_batches() end
for hash, keep in pairs(bounds) do
  sweep_notes(KEYS[hash], KEYS[hash + 1], keep, now, SLACK)
end
return {table.concat(out), epoch}
