-- tollgate: one instance's heartbeat into the registry of live instances.
--
-- KEYS[1]  the registry, a sorted set of instance id -> last heartbeat (Redis time, ms), plus
--          one marker member whose score is minus the time the registry was last (re)built
-- ARGV[1]  this instance's id
-- ARGV[2]  the liveness window in ms: an instance is live if it beat within it
-- Returns  {the number of live instances, this one included;
--           ms since the registry was (re)built;
--           this instance's place among the live ones, ordered by id, from 0}
--
-- A registry with no live instance at all is being (re)built: it is new, or Redis lost it
-- (a restart or a failover), or every instance was cut off for a whole window. Until a whole
-- window has passed since then, the other live instances may not have beaten into it yet, so
-- its count may be too low; the callers keep their last trusted count until it is not.

local marker = '\0rebuilt'
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local window = tonumber(ARGV[2])

-- beats are scored from 0 up, the marker below 0: it never expires and is never counted
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, now - window)
local rebuilt = nil
if redis.call('ZCOUNT', KEYS[1], 0, '+inf') > 0 then
    local score = redis.call('ZSCORE', KEYS[1], marker)
    -- a marker from the future (Redis's clock went back) would hold counts for too long
    if score and -tonumber(score) <= now then
        rebuilt = -tonumber(score)
    end
end
if rebuilt == nil then
    rebuilt = now
    redis.call('ZADD', KEYS[1], -now, marker)
end

redis.call('ZADD', KEYS[1], now, ARGV[1])
-- a registry nobody beats into any more disappears by itself
redis.call('PEXPIRE', KEYS[1], 10 * window)
-- Ordered by id, every instance sees the same places: a local share spreads its
-- remainder, and takes turns, by them.
local place = 0
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], 0, '+inf')) do
    if member < ARGV[1] then
        place = place + 1
    end
end
return {redis.call('ZCOUNT', KEYS[1], 0, '+inf'), now - rebuilt, place}
