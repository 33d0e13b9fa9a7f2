-- tollgate: the decision of one token bucket that does not lock out, the commonest call
-- there is, in a script of its own: lua/policies.lua decides it too, to the unit, but
-- Redis runs a script's whole body per call, and that one's loops over policies, kinds
-- and operations cost a token bucket nearly half of each decision. Same key, same form
-- (see lua/policies.lua; both read it, and the older forms, with lua/common.lua's
-- bucket_state), same arithmetic, same reply: either script may follow the other on a
-- key, and lua/policies.lua does everything else (leases, refunds, charges, lockouts,
-- several policies).
--
-- KEYS[1]  the policy's key
-- ARGV     rate, period_ms, burst, cost
-- Returns  { admitted (0/1), admitted (0/1), remaining, reset_ms, the time of the decision }
--
-- Runs after lua/common.lua and lua/clock.lua (`now`).

local rate, period, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local capacity = burst * period
local level, updated = bucket_state(KEYS[1])
if level == nil or updated == nil then
  level, updated = capacity, nil
else
  local elapsed = now - updated
  if elapsed < 0 then
    elapsed = 0
  end
  if elapsed >= ceil_div(capacity, rate) then
    level = capacity
  else
    level = level + elapsed * rate
    if level > capacity then
      level = capacity
    end
  end
end

local fits = cost <= burst and level >= cost * period
local remaining = floor_div(level, period)
-- the stored time never moves back (see lua/policies.lua)
local at = updated
if at == nil or at < now then
  at = now
end
local wanted = cost
if fits then
  remaining = remaining - cost
  level = level - cost * period
  redis.call('SET', KEYS[1], struct.pack('<xdd', level, at), 'PXAT', at + ceil_div(capacity - level, rate))
  wanted = remaining + 1
end
local reset = 0
if not ((fits and remaining >= burst) or wanted > burst) then
  local missing = wanted * period - level
  if missing > 0 then
    reset = ceil_div(missing, rate) + at - now
  end
end
local verdict = fits and 1 or 0
return { verdict, verdict, remaining, reset, now }
