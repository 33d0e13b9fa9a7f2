-- tollgate: the sliding log's arithmetic and expiry for Redis, once: build.rs inserts
-- these sections where lua/policies.lua names them. Mirrors
-- src/store/algorithm/sliding_log.rs to the unit (tests/it/lua_arithmetic.rs).
--
-- The key holds a sorted set, one member per admitted unit, scored by the time of its
-- admission (ms); a member scored t counts while t > now - window. A request of `cost`
-- units fits when the members that count plus the cost are at most the limit. The members
-- of one time are named '<time>:<n>', n from 1 up without gaps (five digits, so that their
-- order by name is their order by n): an admission adds the next numbers, a refund takes
-- out the highest. A refund takes out up to `cost` of the members scored at the refunded
-- decision's time (the ones it added; taking any other would count less than never
-- counting the request). An admission first removes the members that no longer count, and
-- counts its units at `now`, or at the newest member's time when that is later (a clock
-- that moved back: later is only stricter, and keeps the newest last); the key expires one
-- window after that time (PEXPIREAT, on the same clock as `now`), when no member counts
-- any more. A refund only removes: it keeps the expiry.

-- section: load
-- Declares `count`, the members of `key` that count at `now`.
local count = redis.call('ZCOUNT', key, string.format('(%d', now - window), '+inf')

-- section: weigh
-- Whether `cost` units fit (`fits`) and how many remain before them (`remaining`).
fits = cost <= limit and count + cost <= limit
if limit > count then
  remaining = limit - count
end

-- section: refund
-- Takes out up to `cost` of the members the decision counted at `given` added, while they
-- count; `fits` says whether the state changed.
if cost > 0 and given > now - window then
  local members = redis.call('ZREVRANGEBYSCORE', key, given, given, 'LIMIT', 0, cost)
  -- unpack takes a few thousand values at most: in batches
  for first = 1, #members, 1000 do
    redis.call('ZREM', key, unpack(members, first, math.min(first + 999, #members)))
    fits = true
  end
  count = count - #members
end

-- section: write
-- Counts `units` at `now` (or at the newest member's time, when later), and sets the
-- key's end.
if units > 0 then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local at = now
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if newest[2] and tonumber(newest[2]) > now then
    at = tonumber(newest[2])
  end
  local n = redis.call('ZCOUNT', key, at, at)
  local batch = {}
  for u = 1, units do
    batch[#batch + 1] = at
    batch[#batch + 1] = string.format('%d:%05d', at, n + u)
    if #batch >= 2000 or u == units then
      redis.call('ZADD', key, unpack(batch))
      batch = {}
    end
  end
  redis.call('PEXPIREAT', key, at + window)
  count = count + units
end

-- section: wait
-- `reset`: milliseconds until `wanted` more units fit: until the oldest member that must
-- leave for them leaves; 0 when they never will by waiting (more than the limit) or the
-- caller is admitted with the whole quota left.
if not ((fits and remaining >= limit) or wanted > limit) then
  local leaving = count + wanted - limit
  if leaving >= 1 then
    local oldest = redis.call('ZRANGEBYSCORE', key, string.format('(%d', now - window), '+inf', 'WITHSCORES', 'LIMIT', leaving - 1, 1)
    if oldest[2] and tonumber(oldest[2]) + window > now then
      reset = tonumber(oldest[2]) + window - now
    end
  end
end
