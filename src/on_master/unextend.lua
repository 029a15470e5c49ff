-- The undo of an extend the client was not given. KEYS: key. ARGV: value, the TTL the key had
-- when the extend ran. Only while the value holds the key, and only shortening (LT).
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2], 'LT')
end
return 0
