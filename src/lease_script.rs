//! Recognises lock scripts that set a lease from an argument (compare-then-`PEXPIRE`,
//! compare-then-`SET … PX`, redlock's `EXISTS`-then-`SET … PX`), so that a TTL argument above
//! the cap is refused before anything runs. (Padding and the validity check no longer depend
//! on this: they follow what a script does on the masters, [`crate::script_keys`].)
//!
//! Pure text analysis, no Lua execution: the body is split into Lua 5.1 tokens (comments
//! dropped, strings kept as strings, a leading `#!` line skipped as Redis does), and calls
//! are read from those tokens, so a `redis.call(…)` inside a comment or a string is not a call.
//!
//! Refusing on `ARGV[n]` is right only if `ARGV[n]` means nothing to the script but a TTL (a
//! value above the cap elsewhere must not be refused). [`recognise`] therefore finds a
//! shape only when **every** use of some `ARGV[n]` is the TTL of a `pexpire`/`expire` call or the
//! value after a `"PX"`/`"EX"` option of a `set` call (possibly wrapped in `tonumber(…)`), all
//! those uses agree on the unit, and it finds none (no early refusal) as soon as any use
//! could read `ARGV[n]` in a way it does not understand:
//! - `ARGV` not directly indexed by a decimal literal without leading zeros (`ipairs(ARGV)`,
//!   `unpack(ARGV)`, `#ARGV`, `local a = ARGV`, `ARGV[i]`, `ARGV[1+1]`, `ARGV[02]`);
//! - a way to reach globals indirectly (`_G`, `_ENV`, `getfenv`, `setfenv`, `rawget`, `load`,
//!   `loadstring`, `loadfile`, `dofile`, `debug` — `debug.getregistry()` leads to `_G`);
//! - `redis` or `tonumber` aliased, shadowed or redefined (`local r = redis`,
//!   `function redis.call(…)`, `local function tonumber(…)`), or `redis` used for anything but
//!   `redis.call(…)`, `redis.pcall(…)` and a few members that cannot run commands (`redis.log`…);
//! - a `'px'` that is `set`'s key or value: an option only comes after both.
//!
//! The `ARGV` checks run on the raw text, so a mention in a comment or a string counts as a use:
//! that can only refuse more. A script that computes its TTL (redis-py's `extend`, which adds to
//! the current `PTTL`) is not recognised and runs unchanged (its keys' TTLs are capped by the
//! guard).
//!
//! Two more questions about a script's text, both conservative:
//! - [`is_compare_and_delete`]: exactly one of the classic releases (`get KEYS[1]`, compare with
//!   `ARGV[1]`, `del`), whose reply means "1 deleted our value, 0 it was not there", so the
//!   release merge rule may claim `1`;
//! - [`may_write`]: could it write (then the guard follows it).

use crate::script_keys::script_command;
use bytes::Bytes;

/// Where a recognised script takes its TTL from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseShape {
    /// 1-based index into `ARGV` (never 0).
    pub argv: usize,
    /// 1 for milliseconds (`pexpire`, `PX`), 1000 for seconds (`expire`, `EX`).
    pub unit_ms: u64,
}

/// The lease shape of a script body, if it has one.
pub fn recognise(body: &[u8]) -> Option<LeaseShape> {
    let text = std::str::from_utf8(body).ok()?;
    if reaches_globals(text) || !argv_only_directly_indexed(text) {
        return None;
    }
    let tokens = tokens(text)?;
    if !only_called(&tokens, "tonumber") {
        return None;
    }
    let mut found: Option<LeaseShape> = None;
    let mut uses_in_ttl = 0usize;
    for args in redis_calls(&tokens)? {
        let ttl_positions: Vec<(usize, u64)> =
            match args.first().and_then(|a| literal(a)).as_deref() {
                Some("pexpire") => vec![(2, 1)],
                Some("expire") => vec![(2, 1000)],
                // `set key value [options]`: a `'px'` as the key or value is not an option.
                Some("set") => args
                    .iter()
                    .enumerate()
                    .skip(3)
                    .filter_map(|(i, a)| match literal(a)?.as_str() {
                        "px" => Some((i + 1, 1)),
                        "ex" => Some((i + 1, 1000)),
                        _ => None,
                    })
                    .collect(),
                _ => continue,
            };
        for (pos, unit_ms) in ttl_positions {
            let Some(argv) = args.get(pos).and_then(|a| argv_reference(a)) else {
                continue;
            };
            let shape = LeaseShape { argv, unit_ms };
            if found.is_some_and(|f| f != shape) {
                return None;
            }
            found = Some(shape);
            uses_in_ttl += 1;
        }
    }
    let shape = found?;
    (count_argv_uses(text, shape.argv) == uses_in_ttl).then_some(shape)
}

/// The classic release, and nothing else: the body (comments, `;` and layout aside, `call` or
/// `pcall`, any case in the command names) is one of
/// - `if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else
///   return 0 end` (or `… end return 0`, the comparison either way round or in parentheses, or
///   its negation with the branches swapped);
/// - redis-py's `local token = redis.call('get', KEYS[1]) if not token or token ~= ARGV[1] then
///   return 0 end redis.call('del', KEYS[1]) return 1` (or `… end return redis.call('del', …)`);
///
/// with `unlink` allowed for `del`. Its reply is `1` only if it deleted our value (the compare
/// succeeded, so the key existed) and `0` if the value was not there. Matching whole known
/// texts rather than rules is deliberate: a script passing looser rules, e.g.
/// `if … then redis.call('del', KEYS[1]) end return 1`, would answer `1` without having deleted
/// anything, and the release merge rule trusts a `1`.
pub fn is_compare_and_delete(body: &[u8]) -> bool {
    let Some(script) = std::str::from_utf8(body).ok().and_then(normalised) else {
        return false;
    };
    let var = match script.as_slice() {
        [local, var, ..] if local == "local" => var.as_str(),
        _ => "token",
    };
    let plain_name = var.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_');
    if !plain_name || ["redis", "KEYS", "ARGV"].contains(&var) {
        return false;
    }
    release_templates(var)
        .iter()
        .any(|t| normalised(t).as_ref() == Some(&script))
}

