-- tollgate: the global store of the two-tier store, one call per region's call: units given
-- back, what the region's share admitted counted, and a lease of the caller's global
-- quota, as far as it leaves room for any other region to fall back to its share.
--
-- KEYS[1]  the caller's global record, a hash:
--            s, p, c     the sliding window counter of the caller's limit (window start,
--                        previous count, current count), as lua/policies.lua keeps one
--            <region>:ku, :ks, :ka   the snapshot the region said it holds (the count it
--                        was told, its share, when): what it starts its share from if cut
--                        off; absent when it holds none
--            <region>:su, :ss, :sa   the snapshot this store sent it last
--            <region>:d  its demand per window, as it last reported it
--            <region>:w  its weight, as it last reported it
--            <region>:xs, :xp, :xc   what it reported admitting on its share since the
--                        snapshot it holds (a sliding window counter)
--            <region>:hu, :hw   the most leased units it may hold since its last call (what
--                        it said it held, and what it was granted), and the start of the
--                        window they were counted in
--            <region>:pu units of the window before that it may still spend until its
--                        answer puts them back
-- ARGV     limit, window_ms, region, by ('weight' or 'demand'), weight, all weights,
--          ack used, ack share, ack time (-1 for no snapshot), what the region's share
--          admitted as a sliding window counter (start, previous, current), demand, want,
--          given back, given at, leased units it spent after their window as the same kind
--          of counter (start, previous, current), the leased units it holds and when they
--          were counted
-- Returns  { granted, used (the count after the grant, rounded up), share, now }
--
-- The rule. A region cut off from this store admits up to its share's room: its share
-- of the limit less its part of the count it was last told, that part weighing as the
-- current window of that answer, the rest freeing as the window slides. This store never
-- learns that a region is cut off (a partition looks like a region that has not called
-- yet), so it grants a lease only if the caller's count after it, plus the room of any one
-- other region's share, fits in the limit. A region that calls often has seen a count
-- close to the current one, and its room is small; a region cut off keeps its room, and
-- the others lease what is left. Which snapshot a region holds, it says with each call;
-- the answer, which may be lost, carries a newer one: the larger room of the two counts.
-- A region may spend a leased unit after its window ends, and it is then counted in the
-- window it was spent in, without asking: so a lease in a window also leaves room for the
-- units of the previous one that any region may still hold.

local key = KEYS[1]
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local region, by = ARGV[3], ARGV[4]
local weight, all = tonumber(ARGV[5]), tonumber(ARGV[6])
local ack_used, ack_share, ack_at = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local os, op, oc = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local demand, want = tonumber(ARGV[13]), tonumber(ARGV[14])
local given, given_at = tonumber(ARGV[15]), tonumber(ARGV[16])
local ms, mp, mc = tonumber(ARGV[17]), tonumber(ARGV[18]), tonumber(ARGV[19])
local held, held_at = tonumber(ARGV[20]), tonumber(ARGV[21])

-- Every field, by region.
local fields = redis.call('HGETALL', key)
local s, p, c = 0, 0, 0
local regions = {}
for i = 1, #fields, 2 do
  local name, value = fields[i], tonumber(fields[i + 1])
  if name == 's' then
    s = value
  elseif name == 'p' then
    p = value
  elseif name == 'c' then
    c = value
  else
    local at = string.find(name, ':[^:]*$')
    if at then
      local owner, field = string.sub(name, 1, at - 1), string.sub(name, at + 1)
      regions[owner] = regions[owner] or {}
      regions[owner][field] = value
    end
  end
end
local mine = regions[region] or {}
regions[region] = mine

-- A region silent for five minutes (or two windows, when longer) is forgotten, its share
-- no longer reserved: a region whose traffic has moved elsewhere would otherwise keep its
-- part of the limit from the others for as long as they call. A partition that long ends
-- the guarantee: the region cut off still admits its share, which the others may now
-- lease too.
local forget = math.max(2 * window, 300000)
for name, record in pairs(regions) do
  if name ~= region and (record.sa or 0) < now - forget then
    regions[name] = nil
    local stale = {}
    for field in pairs(record) do
      table.insert(stale, name .. ':' .. field)
    end
    if #stale > 0 then
      redis.call('HDEL', key, unpack(stale))
    end
  end
end

-- 1. Units given back, to the window they were counted in while it still weighs; what
--    the share admitted and leased units spent late, in the windows they were admitted
--    in, as much as they still weigh.
s, p, c = rolled(s, p, c, window, now)
os, op, oc = rolled(os, op, oc, window, now)
ms, mp, mc = rolled(ms, mp, mc, window, now)
if given > 0 then
  if given_at >= s then
    c = math.max(0, c - given)
  elseif given_at >= s - window then
    p = math.max(0, p - given)
  end
end
p, c = p + op + mp, c + oc + mc

