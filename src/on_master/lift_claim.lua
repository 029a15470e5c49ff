-- Lifts the founding claim ARGV[1], only if the quarantine key (KEYS[2]; KEYS[1] the armed
-- marker) still holds it: 1 if lifted, else 0.
if redis.call('get', KEYS[2]) == ARGV[1] then
  return redis.call('del', KEYS[2])
end
return 0
