-- beatless: read one kind of notes, kept in place and logged, on the clock of the server
-- that keeps them (Redis Cluster, where each kind lives in a slot of its own; see
-- notes.lua for the layouts).
--
-- KEYS[1]  {prefix}{notes:{digest}}: the kind's hash (see notes.lua)
-- KEYS[2]  {prefix}{notes:{digest}}:log: the kind's log (see notes.lua)
--
-- No ARGV. Returns {seconds, microseconds, hash, log}: the server's TIME, the hash as
-- HGETALL gives it (key, record, ...) and the log as XRANGE gives it (oldest first).
-- Expired notes are among them; the caller drops those, and bounds the log.

local out = redis.call('TIME')
out[3] = redis.call('HGETALL', KEYS[1])
out[4] = redis.call('XRANGE', KEYS[2], '-', '+')
return out
