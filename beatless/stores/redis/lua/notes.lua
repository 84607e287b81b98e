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
-- A kind of logged notes (a history: see "Logged notes" in beatless/stores/base.py) is
-- one key instead:
--   {prefix}log:{digest}           stream, one entry per note appended: field = the
--                                  note's key, value = v={version}|{expires_ms}|{keep}|{value}
-- A logged note is one XADD, trimmed MAXLEN ~ keep (whole nodes of the stream at a time,
-- so at least the last keep notes stay), with no sweep: readers drop the expired notes,
-- keep each key's last and bound the kind (beatless/stores/redis/_wire.py). A log is
-- created with an expiry (its life, from the caller), and extended when the caller asks
-- (once an hour per node and log, or when a note would outlive it): so a log nobody
-- appends to any more disappears once its last note expired.
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

-- Redis 6.2 and later create no stream for an XADD with NOMKSTREAM (7.0 and later say
-- their version to scripts; an earlier one checks with EXISTS).
local NOMKSTREAM = (redis.REDIS_VERSION_NUM or 0) >= 0x070000

-- Appends a logged note to its log, created with an expiry of life ms if it is absent.
local function log_note(log, version, now, key, ttl_ms, keep, value, life)
  local record = string.format('v=%s|%d|%d|', version, now + tonumber(ttl_ms), keep) .. value
  if NOMKSTREAM then
    if redis.call('XADD', log, 'NOMKSTREAM', 'MAXLEN', '~', keep, '*', key, record) then
      return
    end
  elseif redis.call('EXISTS', log) == 1 then
    redis.call('XADD', log, 'MAXLEN', '~', keep, '*', key, record)
    return
  end
  redis.call('XADD', log, 'MAXLEN', '~', keep, '*', key, record)
  redis.call('PEXPIRE', log, life)
end

-- Extends a log to live life ms from now, if it has less left (never shortens it).
local function extend_log(log, life)
  local left = redis.call('PTTL', log)
  if left == -1 or (left >= 0 and left < tonumber(life)) then
    redis.call('PEXPIRE', log, life)
  end
end

-- A kind's layout, as its caller says it: 'h' (a hash and its expiry index: two keys) or
-- 'l|{life_ms}|{extend}' (a log: one key; extend '1' to extend it). Returns the log's
-- life and whether to extend it; false for a hash.
local function log_layout(layout)
  local life, extend = string.match(layout, '^l|(%d+)|([01])$')
  if not life then return false end
  return life, extend == '1'
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

-- Write and sweep the notes of a post: the kinds' keys are KEYS[first] to the last key,
-- in order (two for a hash, one for a log); from ARGV[at] on, for each kind: its layout
-- (see log_layout), keep (0: unbounded), count c, and c times: key, ttl_ms, value.
local function post_notes(version, slack, now, first, at)
  local k = first
  while k <= #KEYS do
    local life, extend = log_layout(ARGV[at])
    local keep, count = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
    at = at + 3
    for _ = 1, count do
      if life then
        log_note(KEYS[k], version, now, ARGV[at], ARGV[at + 1], keep, ARGV[at + 2], life)
      else
        write_note(KEYS[k], KEYS[k + 1], version, now, ARGV[at], ARGV[at + 1], ARGV[at + 2])
      end
      at = at + 3
    end
    if life then
      if extend then extend_log(KEYS[k], life) end
      k = k + 1
    else
      sweep_notes(KEYS[k], KEYS[k + 1], keep, now, slack)
      k = k + 2
    end
  end
end
