-- beatless: make this node's pending claims committed. Loaded after prelude.lua.
--
-- KEYS[1]      {prefix}epoch (read only; see claim.lua)
-- KEYS[1 + i]  {prefix}claim:{firing id}: the claim record of id i (see prelude.lua)
--
-- ARGV[1]  claim record format version
-- ARGV[2]  expiry slack in ms: how long Redis keeps a committed record past until_ms
-- ARGV[3]  node
--
-- Returns {flags, epoch record or ''}: one '1' per id still held by this node (now
-- committed and remembered for its memory_ms), '0' for any other.

local SLACK, node = tonumber(ARGV[2]), ARGV[3]
local held, out = read_all(2), {}
for i = 2, #KEYS do
  local h = held[KEYS[i]]
  if h and h ~= CORRUPT and h.node == node and h.until_ms >= now then
    held[KEYS[i]] = write(KEYS[i], 'committed', now + h.memory, h.memory, h.tag, h.node,
      h.memory + SLACK)
    out[i - 1] = '1'
  else out[i - 1] = '0' end
end
return {table.concat(out), redis.call('GET', KEYS[1]) or ''}