/// A whole lock script of a client library that the proxy runs as a lock operation of its own
/// ([`known_lock_script`]): node-redlock's when it names one key, Redisson's with its layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KnownLock {
    /// node-redlock (v5)'s acquire: `EXISTS` of every key (`0` if any exists), then `SET key
    /// ARGV[1] PX ARGV[2]` on each, `#KEYS`. With one key: `SET key ARGV[1] NX PX ARGV[2]`
    /// answering `1` or `0`.
    NodeRedlockAcquire,
    /// node-redlock (v5)'s release: the compare-and-delete of every key, answering how many it
    /// deleted. With one key: the classic compare-and-delete (`1` or `0`).
    NodeRedlockRelease,
    /// Redisson's `RLock` acquire: `KEYS = [name]`, `ARGV = [lease ms, <uuid>:<threadId>]`;
    /// where the hash is absent or holds the field, counts the field up and sets the lease,
    /// answering null; else the PTTL. Run as a hash-lock acquire (docs/SAFETY.md, "Hash locks
    /// (Redisson)").
    RedissonAcquire,
    /// `RFencedLock`'s acquire answering its token: `KEYS = [name, token counter]`, `ARGV` as
    /// [`KnownLock::RedissonAcquire`]'s; `{-1, token}` taken, `{pttl, -1}` held. Run as the
    /// `RLock` acquire of `KEYS[1]` (no `INCR`), answering the proxy's fencing token.
    RedissonFencedAcquire,
    /// `RFencedLock`'s plain acquire (its `lock()`): the `RLock` acquire with an `INCR` of
    /// `KEYS[2]`. Run as the `RLock` acquire of `KEYS[1]`.
    RedissonFencedLockAcquire,
}

/// The texts of Redisson's `RLock` acquire: the current one (one branch), the one
/// before it (two branches, `hincrby` in both) and the first (`hset` in the first branch). All
/// take the lock only where the hash is absent or holds the field, with the lease of `ARGV[1]`.
pub const REDISSON_ACQUIRES: [&str; 3] = [
    "if ((redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; return redis.call('pttl', KEYS[1]);",
    "if (redis.call('exists', KEYS[1]) == 0) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; return redis.call('pttl', KEYS[1]);",
    "if (redis.call('exists', KEYS[1]) == 0) then redis.call('hset', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; return redis.call('pttl', KEYS[1]);",
];
/// The channel Redisson's unlock of lock `name` publishes on, where its waiters wait:
/// `RedissonLock.getChannelName()`, `prefixName("redisson_lock__channel", name)`, which
/// braces a name that has no `{` so that the channel shares the lock's cluster slot.
pub fn unlock_channel(name: &[u8]) -> Bytes {
    let prefix = b"redisson_lock__channel:".as_slice();
    let name_braced = name.contains(&b'{');
    let mut channel = Vec::with_capacity(prefix.len() + name.len() + 2);
    channel.extend_from_slice(prefix);
    if !name_braced {
        channel.push(b'{');
    }
    channel.extend_from_slice(name);
    if !name_braced {
        channel.push(b'}');
    }
    Bytes::from(channel)
}

/// `RedissonFencedLock.tryLockInnerAsync(leaseTime, unit, threadId)`.
const REDISSON_FENCED_ACQUIRE: &str = "if (redis.call('exists', KEYS[1]) == 0 or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then local token = redis.call('incr', KEYS[2]);redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return {-1, token}; end; return {redis.call('pttl', KEYS[1]), -1};";
/// `RedissonFencedLock`'s override of the plain acquire.
const REDISSON_FENCED_LOCK_ACQUIRE: &str = "if ((redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then redis.call('incr', KEYS[2]);redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; return redis.call('pttl', KEYS[1]);";

/// node-redlock 5's scripts (`redlock/dist/esm/index.js`), layout and comments aside.
const NODE_REDLOCK_ACQUIRE: &str = "for i, key in ipairs(KEYS) do if redis.call(\"exists\", key) == 1 then return 0 end end for i, key in ipairs(KEYS) do redis.call(\"set\", key, ARGV[1], \"PX\", ARGV[2]) end return #KEYS";
const NODE_REDLOCK_RELEASE: &str = "local count = 0 for i, key in ipairs(KEYS) do if redis.call(\"get\", key) == ARGV[1] then redis.pcall(\"del\", key) count = count + 1 end end return count";

/// Which known lock script `body` is, matched whole (comments, `;` and layout aside), like
/// [`is_compare_and_delete`]: a script that differs in anything else is not one.
pub fn known_lock_script(body: &[u8]) -> Option<KnownLock> {
    let script = normalised(std::str::from_utf8(body).ok()?)?;
    let redisson = REDISSON_ACQUIRES.map(|text| (text, KnownLock::RedissonAcquire));
    [
        (NODE_REDLOCK_ACQUIRE, KnownLock::NodeRedlockAcquire),
        (NODE_REDLOCK_RELEASE, KnownLock::NodeRedlockRelease),
        (REDISSON_FENCED_ACQUIRE, KnownLock::RedissonFencedAcquire),
        (
            REDISSON_FENCED_LOCK_ACQUIRE,
            KnownLock::RedissonFencedLockAcquire,
        ),
    ]
    .into_iter()
    .chain(redisson)
    .find(|(text, _)| normalised(text).as_ref() == Some(&script))
    .map(|(_, known)| known)
}

