-- LOCK.TOKEN on one master. KEYS: key, its token counter. ARGV: value.
-- The token of the counter while the value holds the key: the string the key holds, or a
-- field of the hash it is (Redisson's lock: a field per holder thread). Only a full record
-- <token>:<instance> names the holder: the bare token (16 bytes), or <token>~<record>, is
-- written where a script made a new holder that did not get the token (docs/SAFETY.md,
-- "Tokens for locks taken by scripts", "Hash locks (Redisson)").
local v = redis.pcall('get', KEYS[1])
if v == ARGV[1] or (type(v) == 'table' and redis.pcall('hexists', KEYS[1], ARGV[1]) == 1) then
  local c = redis.call('get', KEYS[2])
  if c and string.sub(c, 17, 17) == ':' then
    return tonumber(string.sub(c, 1, 16))
  end
end
return false
