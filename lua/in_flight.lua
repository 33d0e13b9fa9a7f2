-- tollgate: one caller's slots of requests in flight, for one limit, atomically.
--
-- KEYS[1]  the slots: a sorted set of slot ids, each scored by its expiry (ms, Redis's
--          clock); rl:{acme}:reports:in-flight
-- ARGV     'acquire', the slot id, its time to live (ms), the limit: takes the slot if
--            fewer than the limit are held (expired slots are dropped first); returns
--            { 1, held } or { 0, held }
--          'renew', the slot id, its time to live (ms): extends a slot still held;
--            returns 1, or 0 if it expired or was freed
--          'release', the slot id: frees it; returns 1 if it was held
--
-- Runs after lua/clock.lua (`now`). An expired slot is one whose instance stopped renewing
-- it (it died, or lost Redis): it counts no more, whatever its request is doing. The key
-- itself expires with its last slot.

local key, op, slot = KEYS[1], ARGV[1], ARGV[2]

if op == 'release' then
  return redis.call('ZREM', key, slot)
end

local ttl = tonumber(ARGV[3])

-- Every slot expires by the latest expiry of the set: so does the key.
local function expire_with_last_slot()
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIREAT', key, tonumber(last[2]))
  end
end

if op == 'renew' then
  local expiry = tonumber(redis.call('ZSCORE', key, slot))
  if expiry == nil or expiry <= now then
    redis.call('ZREM', key, slot)
    return 0
  end
  redis.call('ZADD', key, now + ttl, slot)
  expire_with_last_slot()
  return 1
end

-- acquire
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if redis.call('ZSCORE', key, slot) then
  return { 1, redis.call('ZCARD', key) }
end
local held = redis.call('ZCARD', key)
if held >= tonumber(ARGV[4]) then
  return { 0, held }
end
redis.call('ZADD', key, now + ttl, slot)
expire_with_last_slot()
return { 1, held + 1 }
