-- tollgate: the time of a decision (ms). Redis's own, so every instance agrees on it.
local now
do
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
