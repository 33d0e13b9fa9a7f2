-- tollgate: the token bucket. A policy's key holds a hash:
--   l = level in units where one token is `period` units and `rate` units flow in per ms,
--   t = when the level was computed (ms),
--   x = a time (ms) before which the key does not expire.
--
-- A state matters until it has refilled: after writing level l at `now` the key must live
-- until now + ceil_div(capacity - l, rate) at least. A write whose x reaches that far
-- writes l and t only; any other sets x = now + one full refill and the key's expiry to
-- exactly x (PEXPIREAT, on the same clock as `now`). So a busy key that stays well above
-- empty sets its expiry about once per full refill instead of on every write; one kept
-- near empty (at its limit) still sets it on most admitted writes.
--
-- x stays a lower bound of the key's expiry whatever writes the key: a write that skips
-- leaves the expiry alone; a write that sets x sets the expiry to x with it; the key's
-- expiry or deletion takes x with it; and the other writers of a token bucket, lua/check.lua
-- and this module's `store` (lua/lease.lua, lua/refund.lua), follow this rule. Older
-- versions of these scripts leave x alone and on every write set the expiry one full
-- refill after a moment of their own run (PEXPIRE is relative): Redis runs one script at
-- a time, so on a clock that does not go back that moment is at or after the `now` that
-- wrote x, and the expiry they set is at or after x. That is also why x is one full
-- refill ahead and no more: with a longer x, an older version's write could bring the
-- expiry before it, and a later write trusting x could outlive the key.

local token_bucket = {}

function token_bucket.load(key, now, rate, period, burst)
  local capacity = burst * period
  local stored = redis.call('HMGET', key, 'l', 't', 'x')
  local level, updated = tonumber(stored[1]), tonumber(stored[2])
  if level == nil or updated == nil then
    level = capacity
  else
    local elapsed = math.max(now - updated, 0)
    -- past this much silence the bucket is full; checking first keeps products small
    if elapsed >= ceil_div(capacity, rate) then
      level = capacity
    else
      level = math.min(capacity, level + elapsed * rate)
    end
  end
  return { level = level, now = now, expiry = tonumber(stored[3]), updated = updated }
end

function token_bucket.fits(st, cost, rate, period, burst)
  if cost > burst then
    return false
  end
  return st.level >= cost * period
end

function token_bucket.consume(st, cost, rate, period, burst)
  st.level = st.level - cost * period
end

-- Puts back the tokens of a request of `cost` counted at `counted_at`, as many as a bucket
-- that never counted it would hold more: `cost`, less what flowed in between the count and
-- the last write (that bucket may have been full meanwhile and lost it; since the last write
-- this one only filled, which the cap accounts for), capped at the capacity. A state written
-- before the count does not hold it. Returns whether anything changed.
function token_bucket.refund(st, counted_at, cost, rate, period, burst)
  local capacity = burst * period
  if st.level >= capacity or st.updated == nil or st.updated < counted_at then
    return false
  end
  local owed = math.min(cost, burst) * period
  local since = st.updated - counted_at
  -- checked first, so the product below stays under `owed`
  if since >= ceil_div(owed, rate) then
    return false
  end
  st.level = math.min(capacity, st.level + owed - since * rate)
  return true
end

-- Writes the level at `now`, and the expiry only when x falls short of its refill (above).
-- The stored time never moves back (a clock that went back): moved back, the interval in
-- between would be refilled twice.
function token_bucket.store(key, st, now, rate, period, burst)
  local capacity = burst * period
  local at = now
  if st.updated and st.updated > now then
    at = st.updated
  end
  if st.expiry and st.expiry - at >= ceil_div(capacity - st.level, rate) then
    redis.call('HSET', key, 'l', st.level, 't', at)
  else
    local expiry = at + ceil_div(capacity, rate)
    redis.call('HSET', key, 'l', st.level, 't', at, 'x', expiry)
    redis.call('PEXPIREAT', key, expiry)
  end
end

-- The whole tokens left, and the wait until one more is (for a refusal, until `cost` are).
function token_bucket.report(st, fits, cost, rate, period, burst)
  local remaining = floor_div(st.level, period)
  local units = cost
  if fits then
    units = remaining + 1
  end
  local reset = 0
  if not ((fits and remaining >= burst) or units > burst) then
    reset = ceil_div(math.max(units * period - st.level, 0), rate)
  end
  return remaining, reset
end
