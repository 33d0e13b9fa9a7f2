-- tollgate: every operation on one caller's policies, atomically: a decision, a lease, a
-- refund. Each algorithm's arithmetic and the expiry of its keys are written here once.
--
-- KEYS[i]  policy i's key; all of one caller's keys share a hash tag: rl:{acme}:per-second;
--          after the policies' keys, the block key of each policy that locks out, in order
-- ARGV     four numbers per policy: kind (1 sliding window, 2 token bucket, 3 sliding log,
--          or for a policy that locks out, ten times its lockout in ms plus that: 6000001),
--          then limit, window_ms, 0 (sliding window, sliding log) or rate, period_ms, burst
--          (token bucket);
--          then one of
--            nothing or the cost (1 when absent): decides one request of `cost` units;
--            the cost, the units wanted (at least the cost), 'lease': grants the largest
--              count up to the units wanted that every policy admits at once;
--            the cost, the time of the decision that counted it, 'refund': gives it back
--            the units, 0, 'charge': counts them whether or not they fit (what an admitted
--              request turned out to cost beyond its reservation); past a quota the caller
--              is in debt and later requests are refused until it has drained
-- Returns  a decision, a lease or a charge: { admitted (0/1), or the units granted, then per
--            policy: admitted (0/1), remaining, reset_ms, then the time of the decision
--            (ms), which a refund names }; a refund: the number of policies whose state
--            changed
--
-- Runs after lua/common.lua and lua/clock.lua (`now`). A decision writes nothing unless
-- every policy admits: a refused request consumes nothing. A lease grant below the cost is
-- no grant: nothing is written and the reply is the decision's refusal of the request. A
-- refund never admits more than not counting the request at all, and creates no key.
--
-- Lockouts. A policy that locks out has a block key beside its counter, holding the time
-- the block began and expiring when it ends (SET PX): while it exists the caller is refused
-- by that policy, whatever its counter says, and nothing is counted. The operation that
-- takes units and leaves such a policy with nothing remaining sets it, in the same call,
-- and brings the policy's counter key's expiry forward to the block's end when it was
-- later, so that the caller starts afresh when the block ends. A refund that gives units
-- back to the policy, of a decision counted no later than the block began, deletes the
-- block: without that request the quota was not used up. Its name holds no unit (see
-- Policy::lockout_counter), so limits reloaded with the same policy name keep it.
--
-- This runs in Redis's single thread on every decision, and Redis runs the whole script
-- body on every call, so every function or table defined here is built again per call
-- (defining the two algorithms as modules of functions cost a seventh of a decision, and
-- each Lua call about a hundredth). Hence one straight-line pass per phase, plain locals
-- and one flat table for the whole call, each algorithm a branch of each phase.
-- tests/it/lua_arithmetic.rs drives this file against the Rust algorithms.
--
-- The sliding window counter. Its key holds a hash:
--   s = start of the current fixed window (ms), p = previous window's count, c = current count.
-- A request of `cost` units (at most limit) fits when p * (w - elapsed) + c * w <= (limit - cost) * w.
-- A state weighs in decisions until two windows after its start: at s + w its count becomes
-- the previous one, at s + 2w it is forgotten. So the key expires at exactly s + 2w
-- (PEXPIREAT, on the same clock as `now`), set whenever s is written; a write that keeps s
-- keeps the expiry. Older versions of this script set it 2w after their own time, at or
-- after s: never earlier than this rule.
--
-- The token bucket. Its key holds a string of 17 bytes, struct.pack('<xdd', l, t): a zero
-- byte (no older form starts with one), then two little-endian doubles, exact as every
-- value here is an integer below 2^53. One C call reads or writes both, where the text
-- form before it, "<l>:<t>", took a search, two cuts and two conversions (a tenth of the
-- decision's time); that form is still read (bucket_state, lua/common.lua), and replaced by
-- the first write.
--   l = level in units where one token is `period` units and `rate` units flow in per ms,
--   t = when the level was computed (ms); after `now` while the caller is in debt (a
--       charge took more tokens than there were): the level, 0, refills only from then.
-- A state matters until it has refilled: every write sets the value and the key's end in
-- one command, SET with PXAT t + ceil_div(capacity - l, rate) (on the same clock as
-- `now`), when a missing key reads the same as the state, a full bucket. A lockout may
-- bring that end forward to the block's; the next write sets it again.
-- Older versions of this script kept a hash (l, t, and x, a time before which the key did
-- not expire): such a key is read through HMGET when GET finds a hash, and the first write
-- replaces it, its expiry with it. An older version meeting the new form answers with
-- Redis's WRONGTYPE error, as a failed store call.
--
-- The sliding log. Its key holds a sorted set, one member per admitted unit, scored by the
-- time of its admission (ms); a member scored t counts while t > now - window. A request of
-- `cost` units fits when the members that count plus the cost are at most the limit. The
-- members of one time are named '<time>:<n>', n from 1 up without gaps (five digits, so
-- that their order by name is their order by n): an admission adds the next numbers, a
-- refund takes out the highest. A refund takes out up to `cost` of the members scored at
-- the refunded decision's time (the ones it added; taking any other would count less than
-- never counting the request). An admission first removes the members that no longer
-- count, and counts its units at `now`, or at the newest member's time when that is later
-- (a clock that moved back: later is only stricter, and keeps the newest last); the key
-- expires one window after that time (PEXPIREAT, on the same clock as `now`), when no
-- member counts any more. A refund only removes: it keeps the expiry.

