-- The lock operations of one master, for every acquire and release a link merged into this
-- call, run in order (docs/SAFETY.md, "Merged calls decide nothing together").
-- KEYS: the armed marker, the quarantine marker, the write witness, then each operation's keys.
-- ARGV: the witness floor (the highest write witness this master answered the link; 0: no
-- check); the call's bounds, the strictest of its acquires' (src/protocol/master.rs
-- CallBounds): the write deadline (ms, master clock), the earliest clock that may take a
-- token (ms), the token counter's PX; then each operation:
--   acquire: KEYS lock key, token counter; ARGV counter record (<token>:<proxy instance>, the
--     token 16 digits), value, PX.
--   release: KEYS lock key; ARGV 'r', value.
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
-- One MGET for the markers, the witness and every acquire's counter.
local names = {KEYS[1], KEYS[2], KEYS[3]}
local k, a = 4, 5
while a <= #ARGV do
  if ARGV[a] ~= 'r' then
    names[#names + 1] = KEYS[k + 1]
    k = k + 2
    a = a + 3
  else
    k = k + 1
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
local r, written, i, c, took = {}, {}, 1, 4, false
k, a = 4, 5
while a <= #ARGV do
  if ARGV[a] ~= 'r' then
    local record = ARGV[a]
    local counter = written[KEYS[k + 1]] or m[c]
    c = c + 1
    if behind then
      r[i] = -1
    elseif late then
      r[i] = -2
    elseif early then
      r[i] = {-3, t[1] * 1000000 + t[2]}
    elseif not armed then
      r[i] = -1
    elseif counter and counter >= string.sub(record, 1, 16) then
      -- Records start with the zero-padded token: string order is token order.
      r[i] = {-4, tonumber(string.sub(counter, 1, 16))}
    else
      -- pcall: one acquire's error (OOM) is its answer, not the end of the others'.
      local ok = redis.pcall('set', KEYS[k], ARGV[a + 1], 'NX', 'PX', ARGV[a + 2])
      if ok and not ok.err then
        redis.call('set', KEYS[k + 1], record, 'PX', life)
        written[KEYS[k + 1]] = record
        took = true
      end
      r[i] = ok
    end
    k = k + 2
    a = a + 3
  else
    local v = redis.pcall('get', KEYS[k])
    if type(v) == 'table' and v.err then
      r[i] = v
    elseif v == ARGV[a + 1] then
      r[i] = redis.call('del', KEYS[k])
    else
      r[i] = 0
    end
    k = k + 1
    a = a + 2
  end
  i = i + 1
end
if took then
  r[i] = redis.call('incr', KEYS[3])
  i = i + 1
end
r[i] = t[1] * 1000000 + t[2]
return r
