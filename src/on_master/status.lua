-- A master's markers, read by the health monitor. KEYS: armed marker, quarantine marker, and
-- (on a single master) the write witness.
-- {get(armed), pttl(quarantine), get(quarantine), get(witness)}: the armed marker holds the
-- run_id of the redis-server process that armed it (docs/SAFETY.md, "Failovers"), or 1 from
-- earlier versions; the witness counts the lock calls that took a key (docs/SAFETY.md,
-- "Acknowledged writes"; false where there is none).
return {redis.call('get', KEYS[1]), redis.call('pttl', KEYS[2]), redis.call('get', KEYS[2]), KEYS[3] and redis.call('get', KEYS[3])}
