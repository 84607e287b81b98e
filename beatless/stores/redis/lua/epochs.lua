-- beatless: read the epoch records of buckets that share a slot, writing each one that is
-- absent (Redis Cluster: each bucket of claims has an epoch of its own; see
-- redis_cluster.py). A store object reads every bucket's epoch at its first call, so that
-- a bucket whose master later loses its memory is noticed by the next claim there.
--
-- KEYS[i]  {prefix}{bucket}:epoch: v=1|{started_ms}|{token}, the bucket's identity (the
--          same record claim.lua reads and writes as its KEYS[2])
--
-- ARGV[1]  a fresh random token, for each record that is absent
--
-- Returns the records, in the order of KEYS.

if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS do
  local record = redis.call('GET', KEYS[i])
  if not record then
    record = string.format('v=1|%d|%s', now, ARGV[1])
    redis.call('SET', KEYS[i], record)
  end
  out[i] = record
end
return out
