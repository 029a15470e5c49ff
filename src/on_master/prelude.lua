-- The prelude every client script runs behind on the masters (docs/PROTOCOL.md section 5,
-- "Keys a script may touch" and "Lease scripts, by effect"; docs/SAFETY.md, "Scripts touch
-- only what they declare" and "Tokens for locks taken by scripts"). It shadows `redis` with a
-- table whose call and pcall check each command's keys first, pads the leases the script sets,
-- and takes a fencing token where the script makes a new holder. Sent as one line (comment
-- lines dropped, lines joined), so the body keeps its own line numbers in Redis' errors.
-- Placeholders filled by src/script_keys.rs: @SPEC@ the command table, @RESERVED@ the prefix
-- of the proxy's keys, and the error texts @PERSIST@, @NOPERM@, @LATE@, @RESERVED_KEY@.
--
-- ARGV, at its end (removed before the body runs): what a key's token counter is named with
-- before the key (redlock-proxy:token:, with the slot's tag on a cluster node), the token
-- offer (the counter record
-- <token>:<proxy instance>, or '0' for none; the earliest and latest master clocks, ms, that
-- may take it; the counter's life, ms), the drift factor F (0: no padding, no report), the
-- write deadline (ms, master clock; 0: none), the user's key patterns each tagged ('=' a key,
-- '^' a prefix, '*' a glob), and their number m (-1: every key).
local redis, __done = (function(real, keys, argv)
-- spec: |name:FLS|... (first, last, step as one digit each, '-' for a last key of -1, then
-- the lease kind: m a TTL in ms as the third argument, s in seconds, o in a PX/EX option).
-- A constant string costs nothing per run; a Lua table would be built on every run.
local spec, reserved = '@SPEC@', @RESERVED@
local byte, find, lower, gsub, sub, format, select, unpack, ceil = string.byte, string.find, string.lower, string.gsub, string.sub, string.format, select, unpack, math.ceil
local rcall, rpcall = real.call, real.pcall
local n = #argv
local m = tonumber(argv[n])
local base = n - math.max(m, 0) - 1
local due, late, pad, noted = tonumber(argv[base]), false, tonumber(argv[base - 1]), 0
local counters, record, earliest, latest, life = argv[base - 6], argv[base - 5], tonumber(argv[base - 4]), tonumber(argv[base - 3]), tonumber(argv[base - 2])
local tokens, before, leased_keys = pad > 0 and record ~= '0', {}, {}
-- Past the write deadline (held up in a paused master's socket buffer) every call refuses.
if due > 0 then local t = rcall('time') late = t[1] * 1000 + t[2] / 1000 > due end
-- A TTL argument as a whole number of ms, or nil (left to the real call to judge).
local function whole(t, unit)
  if type(t) == 'string' and #t <= 12 and find(t, '^[1-9]%d*$') then t = tonumber(t)
  elseif type(t) ~= 'number' or t < 1 or t > 1e12 or t % 1 ~= 0 then return nil end
  return t * unit
end
-- The shortest lease (the client's ms) among the calls that took effect, and their keys.
local function noting(key, ms, took)
  if not took then return end
  if noted == 0 or ms < noted then noted = ms end
  leased_keys[key] = true
end
-- A lease call: its TTL padded as an acquire's (ms + ceil(ms * F) + 2), in ms (a seconds
-- form runs as its ms twin, which answers the same), noted if it took effect.
local function leased(f, argc, kind, name, key, a3, ...)
  if kind ~= 111 then
    local ms = whole(a3, kind == 115 and 1000 or 1)
    if not ms then return f(name, key, a3, ...) end
    if kind == 115 then name = 'p' .. lower(name) end
    local r = f(name, key, format('%d', ms + ceil(ms * pad) + 2), ...)
    noting(key, ms, r == 1 or (type(r) == 'table' and r.ok ~= nil))
    return r
  end
  local a, c, at, unit = {name, key, a3, ...}, lower(name), nil, nil
  for i = c == 'set' and 4 or 3, argc - 1 do
    local o = type(a[i]) == 'string' and lower(a[i])
    if o == 'px' then at, unit = i, 1 elseif o == 'ex' then at, unit = i, 1000 elseif o == 'get' then at = nil break end
  end
  local ms = at and whole(a[at + 1], unit)
  if not ms then return f(unpack(a, 1, argc)) end
  a[at], a[at + 1] = 'px', format('%d', ms + ceil(ms * pad) + 2)
  local r = f(unpack(a, 1, argc))
  noting(key, ms, (c == 'getex' and type(r) == 'string') or (c == 'set' and type(r) == 'table' and r.ok ~= nil))
  return r
end
-- The user's patterns: glob is Redis' stringmatchlen (the same as src/auth.rs glob_match).
local declared = {}
for i = 1, #keys do declared[keys[i]] = true end
local allowed
if m >= 0 then
  local kinds, rests = {}, {}
  for i = 1, m do kinds[i], rests[i] = byte(argv[n - m - 1 + i], 1), sub(argv[n - m - 1 + i], 2) end
  local function glob(p, k)
    local pl, kl, pi, ki, sp, sk = #p, #k, 1, 1, nil, nil
    while ki <= kl do
      local c, pc, adv = byte(k, ki), byte(p, pi), nil
      if pc == 42 then
        sp, sk, pi = pi + 1, ki, pi + 1
      else
        if pc == 63 then adv = pi + 1
        elseif pc == 91 then
          local i = pi + 1
          local neg = byte(p, i) == 94
          if neg then i = i + 1 end
          local hit = false
          while i <= pl and byte(p, i) ~= 93 do
            local x = byte(p, i)
            if x == 92 and i < pl then hit = hit or byte(p, i + 1) == c i = i + 2
            elseif i + 2 <= pl and byte(p, i + 1) == 45 then
              local lo, hi = x, byte(p, i + 2)
              if lo > hi then lo, hi = hi, lo end
              hit = hit or (c >= lo and c <= hi) i = i + 3
            else hit = hit or x == c i = i + 1 end
          end
          if hit ~= neg then adv = math.min(i + 1, pl + 1) end
        elseif pc == 92 and pi < pl then
          if byte(p, pi + 1) == c then adv = pi + 2 end
        elseif pc == c then adv = pi + 1 end
        if adv then pi, ki = adv, ki + 1
        elseif sp then sk = sk + 1 pi, ki = sp, sk
        else return false end
      end
    end
    while pi <= pl do if byte(p, pi) ~= 42 then return false end pi = pi + 1 end
    return true
  end
  allowed = function(k)
    for i = 1, m do
      local kind, rest = kinds[i], rests[i]
      if kind == 61 then if k == rest then return true end
      elseif kind == 94 then if sub(k, 1, #rest) == rest then return true end
      elseif glob(rest, k) then return true end
    end
    return false
  end
end
-- Who holds a key: the string it holds; for a hash (Redisson's lock, a field per holder
-- thread counting its re-entries), the hash itself, one marker for every hash, so that only
-- the hash appearing is a new holder, never a field added or counted in a present one; false
-- for none, or another type. GET answers a hash with an error: only then is TYPE asked.
local hash = {}
local function holder(k)
  local v = rpcall('get', k)
  if type(v) == 'string' then return v end
  return type(v) == 'table' and rcall('type', k).ok == 'hash' and hash
end
-- When the script returns: a declared key that now has another holder (another string, or a
-- hash where there was none) has a new holder.
-- With a lease on it, it takes the offered token as the acquire script does (clock within
-- the window, token above the counter); refused, the counter keeps its token and names the
-- run as <token>~<record>. Without a lease a counter there keeps only its bare token (later
-- tokens must pass it; it names no holder). An extend keeps the counter (GT).
-- Answers 0 (nothing), 1 (taken) or the first refusal {-2|-3, clock us} / {-4, counter}.
local function fence()
  local tok = 0
  for k, was in pairs(before) do
    local is = holder(k)
    if is and is ~= was then
      local ck = counters .. k
      local c = rcall('get', ck)
      if leased_keys[k] then
        local refusal, t = nil, rcall('time')
        local now = t[1] * 1000 + t[2] / 1000
        if now < earliest then refusal = {-3, t[1] * 1000000 + t[2]}
        elseif now > latest then refusal = {-2, t[1] * 1000000 + t[2]}
        elseif c and c >= sub(record, 1, 16) then refusal = {-4, tonumber(sub(c, 1, 16))} end
        if not refusal then
          rcall('set', ck, record, 'PX', math.max(life, rcall('pttl', k)))
          if tok == 0 then tok = 1 end
        else
          if type(tok) ~= 'table' then tok = refusal end
          -- Refused: the counter keeps its token (0 if none) and names the run after a '~',
          -- which is no full record (LOCK.TOKEN answers none), for the roll-back of a
          -- Redisson acquire to find its own write; it lives at least as long as the lock.
          local keep = c and rcall('pttl', ck) or 0
          rcall('set', ck, (c and sub(c, 1, 16) or '0000000000000000') .. '~' .. record, 'PX', math.max(keep, rcall('pttl', k)))
        end
        c = nil
      end
      if c then rcall('set', ck, sub(c, 1, 16), 'KEEPTTL') end
    elseif is and leased_keys[k] then
      local ms = rcall('pttl', k)
      if ms > 0 then rcall('pexpire', counters .. k, ms, 'GT') end
    end
  end
  return tok
end
for i = base - 6, n do argv[i] = nil end
-- Why a call is refused (Redis' own texts where it has them), or nil and the lease kind.
-- The user's patterns first, for every key, as Redis checks ACLs before running anything;
-- then the declared keys (a declared key is never reserved: the proxy refuses such KEYS).
-- Numbers as keys are converted as Redis 7.0 does (%.17g). The first call naming a
-- declared key notes the string it holds, for the fence.
local function denied(argc, name, ...)
  if type(name) == 'number' then name = format('%.17g', name) end
  if type(name) ~= 'string' then return nil end
  local at = find(spec, '|' .. name .. ':', 1, true)
  if not at then name = lower(name) at = find(spec, '|' .. name .. ':', 1, true) end
  if name == 'persist' then return @PERSIST@ end
  if not at then return "ERR '" .. gsub(sub(name, 1, 128), '%c', '?') .. "' in a script is refused by redlock-proxy: only commands whose keys it can check may run in scripts" end
  local f, l, s = byte(spec, at + #name + 2, at + #name + 4)
  if f == 48 then return nil end
  if l == 45 or l - 48 > argc - 1 then l = argc - 1 else l = l - 48 end
  f, s = f - 48, s - 48
  if allowed then
    for p = f, l, s do
      local k = select(p, ...)
      if type(k) == 'number' then k = format('%.17g', k) end
      if type(k) ~= 'string' then return nil end
      if not allowed(k) then return @NOPERM@ end
    end
  end
  for p = f, l, s do
    local k = select(p, ...)
    if type(k) == 'number' then k = format('%.17g', k) end
    if type(k) ~= 'string' then return nil end
    if declared[k] then
      if tokens and before[k] == nil then before[k] = holder(k) end
    else
      if sub(k, 1, #reserved) == reserved then return @RESERVED_KEY@ end
      return "ERR key '" .. gsub(sub(k, 1, 128), '%c', '?') .. "' is not in the script's KEYS and is refused by redlock-proxy: scripts may touch only the keys they declare"
    end
  end
  local kind = byte(spec, at + #name + 5)
  return nil, kind ~= 124 and kind or nil
end
-- redis.call raises what redis.pcall returns.
local function checked(f, raise, ...)
  local argc, err, kind = select('#', ...), nil, nil
  if late then err = @LATE@ else err, kind = denied(argc, ...) end
  if err then if raise then error({err = err}) end return {err = err} end
  if kind and pad > 0 and argc >= 3 then return leased(f, argc, kind, ...) end
  return f(...)
end
-- The shadow has no field of its own, so no assignment can uncover the real `redis` behind
-- it: an assignment raises what Redis 7 raises for its own (read-only) `redis` table, at the
-- script's line; reads find the checked call and pcall, then the members below, which run no
-- command and change nothing beyond the script's own reply (set_repl, which would keep writes
-- from replicas and the AOF, breakpoint and debug are refused). `rawset`, which could give it
-- a field, is refused before the script reaches a master (src/lease_script.rs). Both
-- metatables are protected (getmetatable answers false).
local members = '|log|LOG_DEBUG|LOG_VERBOSE|LOG_NOTICE|LOG_WARNING|sha1hex|error_reply|status_reply|setresp|replicate_commands|REDIS_VERSION|REDIS_VERSION_NUM|REPL_NONE|REPL_AOF|REPL_SLAVE|REPL_REPLICA|REPL_ALL|'
local api = setmetatable({
  call = function(...) return checked(rcall, true, ...) end,
  pcall = function(...) return checked(rpcall, false, ...) end
}, {__index = function(_, name)
  if type(name) == 'string' and find(members, '|' .. name .. '|', 1, true) then return real[name] end
  error({err = "ERR redis." .. gsub(sub(tostring(name), 1, 64), '%c', '?') .. " in a script is refused by redlock-proxy: only members that run no command and change nothing outside the script may be used"})
end, __metatable = false})
-- __done packs a write script's reply as {lease noted, token verdict, reply}: the reply last,
-- since a nil reply ends a Lua table.
return setmetatable({}, {
  __index = api,
  __newindex = function() error('Attempt to modify a readonly table', 2) end,
  __metatable = false
}), function(r)
  if pad == 0 then return r end
  return {noted, tokens and fence() or 0, r}
end
end)(redis, KEYS, ARGV);
