-- The undo of a hand-over (or a SET IFEQ extend) the client was not given. KEYS: key. ARGV: the
-- value written, the holder's value before, the TTL the key had when the write ran (0: keep).
-- Only while the written value still holds the key.
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[3] == '0' then
  redis.call('set', KEYS[1], ARGV[2], 'KEEPTTL')
else
  redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 1
