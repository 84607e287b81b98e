-- beatless: claim a batch of firings, pending for a lease or (atomic) committed with
-- the commands that enqueue each one won, and, if asked, leave what claim_notes.lua needs
-- to note each one won. Loaded after prelude.lua.
--
-- KEYS[1]      {prefix}epoch: v=2|{started_ms}|{token}|{replid}|{cause}, the store's
--              identity: written by the first claim that finds it absent (cause 'new'),
--              and again, with a new token, by the first claim on a promoted replica
--              (cause 'failover', see below); replid is the master_replid of the server
--              that last ran a claim. A v=1|{started_ms}|{token} record (an earlier
--              beatless) is rewritten in place as v=2, its token kept. Its layout has a
--              version of its own, independent of the claim records' version
-- KEYS[1 + i]  {prefix}claim:{firing id}: the claim record of request i (see prelude.lua)
-- KEYS[1 + n + j]  {prefix}claim:{run id}: the j-th distinct run-lease record the requests
--              name (a claim record too, held pending by workers while a run of the
--              address is in progress; see beatless.node.runs); read only
-- KEYS[1 + n + J + l]  the l-th of L hashes of a namespace's live revisions (kept notes,
--              see _kept.py) that the requests' live checks read; read only
-- KEYS[last]  notes only: {prefix}noting:{token}, where the script leaves what
--              claim_notes.lua needs to write the requests' history notes (see below)
--
-- ARGV[1]   claim record format version
-- ARGV[2]   expiry slack in ms: how long Redis keeps a committed record past until_ms
-- ARGV[3]   node
-- ARGV[4]   lease_ms
-- ARGV[5]   tolerance_ms (10 s)
-- ARGV[6]   unused (an earlier beatless: how long the last-winner hash lived)
-- ARGV[7]   unused (an earlier beatless: where the firing id starts in a claim key)
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
--                   where run is j for the run-lease record KEYS[1 + n + j], 0 for none,
--                   and -1 for a record in another slot that the caller read just before
--                   this script (running.lua) and found held (Redis Cluster: see
--                   redis_cluster.py); live is '' for no live check, else {l}:{field}:
--                   the field of the l-th live revision hash holding the revision after
--                   the claim's own (see "Live revisions" below); revision is the live
--                   revision the claim carries, kept in the record ('' for none: see
--                   prelude.lua); one argument rather than
--                   eight makes a large batch cheaper to send
-- ARGV[12 + n + i]  atomic only: where the commands that enqueue request i are (see push
--                   below)
-- ARGV[13 + 2n]     atomic only: '' without notes; with them, how long (ms) what the
--                   script leaves for claim_notes.lua is kept
-- then, atomic only: the arguments of the commands of every request, in order, each
--                   request's from the index its ARGV[12 + n + i] names
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
-- Eviction. A node that finds an evicting maxmemory-policy begins the record again with
-- cause 'evicted' (epochs.lua): claims made before the claims stopped may be evicted. A
-- caller that saw the old epoch judges it as a store that lost its memory (above: one
-- that holds off answered R while the nodes write back what they sent); while it stands,
-- a caller that saw no epoch before (ARGV[9] '', a node started since), 'w' or not,
-- forgets the firings released before its start + tolerance that nobody holds, as after
-- a failover.
--
-- A firing won atomically on a record that is absent costs one SET NX GET on Redis 7
-- and later (a GET and a SET before), and its commands: the script writes its claim
-- first, then runs them, and deletes the claim again if one fails (the error is raised).
--
-- Notes. A firing's history note is not written here but by claim_notes.lua, which the
-- caller sends once this script has answered: nothing a script writes is seen before it
-- ends, so the messages pushed here reach the queue, and a consumer blocked on it can be
-- served, before the notes are written rather than after. When a request is
-- answered W, T, O or F (the letters that write a note), the script sets the key
-- KEYS[last] to {now}|{letters}, the script's TIME and one letter per request, for
-- ARGV[13 + 2n] ms; claim_notes.lua reads it, deletes it and writes the notes of those
-- requests as of that time. A request whose commands fail ends the script with their
-- error; the key then holds the letters of the requests before it.

