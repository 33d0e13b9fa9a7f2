-- tollgate: the decision of one sliding window that does not lock out, the commonest call
-- of all, in a script of its own, as lua/token_bucket.lua is for a lone token bucket: the
-- same key and form as lua/policies.lua's (a hash of s, p and c, ending two windows after
-- s), the same arithmetic to the unit, so that either script may follow the other on a
-- key. lua/policies.lua does everything else.
--
-- KEYS[1]  the policy's key
-- ARGV[1]  limit, window_ms and cost, packed as three little-endian doubles (exact: every
--          value here is an integer below 2^53)
-- Returns  25 bytes: struct.pack('<Bddd', admitted (0/1), remaining, reset_ms, the time of
--          the decision)
--
-- Runs after lua/clock.lua (`now`), without lua/common.lua: no function is defined here
-- (each would be a closure built on every call), the arguments are read by one unpack and
-- the reply is one string (see lua/token_bucket.lua for what each costs).

local limit, window, cost = struct.unpack('<ddd', ARGV[1])
local floor = math.floor
local stored = redis.call('HMGET', KEYS[1], 's', 'p', 'c')
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

-- Each floor(a / b) below is the quotient of doubles, corrected by one where it rounded
-- across an integer (as floor_div in lua/common.lua).
local used = p * (window - elapsed) + c * window
local fits = cost <= limit and used <= (limit - cost) * window
local remaining = 0
if limit * window > used then
  local n = limit * window - used
  remaining = floor(n / window)
  if remaining * window > n then remaining = remaining - 1 elseif (remaining + 1) * window <= n then remaining = remaining + 1 end
end

local wanted = cost
if fits then
  remaining = remaining - cost
  if remaining < 0 then
    remaining = 0
  end
  wanted = remaining + 1
  c = c + cost
  if whole then
    redis.call('HSET', KEYS[1], 's', s, 'p', p, 'c', c)
    redis.call('PEXPIREAT', KEYS[1], s + 2 * window)
  else
    redis.call('HSET', KEYS[1], 'c', c)
  end
end
local reset = 0
if not ((fits and remaining >= limit) or wanted > limit) then
  -- milliseconds until `wanted` more fit
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
return struct.pack('<Bddd', fits and 1 or 0, remaining, reset, now)
