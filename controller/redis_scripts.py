"""The Lua scripts the controller runs in Redis (each one round trip, applied atomically)."""

from __future__ import annotations

COMMIT_LUA = """
-- Store.commit: records, an intent and numbered events in one step.
-- KEYS: intents, servers, apps, events, event_seq, rev.  ARGV[1]: the batch (Store.commit).
-- Returns {the first event's sequence number (0 without events), the revision (0 when no
-- record was written)}.
local batch = cjson.decode(ARGV[1])
if type(batch.intent) == 'table' then
  redis.call('HSET', KEYS[1], batch.intent[1], batch.intent[2])
end
for _, pair in ipairs(batch.servers) do redis.call('HSET', KEYS[2], pair[1], pair[2]) end
for _, pair in ipairs(batch.apps) do redis.call('HSET', KEYS[3], pair[1], pair[2]) end
local rev = 0
if #batch.servers + #batch.apps > 0 then rev = redis.call('INCR', KEYS[6]) end
local count = #batch.events
if count == 0 then return {0, rev} end
local first = redis.call('INCRBY', KEYS[5], count) - count + 1
for i, rest in ipairs(batch.events) do
  local seq = first + i - 1
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', batch.maxlen, seq .. '-0',
             'data', '{"seq":' .. seq .. ',' .. string.sub(rest, 2))
end
return {first, rev}
"""

CLAIM_LUA = """
-- IdempotencyLog.claim: the key's record when there is one, else ARGV[1] is stored as the
-- running request's marker (for ARGV[2] seconds) and false returned.
local current = redis.call('GET', KEYS[1])
if current then return current end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return false
"""

REPLACE_LUA = """
-- Replace the key's value by ARGV[2] (for ARGV[3] seconds; an empty ARGV[2] deletes it) only
-- while it is still ARGV[1]: 1 when replaced, 0 when someone else changed it first.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1])
else redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3]) end
return 1
"""
