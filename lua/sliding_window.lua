-- tollgate: the sliding window counter. A policy's key holds a hash:
--   s = start of the current fixed window (ms), p = previous window's count, c = current count.
-- A request fits when p * (w - elapsed) + (c + 1) * w <= limit * w.

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

function sliding_window.fits(st, limit, window)
  return st.p * (window - st.elapsed) + (st.c + 1) * window <= limit * window
end

function sliding_window.consume(st)
  st.c = st.c + 1
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

function sliding_window.report(st, limit, window)
  local used = st.p * (window - st.elapsed) + st.c * window
  local budget = limit * window
  local remaining = 0
  if budget > used then
    remaining = floor_div(budget - used, window)
  end
  local reset = 0
  if remaining < limit then
    reset = sliding_wait(st, limit, window, remaining + 1)
  end
  return remaining, reset
end
