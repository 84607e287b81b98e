-- beatless: shared by claim.lua, commit.lua and release.lua, and loaded in front of each.
--
-- ARGV[1] of every script is the claim record format version, so that a script reads
-- and writes records of that version only.
--
-- A claim record is the string  v={version}|{state}|{until_ms}|{memory_ms}|{node}:
-- state 'pending' or 'committed', until_ms the end of the lease or of the memory in
-- epoch milliseconds on the server's clock, memory_ms the memory the claim asked for,
-- and the node that holds it (last, so that a node name may contain '|').

if redis.replicate_commands then redis.replicate_commands() end
local VERSION = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- What read() returns for a record it cannot read: another format, a newer version,
-- another program's value or a key of another type. Nothing is written over it.
local CORRUPT = {corrupt = true}

-- The record at key as a table; false when there is none.
local function read(key)
  local record = redis.pcall('GET', key)
  if not record then return false end
  if type(record) ~= 'string' then return CORRUPT end
  local v, state, until_ms, memory, node =
    string.match(record, '^v=(%d+)|(%a+)|(%d+)|(%d+)|(.*)$')
  if v ~= VERSION or (state ~= 'pending' and state ~= 'committed') then return CORRUPT end
  return {state = state, until_ms = tonumber(until_ms), memory = tonumber(memory), node = node}
end

local function write(key, state, until_ms, memory, node, ttl)
  redis.call('SET', key, string.format('v=%s|%s|%d|%d|%s', VERSION, state, until_ms, memory,
    node), 'PX', string.format('%d', math.max(1, ttl)))
  return {state = state, until_ms = until_ms, memory = memory, node = node}
end

-- Every record from KEYS[first] on, each read once even if its key repeats.
local function read_all(first)
  local held = {}
  for i = first, #KEYS do
    if held[KEYS[i]] == nil then held[KEYS[i]] = read(KEYS[i]) end
  end
  return held
end
