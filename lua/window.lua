-- tollgate: a sliding window counter kept as three numbers (the start of the current fixed
-- window, the previous window's count, the current one's), as lua/policies.lua keeps one,
-- for the two-tier store's scripts (lua/regional.lua, lua/global.lua). Runs after
-- lua/common.lua.

-- A sliding window counter (start, previous, current) moved on to `t`.
local function rolled(start, previous, current, window, t)
  local s = t - t % window
  if start >= s then
    return start, previous, current
  elseif start + window == s then
    return s, current, 0
  end
  return s, 0, 0
end

-- Two counters of one window added, both moved on to `t`.
local function added(s1, p1, c1, s2, p2, c2, window, t)
  s1, p1, c1 = rolled(s1, p1, c1, window, t)
  s2, p2, c2 = rolled(s2, p2, c2, window, t)
  return math.max(s1, s2), p1 + p2, c1 + c2
end

-- What it holds at `t`, times the window (exact in integers).
local function used_scaled(start, previous, current, window, t)
  start, previous, current = rolled(start, previous, current, window, t)
  local elapsed = math.min(t - start, window)
  return previous * (window - elapsed) + current * window
end

-- How many more units a counter of `limit` per window has room for at `t`.
local function room(limit, start, previous, current, window, t)
  local left = limit * window - used_scaled(start, previous, current, window, t)
  if left <= 0 then
    return 0
  end
  return floor_div(left, window)
end
