-- LOCK.TOKEN on one master. KEYS: key, its token counter. ARGV: value.
-- The token of the counter while the value holds the key: the string the key holds, or a
-- field of the hash it is (Redisson's lock: a field per holder thread). A counter of the bare
-- token (16 bytes) names no holder: a script made a new holder that did not get the token
-- (docs/SAFETY.md, "Tokens for locks taken by scripts", "Hash locks (Redisson)").
local v = redis.pcall('get', KEYS[1])
if v == ARGV[1] or (type(v) == 'table' and redis.pcall('hexists', KEYS[1], ARGV[1]) == 1) then
  local c = redis.call('get', KEYS[2])
  if c and #c > 16 then
    return tonumber(string.sub(c, 1, 16))
  end
end
return false
