-- beatless: the history notes of the firings of a claim script (claim.lua), sent right
-- after it has answered. Loaded after notes.lua (no prelude: it reads no claim record).
--
-- KEYS[1]   {prefix}noting:{token}: what the claim script left, {now}|{letters} (its TIME
--           and one letter per request); read and deleted. Absent (the claim script
--           failed, answered no letter that writes a note, or this script ran already),
--           nothing is written
-- KEYS[1 + ...]  the keys of each distinct kind of the requests' notes, in the order of
--           their numbers: {prefix}notes:{digest} and {prefix}notes-expiry:{digest} for a
--           kind kept in place, {prefix}log:{digest} for a log (see notes.lua)
--
-- ARGV[1]   note record format version
-- ARGV[2]   expiry slack in ms: how long Redis keeps a kind past its last note's expiry
-- ARGV[3]   n, the number of requests of the claim script
-- ARGV[4]   K, the number of kinds of notes
-- ARGV[4 + k]  the layout of kind k: 'h' (kept in place: two keys) or
--           'l|{life_ms}|{extend}' (a log: one key; see log_layout in notes.lua)
-- with B = 4 + K:
-- ARGV[B + 3i - 2]  request i's note: {k}|{ttl_ms}|{keep}|{release_ms}, k its kind's
--                   number, keep 0 for unbounded; '' (and '' for the next two) for none
-- ARGV[B + 3i - 1]  the note's key
-- ARGV[B + 3i]      the note's value, a template (see below)
--                   or, for an item of batch note g: '@{g}|{release_ms}', the id of the
--                   item's firing, and the item's start
-- ARGV[B + 3n + 1]  G, the number of batch notes (of kinds kept in place)
-- ARGV[B + 3n + 1 + 3g - 2]  batch note g: {k}|{ttl_ms}|{keep}
-- ARGV[B + 3n + 1 + 3g - 1]  the prefix of its key
-- ARGV[B + 3n + 1 + 3g]      its value, a template with {{items}} and {{at_ms}}
--
-- A request's note is written only when its letter is W, T, O or F, from the claim
-- script's now (its ttl_ms; a note kept in place has its kind swept and bounded by the
-- last keep of the notes written, as notes.lua and a post do, a logged one is one append
-- to its kind's log), with these placeholders of its value replaced: {{outcome}} by won,
-- takeover, skipped_overlap or forgotten, {{at_ms}} by now and {{lateness_ms}} by now -
-- release_ms. A request answered any other letter writes none. A request whose note is
-- an item of batch note g adds, for the same letters, its item closed with
-- ,"{outcome}",{lateness_ms}] to the batch; each batch that got an item is written once,
-- after the requests, under its key prefix .. '.' .. the id of its first firing noted,
-- with {{items}} replaced by its items joined by commas and {{at_ms}} by now.
--
-- Returns 1 when the claim script's letters were found (and its notes written), else 0.

if redis.replicate_commands then redis.replicate_commands() end
-- Redis 6.2 and later have GETDEL (7.0 and later say their version to scripts).
local left
if (redis.REDIS_VERSION_NUM or 0) >= 0x070000 then
  left = redis.call('GETDEL', KEYS[1])
else
  left = redis.call('GET', KEYS[1])
  if left then redis.call('DEL', KEYS[1]) end
end
if not left then return 0 end
local at_ms, letters = string.match(left, '^(%d+)|(%a*)$')
local now = tonumber(at_ms)
local VERSION, SLACK, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

-- The notes' kinds: the index in KEYS of each one's first key, and the life and
-- extension of each log (false for a kind kept in place); where the requests' notes
-- start in ARGV.
local kind_key, kind_log, kind_extend = {}, {}, {}
local kinds = tonumber(ARGV[4])
local at = 2
for k = 1, kinds do
  kind_log[k], kind_extend[k] = log_layout(ARGV[4 + k])
  kind_key[k] = at
  at = at + (kind_log[k] and 1 or 2)
end
local notes_at = 4 + kinds

-- The words that replace {{outcome}}, by the letters that write a note.
local NOTED = {W = 'won', T = 'takeover', O = 'skipped_overlap', F = 'forgotten'}
-- The keep of each kind kept in place that was written, by the index of its hash in KEYS.
local bounds = {}
-- The logs written to that their callers extend, by key, with their life.
local extended = {}

-- The items of each batch note written to, by its number, and its first firing's id.
local batches = {}

local function add_item(i, g, letter, release)
  local batch = batches[g]
  if not batch then
    batch = {first = ARGV[notes_at + 3 * i - 1]}
    batches[g] = batch
  end
  batch[#batch + 1] = ARGV[notes_at + 3 * i] .. ',"' .. NOTED[letter] .. '",' ..
    string.format('%d', now - release) .. ']'
end

-- Writes a note of kind k: appended to its log, or written in place and its kind bounded.
local function write_kind(k, key, ttl, keep, value)
  local first = kind_key[k]
  keep = tonumber(keep)
  if kind_log[k] then
    log_note(KEYS[first], VERSION, now, key, ttl, keep, value, kind_log[k])
    if kind_extend[k] then extended[KEYS[first]] = kind_log[k] end
    return
  end
  write_note(KEYS[first], KEYS[first + 1], VERSION, now, key, ttl, value)
  bounds[first] = keep > 0 and keep or bounds[first] or 0
end

local function write_batches()
  local from = notes_at + 3 * n + 1
  for g, batch in pairs(batches) do
    local head = from + 3 * g - 2
    local k, ttl, keep = string.match(ARGV[head], '^(%d+)|(%d+)|(%d+)$')
    local value = string.gsub(ARGV[head + 2], '{{([%w_]+)}}',
      {items = table.concat(batch, ','), at_ms = string.format('%d', now)})
    write_kind(tonumber(k), ARGV[head + 1] .. '.' .. batch.first, ttl, keep, value)
  end
end

local function note(i, letter)
  local head = notes_at + 3 * i - 2
  local g, item_release = string.match(ARGV[head], '^@(%d+)|(%-?%d+)$')
  if g then
    return add_item(i, tonumber(g), letter, tonumber(item_release))
  end
  local k, ttl, keep, release = string.match(ARGV[head], '^(%d+)|(%d+)|(%d+)|(%-?%d+)$')
  if not k then return end
  local fields = {outcome = NOTED[letter], at_ms = string.format('%d', now),
    lateness_ms = string.format('%d', now - tonumber(release))}
  local value = string.gsub(ARGV[head + 2], '{{([%w_]+)}}', fields)
  write_kind(tonumber(k), ARGV[head + 1], ttl, keep, value)
end

for i = 1, n do
  local letter = string.sub(letters, i, i)
  if NOTED[letter] then note(i, letter) end
end
write_batches()
for first, keep in pairs(bounds) do
  sweep_notes(KEYS[first], KEYS[first + 1], keep, now, SLACK)
end
for log, life in pairs(extended) do
  extend_log(log, life)
end
return 1
