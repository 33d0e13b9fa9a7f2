-- tollgate: leases up to N units of a caller's quota at once, across all of its policies.
--
-- KEYS, ARGV  as for check.lua, four numbers per policy, then the asking request's cost
--             and the units wanted (N >= cost)
-- Returns     { granted, then per policy: admitted (0/1), remaining, reset_ms,
--               then the time of the grant (ms) }
--
-- The grant is the largest count up to N that every policy admits at once (a policy's
-- remaining whole units are exactly what fits), consumed from every policy now, so the
-- instances together never exceed a limit. A grant below the cost is no grant: nothing is
-- written and the reply is check.lua's refusal of the asking request.

local algorithms = { sliding_window, token_bucket }

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

if #ARGV ~= 4 * #KEYS + 2 then
  return redis.error_reply('tollgate: expected 4 arguments per key, a cost and a unit count, got ' .. #ARGV .. ' for ' .. #KEYS .. ' keys')
end
local cost, wanted = tonumber(ARGV[#ARGV - 1]), tonumber(ARGV[#ARGV])
if cost == nil or wanted == nil or cost < 1 or cost ~= math.floor(cost) or wanted < cost or wanted ~= math.floor(wanted) then
  return redis.error_reply('tollgate: a lease needs whole numbers 1 <= cost <= units, got ' .. tostring(ARGV[#ARGV - 1]) .. ' and ' .. tostring(ARGV[#ARGV]))
end

local policies = {}
local grant = wanted
for i = 1, #KEYS do
  local base = (i - 1) * 4
  local algorithm = algorithms[tonumber(ARGV[base + 1])]
  if algorithm == nil then
    return redis.error_reply('tollgate: unknown algorithm ' .. tostring(ARGV[base + 1]))
  end
  local a, b, c = tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4])
  local st = algorithm.load(KEYS[i], now, a, b, c)
  local room = algorithm.report(st, true, 0, a, b, c)
  grant = math.min(grant, room)
  policies[i] = { algorithm = algorithm, st = st, a = a, b = b, c = c }
end
if grant < cost then
  grant = 0
end

local reply = { grant }
for i = 1, #KEYS do
  local p = policies[i]
  local fits, units = true, grant
  if grant > 0 then
    p.algorithm.consume(p.st, grant, p.a, p.b, p.c)
    p.algorithm.store(KEYS[i], p.st, now, p.a, p.b, p.c)
  else
    units = cost
    fits = p.algorithm.fits(p.st, cost, p.a, p.b, p.c)
  end
  local remaining, reset = p.algorithm.report(p.st, fits, units, p.a, p.b, p.c)
  reply[#reply + 1] = fits and 1 or 0
  reply[#reply + 1] = remaining
  reply[#reply + 1] = reset
end
reply[#reply + 1] = now
return reply