/// Could the script write? Conservative: false only if every `redis.call`/`redis.pcall`
/// names, as a plain literal, a command of [`crate::script_keys::SCRIPT_COMMANDS`] that Redis
/// flags read-only; true when a name is not spelled out (`redis.call(ARGV[1], …)`,
/// `'pex' .. 'pire'`, escapes, `local c = redis.call`, `loadstring`…), names a command scripts
/// may not run, or the body is not UTF-8 or not Lua. Any write can leave a key without expiry
/// (`HSET` of a new key), so every script that may write is followed by the guard.
pub fn may_write(body: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(body) else {
        return true;
    };
    if reaches_globals(text) {
        return true;
    }
    let Some(tokens) = tokens(text) else {
        return true;
    };
    let Some(calls) = redis_calls(&tokens) else {
        return true;
    };
    calls.iter().any(|args| {
        args.first()
            .and_then(|a| literal(a))
            .and_then(|name| script_command(&name))
            .is_none_or(|command| command.write)
    })
}

/// One Lua token. Strings hold their text as written between the delimiters (escapes not
/// decoded); names include keywords.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token<'a> {
    Name(&'a str),
    Str(&'a str),
    Number(&'a str),
    Symbol(&'a str),
}

/// The Lua 5.1 tokens of `text` (as `llex.c` reads them), without comments. A first line
/// starting with `#!` is skipped, as Redis does with its shebang. `None` for text Lua would
/// not accept (unfinished string or long bracket, stray character).
fn tokens(text: &str) -> Option<Vec<Token<'_>>> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = if text.starts_with("#!") {
        text.find('\n')?
    } else {
        0
    };
    while let Some(&c) = b.get(i) {
        i = match c {
            b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c => i + 1,
            b'-' if b.get(i + 1) == Some(&b'-') => comment_end(text, i + 2)?,
            _ => {
                let (token, end) = token(text, i, c)?;
                out.push(token);
                end
            }
        };
    }
    Some(out)
}

/// Where the comment whose text starts at `i` (after its `--`) ends: after its long bracket's
/// close, or at the end of its line.
fn comment_end(text: &str, mut i: usize) -> Option<usize> {
    let b = text.as_bytes();
    if let Some((level, start)) = long_bracket_open(b, i) {
        return long_bracket(text, start, level).map(|(_, end)| end);
    }
    while b.get(i).is_some_and(|&c| c != b'\n' && c != b'\r') {
        i += 1;
    }
    Some(i)
}

/// The token starting with `c` at `text[i]` (neither a space nor a comment), and where it
/// ends.
fn token(text: &str, i: usize, c: u8) -> Option<(Token<'_>, usize)> {
    let b = text.as_bytes();
    match c {
        b'[' => bracket(text, i),
        b'\'' | b'"' => quoted(text, i, c),
        // A numeral, `.5` included, read as `read_numeral` does.
        c if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) => {
            let end = numeral_end(b, i);
            Some((Token::Number(&text[i..end]), end))
        }
        c if c.is_ascii_alphabetic() || c == b'_' => {
            let end = name_end(b, i);
            Some((Token::Name(&text[i..end]), end))
        }
        _ => {
            let symbol = symbol(&text[i..], c)?;
            Some((Token::Symbol(symbol), i + symbol.len()))
        }
    }
}

/// At `text[i] == '['`: a long bracket string, or the symbol `[`. `None` for `[=` that opens
/// no long bracket, and for an unfinished one.
fn bracket(text: &str, i: usize) -> Option<(Token<'_>, usize)> {
    match long_bracket_open(text.as_bytes(), i) {
        Some((level, start)) => {
            long_bracket(text, start, level).map(|(content, end)| (Token::Str(content), end))
        }
        None if text.as_bytes().get(i + 1) == Some(&b'=') => None,
        None => Some((Token::Symbol("["), i + 1)),
    }
}

/// The string opened by `quote` at `text[i]`, and where it ends after its closing quote.
/// `None` if it is unfinished or a line ends in it.
fn quoted(text: &str, i: usize, quote: u8) -> Option<(Token<'_>, usize)> {
    let b = text.as_bytes();
    let mut j = i + 1;
    loop {
        match *b.get(j)? {
            q if q == quote => break,
            b'\n' | b'\r' => return None,
            b'\\' => {
                // `\` + newline continues the string; `\r\n` and `\n\r` are one.
                let escaped = *b.get(j + 1)?;
                j += 2;
                if matches!(escaped, b'\n' | b'\r')
                    && b.get(j)
                        .is_some_and(|&n| matches!(n, b'\n' | b'\r') && n != escaped)
                {
                    j += 1;
                }
            }
            _ => j += 1,
        }
    }
    Some((Token::Str(&text[i + 1..j]), j + 1))
}

/// Where the numeral starting at `b[i]` ends: digits and dots, an exponent and its sign, then
/// any name characters (`llex.c` reads them all as part of it).
fn numeral_end(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|&c| c.is_ascii_digit() || c == b'.') {
        i += 1;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
    }
    name_end(b, i)
}

/// Where the run of name characters (letters, digits, `_`) starting at `b[i]` ends.
fn name_end(b: &[u8], mut i: usize) -> usize {
    while b
        .get(i)
        .is_some_and(|&c| c.is_ascii_alphanumeric() || c == b'_')
    {
        i += 1;
    }
    i
}

