-- tollgate: the decision of one token bucket that does not lock out, the commonest call
-- there is, in a script of its own: lua/policies.lua decides it too, to the unit, but
-- Redis runs a script's whole body per call, and that one's loops over policies, kinds
-- and operations cost a token bucket nearly half of each decision. Same key, same form
-- (see lua/policies.lua), same arithmetic: either script may follow the other on a key,
-- and lua/policies.lua does everything else (leases, refunds, charges, lockouts, several
-- policies).
--
-- KEYS[1]  the policy's key
-- ARGV[1]  rate, period_ms, burst and cost, packed as four little-endian doubles
--          (exact: every value here is an integer below 2^53)
-- Returns  25 bytes: struct.pack('<Bddd', admitted (0/1), remaining, reset_ms, the time of
--          the decision)
--
-- Runs after lua/clock.lua (`now`), without lua/common.lua. What a call costs here is
-- mostly the interpreter's own work, measured in redis-server: four tonumber() calls on
-- text arguments took 0.4 µs where one unpack takes 0.1; each function defined in the
-- body is a closure built on every call; a reply of five integers cost 0.4 µs more than
-- one string. Hence packed arguments and reply, and the divisions written out.

local rate, period, burst, cost = struct.unpack('<dddd', ARGV[1])
local capacity = burst * period
local floor = math.floor

local level, updated
local stored = redis.pcall('GET', KEYS[1])
if type(stored) == 'string' then
  if string.byte(stored) == 0 then
    level, updated = struct.unpack('<xdd', stored)
  else
    -- the text form "<l>:<t>" of older versions
    local split = string.find(stored, ':', 1, true)
    if split then
      level, updated = tonumber(string.sub(stored, 1, split - 1)), tonumber(string.sub(stored, split + 1))
    end
  end
elseif stored then
  -- GET failed: the hash of l and t of older versions
  stored = redis.call('HMGET', KEYS[1], 'l', 't')
  level, updated = tonumber(stored[1]), tonumber(stored[2])
end

-- ceil(a / b) for the integers here: the quotient of doubles, corrected by one where it
-- rounded across an integer (as ceil_div in lua/common.lua)
if level == nil or updated == nil then
  level, updated = capacity, nil
else
  local elapsed = now - updated
  if elapsed < 0 then
    elapsed = 0
  end
  local n = capacity + rate - 1
  local full = floor(n / rate)
  if full * rate > n then full = full - 1 elseif (full + 1) * rate <= n then full = full + 1 end
  if elapsed >= full then
    level = capacity
  else
    level = level + elapsed * rate
    if level > capacity then
      level = capacity
    end
  end
end

local fits = cost <= burst and level >= cost * period
local remaining = floor(level / period)
if remaining * period > level then
  remaining = remaining - 1
elseif (remaining + 1) * period <= level then
  remaining = remaining + 1
end
-- the stored time never moves back (see lua/policies.lua)
local at = updated
if at == nil or at < now then
  at = now
end
local wanted = cost
if fits then
  remaining = remaining - cost
  level = level - cost * period
  local n = capacity - level + rate - 1
  local refilled = floor(n / rate)
  if refilled * rate > n then refilled = refilled - 1 elseif (refilled + 1) * rate <= n then refilled = refilled + 1 end
  redis.call('SET', KEYS[1], struct.pack('<xdd', level, at), 'PXAT', at + refilled)
  wanted = remaining + 1
end
local reset = 0
if not ((fits and remaining >= burst) or wanted > burst) then
  local missing = wanted * period - level
  if missing > 0 then
    local n = missing + rate - 1
    local wait = floor(n / rate)
    if wait * rate > n then wait = wait - 1 elseif (wait + 1) * rate <= n then wait = wait + 1 end
    reset = wait + at - now
  end
end
return struct.pack('<Bddd', fits and 1 or 0, remaining, reset, now)