-- four numbers per policy, then 0, 1 or 3 more: the count of policies is never ambiguous
local policies = math.floor(#ARGV / 4)
-- 'check', 'lease' or 'refund'; `given` is the units wanted or the refunded decision's time
local operation, cost, given = 'check', 1, nil
if #ARGV == 4 * policies + 1 then
  -- '1' is the common cost: compared as a string, it needs no parsing
  if ARGV[#ARGV] ~= '1' then
    cost = tonumber(ARGV[#ARGV])
    if cost == nil or cost < 0 or cost ~= math.floor(cost) then
      return redis.error_reply('tollgate: the cost must be a whole number of units, got ' .. tostring(ARGV[#ARGV]))
    end
  end
elseif #ARGV == 4 * policies + 3 then
  operation, cost, given = ARGV[#ARGV], tonumber(ARGV[#ARGV - 2]), tonumber(ARGV[#ARGV - 1])
  if operation == 'lease' then
    if cost == nil or given == nil or cost < 1 or cost ~= math.floor(cost) or given < cost or given ~= math.floor(given) then
      return redis.error_reply('tollgate: a lease needs whole numbers 1 <= cost <= units, got ' .. tostring(ARGV[#ARGV - 2]) .. ' and ' .. tostring(ARGV[#ARGV - 1]))
    end
  elseif operation == 'refund' then
    if cost == nil or given == nil then
      return redis.error_reply('tollgate: a refund needs a cost and a time, got ' .. tostring(ARGV[#ARGV - 2]) .. ' and ' .. tostring(ARGV[#ARGV - 1]))
    end
  elseif operation == 'charge' then
    if cost == nil or cost < 0 or cost ~= math.floor(cost) then
      return redis.error_reply('tollgate: a charge needs a whole number of units, got ' .. tostring(ARGV[#ARGV - 2]))
    end
  else
    return redis.error_reply('tollgate: unknown operation ' .. tostring(operation))
  end
elseif #ARGV ~= 4 * policies then
  return redis.error_reply('tollgate: expected 4 arguments per policy and a cost, or a cost, a number and an operation, got ' .. #ARGV)
end
local refunding = operation == 'refund'
local charging = operation == 'charge'
if policies == 0 then
  if #KEYS ~= 0 then
    return redis.error_reply('tollgate: ' .. #KEYS .. ' keys for no policy')
  end
  if refunding then
    return 0
  end
  return { operation == 'lease' and given or 1, now }
end

-- Load every policy's state, then weigh the request (or apply the refund) against it,
-- keeping twelve values per policy in `loaded`: the last three are its lockout (ms, or
-- false), its block key, and the time its standing block has left (ms, or false); before
-- them, ten: whether the request fits (for a refund,
-- whether the state changed), the policy's kind and three numbers (a sliding window's
-- limit and window; a token bucket's rate, period and burst), then its state: a sliding
-- window's s, p, c (rolled to `now`'s window), elapsed (now - s, at least 0) and whether
-- the whole state is to be written (s moved, or a refund changed p), or a token bucket's
-- level (refilled to `now`), stored time and x. Each policy's remaining units before this
-- request go in its place in the reply. Built presized for one policy, the common case.
local loaded = { false, false, false, false, false, false, false, false, false, false, false, false }
-- block keys come after the policies' keys, one per policy that locks out
local locks = 0
local reply = { 1, 0, 0, 0, 0 }
local admitted = true
-- a lease's grant: the least that remains, at most the units wanted
local grant = nil
if operation == 'lease' then
  grant = given
end
for i = 1, policies do
  local base = 12 * i - 12
  local argv = 4 * i - 4
  local kind = ARGV[argv + 1]
  local fits, remaining = false, 0
  local lock, block_key, blocked = false, false, false
  if kind ~= '1' and kind ~= '2' and kind ~= '3' then
    local code = tonumber(kind)
    if code == nil or code < 10 or code ~= math.floor(code) or code % 10 < 1 or code % 10 > 3 then
      return redis.error_reply('tollgate: unknown algorithm ' .. tostring(kind))
    end
    lock, kind = (code - code % 10) / 10, tostring(code % 10)
    locks = locks + 1
    block_key = KEYS[policies + locks]
    if block_key == nil then
      return redis.error_reply('tollgate: no block key for policy ' .. i)
    end
    if not refunding then
      local left = redis.call('PTTL', block_key)
      if left > 0 then
        blocked = left
      end
    end
  end
  if kind == '1' then
    local limit, window = tonumber(ARGV[argv + 2]), tonumber(ARGV[argv + 3])
    local stored = redis.call('HMGET', KEYS[i], 's', 'p', 'c')
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
    if refunding then
      -- the units come off the window they were counted in while it still weighs, never
      -- below 0
      local counted_in = given - given % window
      if counted_in == s and c > 0 then
        c, fits = math.max(c - cost, 0), true
      elseif counted_in + window == s and p > 0 then
        p, fits, whole = math.max(p - cost, 0), true, true
      end
    else
      local used = p * (window - elapsed) + c * window
      fits = charging or (cost <= limit and used <= (limit - cost) * window)
      if limit * window > used then
        remaining = floor_div(limit * window - used, window)
      end
    end
    loaded[base + 3], loaded[base + 4] = limit, window
    loaded[base + 5], loaded[base + 6], loaded[base + 7] = s, p, c
    loaded[base + 8], loaded[base + 9] = elapsed, whole
  elseif kind == '2' then
    local rate, period, burst = tonumber(ARGV[argv + 2]), tonumber(ARGV[argv + 3]), tonumber(ARGV[argv + 4])
    local capacity = burst * period
    local level, updated = bucket_state(KEYS[i])
    if level == nil or updated == nil then
      level = capacity
    else
      local elapsed = now - updated
      if elapsed < 0 then
        elapsed = 0
      end
      -- past this much silence the bucket is full; checking first keeps products small
      if elapsed >= ceil_div(capacity, rate) then
        level = capacity
      else
        level = level + elapsed * rate
        if level > capacity then
          level = capacity
        end
      end
    end
    if refunding and updated ~= nil and updated > now then
      -- in debt: what comes back pays it off first, as much of it as the refill would
      -- have, in whole milliseconds
      local owed = cost * period
      local paid = math.min(floor_div(owed, rate), updated - now)
      updated = updated - paid
      if updated <= now then
        level = math.min(capacity, owed - paid * rate)
      end
      fits = paid > 0 or level > 0
    elseif refunding then
      -- puts back as many tokens as a bucket that never counted the request would hold
      -- more: its cost, less what flowed in between the count and the last write (that
      -- bucket may have been full meanwhile and lost it; since the last write this one
      -- only filled, which the cap accounts for), capped at the capacity. A state written
      -- before the count does not hold it.
      if level < capacity and updated ~= nil and updated >= given then
        local owed = math.min(cost, burst) * period
        local since = updated - given
        -- checked first, so the product below stays under `owed`
        if since < ceil_div(owed, rate) then
          level, fits = math.min(capacity, level + owed - since * rate), true
        end
      end
    else
      fits = charging or (cost <= burst and level >= cost * period)
      remaining = floor_div(level, period)
    end
    loaded[base + 3], loaded[base + 4], loaded[base + 5] = rate, period, burst
    loaded[base + 6], loaded[base + 7] = level, updated
  elseif kind == '3' then
    local limit, window = tonumber(ARGV[argv + 2]), tonumber(ARGV[argv + 3])
    local count = redis.call('ZCOUNT', KEYS[i], string.format('(%d', now - window), '+inf')
    if refunding then
      -- up to `cost` of the members the refunded decision added, while they count
      if cost > 0 and given > now - window then
        local members = redis.call('ZREVRANGEBYSCORE', KEYS[i], given, given, 'LIMIT', 0, cost)
        -- unpack takes a few thousand values at most: in batches
        for first = 1, #members, 1000 do
          redis.call('ZREM', KEYS[i], unpack(members, first, math.min(first + 999, #members)))
          fits = true
        end
        count = count - #members
      end
    else
      fits = charging or (cost <= limit and count + cost <= limit)
      if limit > count then
        remaining = limit - count
      end
    end
    loaded[base + 3], loaded[base + 4], loaded[base + 5] = limit, window, count
  else
    return redis.error_reply('tollgate: unknown algorithm ' .. tostring(kind))
  end
  if blocked then
    -- a charge counts its units all the same: the block stands
    fits, remaining = charging, 0
  elseif refunding and lock and fits then
    -- the refunded request was part of what used the quota up: the block goes
    local since = tonumber(redis.call('GET', block_key))
    if since and since >= given then
      redis.call('DEL', block_key)
      if kind == '1' then
        -- written whole, so its key expires two windows after its start again
        loaded[base + 9] = true
      elseif kind == '3' then
        -- the log lives until its newest member leaves again
        local newest = redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')
        if newest[2] then
          redis.call('PEXPIREAT', KEYS[i], tonumber(newest[2]) + loaded[base + 4])
        end
      end
    end
  end
  loaded[base + 10], loaded[base + 11], loaded[base + 12] = lock, block_key, blocked
  loaded[base + 1], loaded[base + 2] = fits, kind
  admitted = admitted and fits
  reply[3 * i] = remaining
  if grant and remaining < grant then
    grant = remaining
  end
end
if #KEYS ~= policies + locks then
  return redis.error_reply('tollgate: expected ' .. (policies + locks) .. ' keys, got ' .. #KEYS)
end

-- Whether to take units from every policy, and how many: a decision takes the cost when
-- every policy admits it, a lease its grant, a refund none.
local take, units = admitted, cost
if operation == 'lease' then
  if grant >= cost then
    take, units = true, grant
  else
    take, grant = false, 0
  end
  reply[1] = grant
elseif refunding then
  take, units = false, 0
elseif charging then
  take = true
elseif not admitted then
  reply[1] = 0
end

-- Write each policy's state that changed, and report each: what remains, and the wait
-- until one more unit fits (for a refusal, until `cost` do).
local changed = 0
for i = 1, policies do
  local base = 12 * i - 12
  -- a granted lease shows every policy as admitting
  local fits = take or loaded[base + 1]
  local write = take or (refunding and fits)
  local remaining, reset = reply[3 * i], 0
  if take then
    -- past the quota (a charge): nothing remains
    remaining = math.max(remaining - units, 0)
  end
  local wanted = cost
  if fits then
    wanted = remaining + 1
  end
  if loaded[base + 2] == '1' then
    local limit, window = loaded[base + 3], loaded[base + 4]
    local p, c, elapsed = loaded[base + 6], loaded[base + 7], loaded[base + 8]
    if write then
      c = c + units
      if loaded[base + 9] then
        local s = loaded[base + 5]
        redis.call('HSET', KEYS[i], 's', s, 'p', p, 'c', c)
        redis.call('PEXPIREAT', KEYS[i], s + 2 * window)
      else
        redis.call('HSET', KEYS[i], 'c', c)
      end
    end
    if not ((fits and remaining >= limit) or wanted > limit or refunding) then
      -- milliseconds until `wanted` more fit
      if c + wanted <= limit then
        if p > 0 then
          -- the previous window's share falls enough at `earliest` into this one
          local earliest = window - floor_div((limit - c - wanted) * window, p)
          if earliest > elapsed then
            reset = earliest - elapsed
          end
        end
      else
        -- only the next window has room, once this one's share of it falls enough
        local earliest = 0
        if c > 0 then
          earliest = window - floor_div((limit - wanted) * window, c)
          if earliest < 0 then
            earliest = 0
          end
        end
        reset = window - elapsed + earliest
      end
    end
  elseif loaded[base + 2] == '3' then
    local limit, window, count = loaded[base + 3], loaded[base + 4], loaded[base + 5]
    if write and units > 0 then
      local key = KEYS[i]
      redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
      local at = now
      local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      if newest[2] and tonumber(newest[2]) > now then
        at = tonumber(newest[2])
      end
      local n = redis.call('ZCOUNT', key, at, at)
      local batch = {}
      for u = 1, units do
        batch[#batch + 1] = at
        batch[#batch + 1] = string.format('%d:%05d', at, n + u)
        if #batch >= 2000 or u == units then
          redis.call('ZADD', key, unpack(batch))
          batch = {}
        end
      end
      redis.call('PEXPIREAT', key, at + window)
      count = count + units
    end
    if not ((fits and remaining >= limit) or wanted > limit or refunding) then
      -- until the oldest member that must leave for `wanted` more to fit leaves
      local leaving = count + wanted - limit
      if leaving >= 1 then
        local oldest = redis.call('ZRANGEBYSCORE', KEYS[i], string.format('(%d', now - window), '+inf', 'WITHSCORES', 'LIMIT', leaving - 1, 1)
        if oldest[2] and tonumber(oldest[2]) + window > now then
          reset = tonumber(oldest[2]) + window - now
        end
      end
    end
  else
    local rate, period, burst = loaded[base + 3], loaded[base + 4], loaded[base + 5]
    local level = loaded[base + 6]
    -- the stored time never moves back (a clock that went back): moved back, the
    -- interval in between would be refilled twice
    local at = loaded[base + 7]
    if at == nil or at < now then
      at = now
    end
    if write then
      level = level - units * period
      if level < 0 then
        -- a charge past the bucket: the rest is a debt, refilled before the level rises
        at = at + ceil_div(-level, rate)
        level = 0
      end
      -- one command: the state, and the key's end when the level has refilled (a missing
      -- key reads as a full bucket)
      redis.call('SET', KEYS[i], struct.pack('<xdd', level, at), 'PXAT', at + ceil_div(burst * period - level, rate))
    end
    if not ((fits and remaining >= burst) or wanted > burst or refunding) then
      local missing = wanted * period - level
      if missing > 0 then
        -- and while in debt, the refill starts only at `at`
        reset = ceil_div(missing, rate) + at - now
      end
    end
  end
  local lock = loaded[base + 10]
  if loaded[base + 12] then
    reset = loaded[base + 12]
  elseif take and lock and remaining == 0 and units > 0 then
    -- this request used the quota up: the block begins, and the counter ends with it
    local ends = now + lock
    redis.call('SET', loaded[base + 11], now, 'PX', lock)
    if loaded[base + 2] == '1' then
      if loaded[base + 5] + 2 * loaded[base + 4] > ends then
        redis.call('PEXPIREAT', KEYS[i], ends)
      end
    else
      local left = redis.call('PTTL', KEYS[i])
      if left < 0 or now + left > ends then
        redis.call('PEXPIREAT', KEYS[i], ends)
      end
    end
    reset = lock
  end
  if write then
    changed = changed + 1
  end
  reply[3 * i - 1], reply[3 * i], reply[3 * i + 1] = fits and 1 or 0, remaining, reset
end
if refunding then
  return changed
end
reply[3 * policies + 2] = now
return reply
