-- beatless: write notes, then sweep each kind written and bound those that ask.
-- Loaded after notes.lua (no prelude: it reads no claim record).
--
-- KEYS[2k - 1]  {prefix}notes:{digest}: hash of the k-th kind of the post (see notes.lua)
-- KEYS[2k]      {prefix}notes-expiry:{digest}: sorted set of the same kind (see notes.lua)
--
-- ARGV[1]  note record format version
-- ARGV[2]  expiry slack in ms: how long Redis keeps a kind past its last note's expiry
-- then, for each kind k in the order of KEYS:
--          keep (0: unbounded), count c, and c times: key, ttl_ms, value
--
-- The notes are written and their kinds swept as notes.lua says. Returns 0.

if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
post_notes(ARGV[1], tonumber(ARGV[2]), now, 1, 3)
return 0
