-- The compare-and-delete every client library sends to release (KEYS: key; ARGV: value), and
-- the clean-up of a plain SET NX PX (quarantine off: no counter record). 1 if deleted, else 0.
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
else
  return 0
end
