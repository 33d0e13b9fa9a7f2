-- tollgate: decides one request against all of a caller's policies, atomically.
--
-- KEYS[i]  policy i's key; all of one caller's keys share a hash tag: rl:{acme}:per-second
-- ARGV     four numbers per policy: kind (1 sliding window, 2 token bucket), then
--          limit, window_ms, 0 (sliding window) or rate, period_ms, burst (token bucket);
--          then, optionally, the request's cost in units (1 when absent)
-- Returns  { admitted (0/1), then per policy: admitted (0/1), remaining, reset_ms,
--            then the time of the decision (ms), which a refund names }
--
-- Time is Redis's own, so every instance agrees on it. Nothing is written unless every
-- policy admits: a refused request consumes nothing.

local algorithms = { sliding_window, token_bucket }

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local cost = 1
if #ARGV == 4 * #KEYS + 1 then
  cost = tonumber(ARGV[#ARGV])
elseif #ARGV ~= 4 * #KEYS then
  return redis.error_reply('tollgate: expected 4 arguments per key and a cost, got ' .. #ARGV .. ' for ' .. #KEYS .. ' keys')
end
if cost == nil or cost < 0 or cost ~= math.floor(cost) then
  return redis.error_reply('tollgate: the cost must be a whole number of units, got ' .. tostring(ARGV[#ARGV]))
end

local policies = {}
local admitted = true
for i = 1, #KEYS do
  local base = (i - 1) * 4
  local algorithm = algorithms[tonumber(ARGV[base + 1])]
  if algorithm == nil then
    return redis.error_reply('tollgate: unknown algorithm ' .. tostring(ARGV[base + 1]))
  end
  local a, b, c = tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4])
  local st = algorithm.load(KEYS[i], now, a, b, c)
  local fits = algorithm.fits(st, cost, a, b, c)
  admitted = admitted and fits
  policies[i] = { algorithm = algorithm, st = st, fits = fits, a = a, b = b, c = c }
end

local reply = { admitted and 1 or 0 }
for i = 1, #KEYS do
  local p = policies[i]
  if admitted then
    p.algorithm.consume(p.st, cost, p.a, p.b, p.c)
    p.algorithm.store(KEYS[i], p.st, now, p.a, p.b, p.c)
  end
  local remaining, reset = p.algorithm.report(p.st, p.fits, cost, p.a, p.b, p.c)
  reply[#reply + 1] = p.fits and 1 or 0
  reply[#reply + 1] = remaining
  reply[#reply + 1] = reset
end
reply[#reply + 1] = now
return reply
