-- tollgate: decides one request against all of a caller's policies, atomically.
--
-- KEYS[i]  policy i's key; all of one caller's keys share a hash tag: rl:{acme}:per-second
-- ARGV     four numbers per policy: kind (1 sliding window, 2 token bucket), then
--          limit, window_ms, 0 (sliding window) or rate, period_ms, burst (token bucket);
--          then, optionally, the request's cost in units (1 when absent)
-- Returns  { admitted (0/1), then per policy: admitted (0/1), remaining, reset_ms,
--            then the time of the decision (ms), which a refund names }
--
-- Runs after lua/common.lua and lua/clock.lua (`now`). Nothing is written unless every
-- policy admits: a refused request consumes nothing.
--
-- This runs in Redis's single thread on every decision, and Redis runs the whole script
-- body on every call, so every function or table defined here is built again per call.
-- Hence one straight-line pass per phase, plain locals, one flat table for the whole call,
-- and the arithmetic of lua/sliding_window.lua and lua/token_bucket.lua written out inline
-- rather than those modules loaded (defining them alone costs a third of a minimal
-- decision). tests/it/lua_arithmetic.rs drives this file against the Rust algorithms.

local policies = #KEYS
local cost = 1
if #ARGV == 4 * policies + 1 then
  -- '1' is the common cost: compared as a string, it needs no parsing
  if ARGV[#ARGV] ~= '1' then
    cost = tonumber(ARGV[#ARGV])
    if cost == nil or cost < 0 or cost ~= math.floor(cost) then
      return redis.error_reply('tollgate: the cost must be a whole number of units, got ' .. tostring(ARGV[#ARGV]))
    end
  end
elseif #ARGV ~= 4 * policies then
  return redis.error_reply('tollgate: expected 4 arguments per key and a cost, got ' .. #ARGV .. ' for ' .. #KEYS .. ' keys')
end
if policies == 0 then
  return { 1, now }
end

-- Load and weigh every policy, keeping eight values per policy in `loaded`: whether the
-- request fits, the policy's kind and three numbers (a sliding window's limit and window;
-- a token bucket's rate, period and burst), then its state: a sliding window's start,
-- previous and current counts (rolled to `now`'s window) and whether the start moved, or a
-- token bucket's level, stored x and stored time. Built presized for one policy, the common
-- case.
local loaded = { false, false, false, false, false, false, false, false }
local admitted = true
for i = 1, policies do
  local base = 8 * i - 8
  local argv = 4 * i - 4
  local kind = ARGV[argv + 1]
  local fits
  if kind == '1' then
    -- fits when p * (window - elapsed) + c * window <= (limit - cost) * window
    local limit, window = tonumber(ARGV[argv + 2]), tonumber(ARGV[argv + 3])
    local stored = redis.call('HMGET', KEYS[i], 's', 'p', 'c')
    local start = now - now % window
    local s, p, c = tonumber(stored[1]), tonumber(stored[2]) or 0, tonumber(stored[3]) or 0
    local moved = true
    if s == start then
      moved = false
    elseif s == nil then
      s, p, c = start, 0, 0
    elseif s + window == start then
      s, p, c = start, c, 0
    elseif s > start then
      -- a state from the future (the clock moved back): keep it, it is only stricter
      moved = false
    else
      s, p, c = start, 0, 0
    end
    local elapsed = now - s
    if elapsed < 0 then
      elapsed = 0
    end
    fits = cost <= limit and p * (window - elapsed) + c * window <= (limit - cost) * window
    loaded[base + 3], loaded[base + 4] = limit, window
    loaded[base + 5], loaded[base + 6], loaded[base + 7], loaded[base + 8] = s, p, c, moved
  elseif kind == '2' then
    -- the level counts `period` units a token; `rate` units flow in per ms
    local rate, period, burst = tonumber(ARGV[argv + 2]), tonumber(ARGV[argv + 3]), tonumber(ARGV[argv + 4])
    local capacity = burst * period
    local stored = redis.call('HMGET', KEYS[i], 'l', 't', 'x')
    local level, updated = tonumber(stored[1]), tonumber(stored[2])
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
    fits = cost <= burst and level >= cost * period
    loaded[base + 3], loaded[base + 4], loaded[base + 5] = rate, period, burst
    loaded[base + 6], loaded[base + 7], loaded[base + 8] = level, tonumber(stored[3]), updated
  else
    return redis.error_reply('tollgate: unknown algorithm ' .. tostring(kind))
  end
  loaded[base + 1], loaded[base + 2] = fits, kind
  admitted = admitted and fits
end

-- Consume from every policy if all admit, and report each: what remains, and the wait
-- until one more unit fits (for a refusal, until `cost` do).
-- presized for one policy, the common case
local reply = { admitted and 1 or 0, 0, 0, 0, 0 }
for i = 1, policies do
  local base = 8 * i - 8
  local fits = loaded[base + 1]
  local remaining, reset = 0, 0
  if loaded[base + 2] == '1' then
    local limit, window = loaded[base + 3], loaded[base + 4]
    local s, p, c = loaded[base + 5], loaded[base + 6], loaded[base + 7]
    if admitted then
      c = c + cost
      if loaded[base + 8] then
        redis.call('HSET', KEYS[i], 's', s, 'p', p, 'c', c)
        -- after two windows of silence the state affects no decision: the key lives until
        -- then, which only a new window moves
        redis.call('PEXPIRE', KEYS[i], s + 2 * window - now)
      else
        redis.call('HSET', KEYS[i], 'c', c)
      end
    end
    local elapsed = now - s
    if elapsed < 0 then
      elapsed = 0
    end
    local used = p * (window - elapsed) + c * window
    if limit * window > used then
      remaining = floor_div(limit * window - used, window)
    end
    local units = cost
    if fits then
      units = remaining + 1
    end
    if not ((fits and remaining >= limit) or units > limit) then
      -- milliseconds until `units` more fit
      if c + units <= limit then
        if p > 0 then
          local earliest = window - floor_div((limit - c - units) * window, p)
          if earliest < 0 then
            earliest = 0
          end
          reset = earliest - elapsed
          if reset < 0 then
            reset = 0
          end
        end
      else
        local earliest = 0
        if c > 0 then
          earliest = window - floor_div((limit - units) * window, c)
          if earliest < 0 then
            earliest = 0
          end
        end
        reset = window - elapsed + earliest
      end
    end
  else
    local rate, period, burst = loaded[base + 3], loaded[base + 4], loaded[base + 5]
    local level = loaded[base + 6]
    if admitted then
      level = level - cost * period
      -- the stored time never moves back (lua/token_bucket.lua says why)
      local at = loaded[base + 8]
      if at == nil or at < now then
        at = now
      end
      -- the key outlives the state's refill, its expiry set only when x (a time before
      -- which the key does not expire) falls short; why x stays one: lua/token_bucket.lua
      local expiry = loaded[base + 7]
      if expiry and expiry - at >= ceil_div(burst * period - level, rate) then
        redis.call('HSET', KEYS[i], 'l', level, 't', at)
      else
        expiry = at + ceil_div(burst * period, rate)
        redis.call('HSET', KEYS[i], 'l', level, 't', at, 'x', expiry)
        redis.call('PEXPIREAT', KEYS[i], expiry)
      end
    end
    remaining = floor_div(level, period)
    local units = cost
    if fits then
      units = remaining + 1
    end
    if not ((fits and remaining >= burst) or units > burst) then
      local missing = units * period - level
      if missing > 0 then
        reset = ceil_div(missing, rate)
      end
    end
  end
  reply[3 * i - 1], reply[3 * i], reply[3 * i + 1] = fits and 1 or 0, remaining, reset
end
reply[3 * policies + 2] = now
return reply
