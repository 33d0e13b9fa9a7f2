-- tollgate: shared helpers. Lua numbers are doubles; every value here stays an integer
-- below 2^53 (the Rust side checks limit x window and burst x period), so arithmetic is
-- exact and matches src/store/algorithm/ bit for bit.

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
