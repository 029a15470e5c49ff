-- The lock operations of one master, for every acquire and release a link merged into this
-- call, run in order (docs/SAFETY.md, "Merged calls decide nothing together").
-- KEYS: each operation's key (the lock's). The proxy's own keys (the armed and quarantine
-- markers, the write witness, each key's token counter) are named here, not passed: a master
-- converts every name passed (about 1,700 instructions each), and a single master runs a
-- script that touches keys it does not declare (a Redis Cluster node would refuse it: its
-- cluster_lock.lua passes every name). src/on_master/mod.rs checks they are its constants.
-- ARGV: the witness floor (the highest write witness this master answered the link; 0: no
-- check); the call's bounds, the strictest of its acquires' (src/protocol/master.rs
-- CallBounds): the write deadline (ms, master clock), the earliest clock that may take a
-- token (ms), the token counter's PX; then each operation:
--   acquire: ARGV counter record (<token>:<proxy instance>, the token 16 digits), value, PX.
--   release: ARGV 'r', value.
-- Reply: one element per operation. Acquire: OK or nil from SET NX; -1 unarmed, quarantined,
-- or its witness below the floor; -2 past the deadline; {-3, clock us} token too far ahead of
-- the clock; {-4, counter} token not above the counter. Release: 1 deleted, 0 not ours, or its
-- error. Then, if an acquire took its key, the write witness counted up once for the call:
-- every acquire this master acknowledged is in its data only if the witness it answered is
-- (docs/SAFETY.md, "Acknowledged writes"). Last, always, the clock (us) this call read: the
-- proxy judges it against its own clock before any OK of the call counts as a vote
-- (docs/SAFETY.md, "Master clocks: steps and rates between two looks").
local t = redis.call('time')
-- ms with the us as a fraction: at least as strict as whole ms for the deadline.
local now = t[1] * 1000 + t[2] / 1000
local late, early, life = now > ARGV[2] + 0, now < ARGV[3] + 0, ARGV[4]
local witness = 'redlock-proxy:witness'
-- One MGET for the markers, the witness and every acquire's counter.
local names, counters, a = {'redlock-proxy:armed', 'redlock-proxy:quarantine', witness}, {}, 5
for k = 1, #KEYS do
  if ARGV[a] ~= 'r' then
    counters[k] = 'redlock-proxy:token:' .. KEYS[k]
    names[#names + 1] = counters[k]
    a = a + 3
  else
    a = a + 2
  end
end
local m = redis.call('mget', unpack(names))
local armed = m[1] and not m[2]
-- A witness below the floor: the master lost writes it acknowledged (its data replaced since
-- the link's last answer): no acquire takes a key, whatever else it would answer; releases run.
-- Both are decimals without leading zeros (INCR's, the proxy's): compared as strings, length
-- first, which spares two conversions to a number (strtod) per call.
local w, f = m[3] or '0', ARGV[1]
local behind = #w < #f or (#w == #f and w < f)
-- written: the counters this call set, so each acquire compares with the counter at its turn.
local r, written, c, took = {}, {}, 4, false
a = 5
for k = 1, #KEYS do
  if ARGV[a] ~= 'r' then
    local record, counter_key = ARGV[a], counters[k]
    local counter = written[counter_key] or m[c]
    c = c + 1
    if behind then
      r[k] = -1
    elseif late then
      r[k] = -2
    elseif early then
      r[k] = {-3, t[1] * 1000000 + t[2]}
    elseif not armed then
      r[k] = -1
    elseif counter and counter >= string.sub(record, 1, 16) then
      -- Records start with the zero-padded token: string order is token order.
      r[k] = {-4, tonumber(string.sub(counter, 1, 16))}
    else
      -- pcall: one acquire's error (OOM) is its answer, not the end of the others'.
      local ok = redis.pcall('set', KEYS[k], ARGV[a + 1], 'NX', 'PX', ARGV[a + 2])
      if ok and not ok.err then
        redis.call('set', counter_key, record, 'PX', life)
        written[counter_key] = record
        took = true
      end
      r[k] = ok
    end
    a = a + 3
  else
    local v = redis.pcall('get', KEYS[k])
    if type(v) == 'table' and v.err then
      r[k] = v
    elseif v == ARGV[a + 1] then
      r[k] = redis.call('del', KEYS[k])
    else
      r[k] = 0
    end
    a = a + 2
  end
end
local i = #KEYS + 1
if took then
  r[i] = redis.call('incr', witness)
  i = i + 1
end
r[i] = t[1] * 1000000 + t[2]
return r