local SLACK, node, lease = tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local tolerance = tonumber(ARGV[5])
local atomic = string.sub(ARGV[8], 1, 1) == '1'
local waits = string.find(ARGV[8], 'w', 2, true) ~= nil
local holds = string.find(ARGV[8], 'h', 2, true) ~= nil
local count, lives = string.match(ARGV[12], '^(%d+)|?(%d*)$')
local n = tonumber(count)
local noting = (ARGV[13 + 2 * n] or '') ~= ''
-- Redis 7 and later: SET ... NX GET claims an absent record in one command.
local SET_NX_GET = (redis.REDIS_VERSION_NUM or 0) >= 0x070000

-- The key before the first live revision hash (the key the notes leave for
-- claim_notes.lua is last).
local lives_from = (noting and #KEYS - 1 or #KEYS) - (tonumber(lives) or 0)

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
  local record = redis.call('GET', KEYS[1])
  local id, continued = replication()
  if not record then
    record = string.format('v=2|%d|%s|%s|new', now, ARGV[11], id)
    redis.call('SET', KEYS[1], record)
    return record, now, ARGV[11], 'new'
  end
  local version, started, rest = string.match(record, '^v=(%d+)|(%d+)|(.+)$')
  if not version then
    error({err = 'BEATLESS unreadable epoch record at ' .. KEYS[1] .. ': ' .. record})
  end
  local token, replid, cause = rest, '', 'new'
  if version ~= '1' then
    token, replid, cause = string.match(rest, '^([^|]+)|(%x*)|(%a+)$')
    if not token then
      error({err = 'BEATLESS unreadable epoch record at ' .. KEYS[1] .. ': ' .. record})
    end
  end
  if replid == id then
    return record, tonumber(started), token, cause
  end
  if replid ~= '' and continued ~= '' then
    started, token, cause = now, ARGV[11], 'failover'
  end
  record = string.format('v=2|%d|%s|%s|%s', started, token, id, cause)
  redis.call('SET', KEYS[1], record)
  return record, tonumber(started), token, cause
end

local epoch, started, token, cause = current_epoch()
local failover = cause == 'failover'
-- An epoch begun again by a node that found an evicting policy (see "Eviction" above),
-- met by a caller that saw no epoch before: it cannot tell what it missed.
local unseen_eviction = cause == 'evicted' and ARGV[9] == ''
local forgot_before = tonumber(ARGV[10]) or false
if ARGV[9] ~= '' and token ~= ARGV[9] and not (failover and waits) then
  forgot_before = started + tolerance
end
-- The caller's own horizon, which a caller that re-seeds holds off before.
local held_off_before = holds and forgot_before
if (failover and not waits) or unseen_eviction then
  forgot_before = math.max(forgot_before or 0, started + tolerance)
end
-- A failover's horizon for firings nobody holds (an eviction's, for a caller that saw no
-- epoch before): always forgotten, never held off.
local failover_before = ((failover and not waits) or unseen_eviction) and started + tolerance
-- A failover's horizon for pending claims whose lease ran out: their commits may be lost.
local lost_before = failover and started + tolerance

-- Every record the batch reads (claims and run leases), read once each when first
-- needed, and updated as the batch writes.
local held = {}
local function fetch(key)
  local h = held[key]
  if h == nil then
    h = read(key)
    held[key] = h
  end
  return h
end

-- The committed record of a firing won or decided now, and its expiry.
local function committed(key, r)
  return write(key, 'committed', now + r.memory, r.memory, r.tag, node, r.memory + SLACK,
    r.revision)
end

-- Runs the commands that enqueue request i: ARGV[12 + n + i] is {first}|{counts}, the
-- index in ARGV of its first argument and each command's argument count ('|' between
-- them; none for no command), its arguments laid from ARGV[first] on (push_args in
-- _wire.py): each command runs on its arguments as they came, nothing split or copied.
local function push(i)
  local first, counts = string.match(ARGV[12 + n + i], '^(%d+)|([%d|]*)$')
  local at = tonumber(first)
  for count in string.gmatch(counts, '%d+') do
    local last = at + tonumber(count) - 1
    redis.call(unpack(ARGV, at, last))
    at = last + 1
  end
end

-- The letter of each request decided; whether one of them writes a note.
local out, noted = {}, false
-- The letters that write a note (see "Notes" above).
local NOTED = {W = true, T = true, O = true, F = true}

