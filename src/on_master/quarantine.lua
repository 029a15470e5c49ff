-- Quarantines a master for ARGV[1] ms (keeping a later end) and re-arms it, in one step: no
-- acquire can pass the marker check in between (docs/SAFETY.md, quarantine). KEYS: armed
-- marker, quarantine marker. Answers the quarantine's remaining ms.
local q = redis.call('get', KEYS[2])
-- A founding claim in the quarantine key becomes a loss quarantine ('1'), which no founder lifts.
if q and q ~= '1' then
  redis.call('set', KEYS[2], '1', 'KEEPTTL')
end
redis.call('set', KEYS[2], '1', 'NX', 'PX', ARGV[1])
redis.call('pexpire', KEYS[2], ARGV[1], 'GT')
-- Armed by this very process: a server that later serves this data under another run_id got
-- it by replication or from disk (docs/SAFETY.md, "Failovers").
redis.call('set', KEYS[1], string.match(redis.call('info', 'server'), 'run_id:(%w+)'))
return redis.call('pttl', KEYS[2])
