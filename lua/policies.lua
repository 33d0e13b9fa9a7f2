-- tollgate: every operation on one caller's policies, atomically: a decision, a lease, a
-- refund, a charge.
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
-- Each algorithm's arithmetic and key form are in its own file, lua/algorithm/*.lua, in
-- sections that build.rs inserts at each `-- insert: <algorithm> <section>` line below;
-- lua/lone.lua takes the same sections for a lone policy's script. They work on the
-- locals named here: `key`, the policy's numbers, `now`, `cost`, `units`, `given`, `fits`,
-- `remaining`, `wanted` and `reset`.

local floor = math.floor

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
-- the whole state is to be written (s moved, or a refund changed p), a token bucket's
-- level (refilled to `now`) and the time it is written at, or a sliding log's count. Each
-- policy's remaining units before this request go in its place in the reply. Built
-- presized for one policy, the common case.
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
  local key = KEYS[i]
  if kind == '1' then
    local limit, window = tonumber(ARGV[argv + 2]), tonumber(ARGV[argv + 3])
    -- insert: sliding_window load
    if refunding then
      -- insert: sliding_window refund
    else
      -- insert: sliding_window weigh
      fits = fits or charging
    end
    loaded[base + 3], loaded[base + 4] = limit, window
    loaded[base + 5], loaded[base + 6], loaded[base + 7] = s, p, c
    loaded[base + 8], loaded[base + 9] = elapsed, whole
  elseif kind == '2' then
    local rate, period, burst = tonumber(ARGV[argv + 2]), tonumber(ARGV[argv + 3]), tonumber(ARGV[argv + 4])
    -- insert: token_bucket load
    if refunding then
      -- insert: token_bucket refund
    else
      -- insert: token_bucket weigh
      fits = fits or charging
    end
    loaded[base + 3], loaded[base + 4], loaded[base + 5] = rate, period, burst
    loaded[base + 6], loaded[base + 7] = level, at
  elseif kind == '3' then
    local limit, window = tonumber(ARGV[argv + 2]), tonumber(ARGV[argv + 3])
    -- insert: sliding_log load
    if refunding then
      -- insert: sliding_log refund
    else
      -- insert: sliding_log weigh
      fits = fits or charging
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
        local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
        if newest[2] then
          redis.call('PEXPIREAT', key, tonumber(newest[2]) + loaded[base + 4])
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
  local key = KEYS[i]
  if loaded[base + 2] == '1' then
    local limit, window = loaded[base + 3], loaded[base + 4]
    local s, p, c = loaded[base + 5], loaded[base + 6], loaded[base + 7]
    local elapsed, whole = loaded[base + 8], loaded[base + 9]
    if write then
      -- insert: sliding_window write
    end
    if not refunding then
      -- insert: sliding_window wait
    end
  elseif loaded[base + 2] == '3' then
    local limit, window, count = loaded[base + 3], loaded[base + 4], loaded[base + 5]
    if write then
      -- insert: sliding_log write
    end
    if not refunding then
      -- insert: sliding_log wait
    end
  else
    local rate, period, burst = loaded[base + 3], loaded[base + 4], loaded[base + 5]
    local level, at = loaded[base + 6], loaded[base + 7]
    if write then
      -- insert: token_bucket write
    end
    if not refunding then
      -- insert: token_bucket wait
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
        redis.call('PEXPIREAT', key, ends)
      end
    else
      local left = redis.call('PTTL', key)
      if left < 0 or now + left > ends then
        redis.call('PEXPIREAT', key, ends)
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
