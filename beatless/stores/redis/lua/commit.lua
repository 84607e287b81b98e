-- beatless: make this node's pending claims committed, then write the notes that go
-- with them, in one script. Loaded after prelude.lua and notes.lua.
--
-- KEYS[1]              {prefix}epoch (read only; see claim.lua)
-- KEYS[1 + i]          {prefix}claim:{firing id}: the claim record of id i (see prelude.lua)
-- KEYS[1 + n + 2k - 1] {prefix}notes:{digest}: hash of the k-th kind of notes (see notes.lua)
-- KEYS[1 + n + 2k]     {prefix}notes-expiry:{digest}: sorted set of the same kind
--
-- ARGV[1]  claim record format version
-- ARGV[2]  expiry slack in ms: how long Redis keeps a committed record past until_ms,
--          and a kind of notes past its last note's expiry
-- ARGV[3]  node
-- ARGV[4]  n, the number of ids
-- ARGV[5]  note record format version
-- ARGV[6]  on: the notes, as post.lua takes them: for each kind k in the order of KEYS,
--          keep (0: unbounded), count c, and c times: key, ttl_ms, value
--
-- The notes are written (and their kinds swept, as notes.lua says) whatever the flags.
-- Returns {flags, epoch record or ''}: one '1' per id still held by this node (now
-- committed and remembered for its memory_ms), '0' for any other.

local SLACK, node, n = tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local held, out = read_all(2, 1 + n), {}
for i = 2, 1 + n do
  local h = held[KEYS[i]]
  if h and h ~= CORRUPT and h.node == node and h.until_ms >= now then
    held[KEYS[i]] = write(KEYS[i], 'committed', now + h.memory, h.memory, h.tag, h.node,
      h.memory + SLACK, h.revision)
    out[i - 1] = '1'
  else out[i - 1] = '0' end
end
post_notes(ARGV[5], SLACK, now, 2 + n, 6)
return {table.concat(out), redis.call('GET', KEYS[1]) or ''}
