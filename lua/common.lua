-- tollgate: shared helpers. Lua numbers are doubles; every value here stays an integer
-- below 2^53 (the Rust side checks limit x window and burst x period), so arithmetic is
-- exact and matches src/algorithm.rs bit for bit.

-- floor(a / b) for integers a >= 0, b > 0, corrected for rounding of the division.
local function floor_div(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function ceil_div(a, b)
  return floor_div(a + b - 1, b)
end

-- A token bucket's level and time as stored at `key`; nil, nil when there is none. The
-- current form is 17 bytes, a zero byte then two little-endian doubles
-- (struct.pack('<xdd', level, time)); the older forms, the text "<l>:<t>" and a hash of l
-- and t, are read too, and the caller's next write replaces them.
local function bucket_state(key)
  local stored = redis.pcall('GET', key)
  if type(stored) == 'string' then
    if string.byte(stored) == 0 then
      local level, updated = struct.unpack('<xdd', stored)
      return level, updated
    end
    local split = string.find(stored, ':', 1, true)
    if split then
      return tonumber(string.sub(stored, 1, split - 1)), tonumber(string.sub(stored, split + 1))
    end
  elseif stored then
    -- GET failed: the key holds a hash
    stored = redis.call('HMGET', key, 'l', 't')
    return tonumber(stored[1]), tonumber(stored[2])
  end
  return nil, nil
end
