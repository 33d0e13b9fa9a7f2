-- tollgate: gives back the units an admitted request consumed, when it turned out not to
-- count (a successful login on a route that counts failed attempts).
--
-- KEYS, ARGV  as for check.lua, four numbers per policy, then the cost and the time of the
--             decision that consumed it (the last value check.lua returned)
-- Returns     the number of policies whose state changed
--
-- A sliding window gives back to the window the units were counted in while it still
-- weighs (the current or the previous window), never below 0; a token bucket puts back as
-- many tokens as a bucket that never counted them would hold more (lua/token_bucket.lua).
-- Neither admits more than not counting the request at all. A caller whose keys expired
-- has nothing to give back, and no key is created.

local algorithms = { sliding_window, token_bucket }

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

if #ARGV ~= 4 * #KEYS + 2 then
  return redis.error_reply('tollgate: expected 4 arguments per key, a cost and a time, got ' .. #ARGV .. ' for ' .. #KEYS .. ' keys')
end
local cost, counted_at = tonumber(ARGV[#ARGV - 1]), tonumber(ARGV[#ARGV])

local changed = 0
for i = 1, #KEYS do
  local base = (i - 1) * 4
  local algorithm = algorithms[tonumber(ARGV[base + 1])]
  if algorithm == nil then
    return redis.error_reply('tollgate: unknown algorithm ' .. tostring(ARGV[base + 1]))
  end
  local a, b, c = tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4])
  if redis.call('EXISTS', KEYS[i]) == 1 then
    local st = algorithm.load(KEYS[i], now, a, b, c)
    if algorithm.refund(st, counted_at, cost, a, b, c) then
      algorithm.store(KEYS[i], st, now, a, b, c)
      changed = changed + 1
    end
  end
end
return changed