-- The letters decided so far, left for claim_notes.lua when one of them writes a note.
local function leave()
  local letters = table.concat(out)
  if noting and noted then
    redis.call('SET', KEYS[#KEYS], string.format('%d|', now) .. letters, 'PX',
      ARGV[13 + 2 * n])
  end
  return letters
end

-- Runs the commands of request i. When one fails after a firing that writes a note was
-- decided (so not as the script's first write, whose refusals keep their own error),
-- the letters so far are left first: those firings stand, and were sent.
local function push_or_leave(i)
  if not (noting and noted) then return push(i) end
  local ok, err = pcall(push, i)
  if not ok then
    leave()
    error(err)
  end
end

local function win(i, key, r)
  if not atomic then
    return write(key, 'pending', now + lease, r.memory, r.tag, node, lease + r.memory,
      r.revision)
  end
  push_or_leave(i)
  return committed(key, r)
end

-- Whether the request's run-lease record is held: a live pending claim.
local function running(r)
  if r.run == 0 then return false end
  if r.run < 0 then return true end
  local h = fetch(KEYS[1 + n + r.run])
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

-- The letter for a firing nobody holds live (h: its record, false when absent): refused,
-- stale, re-seeding, forgotten, overlapping or won; nothing written.
local function free_letter(h, r)
  if now - r.occurrence > r.max_late + tolerance then return 'X' end
  if r.release - now > tolerance then return 'E' end
  if stale(r) then return 'S' end
  local lost = h and lost_before and h.state == 'pending' and r.release < lost_before
  if not h and held_off_before and r.release < held_off_before
      and not (failover_before and r.release < failover_before) then
    return 'R'
  end
  if lost or (not h and forgot_before and r.release < forgot_before) then return 'F' end
  if running(r) then return 'O' end
  return (h and h.state == 'pending') and 'T' or 'W'
end

local function decide_free(i, key, h, r)
  local letter = free_letter(h, r)
  if letter == 'F' or letter == 'O' then return letter, committed(key, r) end
  if letter == 'W' or letter == 'T' then return letter, win(i, key, r) end
  return letter
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

-- An atomic win of a record not read yet, in one SET NX GET when the firing would be won
-- were its record absent: nil when it was not, else the letter and the record, as
-- decide() answers them. The claim is written before the commands run: if one fails,
-- it is deleted again (it was absent) and the error raised. A key of another type reads
-- as a corrupt record; a SET refused (Redis full under noeviction, a read-only replica,
-- min-replicas-to-write) raises that refusal, as a SET outside pcall would.
local function claim_absent(i, key, r)
  if not (SET_NX_GET and atomic and held[key] == nil and free_letter(false, r) == 'W') then
    return nil
  end
  local found = redis.pcall('SET', key,
    text('committed', now + r.memory, r.memory, r.tag, node, r.revision),
    'NX', 'PX', string.format('%d', math.max(1, r.memory + SLACK)), 'GET')
  if type(found) == 'table' and string.sub(found.err or '', 1, 9) ~= 'WRONGTYPE' then
    error(found)  -- full, a read-only replica: refused as the first write, nothing written
  end
  if found then
    held[key] = parse(found)
    return decide(i, key, held[key], r)
  end
  local ok, err = pcall(push, i)
  if not ok then
    redis.call('DEL', key)
    if noting and noted then leave() end
    error(err)
  end
  return 'W', {state = 'committed', until_ms = now + r.memory, memory = r.memory,
    tag = r.tag, node = node, revision = r.revision}
end

for i = 1, n do
  local key = KEYS[i + 1]
  local occurrence, max_late, memory, release, tag, run, live, revision, address =
    string.match(ARGV[12 + i],
      '^(%-?%d+)|(%d+)|(%d+)|(%-?%d+)|(%x*)|(%-?%d+)|([%d:]*)|(%d*)|(.*)$')
  local r = {occurrence = tonumber(occurrence), max_late = tonumber(max_late),
    memory = tonumber(memory), release = tonumber(release), tag = tag, run = tonumber(run),
    live = live, revision = revision, address = address}
  local letter, written = claim_absent(i, key, r)
  if not letter then
    letter, written = decide(i, key, fetch(key), r)
  end
  out[i] = letter
  if NOTED[letter] then noted = true end
  if written then held[key] = written end
end
return {leave(), epoch}
