-- A master's markers, read by the health monitor. KEYS: armed marker, quarantine marker.
-- {exists(armed), pttl(quarantine), get(quarantine)}.
return {redis.call('exists', KEYS[1]), redis.call('pttl', KEYS[2]), redis.call('get', KEYS[2])}
