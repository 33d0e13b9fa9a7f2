-- tollgate: one instance's heartbeat into the registry of live instances.
--
-- KEYS[1]  the registry, a sorted set of instance id -> last heartbeat (Redis time, ms)
-- ARGV[1]  this instance's id
-- ARGV[2]  the liveness window in ms: an instance is live if it beat within it
-- Returns  the number of live instances, this one included

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local window = tonumber(ARGV[2])

redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
-- a registry nobody beats into any more disappears by itself
redis.call('PEXPIRE', KEYS[1], 10 * window)
return redis.call('ZCARD', KEYS[1])
