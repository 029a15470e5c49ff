-- SET key to IFEQ from, PX ms or KEEPTTL, on one master: a lock handed over from its holder's
-- value to another, or extended (to = from). KEYS: key, its token counter, the armed marker, the
-- quarantine marker. ARGV: from, to, PX (0: keep the TTL), the write's deadline (ms, master clock).
-- {1, PTTL before} if written; 0 if from does not hold the key; -1 unarmed or quarantined; -2 past
-- the deadline (nothing written); WRONGTYPE for a key that is not a string, as Redis 8.4 answers.
local t = redis.call('time')
if t[1] * 1000 + t[2] / 1000 > tonumber(ARGV[4]) then
  return -2
end
if redis.call('exists', KEYS[3]) == 0 or redis.call('exists', KEYS[4]) == 1 then
  return -1
end
local current = redis.pcall('get', KEYS[1])
if type(current) == 'table' then
  return current
end
if current ~= ARGV[1] then
  return 0
end
local before = redis.call('pttl', KEYS[1])
if ARGV[3] == '0' then
  redis.call('set', KEYS[1], ARGV[2], 'KEEPTTL')
else
  redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('pexpire', KEYS[2], ARGV[3], 'GT')
end
-- A new holder takes no token: the counter keeps its token (the floor of later proposals) but no
-- longer names a grant, so LOCK.TOKEN answers null for the new holder (docs/SAFETY.md).
local counter = redis.call('get', KEYS[2])
if counter and ARGV[1] ~= ARGV[2] then
  redis.call('set', KEYS[2], string.sub(counter, 1, 16), 'KEEPTTL')
end
return {1, before}
