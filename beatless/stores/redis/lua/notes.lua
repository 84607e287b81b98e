-- beatless: writing notes, shared by post.lua, commit.lua and claim.lua and loaded in
-- front of each (after prelude.lua for the last two), so that a commit or a claim writes
-- its notes in its own script. It defines functions only; each takes the script's clock,
-- now (epoch ms of the server's TIME, read once per script), from its caller.
--
-- A kind of notes is two keys:
--   {prefix}notes:{digest}         hash, one field per note: field = the note's key,
--                                  value = v={version}|{expires_ms}|{value}
--   {prefix}notes-expiry:{digest}  sorted set, one member per note: member = the note's
--                                  key, score = expires_ms (the index that sweeps and
--                                  bounds the kind without reading its values)
--
-- A note written at now with ttl_ms expires at now + ttl_ms and is live through that
-- millisecond. After its notes are written, a kind is swept: it loses the notes that
-- expired, then, when it has a keep, all but the keep notes that expire last; its two
-- keys expire slack ms after the last note left, so a kind nobody writes to any more
-- disappears. A key written twice in one script keeps its last note.

-- Fields per HDEL: unpack() cannot spread an unbounded list over a call's arguments.
local NOTES_BATCH = 1000

local function forget_notes(notes, keys)
  for i = 1, #keys, NOTES_BATCH do
    redis.call('HDEL', notes, unpack(keys, i, math.min(i + NOTES_BATCH - 1, #keys)))
  end
end

local function write_note(notes, expiry, version, now, key, ttl_ms, value)
  local expires = string.format('%d', now + tonumber(ttl_ms))
  redis.call('HSET', notes, key, 'v=' .. version .. '|' .. expires .. '|' .. value)
  redis.call('ZADD', expiry, expires, key)
end

-- Only for a kind that has just been written: it has a last note to expire after.
-- A kind with one note holds only the one just written, live: nothing to sweep. Others
-- look at the note that expires first before they look for expired ones.
local function sweep_notes(notes, expiry, keep, now, slack)
  local count = redis.call('ZCARD', expiry)
  if count > 1 then
    local first = redis.call('ZRANGE', expiry, 0, 0, 'WITHSCORES')
    if tonumber(first[2]) < now then
      local expired = string.format('(%d', now)
      forget_notes(notes, redis.call('ZRANGEBYSCORE', expiry, '-inf', expired))
      count = count - redis.call('ZREMRANGEBYSCORE', expiry, '-inf', expired)
    end
    local excess = count - keep
    if keep > 0 and excess > 0 then
      forget_notes(notes, redis.call('ZRANGE', expiry, 0, excess - 1))
      redis.call('ZREMRANGEBYRANK', expiry, 0, excess - 1)
    end
  end
  local last = tonumber(redis.call('ZRANGE', expiry, -1, -1, 'WITHSCORES')[2])
  local ttl = string.format('%d', last - now + slack)
  redis.call('PEXPIRE', notes, ttl)
  redis.call('PEXPIRE', expiry, ttl)
end

-- Write and sweep the notes of a post: the kinds' key pairs are KEYS[first] to the last
-- key, in order; from ARGV[at] on, for each kind: keep (0: unbounded), count c, and c
-- times: key, ttl_ms, value.
local function post_notes(version, slack, now, first, at)
  for k = first, #KEYS, 2 do
    local keep, count = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
    at = at + 2
    for _ = 1, count do
      write_note(KEYS[k], KEYS[k + 1], version, now, ARGV[at], ARGV[at + 1], ARGV[at + 2])
      at = at + 3
    end
    sweep_notes(KEYS[k], KEYS[k + 1], keep, now, slack)
  end
end
