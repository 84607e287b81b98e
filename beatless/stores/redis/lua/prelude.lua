-- beatless: shared by claim.lua, commit.lua and release.lua, and loaded in front of each.
--
-- ARGV[1] of every script is the claim record format version, so that a script writes
-- records of that version only (and reads those and version 1 ones).
--
-- A claim record is the string  v={version}|{state}|{until_ms}|{memory_ms}|{tag}|{node}:
-- state 'pending' or 'committed', until_ms the end of the lease or of the memory in
-- epoch milliseconds on the server's clock, memory_ms the memory the claim asked for,
-- tag the task tag of the request that wrote it (hex digits, '' for none), and the node
-- that holds it (last, so that a node name may contain '|'). A record of version 1,
-- written by an earlier beatless, has no tag field and is read with tag ''.
--
-- The live revision a claim carried (beatless/stores/base.py, "Claim records") follows
-- the node as \31{revision} (the byte 0x1f, then decimal digits); a claim without one
-- writes nothing there, as an earlier beatless never did. A beatless that does not know
-- it reads the record as before, the suffix as part of the node's name: a name no node of
-- its own has, so it judges the claim another node's, which it is.

if redis.replicate_commands then redis.replicate_commands() end
local VERSION = ARGV[1]
local UNTAGGED = '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- What read() returns for a record it cannot read: another format, a newer version,
-- another program's value or a key of another type. Nothing is written over it.
local CORRUPT = {corrupt = true}

-- A record's text as a table (CORRUPT for one that cannot be read).
local function parse(record)
  if type(record) ~= 'string' then return CORRUPT end
  local v, state, until_ms, memory, tag, node =
    string.match(record, '^v=(%d+)|(%a+)|(%d+)|(%d+)|(%x*)|(.*)$')
  if v ~= VERSION then
    v, state, until_ms, memory, node =
      string.match(record, '^v=(%d+)|(%a+)|(%d+)|(%d+)|(.*)$')
    if v ~= UNTAGGED then return CORRUPT end
    tag = ''
  end
  if state ~= 'pending' and state ~= 'committed' then return CORRUPT end
  local name, revision = string.match(node, '^(.*)\31(%d+)$')
  return {state = state, until_ms = tonumber(until_ms), memory = tonumber(memory), tag = tag,
    node = name or node, revision = revision or ''}
end

-- The record at key as a table; false when there is none.
local function read(key)
  local record = redis.pcall('GET', key)
  if not record then return false end
  return parse(record)
end

-- A record's text, in the version of this script; revision is '' for none.
local function text(state, until_ms, memory, tag, node, revision)
  local suffix = revision ~= '' and ('\31' .. revision) or ''
  return string.format('v=%s|%s|%d|%d|%s|%s%s', VERSION, state, until_ms, memory, tag, node,
    suffix)
end

-- Writes a claim record; revision is '' for none.
local function write(key, state, until_ms, memory, tag, node, ttl, revision)
  redis.call('SET', key, text(state, until_ms, memory, tag, node, revision), 'PX',
    string.format('%d', math.max(1, ttl)))
  return {state = state, until_ms = until_ms, memory = memory, tag = tag, node = node,
    revision = revision}
end

-- Every record from KEYS[first] to KEYS[last], each read once even if its key repeats.
local function read_all(first, last)
  local held = {}
  for i = first, last do
    if held[KEYS[i]] == nil then held[KEYS[i]] = read(KEYS[i]) end
  end
  return held
end
