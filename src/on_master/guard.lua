-- Run on every master right after a command that may have written (docs/PROTOCOL.md section
-- 5, the guard). KEYS: armed marker, quarantine marker, then the keys it could have written.
-- ARGV: the lease bound (ms).
-- Caps every key at the bound, those without expiry included; then answers -1 if the master
-- is unarmed or quarantined (run after the write, a present marker proves no wipe came
-- before it), else what it capped: 1 a TTL above the bound, 2 no expiry, or-ed.
local capped = 0
for i = 3, #KEYS do
  local ttl = redis.call('pttl', KEYS[i])
  if ttl == -1 or ttl > tonumber(ARGV[1]) then
    redis.call('pexpire', KEYS[i], ARGV[1])
    if ttl == -1 then
      capped = bit.bor(capped, 2)
    else
      capped = bit.bor(capped, 1)
    end
  end
end
if redis.call('exists', KEYS[1]) == 0 or redis.call('exists', KEYS[2]) == 1 then
  return -1
end
return capped
