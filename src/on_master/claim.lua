-- A founding claim (docs/SAFETY.md, founding). KEYS: armed marker, quarantine marker.
-- ARGV: the proxy's tag ('founding:<instance>'), the lease bound B (ms).
-- An unarmed master is armed (with this process's run_id, docs/SAFETY.md "Failovers") with the
-- claim in its quarantine key, in one step; a claim with a larger tag is adopted (its expiry
-- kept). Answers the markers as status.lua does.
if redis.call('exists', KEYS[1]) == 0 then
  redis.call('set', KEYS[1], string.match(redis.call('info', 'server'), 'run_id:(%w+)'))
  redis.call('set', KEYS[2], ARGV[1], 'PX', ARGV[2])
else
  local q = redis.call('get', KEYS[2])
  if q and string.sub(q, 1, 9) == 'founding:' and q > ARGV[1] then
    redis.call('set', KEYS[2], ARGV[1], 'KEEPTTL')
  end
end
return {redis.call('get', KEYS[1]), redis.call('pttl', KEYS[2]), redis.call('get', KEYS[2])}
