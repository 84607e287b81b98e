-- beatless: read one kind of notes, kept in place and logged, on the clock of the server
-- that keeps them (Redis Cluster, where each kind lives in a slot of its own; see
-- notes.lua for the layouts).
--
-- KEYS[1]  {prefix}{notes:{digest}}: the kind's hash (see notes.lua)
-- KEYS[2]  {prefix}{notes:{digest}}:log: the kind's log (see notes.lua)
--
-- ARGV[1]  how many fields a page of the hash holds (HSCAN's COUNT)
--
-- Returns {seconds, microseconds, page, log}: the server's TIME, the hash's first page
-- as HSCAN gives it ({cursor, {key, record, ...}}: the pages that follow, the caller
-- reads with HSCAN) and the log as XRANGE gives it (oldest first). Expired notes are
-- among them; the caller drops those, and bounds the log.

local out = redis.call('TIME')
out[3] = redis.call('HSCAN', KEYS[1], '0', 'COUNT', ARGV[1])
out[4] = redis.call('XRANGE', KEYS[2], '-', '+')
return out
