-- The clean-up of one refused (or too late) hash-lock acquire: a Redisson acquire the proxy
-- ran as a lock operation (docs/SAFETY.md, "Hash locks (Redisson)"). KEYS: the lock (a hash),
-- its token counter. ARGV: the field (<uuid>:<threadId>), the attempt's counter record.
-- Only while the counter still names the attempt (the prelude wrote it in the run that
-- created the hash: the record itself where the master took the token, else
-- <counter's token>~<record>; every later new holder rewrites or cuts it): takes back the one
-- count the attempt gave the field (a retry's re-entry on top of it keeps its own), and cuts
-- the counter to its bare token, so that this runs at most once however often it is sent;
-- the cut keeps the token and its expiry (later tokens still go above it). 1 if it undid,
-- else 0.
local c = redis.call('get', KEYS[2])
if not c or (c ~= ARGV[2] and string.sub(c, 17) ~= '~' .. ARGV[2]) then
  return 0
end
redis.call('set', KEYS[2], string.sub(c, 1, 16), 'KEEPTTL')
if redis.pcall('hexists', KEYS[1], ARGV[1]) ~= 1 then
  return 0
end
if redis.call('hincrby', KEYS[1], ARGV[1], -1) <= 0 then
  redis.call('hdel', KEYS[1], ARGV[1])
end
return 1
