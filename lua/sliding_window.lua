-- tollgate: the sliding window counter. A policy's key holds a hash:
--   s = start of the current fixed window (ms), p = previous window's count, c = current count.
-- A request of `cost` units (at most limit) fits when p * (w - elapsed) + c * w <= (limit - cost) * w.

local sliding_window = {}

function sliding_window.load(key, now, limit, window)
  local start = now - (now % window)
  local stored = redis.call('HMGET', key, 's', 'p', 'c')
  local s, p, c = tonumber(stored[1]), tonumber(stored[2]) or 0, tonumber(stored[3]) or 0
  if s == nil then
    s, p, c = start, 0, 0
  elseif s == start then
    -- the same window
  elseif s + window == start then
    s, p, c = start, c, 0
  elseif s > start then
    -- a state from the future (the clock moved back): keep it, it is only stricter
  else
    s, p, c = start, 0, 0
  end
  local elapsed = math.min(math.max(now - s, 0), window)
  return { s = s, p = p, c = c, elapsed = elapsed }
end

function sliding_window.fits(st, cost, limit, window)
  if cost > limit then
    return false
  end
  return st.p * (window - st.elapsed) + st.c * window <= (limit - cost) * window
end

function sliding_window.consume(st, cost)
  st.c = st.c + cost
end

-- Takes `cost` units off the window they were counted in (at `counted_at`) while it still
-- weighs, never below 0. Returns whether anything changed.
function sliding_window.refund(st, counted_at, cost, limit, window)
  local counted_in = counted_at - (counted_at % window)
  if counted_in == st.s and st.c > 0 then
    st.c = math.max(st.c - cost, 0)
    return true
  elseif counted_in + window == st.s and st.p > 0 then
    st.p = math.max(st.p - cost, 0)
    return true
  end
  return false
end

function sliding_window.store(key, st, now, limit, window)
  redis.call('HSET', key, 's', st.s, 'p', st.p, 'c', st.c)
  -- after two windows of silence the state affects no decision
  redis.call('PEXPIRE', key, 2 * window)
end

-- Milliseconds until `units` more requests fit.
local function sliding_wait(st, limit, window, units)
  if st.c + units <= limit then
    if st.p == 0 then
      return 0
    end
    local earliest = math.max(window - floor_div((limit - st.c - units) * window, st.p), 0)
    return math.max(earliest - st.elapsed, 0)
  elseif units <= limit then
    local earliest = 0
    if st.c > 0 then
      earliest = math.max(window - floor_div((limit - units) * window, st.c), 0)
    end
    return (window - st.elapsed) + earliest
  end
  return 9007199254740991
end

-- What remains, and the wait until one more unit fits (for a refusal, until `cost` do).
function sliding_window.report(st, fits, cost, limit, window)
  local used = st.p * (window - st.elapsed) + st.c * window
  local budget = limit * window
  local remaining = 0
  if budget > used then
    remaining = floor_div(budget - used, window)
  end
  local units = cost
  if fits then
    units = remaining + 1
  end
  local reset = 0
  if not ((fits and remaining >= limit) or units > limit) then
    reset = sliding_wait(st, limit, window, units)
  end
  return remaining, reset
end
