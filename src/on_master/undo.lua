-- The clean-up of one refused acquire attempt (docs/SAFETY.md, "Clean-ups undo only their own
-- attempt"). KEYS: lock key, token counter. ARGV: value, the attempt's counter record.
-- Deletes the lock only while it holds the value and the counter still names the attempt;
-- the counter stays (tokens only go up). 1 if deleted, else 0.
if redis.call('get', KEYS[1]) == ARGV[1] and redis.call('get', KEYS[2]) == ARGV[2] then
  return redis.call('del', KEYS[1])
end
return 0
