-- beatless: end this node's pending claims now. Loaded after prelude.lua.
--
-- KEYS[i]  {prefix}claim:{firing id}: the claim record of id i (see prelude.lua)
--
-- ARGV[1]  claim record format version
-- ARGV[2]  node
--
-- A released claim is not deleted: its lease ends (until_ms = now - 1) and the record
-- is kept for its memory_ms, as a pending record whose lease ran out would be, so that
-- the next claim that is not late is a takeover, never a first win. Committed claims
-- and other nodes' claims are left alone. Returns 0.

local node = ARGV[2]
local held = read_all(1, #KEYS)
for i = 1, #KEYS do
  local h = held[KEYS[i]]
  if h and h ~= CORRUPT and h.state == 'pending' and h.node == node then
    local until_ms = math.min(h.until_ms, now - 1)
    held[KEYS[i]] = write(KEYS[i], 'pending', until_ms, h.memory, h.tag, node,
      until_ms + h.memory - now, h.revision)
  end
end
return 0
