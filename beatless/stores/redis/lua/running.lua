-- beatless: whether run-lease records are held, for a store whose run leases live in
-- other slots than the claims that check them (Redis Cluster; see redis_cluster.py).
-- Loaded after prelude.lua.
--
-- KEYS[j]  {prefix}{bucket}:claim:{run id}: a run-lease record, a claim record like any
--          other (see prelude.lua), held pending by workers while a run of its address is
--          in progress (see beatless.node.runs); read only
--
-- ARGV[1]  claim record format version
--
-- Returns one character per key: '1' when the record is a live pending claim on this
-- server's clock, '0' otherwise (absent, committed, lapsed or unreadable).

local held, out = read_all(1, #KEYS), {}
for j = 1, #KEYS do
  local h = held[KEYS[j]]
  local live = h and h ~= CORRUPT and h.state == 'pending' and h.until_ms >= now
  out[j] = live and '1' or '0'
end
return table.concat(out)
