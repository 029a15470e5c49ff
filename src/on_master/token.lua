-- LOCK.TOKEN on one master. KEYS: key, its token counter. ARGV: value.
-- The token of the counter while the value holds the key. A counter of the bare token (16
-- bytes) names no holder: a script made a new holder that did not get the token
-- (docs/SAFETY.md, "Tokens for locks taken by scripts").
if redis.call('get', KEYS[1]) == ARGV[1] then
  local c = redis.call('get', KEYS[2])
  if c and #c > 16 then
    return tonumber(string.sub(c, 1, 16))
  end
end
return false
