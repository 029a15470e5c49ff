#!lua flags=allow-cross-slot-keys
-- lock.lua for a Redis Cluster node: the lock operations of every acquire and release a link
-- merged into this call, whatever their slots (all served by this node), run in order
-- (docs/SAFETY.md, "Cluster masters"). A call's keys may span slots, which a node refuses for
-- declared keys (CROSSSLOT): every name comes in ARGV, and the flag above lets the script
-- reach keys of several slots of this node (a key another node serves fails the whole call).
-- ARGV[1]: the number n of names; ARGV[2..n+1]: each operation's names; then the call's
-- bounds (deadline, earliest clock, counter PX) and each operation, as lock.lua's:
--   acquire: names: its slot's armed and quarantine markers, lock key, token counter;
--     then counter record, value, PX.
--   release: names: lock key; then 'r', value.
-- Reply: lock.lua's, where armed means stamped with this node's id (CLUSTER MYID), unquarantined.
local n = tonumber(ARGV[1])
local t = redis.call('time')
local now = t[1] * 1000 + t[2] / 1000
local late, early, life = now > ARGV[n + 2] + 0, now < ARGV[n + 3] + 0, ARGV[n + 4]
local me = redis.call('cluster', 'myid')
local r, i, k, a = {}, 1, 2, n + 5
while a <= #ARGV do
  if ARGV[a] ~= 'r' then
    local record = ARGV[a]
    local lock, counter_key = ARGV[k + 2], ARGV[k + 3]
    if late then
      r[i] = -2
    elseif early then
      r[i] = {-3, t[1] * 1000000 + t[2]}
    else
      -- The slot's markers and the counter (one slot: one MGET), read at the operation's turn:
      -- an earlier operation of this call may have set the counter.
      local m = redis.call('mget', ARGV[k], ARGV[k + 1], counter_key)
      local counter = m[3]
      if m[1] ~= me or m[2] then
        r[i] = -1
      elseif counter and counter >= string.sub(record, 1, 16) then
        -- Records start with the zero-padded token: string order is token order.
        r[i] = {-4, tonumber(string.sub(counter, 1, 16))}
      else
        -- pcall: one acquire's error (OOM) is its answer, not the end of the others'.
        local ok = redis.pcall('set', lock, ARGV[a + 1], 'NX', 'PX', ARGV[a + 2])
        if ok and not ok.err then
          redis.call('set', counter_key, record, 'PX', life)
        end
        r[i] = ok
      end
    end
    k = k + 4
    a = a + 3
  else
    local v = redis.pcall('get', ARGV[k])
    if type(v) == 'table' and v.err then
      r[i] = v
    elseif v == ARGV[a + 1] then
      r[i] = redis.call('del', ARGV[k])
    else
      r[i] = 0
    end
    k = k + 1
    a = a + 2
  end
  i = i + 1
end
return r