/// The operator or punctuation starting with `c` at the start of `rest`; `None` for a
/// character Lua does not accept.
fn symbol(rest: &str, c: u8) -> Option<&str> {
    ["...", "..", "==", "~=", "<=", ">="]
        .into_iter()
        .find(|s| rest.starts_with(s))
        .or_else(|| {
            let single = "+-*/%^#<>=(){}[];:,.";
            single.contains(c as char).then(|| &rest[..1])
        })
}

/// At `b[at] == '['`: a long bracket `[==[` opens here → (its level, where its content starts).
fn long_bracket_open(b: &[u8], at: usize) -> Option<(usize, usize)> {
    if b.get(at) != Some(&b'[') {
        return None;
    }
    let level = b[at + 1..].iter().take_while(|&&c| c == b'=').count();
    (b.get(at + 1 + level) == Some(&b'[')).then_some((level, at + 2 + level))
}

/// The content of a long bracket of `level` starting at `start`, and where its close ends.
fn long_bracket(text: &str, start: usize, level: usize) -> Option<(&str, usize)> {
    let close = format!("]{}]", "=".repeat(level));
    let len = text[start..].find(&close)?;
    Some((&text[start..start + len], start + len + close.len()))
}

/// Members of `redis` that run no command and read no argument of their own accord.
const HARMLESS_REDIS_MEMBERS: &[&str] = &[
    "log",
    "LOG_DEBUG",
    "LOG_VERBOSE",
    "LOG_NOTICE",
    "LOG_WARNING",
    "error_reply",
    "status_reply",
    "sha1hex",
    "setresp",
    "set_repl",
    "replicate_commands",
    "REPL_NONE",
    "REPL_AOF",
    "REPL_SLAVE",
    "REPL_REPLICA",
    "REPL_ALL",
    "REDIS_VERSION",
    "REDIS_VERSION_NUM",
];

/// The argument lists (each argument as its tokens) of every `redis.call(…)` and
/// `redis.pcall(…)`. `None` if `redis` is used any other way: aliased, shadowed, redefined
/// (`function redis.call`), a member other than the harmless ones, or a call left open.
fn redis_calls<'t, 'a>(tokens: &'t [Token<'a>]) -> Option<Vec<Vec<&'t [Token<'a>]>>> {
    let mut calls = Vec::new();
    for (at, token) in tokens.iter().enumerate() {
        if *token != Token::Name("redis") {
            continue;
        }
        if !is_global_use(tokens, at) {
            return None;
        }
        match &tokens[at + 1..] {
            [Token::Symbol("."), Token::Name("call" | "pcall"), Token::Symbol("("), ..] => {
                calls.push(arguments(tokens, at + 3)?);
            }
            [Token::Symbol("."), Token::Name(member), ..]
                if HARMLESS_REDIS_MEMBERS.contains(member) => {}
            _ => return None,
        }
    }
    Some(calls)
}

/// Not a field (`t.redis`, `t:redis`) nor the name of a function being defined.
fn is_global_use(tokens: &[Token], at: usize) -> bool {
    !matches!(
        at.checked_sub(1).map(|p| tokens[p]),
        Some(Token::Symbol("." | ":") | Token::Name("function"))
    )
}

/// True if every use of the global function `name` is a plain call `name(…)`: it is not
/// assigned, declared, passed around or defined anew.
fn only_called(tokens: &[Token], name: &str) -> bool {
    tokens.iter().enumerate().all(|(at, token)| {
        *token != Token::Name(name)
            || (is_global_use(tokens, at) && tokens.get(at + 1) == Some(&Token::Symbol("(")))
    })
}

