-- SET and DELEX with a condition that is a plain write, not a lock operation (IFNE, and a
-- digest condition the proxy resolved to a value), on one master. KEYS: key. ARGV: 'set' or
-- 'del'; the condition ('eq': the key holds ARGV[3]; 'ne': missing or another value; 'nx':
-- missing); the value compared; for 'set': the new value, GET ('1' or '0'), the expiry
-- ('PX' ms, 'PXAT' ms, 'KEEPTTL' or ''), its argument. Redis 8.4's answers: WRONGTYPE for a key
-- that is not a string; 'del' 1 or 0; 'set' OK or nil, with GET the old value, set or not.
local current = redis.pcall('get', KEYS[1])
if type(current) == 'table' then
  return current
end
local holds
if ARGV[2] == 'eq' then
  holds = current == ARGV[3]
elseif ARGV[2] == 'ne' then
  holds = current ~= ARGV[3]
else
  holds = not current
end
if ARGV[1] == 'del' then
  if holds and current then
    return redis.call('del', KEYS[1])
  end
  return 0
end
if holds then
  if ARGV[6] == '' then
    redis.call('set', KEYS[1], ARGV[4])
  elseif ARGV[6] == 'KEEPTTL' then
    redis.call('set', KEYS[1], ARGV[4], 'KEEPTTL')
  else
    redis.call('set', KEYS[1], ARGV[4], ARGV[6], ARGV[7])
  end
end
if ARGV[5] == '1' then
  return current
end
if holds then
  return redis.status_reply('OK')
end
return false
