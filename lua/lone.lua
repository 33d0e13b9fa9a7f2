-- tollgate: the decision of a caller's one policy when it is a token bucket or a sliding
-- window that does not lock out, the commonest call there is, in a script of its own.
-- build.rs makes one script of this per algorithm, `{algorithm}` standing for its name:
-- the same sections of lua/algorithm/ that lua/policies.lua runs, on the same key and
-- form, so either script may follow the other on a key. Redis runs a script's whole body
-- per call, and that one's loops over policies, kinds and operations cost a token bucket
-- nearly half of each decision; lua/policies.lua does everything else (leases, refunds,
-- charges, lockouts, several policies).
--
-- KEYS[1]  the policy's key
-- ARGV[1]  the policy's numbers and the cost, packed as little-endian doubles (the
--          `arguments` section of the algorithm's file; exact: every value here is an
--          integer below 2^53)
-- Returns  25 bytes: struct.pack('<Bddd', admitted (0/1), remaining, reset_ms, the time of
--          the decision)
--
-- Runs after lua/clock.lua (`now`), without lua/common.lua. What a call costs here is
-- mostly the interpreter's own work, measured in redis-server: four tonumber() calls on
-- text arguments took 0.4 µs where one unpack takes 0.1; each function defined in the
-- body is a closure built on every call; a reply of five integers cost 0.4 µs more than
-- one string. Hence packed arguments and reply, and no helpers.

-- insert: {algorithm} arguments
local floor = math.floor
local key = KEYS[1]
local units = cost
local fits, remaining, reset = false, 0, 0
-- insert: {algorithm} load
-- insert: {algorithm} weigh
local wanted = cost
if fits then
  -- insert: {algorithm} write
  remaining = remaining - cost
  if remaining < 0 then
    remaining = 0
  end
  wanted = remaining + 1
end
-- insert: {algorithm} wait
return struct.pack('<Bddd', fits and 1 or 0, remaining, reset, now)