-- 2. The region's record: its snapshot, what it admitted on its share since, its demand.
local holds = ack_at >= 0
local same = holds and mine.ka == ack_at and mine.ku == ack_used and mine.ks == ack_share
if same then
  mine.xs, mine.xp, mine.xc = added(mine.xs or 0, mine.xp or 0, mine.xc or 0, os, op, oc,
    window, now)
else
  mine.xs, mine.xp, mine.xc = 0, 0, 0
end
if holds then
  mine.ku, mine.ks, mine.ka = ack_used, ack_share, ack_at
else
  mine.ku, mine.ks, mine.ka = nil, nil, nil
end
mine.d, mine.w = demand, weight

-- A region's share of the limit: its weight's part, or its part of the regions' demand.
local function share_of(record)
  if by == 'weight' then
    return floor_div(limit * (record.w or 0), math.max(all, 1))
  end
  local total = 0
  for _, other in pairs(regions) do
    total = total + (other.d or 0)
  end
  if total == 0 then
    return 0
  end
  return floor_div(limit * (record.d or 0), total)
end

-- The room a share started from a snapshot has at `t`: its part of the count then, all of
-- it in that answer's window, then what it admitted since.
local function room_from(used, share, at, xs, xp, xc, t)
  local seed = ceil_div(math.min(used, limit) * share, math.max(limit, 1))
  local ss, sp, sc = added(at - at % window, 0, seed, xs, xp, xc, window, t)
  return room(share, ss, sp, sc, window, t)
end

-- The most a region could admit on its share at `t`, were it cut off now.
local function room_of(record, t)
  local known
  if record.ka then
    known = room_from(record.ku, record.ks, record.ka, record.xs or 0, record.xp or 0,
      record.xc or 0, t)
  else
    -- No snapshot: it starts from nothing, at its whole share (by demand, a region that
    -- never reported any has none).
    known = room_from(0, share_of(record), now, record.xs or 0, record.xp or 0,
      record.xc or 0, t)
  end
  local sent = 0
  if record.sa then
    sent = room_from(record.su, record.ss, record.sa, 0, 0, 0, t)
  end
  return math.max(known, sent)
end

-- 3. The grant: what the region wants, as far as the count has room for it and the room
--    of the other region that could admit the most on its share, now and at the end of
--    the window. Both change linearly in between (the count falls as the previous window
--    slides out, a share's room grows as its seed does), so if both ends hold, every time
--    between does: a share seeded in the previous window reaches its whole room by the
--    window's end, when the count is this window's alone.
local window_end = now - now % window + window - 1
local used = ceil_div(used_scaled(s, p, c, window, now), window)
local used_at_end = ceil_div(used_scaled(s, p, c, window, window_end), window)
local reserved, reserved_at_end = 0, 0
-- Leased units of the previous window a region may still spend, which then count in this
-- one: kept room for as if they had been, the other regions' as far as their last calls
-- tell (what each said it held, and the grant it was answered), this one's as it says.
local held_window = held_at - held_at % window
local bridging = 0
if held > 0 and held_window == s - window then
  bridging = held
end
for name, record in pairs(regions) do
  if name ~= region then
    reserved = math.max(reserved, room_of(record, now))
    reserved_at_end = math.max(reserved_at_end, room_of(record, window_end))
    if record.hw == s - window then
      bridging = bridging + (record.hu or 0)
    elseif record.hw == s then
      bridging = bridging + (record.pu or 0)
    end
  end
end
-- Spent, such a unit leaves the previous window's count, which weighs less as this one
-- goes on, for this one's: it adds as much as the previous window has slid out, all of
-- it at the end.
local bridging_now = ceil_div(bridging * (now - s), window)
local granted = math.max(0, math.min(want, limit - reserved - used - bridging_now,
  limit - reserved_at_end - used_at_end - bridging))
-- What the region may hold from now on. The answer puts back units of an earlier window
-- than its grant's, but until it arrives they may still be spent.
if granted > 0 then
  mine.hu, mine.hw, mine.pu = granted, s, 0
  if held_window == s then
    mine.hu = granted + held
  elseif held_window == s - window then
    mine.pu = held
  end
else
  mine.hu, mine.hw, mine.pu = held, held_window, 0
end
c = c + granted
used = ceil_div(used_scaled(s, p, c, window, now), window)
local share = share_of(mine)
mine.su, mine.ss, mine.sa = used, share, now

-- 4. Written back; the record lasts as long as a region could still be remembered.
local out = { 's', s, 'p', p, 'c', c }
for _, field in ipairs({ 'ku', 'ks', 'ka', 'su', 'ss', 'sa', 'd', 'w', 'xs', 'xp', 'xc', 'hu',
  'hw', 'pu' }) do
  if mine[field] ~= nil then
    table.insert(out, region .. ':' .. field)
    table.insert(out, mine[field])
  end
end
if not holds then
  redis.call('HDEL', key, region .. ':ku', region .. ':ks', region .. ':ka')
end
redis.call('HSET', key, unpack(out))
redis.call('PEXPIRE', key, forget + 2 * window)
return { granted, used, share, now }
