-- tollgate: the token bucket. A policy's key holds a hash:
--   l = level in units where one token is `period` units and `rate` units flow in per ms,
--   t = when the level was computed (ms).

local token_bucket = {}

function token_bucket.load(key, now, rate, period, burst)
  local capacity = burst * period
  local stored = redis.call('HMGET', key, 'l', 't')
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
  return { level = level, now = now }
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

-- Puts `cost` tokens back, capped at the capacity. Returns whether anything changed.
function token_bucket.refund(st, counted_at, cost, rate, period, burst)
  local capacity = burst * period
  if st.level >= capacity then
    return false
  end
  st.level = math.min(capacity, st.level + math.min(cost, burst) * period)
  return true
end

function token_bucket.store(key, st, now, rate, period, burst)
  redis.call('HSET', key, 'l', st.level, 't', now)
  -- once refilled completely the state affects no decision
  redis.call('PEXPIRE', key, ceil_div(burst * period, rate))
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
