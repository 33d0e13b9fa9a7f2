-- tollgate: the sliding window counter's arithmetic and expiry for Redis, once: build.rs
-- inserts these sections into lua/policies.lua and, for a lone window, lua/lone.lua. Each
-- is plain statements on the locals of the script it lands in (a function here would be a
-- closure Redis builds on every call). The numbers are integers below 2^53, exact in
-- doubles; each floor(a / b) is the quotient corrected by one where it rounded across an
-- integer. Mirrors src/store/algorithm/sliding_window.rs (tests/it/lua_arithmetic.rs).
--
-- The key holds a hash: s = start of the current fixed window (ms), p = the previous
-- window's count, c = the current one's. A request of `cost` units (at most limit) fits
-- when p * (w - elapsed) + c * w <= (limit - cost) * w. A state weighs in decisions until
-- two windows after its start: at s + w its count becomes the previous one, at s + 2w it is
-- forgotten. So the key expires at exactly s + 2w (PEXPIREAT, on the same clock as `now`),
-- set whenever s is written; a write that keeps s keeps the expiry. Older versions set it
-- 2w after their own time, at or after s: never earlier than this rule.

-- section: arguments
-- A lone window's script's one argument: its numbers and the cost, packed.
local limit, window, cost = struct.unpack('<ddd', ARGV[1])

-- section: load
-- Reads `key` and rolls its state to `now`'s window: declares s, p, c, `elapsed` (now - s,
-- at least 0) and `whole` (whether s moved, so that a write rewrites the whole state).
local stored = redis.call('HMGET', key, 's', 'p', 'c')
local start = now - now % window
local s, p, c = tonumber(stored[1]), tonumber(stored[2]) or 0, tonumber(stored[3]) or 0
local whole = true
if s == start then
  whole = false
elseif s == nil then
  s, p, c = start, 0, 0
elseif s + window == start then
  s, p, c = start, c, 0
elseif s > start then
  -- a state from the future (the clock moved back): keep it, it is only stricter
  whole = false
else
  s, p, c = start, 0, 0
end
local elapsed = now - s
if elapsed < 0 then
  elapsed = 0
end

-- section: weigh
-- Whether `cost` units fit (`fits`) and how many remain before them (`remaining`).
local used = p * (window - elapsed) + c * window
fits = cost <= limit and used <= (limit - cost) * window
if limit * window > used then
  local n = limit * window - used
  remaining = floor(n / window)
  if remaining * window > n then remaining = remaining - 1 elseif (remaining + 1) * window <= n then remaining = remaining + 1 end
end

-- section: refund
-- Gives back `cost` units counted at `given`: they come off the window they were counted
-- in while it still weighs, never below 0; `fits` says whether the state changed.
local counted_in = given - given % window
if counted_in == s and c > 0 then
  c, fits = math.max(c - cost, 0), true
elseif counted_in + window == s and p > 0 then
  p, fits, whole = math.max(p - cost, 0), true, true
end

-- section: write
-- Counts `units` and writes the state, with the key's end when s moved.
c = c + units
if whole then
  redis.call('HSET', key, 's', s, 'p', p, 'c', c)
  redis.call('PEXPIREAT', key, s + 2 * window)
else
  redis.call('HSET', key, 'c', c)
end

-- section: wait
-- `reset`: milliseconds until `wanted` more units fit, 0 when they never will by waiting
-- (more than the limit) or the caller is admitted with the whole quota left.
if not ((fits and remaining >= limit) or wanted > limit) then
  if c + wanted <= limit then
    if p > 0 then
      -- the previous window's share falls enough at `earliest` into this one
      local n = (limit - c - wanted) * window
      local q = floor(n / p)
      if q * p > n then q = q - 1 elseif (q + 1) * p <= n then q = q + 1 end
      local earliest = window - q
      if earliest > elapsed then
        reset = earliest - elapsed
      end
    end
  else
    -- only the next window has room, once this one's share of it falls enough
    local earliest = 0
    if c > 0 then
      local n = (limit - wanted) * window
      local q = floor(n / c)
      if q * c > n then q = q - 1 elseif (q + 1) * c <= n then q = q + 1 end
      earliest = window - q
      if earliest < 0 then
        earliest = 0
      end
    end
    reset = window - elapsed + earliest
  end
end
