-- LOCK.EXTEND on one master (docs/PROTOCOL.md section 10). KEYS: key, its token counter, the
-- armed marker, the quarantine marker. ARGV: value, PX, the write's deadline (ms, master clock).
-- {1, PTTL before} if extended; 0 if the value does not hold the key; -1 unarmed or
-- quarantined; -2 past the deadline (nothing written).
local t = redis.call('time')
if t[1] * 1000 + t[2] / 1000 > tonumber(ARGV[3]) then
  return -2
end
if redis.call('exists', KEYS[3]) == 0 or redis.call('exists', KEYS[4]) == 1 then
  return -1
end
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
local before = redis.call('pttl', KEYS[1])
redis.call('pexpire', KEYS[1], ARGV[2])
-- Only ever lengthened: the token order needs the counter to live its full life.
redis.call('pexpire', KEYS[2], ARGV[2], 'GT')
return {1, before}