/// The arguments of the call whose `(` is `tokens[open]`, split at its top-level commas (a
/// function literal's body counts as nested). `None` if it is not closed.
fn arguments<'t, 'a>(tokens: &'t [Token<'a>], open: usize) -> Option<Vec<&'t [Token<'a>]>> {
    let mut depth = 0usize;
    let mut start = open + 1;
    let mut args = Vec::new();
    for (i, token) in tokens.iter().enumerate().skip(open + 1) {
        match token {
            Token::Symbol(")") if depth == 0 => {
                if i > start || !args.is_empty() {
                    args.push(&tokens[start..i]);
                }
                return Some(args);
            }
            Token::Symbol("(" | "[" | "{") | Token::Name("function" | "if" | "do" | "repeat") => {
                depth += 1
            }
            Token::Symbol(")" | "]" | "}") | Token::Name("end" | "until") => {
                depth = depth.checked_sub(1)?
            }
            Token::Symbol(",") if depth == 0 => {
                args.push(&tokens[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    None
}

/// A string literal argument, lower-cased; `None` for anything else, and for a literal with an
/// escape (its value is not its text, so it is not taken for a command or option name).
fn literal(arg: &[Token]) -> Option<String> {
    match arg {
        [Token::Str(s)] if !s.contains('\\') => Some(s.to_ascii_lowercase()),
        _ => None,
    }
}

/// `ARGV[2]` or `tonumber(ARGV[2])` → 2. Index 0 (always `nil`) is not a reference.
fn argv_reference(arg: &[Token]) -> Option<usize> {
    let inner = match arg {
        [Token::Name("tonumber"), Token::Symbol("("), inner @ .., Token::Symbol(")")] => inner,
        _ => arg,
    };
    let [Token::Name("ARGV"), Token::Symbol("["), Token::Number(n), Token::Symbol("]")] = inner
    else {
        return None;
    };
    let plain = n.bytes().all(|b| b.is_ascii_digit()) && !n.starts_with('0');
    n.parse().ok().filter(|_| plain)
}

/// Every occurrence of the identifier `name` in `text` (not part of a longer identifier),
/// comments and strings included, as the text that follows it.
fn identifier_uses<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(name)
        .filter(|(at, _)| {
            let before = text[..*at].chars().next_back();
            let after = text[at + name.len()..].chars().next();
            !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
        })
        .map(|(at, _)| &text[at + name.len()..])
        .collect()
}

/// True if every mention of `ARGV` is `ARGV[<decimal literal without leading zero>]`
/// (whitespace allowed around the index).
fn argv_only_directly_indexed(text: &str) -> bool {
    identifier_uses(text, "ARGV").into_iter().all(|rest| {
        let Some(inside) = rest.trim_start().strip_prefix('[') else {
            return false;
        };
        let Some((index, _)) = inside.split_once(']') else {
            return false;
        };
        let index = index.trim();
        !index.is_empty()
            && index.bytes().all(|b| b.is_ascii_digit())
            && !(index.len() > 1 && index.starts_with('0'))
    })
}

/// True if the text mentions a way to reach `ARGV` (or any global) other than by its name.
/// Such a script could also reach the real `redis` around the shadow of
/// [`crate::script_keys`] (or the shadow's upvalues, through `debug`), give the shadow a field
/// of its own (`rawset`), or call the prelude's finisher itself, so the proxy refuses it.
/// Conservative: a mention in a comment or a string counts.
pub fn reaches_globals(text: &str) -> bool {
    [
        "_G",
        "_ENV",
        "getfenv",
        "setfenv",
        "rawget",
        "rawset",
        "load",
        "loadstring",
        "loadfile",
        "dofile",
        "debug",
        // The prelude's own finisher (src/on_master/prelude.lua), in the body's scope.
        "__done",
    ]
    .iter()
    .any(|name| !identifier_uses(text, name).is_empty())
}

/// `text` without whitespace.
fn compact(text: &str) -> String {
    text.chars().filter(|c| !c.is_whitespace()).collect()
}

/// How many times `ARGV[n]` appears in `text`, comments and strings included (any spacing
/// inside the brackets).
fn count_argv_uses(text: &str, n: usize) -> usize {
    compact(text).matches(&format!("ARGV[{n}]")).count()
}

/// The tokens of a script as comparable words: no `;`, `redis.pcall` as `redis.call`, string
/// literals lower-cased (as `'text`).
fn normalised(text: &str) -> Option<Vec<String>> {
    let tokens = tokens(text)?;
    let mut words = Vec::with_capacity(tokens.len());
    for (i, token) in tokens.iter().enumerate() {
        let after_redis_dot =
            i >= 2 && tokens[i - 2] == Token::Name("redis") && tokens[i - 1] == Token::Symbol(".");
        words.push(match *token {
            Token::Symbol(";") => continue,
            Token::Name("pcall") if after_redis_dot => "call".to_string(),
            Token::Str(s) => format!("'{}", s.to_ascii_lowercase()),
            Token::Name(s) | Token::Number(s) | Token::Symbol(s) => s.to_string(),
        });
    }
    Some(words)
}

/// The accepted compare-and-delete texts (see [`is_compare_and_delete`]), `var` naming
/// redis-py's local.
fn release_templates(var: &str) -> Vec<String> {
    let get = "redis.call('get', KEYS[1])";
    let token = "ARGV[1]";
    let parenthesised = [("", ""), ("(", ")")];
    let mut out = Vec::new();
    for del in ["del", "unlink"] {
        let del = format!("redis.call('{del}', KEYS[1])");
        for (a, b) in [(get, token), (token, get)] {
            for (open, close) in parenthesised {
                let equal = format!("{open}{a} == {b}{close}");
                let differ = format!("{open}{a} ~= {b}{close}");
                out.push(format!("if {equal} then return {del} else return 0 end"));
                out.push(format!("if {equal} then return {del} end return 0"));
                out.push(format!("if {differ} then return 0 else return {del} end"));
                out.push(format!("if {differ} then return 0 end return {del}"));
            }
        }
        for differ in [
            format!("not {var} or {var} ~= {token}"),
            format!("{var} ~= {token}"),
        ] {
            for (open, close) in parenthesised {
                for tail in [format!("{del} return 1"), format!("return {del}")] {
                    out.push(format!(
                        "local {var} = {get} if {open}{differ}{close} then return 0 end {tail}"
                    ));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1;

    const REDISSON_ACQUIRE: &str = "if (redis.call('exists', KEYS[1]) == 0) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; return redis.call('pttl', KEYS[1]);";

    const REDISSON_UNLOCK: &str = "if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then return nil; end; local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); if (counter > 0) then redis.call('pexpire', KEYS[1], ARGV[2]); return 0; else redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], ARGV[1]); return 1; end; return nil;";

    #[test]
    fn redisson_unlock_channels_brace_names_without_a_brace() {
        for (name, channel) in [
            ("lock", "redisson_lock__channel:{lock}"),
            ("{tag}:lock", "redisson_lock__channel:{tag}:lock"),
            ("a{b", "redisson_lock__channel:a{b"),
            ("", "redisson_lock__channel:{}"),
        ] {
            assert_eq!(&unlock_channel(name.as_bytes())[..], channel.as_bytes());
        }
    }

    #[test]
    fn recognised_and_refused_shapes() {
        let cases: &[(&str, Option<(usize, u64)>)] = &[
            // redis-cli / node-redis extend (client traces)
            (include_str!("../tests/scripts/redis-cli-extend.lua"), Some((2, MS))),
            (r#"if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("pexpire",KEYS[1],ARGV[2]) else return 0 end"#, Some((2, MS))),
            // redlock v5 extend and acquire (comments, ipairs(KEYS), #KEYS)
            (include_str!("../tests/scripts/node-redlock-extend.lua"), Some((2, MS))),
            (include_str!("../tests/scripts/node-redlock-acquire.lua"), Some((2, MS))),
            // redis-py reacquire: compare then pexpire ARGV[2]
            (include_str!("../tests/scripts/python-redis-py-reacquire.lua"), Some((2, MS))),
            // redis-py extend computes its TTL from PTTL: not recognised
            (include_str!("../tests/scripts/python-redis-py-extend.lua"), None),
            // releases have no lease
            (include_str!("../tests/scripts/python-redis-py-release.lua"), None),
            (include_str!("../tests/scripts/php-phpredis-release.lua"), None),
            (include_str!("../tests/scripts/redis-cli-release.lua"), None),
            (include_str!("../tests/scripts/node-redlock-release.lua"), None),
            // seconds, with tonumber and odd spacing and case
            ("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call( 'EXPIRE' , KEYS[1], tonumber( ARGV[ 2 ] ) ) end return 0", Some((2, 1000))),
            ("return redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2], 'XX')", Some((2, 1000))),
            ("return redis.pcall('set', KEYS[1], [[v]], [[PX]], ARGV[3])", Some((3, MS))),
            // Redisson's acquire: ARGV[1] is only ever the TTL of a pexpire
            (REDISSON_ACQUIRE, Some((1, MS))),
            // Redisson's unlock: ARGV[2] is only the TTL of the re-entrant branch's pexpire
            (REDISSON_UNLOCK, Some((2, MS))),
            // a Redis 7 shebang line is skipped; harmless redis members are allowed
            ("#!lua\nreturn redis.call('pexpire', KEYS[1], ARGV[1])", Some((1, MS))),
            ("redis.log(redis.LOG_WARNING, 'extending') return redis.call('pexpire', KEYS[1], ARGV[2])", Some((2, MS))),
            // ARGV[2] also used for something else: refusing on it could refuse another use
            ("redis.call('pexpire', KEYS[1], ARGV[2]); return redis.call('get', ARGV[2])", None),
            ("ARGV[2] = ARGV[2] redis.call('pexpire', KEYS[1], ARGV[2])", None),
            // units disagree
            ("redis.call('pexpire', KEYS[1], ARGV[2]); redis.call('expire', KEYS[2], ARGV[2])", None),
            // TTL is a computed value, or not an argument at all
            ("redis.call('pexpire', KEYS[1], ARGV[2] * 2)", None),
            ("redis.call('pexpire', KEYS[1], tonumber(ARGV[2], 16))", None),
            ("redis.call('pexpire', KEYS[1], 1000)", None),
            ("return 1", None),
            // ARGV[0] is always nil and has no place to pad
            ("return redis.call('pexpire', KEYS[1], ARGV[0])", None),
            // ARGV reached indirectly: ARGV[2] may be read as something else
            ("for i, a in ipairs(ARGV) do end return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("local t = {unpack(ARGV)} return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("local t = {table.unpack(ARGV)} return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("if #ARGV > 2 then end return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("local a = ARGV return redis.call('pexpire', KEYS[1], a[2])", None),
            ("local f = function(ARGV) end return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("local i = 2 redis.call('set', KEYS[1], ARGV[i]) return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("redis.call('set', KEYS[1], ARGV[1+1]) return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("redis.call('set', KEYS[1], ARGV[02]) return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("return redis.call('pexpire', KEYS[1], ARGV[02])", None),
            ("return redis.call('pexpire', KEYS[1], ARGV[0x2])", None),
            ("local g = _G['ARGV'] return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("local g = _G['AR'..'GV'] return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("local g = getfenv(0) return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("local g = rawget(x, 'y') return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("local f = loadstring('return 1') return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("local f = load(g) return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("local r = debug.getregistry() return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            // redis.call or tonumber redefined, aliased or shadowed
            ("redis.call = function(c, k, t) return redis.pcall('get', t) end return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("function redis.call(c, k, t) return redis.pcall('get', t) end return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("local redis = {call = function(c, k, t) end} return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("local c = redis.call return c('pexpire', KEYS[1], ARGV[2])", None),
            ("local function tonumber(x) return redis.call('get', x) end return redis.call('pexpire', KEYS[1], tonumber(ARGV[2]))", None),
            ("tonumber = function(x) return x end return redis.call('pexpire', KEYS[1], tonumber(ARGV[2]))", None),
            // a call in a comment or a string is not a call
            ("return redis.call('get', -- redis.call('pexpire', KEYS[1],\nARGV[2])", None),
            ("return redis.call('get', --[[ redis.call('pexpire', KEYS[1], ]] ARGV[2])", None),
            ("local s = \"redis.call('pexpire', KEYS[1], ARGV[2])\" return s", None),
            // mentions in comments and strings count as uses (conservative)
            ("-- pads ARGV[2]\nreturn redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("redis.log(redis.LOG_NOTICE, 'ARGV') return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            // a literal 'px' used as the key or the value is not an option
            ("return redis.call('set', 'px', ARGV[2])", None),
            ("return redis.call('set', KEYS[1], 'px', ARGV[2])", None),
            ("redis.call('set', KEYS[1], 'px', ARGV[2]) return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            // an escaped option is not read as one
            ("return redis.call('set', KEYS[1], ARGV[1], '\\112x', ARGV[2])", None),
            // a function literal's body is not split into arguments
            ("redis.pcall('pexpire', KEYS[1], function() x, ARGV[2], y = 1, 2, 3 end)", None),
            // not Lua
            ("return redis.call('pexpire', KEYS[1], ARGV[2]) !", None),
            ("return redis.call('pexpire', KEYS[1], ARGV[2]) 'open", None),
        ];
        for (body, expected) in cases {
            let expected = expected.map(|(argv, unit_ms)| LeaseShape { argv, unit_ms });
            assert_eq!(recognise(body.as_bytes()), expected, "{body}");
        }
    }

    #[test]
    fn node_redlock_scripts_are_known_whole() {
        let acquire = include_str!("../tests/scripts/node-redlock-acquire.lua");
        let release = include_str!("../tests/scripts/node-redlock-release.lua");
        assert_eq!(
            known_lock_script(acquire.as_bytes()),
            Some(KnownLock::NodeRedlockAcquire)
        );
        assert_eq!(
            known_lock_script(release.as_bytes()),
            Some(KnownLock::NodeRedlockRelease)
        );
        // Any other meaning is not one: a set without the expiry, a count without the delete.
        for changed in [
            acquire.replace(", \"PX\", ARGV[2]", ""),
            acquire.replace("return 0", "return 1"),
            release.replace("redis.pcall(\"del\", key)", ""),
            release.replace("== ARGV[1]", "~= ARGV[1]"),
        ] {
            assert_eq!(known_lock_script(changed.as_bytes()), None, "{changed}");
        }
        let classic = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
        assert_eq!(known_lock_script(classic.as_bytes()), None);
    }

    #[test]
    fn redisson_acquires_are_known_whole() {
        for text in REDISSON_ACQUIRES {
            assert_eq!(
                known_lock_script(text.as_bytes()),
                Some(KnownLock::RedissonAcquire)
            );
            // Layout and comments aside.
            let laid_out = format!("-- Redisson\n{}", text.replace("; ", ";\n  "));
            assert_eq!(
                known_lock_script(laid_out.as_bytes()),
                Some(KnownLock::RedissonAcquire)
            );
        }
        assert_eq!(REDISSON_ACQUIRES[1], REDISSON_ACQUIRE);
        assert_eq!(
            known_lock_script(REDISSON_FENCED_ACQUIRE.as_bytes()),
            Some(KnownLock::RedissonFencedAcquire)
        );
        assert_eq!(
            known_lock_script(REDISSON_FENCED_LOCK_ACQUIRE.as_bytes()),
            Some(KnownLock::RedissonFencedLockAcquire)
        );
        // Any other meaning is not one: a success that is not null, no lease, the lease from
        // another argument, a grant whoever holds the hash, the unlock and the renewal.
        let current = REDISSON_ACQUIRES[0];
        for changed in [
            current.replace("return nil", "return 1"),
            current.replace(" redis.call('pexpire', KEYS[1], ARGV[1]);", ""),
            current.replace("pexpire', KEYS[1], ARGV[1]", "pexpire', KEYS[1], ARGV[3]"),
            current.replace("== 1)) then", "== 0)) then"),
            current.replace(" or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)", ""),
            REDISSON_FENCED_ACQUIRE.replace("{-1, token}", "{1, token}"),
            REDISSON_UNLOCK.to_string(),
            "if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then redis.call('pexpire', KEYS[1], ARGV[1]); return 1; end; return 0;".to_string(),
        ] {
            assert_eq!(known_lock_script(changed.as_bytes()), None, "{changed}");
        }
    }

    #[test]
    fn compare_and_delete_is_recognised_exactly() {
        let cases: &[(&str, bool)] = &[
            (include_str!("../tests/scripts/python-redis-py-release.lua"), true),
            (include_str!("../tests/scripts/php-phpredis-release.lua"), true),
            (include_str!("../tests/scripts/redis-cli-release.lua"), true),
            (crate::on_master::COMPARE_AND_DELETE.text(), true),
            ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('unlink', KEYS[1]) end return 0", true),
            ("if (ARGV[1] == redis.pcall('GET', KEYS[1])) then return redis.pcall('DEL', KEYS[1]); else return 0; end", true),
            ("if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end return redis.call('del', KEYS[1])", true),
            ("-- release\nlocal v = redis.call('get', KEYS[1]) if v ~= ARGV[1] then return 0 end return redis.call('del', KEYS[1])", true),
            // node-redlock's release loops over KEYS and returns a count
            (include_str!("../tests/scripts/node-redlock-release.lua"), false),
            // Redisson's unlock, extends, acquires, unknown shapes
            (REDISSON_UNLOCK, false),
            (REDISSON_ACQUIRE, false),
            (include_str!("../tests/scripts/redis-cli-extend.lua"), false),
            (include_str!("../tests/scripts/python-redis-py-reacquire.lua"), false),
            (include_str!("../tests/scripts/node-redlock-acquire.lua"), false),
            ("if redis.call('get', KEYS[1]) == ARGV[2] then return redis.call('del', KEYS[1]) end return 0", false),
            ("if redis.call('get', KEYS[2]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0", false),
            ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[2]) end return 0", false),
            ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1], KEYS[2]) end return 0", false),
            ("return redis.call('get', KEYS[1])", false),
            ("if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('set', KEYS[1], 'x') return redis.call('del', KEYS[1]) end", false),
            ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0", false),
            // answers 1 without having deleted anything, or nil when not held
            ("if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('del', KEYS[1]) end return 1", false),
            ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end", false),
            ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) + 1 else return 0 end", false),
            ("if redis.call('get', KEYS[1]) ~= ARGV[1] then return 1 else return redis.call('del', KEYS[1]) end", false),
            // escaped or computed names are not taken at their word
            ("if redis.call('g\\101t', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end", false),
            ("local redis = x if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end", false),
            ("local KEYS = redis.call('get', KEYS[1]) if not KEYS or KEYS ~= ARGV[1] then return 0 end redis.call('del', KEYS[1]) return 1", false),
            ("return 1", false),
            ("", false),
        ];
        for (body, expected) in cases {
            assert_eq!(is_compare_and_delete(body.as_bytes()), *expected, "{body}");
        }
    }

    #[test]
    fn scripts_that_may_write() {
        let cases: &[(&[u8], bool)] = &[
            (
                include_bytes!("../tests/scripts/python-redis-py-extend.lua"),
                true,
            ),
            (
                include_bytes!("../tests/scripts/python-redis-py-reacquire.lua"),
                true,
            ),
            (
                include_bytes!("../tests/scripts/redis-cli-extend.lua"),
                true,
            ),
            (
                include_bytes!("../tests/scripts/node-redlock-acquire.lua"),
                true,
            ),
            (
                include_bytes!("../tests/scripts/node-redlock-extend.lua"),
                true,
            ),
            (REDISSON_ACQUIRE.as_bytes(), true),
            // releases delete
            (
                include_bytes!("../tests/scripts/redis-cli-release.lua"),
                true,
            ),
            (
                include_bytes!("../tests/scripts/php-phpredis-release.lua"),
                true,
            ),
            // a write that sets no expiry at all: the guard must see its key
            (b"return redis.call('HSET', KEYS[1], 'f', 'v')", true),
            (b"return redis.call('incr', KEYS[1])", true),
            // commands scripts may not run count as writes
            (b"return redis.call('SWAPDB', 0, 1)", true),
            (b"return redis.call('PERSIST', KEYS[1])", true),
            (b"return redis.call('hsetex', KEYS[1], 'PX', 5)", true),
            // reads only
            (b"return redis.call('get', KEYS[1])", false),
            (
                b"redis.log(redis.LOG_WARNING, 'x') return redis.pcall('PTTL', KEYS[1])",
                false,
            ),
            (
                b"-- set, expire and persist in a comment\nreturn redis.call('exists', KEYS[1])",
                false,
            ),
            // the command name is not spelled out
            (b"return redis.call(ARGV[1], KEYS[1], ARGV[2])", true),
            (b"return redis.call('g' .. 'et', KEYS[1])", true),
            (b"return redis.call('g\\101t', KEYS[1])", true),
            (b"local c = redis.call return c('get', KEYS[1])", true),
            (b"return loadstring(ARGV[1])()", true),
            (b"return redis.call('get', KEYS[1]) 'unfinished", true),
            (&[0xff, 0xfe], true),
        ];
        for (body, expected) in cases {
            assert_eq!(
                may_write(body),
                *expected,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn lua_tokens() {
        use Token::*;
        let cases: &[(&str, Option<Vec<Token>>)] = &[
            (
                "a.b(1, 'x')",
                Some(vec![
                    Name("a"),
                    Symbol("."),
                    Name("b"),
                    Symbol("("),
                    Number("1"),
                    Symbol(","),
                    Str("x"),
                    Symbol(")"),
                ]),
            ),
            (
                "x -- c\ny --[==[ long ]] ]==] z",
                Some(vec![Name("x"), Name("y"), Name("z")]),
            ),
            ("--[=x line comment\nq", Some(vec![Name("q")])),
            (
                "s = [==[a]]b]==]",
                Some(vec![Name("s"), Symbol("="), Str("a]]b")]),
            ),
            (
                r#"'it\'s' "a\"b" 'c\\'"#,
                Some(vec![Str(r"it\'s"), Str(r#"a\"b"#), Str(r"c\\")]),
            ),
            ("'a\\\r\nb'", Some(vec![Str("a\\\r\nb")])),
            (
                "a ~= b == c .. d ... #e <= f",
                Some(vec![
                    Name("a"),
                    Symbol("~="),
                    Name("b"),
                    Symbol("=="),
                    Name("c"),
                    Symbol(".."),
                    Name("d"),
                    Symbol("..."),
                    Symbol("#"),
                    Name("e"),
                    Symbol("<="),
                    Name("f"),
                ]),
            ),
            (
                "t[02] 1e+5 .5e-1 0x1F a.b",
                Some(vec![
                    Name("t"),
                    Symbol("["),
                    Number("02"),
                    Symbol("]"),
                    Number("1e+5"),
                    Number(".5e-1"),
                    Number("0x1F"),
                    Name("a"),
                    Symbol("."),
                    Name("b"),
                ]),
            ),
            (
                "#!lua flags=no-writes\nreturn 1",
                Some(vec![Name("return"), Number("1")]),
            ),
            ("'open", None),
            ("'line\nbreak'", None),
            ("[[open", None),
            ("--[[open", None),
            ("[=x", None),
            ("a ~ b", None),
            ("#!lua", None),
            ("é", None),
        ];
        for (text, expected) in cases {
            assert_eq!(tokens(text), *expected, "{text:?}");
        }
    }

    #[test]
    fn garbage_never_panics() {
        for body in [
            "redis.call(",
            "redis.call('pexpire'",
            "redis.pcall)",
            "redis.",
            "redis",
            "redis.call",
            "\u{0}\u{ff}",
            "redis.call('set', 'px')",
            "redis.call('set', KEYS[1], 'v', 'px')",
            "redis.call(]",
            "redis.call(end)",
            "[",
            "--[",
            "'\\",
            "'\\\r",
            "1e",
            "local",
            "#!",
        ] {
            let _ = recognise(body.as_bytes());
            let _ = is_compare_and_delete(body.as_bytes());
            let _ = may_write(body.as_bytes());
        }
        let _ = recognise(&[0xff, 0xfe]);
        let _ = is_compare_and_delete(&[0xff, 0xfe]);
    }
}
