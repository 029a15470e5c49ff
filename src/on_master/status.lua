-- A master's markers, read by the health monitor. KEYS: armed marker, quarantine marker.
-- {get(armed), pttl(quarantine), get(quarantine)}: the armed marker holds the run_id of the
-- redis-server process that armed it (docs/SAFETY.md, "Failovers"), or 1 from earlier versions.
return {redis.call('get', KEYS[1]), redis.call('pttl', KEYS[2]), redis.call('get', KEYS[2])}
