-- Re-stamps the armed marker with this process's run_id where the health monitor judged its
-- data this server's own (docs/SAFETY.md, "Failovers"). KEYS: armed marker. ARGV: the stamp
-- judged, the run_id judged. Writes only if the marker still holds that stamp and this is the
-- process judged (a restart in between is judged again at the next poll); never arms.
-- Answers 1 if it wrote.
local own = string.match(redis.call('info', 'server'), 'run_id:(%w+)')
if own == ARGV[2] and redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('set', KEYS[1], own)
  return 1
end
return 0
