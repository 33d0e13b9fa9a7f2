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

function token_bucket.fits(st, rate, period, burst)
  return st.level >= period
end

function token_bucket.consume(st, rate, period, burst)
  st.level = st.level - period
end

function token_bucket.store(key, st, now, rate, period, burst)
  redis.call('HSET', key, 'l', st.level, 't', now)
  -- once refilled completely the state affects no decision
  redis.call('PEXPIRE', key, ceil_div(burst * period, rate))
end

function token_bucket.report(st, rate, period, burst)
  local remaining = floor_div(st.level, period)
  local reset = 0
  if remaining < burst then
    reset = ceil_div((remaining + 1) * period - st.level, rate)
  end
  return remaining, reset
end
