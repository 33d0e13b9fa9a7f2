-- tollgate: a region's record of one caller in the two-tier store, in the region's own
-- Redis: the units it has leased of the caller's global quota, its demand, and its share of
-- the limit while the global store is out of reach. Every request is one call of 'decide';
-- the instance that a 'decide' hands a refill to makes the call to the global store and
-- writes its outcome back with 'answered' or 'failed'.
--
-- KEYS[1]  the record, a hash:
--            h, ha       leased units held, and when the global store counted them (its
--                        clock)
--            we, he      when the global window they were counted in ends, and when they
--                        stop being spendable, a window later (this Redis's clock)
--            rt, ra      units to give back to the global store, and when it counted them
--            os, op, oc  what the share admitted that the global store has not counted: a
--                        sliding window counter of the limit's window, so that it counts
--                        there as much as it still weighs
--            ms, mp, mc  leased units spent after their window ended, which the global
--                        store counts again in the window they were spent in (and takes
--                        back from their own with rt): the same kind of counter
--            ds, dp, dc  the demand: a sliding window counter over one second
--            df          when the record was made: over its first second, the demand is
--                        what it has seen over its age (at least a round trip)
--            cl          until when an instance holds the refill (ms)
--            np          no refill before this time (ms)
--            cut         1 while the region is cut off from the global store
--            ss, sp, sc  the share's sliding window counter while cut off (window start,
--                        previous, current)
--            su, sh, sg  the last answer's snapshot: the caller's count, the region's
--                        share, when the global store counted it (its clock); the share
--                        while cut off is the snapshot's
-- ARGV     'decide', cost, limit, window_ms, rtt_ms, horizon_ms, claim_ms
--          'answered', granted, spendable_ms (until the units' window ends), counted_at,
--                      used, share, asked, window_ms, horizon_ms
--          'failed', limit, window_ms, share (without a snapshot), probe_ms, and the
--                      owed and moved counters the call carried (start, previous,
--                      current each)
-- Returns  'decide': { admitted, remaining, reset_ms, now, refill, want, give_back,
--                      given_at, owed start, previous, current, demand per window,
--                      snapshot used, share, time (-1 without one), moved start,
--                      previous, current, units held, when they were counted };
--                      otherwise { now }.

local DEMAND_MS = 1000

local key = KEYS[1]
local op = ARGV[1]

local function n(value)
  return tonumber(value) or 0
end

local f = redis.call('HMGET', key, 'h', 'he', 'ha', 'rt', 'ra', 'os', 'ds', 'dp', 'dc',
  'cl', 'np', 'cut', 'sh', 'ss', 'sp', 'sc', 'su', 'sg', 'op', 'oc', 'df', 'we', 'ms', 'mp',
  'mc')
local r = {
  h = n(f[1]), he = n(f[2]), ha = n(f[3]), rt = n(f[4]), ra = n(f[5]), os = n(f[6]),
  ds = n(f[7]), dp = n(f[8]), dc = n(f[9]), cl = n(f[10]), np = n(f[11]), cut = n(f[12]),
  sh = n(f[13]), ss = n(f[14]), sp = n(f[15]), sc = n(f[16]), su = f[17] and n(f[17]),
  sg = n(f[18]), op = n(f[19]), oc = n(f[20]), df = f[21] and n(f[21]), we = n(f[22]),
  ms = n(f[23]), mp = n(f[24]), mc = n(f[25]),
}

-- Units counted at `at` go back to the global store with the next call. One time per
-- record: units of another time are kept counted (never spent), which only makes the
-- global count stricter.
local function give_back(units, at)
  if units <= 0 then
    return
  end
  if r.rt == 0 or r.ra == at then
    r.rt = r.rt + units
    r.ra = at
  end
end

local function save(window)
  -- The record may have expired under a call that took long: its first sight is now.
  redis.call('HSET', key, 'h', r.h, 'he', r.he, 'ha', r.ha, 'rt', r.rt, 'ra', r.ra,
    'os', r.os, 'op', r.op, 'oc', r.oc, 'df', r.df or now, 'ds', r.ds, 'dp', r.dp, 'dc', r.dc,
    'cl', r.cl, 'np', r.np, 'cut', r.cut, 'sh', r.sh, 'ss', r.ss, 'sp', r.sp, 'sc', r.sc,
    'sg', r.sg, 'we', r.we, 'ms', r.ms, 'mp', r.mp, 'mc', r.mc)
  if r.su then
    redis.call('HSET', key, 'su', r.su)
  end
  -- Kept while anything in it still matters: the leased units and the share's counter
  -- and the snapshot for two windows, the demand for its second.
  redis.call('PEXPIRE', key, 2 * window + 2 * DEMAND_MS)
end

if op == 'decide' then
  local cost, limit, window = n(ARGV[2]), n(ARGV[3]), n(ARGV[4])
  local rtt, horizon, claim = n(ARGV[5]), n(ARGV[6]), n(ARGV[7])
  -- Leased units go back a window after their own ends, and at its end while the region
  -- is cut off (the share decides then, and nothing spent late could be counted).
  if r.h > 0 and (now >= r.he or (r.cut == 1 and now >= r.we)) then
    give_back(r.h, r.ha)
    r.h = 0
  end
  -- Every unit asked counts in the demand, admitted or not: leases are sized by it.
  r.ds, r.dp, r.dc = rolled(r.ds, r.dp, r.dc, DEMAND_MS, now)
  r.dc = r.dc + cost
  local demand = ceil_div(used_scaled(r.ds, r.dp, r.dc, DEMAND_MS, now), DEMAND_MS)
  r.df = r.df or now
  local age = now - r.df
  if age < DEMAND_MS then
    -- A second not yet seen whole would show a fraction of the demand: sized by it, the
    -- first leases would come one unit at a time.
    demand = ceil_div((r.dp + r.dc) * DEMAND_MS, math.max(age, rtt, 1))
  end

  local admitted = 0
  if cost <= r.h then
    r.h = r.h - cost
    admitted = 1
    if now >= r.we then
      -- Spent after its window ended: counted again in this one, and taken back from its
      -- own. A caller with gaps between its requests longer than what is left of a window
      -- would otherwise find its lease gone every time.
      give_back(cost, r.ha)
      r.ms, r.mp, r.mc = rolled(r.ms, r.mp, r.mc, window, now)
      r.mc = r.mc + cost
    end
  elseif r.cut == 1 then
    r.ss, r.sp, r.sc = rolled(r.ss, r.sp, r.sc, window, now)
    if cost <= room(r.sh, r.ss, r.sp, r.sc, window, now) then
      r.sc = r.sc + cost
      r.os, r.op, r.oc = rolled(r.os, r.op, r.oc, window, now)
      r.oc = r.oc + cost
      admitted = 1
    end
  end

  -- A refill, when none is on its way: while linked, when the units held would not last
  -- a round trip and a half at this demand, or there is something to give back or to have
  -- counted; while cut off, every probe interval.
  local refill, want, given, given_at = 0, 0, 0, 0
  local os, op, oc, ms, mp, mc = 0, 0, 0, 0, 0, 0
  local owes = used_scaled(r.os, r.op, r.oc, window, now) > 0
    or used_scaled(r.ms, r.mp, r.mc, window, now) > 0
  if r.cl <= now and r.np <= now then
    if r.cut == 1 or r.h * DEMAND_MS <= demand * (rtt + math.floor(rtt / 2))
        or r.rt > 0 or owes then
      refill = 1
      -- What the next round trip and the horizon will ask, on top of what is held: a
      -- call then comes every horizon and round trip of demand, whatever is left when it
      -- leaves.
      want = math.min(limit, ceil_div(demand * (rtt + horizon), DEMAND_MS))
      given, given_at = r.rt, r.ra
      os, op, oc = rolled(r.os, r.op, r.oc, window, now)
      ms, mp, mc = rolled(r.ms, r.mp, r.mc, window, now)
      r.rt, r.ra, r.os, r.op, r.oc, r.ms, r.mp, r.mc = 0, 0, 0, 0, 0, 0, 0, 0
      r.cl = now + claim
    end
  end

  local remaining = r.h
  if r.cut == 1 then
    remaining = remaining + room(r.sh, r.ss, r.sp, r.sc, window, now)
  end
  local reset = 0
  if admitted == 0 and remaining < cost then
    reset = math.max(rtt, 1)
  end
  save(window)
  local ack_used, ack_at = 0, -1
  if r.su then
    ack_used, ack_at = r.su, r.sg
  end
  return { admitted, remaining, reset, now, refill, want, given, given_at, os, op, oc,
    ceil_div(demand * window, DEMAND_MS), ack_used, r.sh, ack_at, ms, mp, mc, r.h, r.ha }
end

if op == 'answered' then
  local granted, spendable, counted_at = n(ARGV[2]), n(ARGV[3]), n(ARGV[4])
  local used, share, asked = n(ARGV[5]), n(ARGV[6]), n(ARGV[7])
  local window, horizon = n(ARGV[8]), n(ARGV[9])
  r.cl = 0
  if granted < asked then
    -- The limit had no room for all of it: half the horizon later there is more room
    -- for fewer calls.
    r.np = now + math.floor(horizon / 2)
  end
  if r.cut == 1 then
    if granted == 0 then
      -- Reachable, but nothing to lease yet: the share goes on, and the snapshot it
      -- started from is the one the region keeps saying it holds.
      save(window)
      return { now }
    end
    -- Linked again. The grant pays first for what the share admitted while this answer
    -- was on its way.
    r.os, r.op, r.oc = rolled(r.os, r.op, r.oc, window, now)
    local covered = math.min(granted, r.oc)
    r.oc = r.oc - covered
    granted = granted - covered
    covered = math.min(granted, r.op)
    r.op = r.op - covered
    granted = granted - covered
    r.cut = 0
  end
  r.su, r.sh, r.sg = used, share, counted_at
  if granted > 0 then
    local ends = now + spendable
    if r.h > 0 and floor_div(r.ha, window) ~= floor_div(counted_at, window) then
      -- Units of an earlier global window: they go back, the new ones take their place.
      give_back(r.h, r.ha)
      r.h = 0
    end
    if r.h > 0 then
      r.we = math.min(r.we, ends)
    else
      r.we = ends
    end
    r.he = r.we + window
    r.h = r.h + granted
    r.ha = counted_at
  end
  save(window)
  return { now }
end

if op == 'failed' then
  local limit, window, share = n(ARGV[2]), n(ARGV[3]), n(ARGV[4])
  local probe = n(ARGV[5])
  r.cl = 0
  r.np = now + probe
  -- The global store may or may not have counted what the call owed: owed again, counted
  -- twice at worst, never not at all.
  r.os, r.op, r.oc = added(r.os, r.op, r.oc, n(ARGV[6]), n(ARGV[7]), n(ARGV[8]), window, now)
  r.ms, r.mp, r.mc = added(r.ms, r.mp, r.mc, n(ARGV[9]), n(ARGV[10]), n(ARGV[11]), window,
    now)
  if r.cut == 0 then
    r.cut = 1
    if r.su and limit > 0 then
      share = r.sh
      -- The local share's rule: the share starts from its part of the count the global
      -- store last gave, all of it in the window of that answer, and what freed since
      -- counts as spent (the region did not admit on it while the call timed out, and
      -- admitting it all now would bunch a window's worth into what is left of one).
      local seed = ceil_div(math.min(r.su, limit) * share, limit)
      r.ss, r.sp, r.sc = r.sg - r.sg % window, 0, seed
      local freed = room(share, r.ss, r.sp, r.sc, window, now)
        - room(share, r.ss, r.sp, r.sc, window, math.max(r.sg, r.ss))
      r.ss, r.sp, r.sc = rolled(r.ss, r.sp, r.sc, window, now)
      r.sc = r.sc + math.max(0, freed)
    else
      r.ss, r.sp, r.sc = 0, 0, 0
    end
    r.sh = share
  end
  save(window)
  return { now }
end

return redis.error_reply('tollgate: unknown regional operation ' .. tostring(op))
