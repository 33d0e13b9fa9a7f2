-- tollgate: the token bucket's arithmetic and expiry for Redis, once: build.rs inserts
-- these sections into lua/policies.lua and, for a lone bucket, lua/lone.lua; the sections
-- are statements on the locals of the script they land in. Values are integers below
-- 2^53, exact as doubles; floor(a / b) is the quotient corrected by one where it rounded
-- across an integer, ceil(a / b) is floor((a + b - 1) / b). Mirrors
-- src/store/algorithm/token_bucket.rs to the unit (tests/it/lua_arithmetic.rs).
--
-- The key holds a string of 17 bytes, struct.pack('<xdd', l, t): a zero byte (no older
-- form starts with one), then two little-endian doubles. One C call reads or writes both,
-- where the text form before it, "<l>:<t>", took a search, two cuts and two conversions (a
-- tenth of the decision's time); that form is still read, and replaced by the first write.
--   l = level in units where one token is `period` units and `rate` units flow in per ms,
--   t = when the level was computed (ms); after `now` while the caller is in debt (a
--       charge took more tokens than there were): the level, 0, refills only from then.
-- A state matters until it has refilled: every write sets the value and the key's end in
-- one command, SET with PXAT t + ceil((capacity - l) / rate) (on the same clock as `now`),
-- when a missing key reads the same as the state, a full bucket. A lockout may bring that
-- end forward to the block's; the next write sets it again.
-- Older versions kept a hash (l, t, and x, a time before which the key did not expire):
-- such a key is read through HMGET when GET finds a hash, and the first write replaces it,
-- its expiry with it. An older version meeting the new form answers with Redis's WRONGTYPE
-- error, as a failed store call.

-- section: arguments
-- A lone bucket's script's one argument: its numbers and the cost, packed.
local rate, period, burst, cost = struct.unpack('<dddd', ARGV[1])

-- section: load
-- Reads `key` and refills its level to `now`: declares `capacity`, `level`, `updated`
-- (the stored time, nil for a full bucket with no state) and `at`.
local capacity = burst * period
local level, updated
local stored = redis.pcall('GET', key)
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
  stored = redis.call('HMGET', key, 'l', 't')
  level, updated = tonumber(stored[1]), tonumber(stored[2])
end
if level == nil or updated == nil then
  level, updated = capacity, nil
else
  local elapsed = now - updated
  if elapsed < 0 then
    elapsed = 0
  end
  -- past this much silence the bucket is full; checking first keeps products small
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
-- the time the state is written at and waits count from: the stored time never moves back
-- (a clock that went back), or the interval in between would be refilled twice
local at = updated
if at == nil or at < now then
  at = now
end

-- section: weigh
-- Whether `cost` units fit (`fits`) and how many remain before them (`remaining`).
fits = cost <= burst and level >= cost * period
remaining = floor(level / period)
if remaining * period > level then remaining = remaining - 1 elseif (remaining + 1) * period <= level then remaining = remaining + 1 end

-- section: refund
-- Gives back `cost` units counted at `given`; `fits` says whether the state changed. Runs
-- in lua/policies.lua alone, after lua/common.lua's floor_div and ceil_div.
if updated ~= nil and updated > now then
  -- in debt: what comes back pays it off first, as much of it as the refill would have,
  -- in whole milliseconds
  local owed = cost * period
  local paid = math.min(floor_div(owed, rate), updated - now)
  updated = updated - paid
  -- never before now: at most the debt was paid
  at = updated
  if updated <= now then
    level = math.min(capacity, owed - paid * rate)
  end
  fits = paid > 0 or level > 0
elseif level < capacity and updated ~= nil and updated >= given then
  -- puts back as many tokens as a bucket that never counted the request would hold more:
  -- its cost, less what flowed in between the count and the last write (that bucket may
  -- have been full meanwhile and lost it; since the last write this one only filled,
  -- which the cap accounts for), capped at the capacity. A state written before the
  -- count does not hold it.
  local owed = math.min(cost, burst) * period
  local since = updated - given
  -- checked first, so the product below stays under `owed`
  if since < ceil_div(owed, rate) then
    level, fits = math.min(capacity, level + owed - since * rate), true
  end
end

-- section: write
-- Takes `units` and writes the state and the key's end (when the level has refilled) in
-- one command.
level = level - units * period
if level < 0 then
  -- a charge past the bucket: the rest is a debt, refilled before the level rises
  local n = -level + rate - 1
  local owed = floor(n / rate)
  if owed * rate > n then owed = owed - 1 elseif (owed + 1) * rate <= n then owed = owed + 1 end
  at = at + owed
  level = 0
end
do
  local n = burst * period - level + rate - 1
  local refilled = floor(n / rate)
  if refilled * rate > n then refilled = refilled - 1 elseif (refilled + 1) * rate <= n then refilled = refilled + 1 end
  redis.call('SET', key, struct.pack('<xdd', level, at), 'PXAT', at + refilled)
end

-- section: wait
-- `reset`: milliseconds until `wanted` more tokens are in, 0 when they never will by
-- waiting (more than the burst) or the caller is admitted with the whole burst left;
-- while in debt, the refill starts only at `at`.
if not ((fits and remaining >= burst) or wanted > burst) then
  local missing = wanted * period - level
  if missing > 0 then
    local n = missing + rate - 1
    local wait = floor(n / rate)
    if wait * rate > n then wait = wait - 1 elseif (wait + 1) * rate <= n then wait = wait + 1 end
    reset = wait + at - now
  end
end
