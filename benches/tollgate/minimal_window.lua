-- The least a Redis sliding window counter can do per decision, one key and no checks:
-- what redis-benchmark runs beside tollgate's script to price the generic per-policy
-- loop in redis-server's single thread. KEYS[1] the counter, ARGV limit, window (ms).
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local start = now - (now % window)
local stored = redis.call('HMGET', KEYS[1], 's', 'p', 'c')
local s, p, c = tonumber(stored[1]), tonumber(stored[2]) or 0, tonumber(stored[3]) or 0
if s ~= start then
  if s ~= nil and s + window == start then
    p, c = c, 0
  else
    p, c = 0, 0
  end
end
local elapsed = now - start
if p * (window - elapsed) + (c + 1) * window > limit * window then
  return { 0, 0 }
end
redis.call('HSET', KEYS[1], 's', start, 'p', p, 'c', c + 1)
redis.call('PEXPIRE', KEYS[1], 2 * window)
return { 1, limit - c - 1 }
