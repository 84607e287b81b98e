-- beatless: read the epoch records of buckets that share a slot, writing each one that is
-- absent (Redis Cluster: each bucket of claims has an epoch of its own; see
-- redis_cluster.py). A store object reads every bucket's epoch at its first call, so that
-- a bucket whose master later loses its memory is noticed by the next claim there.
-- With a cause, every record is begun again (a single Redis's one epoch record too): a
-- store that may have lost claims while it still ran (an evicting policy, see _facts.py).
--
-- KEYS[i]  {prefix}{bucket}:epoch: v=2|{started_ms}|{token}|{replid}|new, the bucket's
--          identity (the same record claim.lua reads and writes as its KEYS[2]), naming
--          this master's master_replid, so that a failover to its replica is noticed in
--          a bucket whose first claim the replica lacks)
--
-- ARGV[1]  a fresh random token, for each record that is absent
-- ARGV[2]  optional: 'evicted', to write every record anew, started now, with the token
--          ARGV[1] and that cause, whether it was there or not
--
-- Returns the records, in the order of KEYS.

if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local replid = string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)') or ''
local cause = ARGV[2]
local out = {}
for i = 1, #KEYS do
  local record = redis.call('GET', KEYS[i])
  if cause then
    record = string.format('v=2|%d|%s|%s|%s', now, ARGV[1], replid, cause)
    redis.call('SET', KEYS[i], record)
  elseif not record then
    record = string.format('v=2|%d|%s|%s|new', now, ARGV[1], replid)
    redis.call('SET', KEYS[i], record)
  end
  out[i] = record
end
return out
