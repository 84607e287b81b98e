-- beatless: read kinds of notes on the clock of the server that keeps them (Redis
-- Cluster, where each kind lives in a slot of its own; see notes.lua for the layout).
--
-- KEYS[k]  {prefix}{notes:{digest}}: the hash of the k-th kind asked (see notes.lua)
--
-- No ARGV. Returns {seconds, microseconds, notes of KEYS[1], ...}: the server's TIME,
-- then each hash as HGETALL gives it (key, record, key, record, ...). Expired notes are
-- among them; the caller drops those.

local out = redis.call('TIME')
for k = 1, #KEYS do
  out[#out + 1] = redis.call('HGETALL', KEYS[k])
end
return out
