-- beatless: read kinds of notes on the clock of the server that keeps them (Redis
-- Cluster, where each kind lives in a slot of its own; see notes.lua for the layout).
--
-- KEYS[k]  {prefix}{notes:{digest}}: the hash of the k-th kind asked (see notes.lua)
--
-- ARGV[1]  how many fields a page of a hash holds (HSCAN's COUNT)
--
-- Returns {seconds, microseconds, page of KEYS[1], ...}: the server's TIME, then the
-- first page of each hash as HSCAN gives it ({cursor, {key, record, key, record, ...}}):
-- a small hash whole, with cursor 0; the caller reads the pages of a bigger one that
-- follow with HSCAN, so that no call holds the server for a whole big hash. Expired
-- notes are among them; the caller drops those.

local out = redis.call('TIME')
for k = 1, #KEYS do
  out[#out + 1] = redis.call('HSCAN', KEYS[k], '0', 'COUNT', ARGV[1])
end
return out
