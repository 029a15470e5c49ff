//! Recognises lock scripts that set a lease from an argument (compare-then-`PEXPIRE`,
//! compare-then-`SET … PX`, redlock's `EXISTS`-then-`SET … PX`), so that they get the
//! acquire's treatment: the TTL argument is padded by drift on the masters and a success is
//! only reported while `TTL − elapsed − drift > 0`.
//!
//! Pure text analysis, no Lua execution. A script is recognised only when **every** use of
//! some `ARGV[n]` is the TTL of a `pexpire`/`expire` call or the value after a `"PX"`/`"EX"`
//! option of a `set` call (possibly wrapped in `tonumber(…)`), and all those uses agree on the
//! unit. That condition is what makes padding safe: `ARGV[n]` means nothing to the script but
//! a TTL, so replacing it by a larger TTL changes nothing else. So the recogniser refuses
//! (no padding, plain script) as soon as any use of `ARGV` is not understood: `ARGV` not
//! directly indexed by a decimal literal (`ipairs(ARGV)`, `unpack(ARGV)`, `#ARGV`,
//! `local a = ARGV`, `ARGV[i]`, `ARGV[02]`), or a way to reach it indirectly (`_G`, `_ENV`,
//! `getfenv`, `rawget`, `load`, `loadstring`). Uses inside strings and comments count too,
//! which can only refuse more. A `'px'` literal is an option only after a `set`'s key and
//! value. A script that computes its TTL (redis-py's `extend`, which adds to the current
//! `PTTL`) is not recognised and runs unchanged (its keys' TTLs are capped by the guard).
//!
//! Two more questions about a script's text, both conservative:
//! - [`is_compare_and_delete`]: the classic release (`get KEYS[1]`, compare with `ARGV[1]`,
//!   `del`), whose reply means "1 deleted, 0 not there", so the integer merge rules apply;
//! - [`may_set_expiry`]: could it set or extend an expiry (then the guard follows it).

/// Where a recognised script takes its TTL from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseShape {
    /// 1-based index into `ARGV`.
    pub argv: usize,
    /// 1 for milliseconds (`pexpire`, `PX`), 1000 for seconds (`expire`, `EX`).
    pub unit_ms: u64,
}

/// The lease shape of a script body, if it has one.
pub fn recognise(body: &[u8]) -> Option<LeaseShape> {
    let text = std::str::from_utf8(body).ok()?;
    if !argv_only_directly_indexed(text) || reaches_globals(text) {
        return None;
    }
    let mut found: Option<LeaseShape> = None;
    let mut uses_in_ttl = 0usize;
    for args in redis_calls(text) {
        let Some(name) = args.first().and_then(|a| string_literal(a)) else {
            continue;
        };
        let name = name.to_ascii_lowercase();
        let ttl_positions: Vec<(usize, u64)> = match name.as_str() {
            "pexpire" => vec![(2, 1)],
            "expire" => vec![(2, 1000)],
            "set" => args
                .iter()
                .enumerate()
                // `set key value [options]`: a `'px'` as the key or value is not an option.
                .skip(3)
                .filter_map(
                    |(i, a)| match string_literal(a)?.to_ascii_lowercase().as_str() {
                        "px" => Some((i + 1, 1)),
                        "ex" => Some((i + 1, 1000)),
                        _ => None,
                    },
                )
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
    let all_uses = count_argv_uses(text, shape.argv);
    (all_uses == uses_in_ttl).then_some(shape)
}

/// Every occurrence of the identifier `name` in `text` (not part of a longer identifier), as
/// the text that follows it.
fn identifier_uses<'a>(text: &'a str, name: &str) -> impl Iterator<Item = &'a str> + 'a {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let name = name.to_string();
    text.match_indices(name.clone().as_str())
        .filter(move |(at, _)| {
            let before = text[..*at].chars().next_back();
            let after = text[at + name.len()..].chars().next();
            !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
        })
        .map(|(at, m)| &text[at + m.len()..])
        .collect::<Vec<_>>()
        .into_iter()
}

/// True if every use of `ARGV` is `ARGV[<decimal literal without leading zero>]`.
fn argv_only_directly_indexed(text: &str) -> bool {
    identifier_uses(text, "ARGV").all(|rest| {
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

/// True if the script can reach `ARGV` (or anything) through the global environment.
fn reaches_globals(text: &str) -> bool {
    [
        "_G",
        "_ENV",
        "getfenv",
        "setfenv",
        "rawget",
        "load",
        "loadstring",
    ]
    .iter()
    .any(|name| identifier_uses(text, name).next().is_some())
}

/// The classic release: every Redis call is `get`, `del` or `unlink` on `KEYS[1]`, there is a
/// `get` and a deletion, and the only argument used is `ARGV[1]` (the token compared). Its reply
/// is `1` (deleted) or `0` (not there), so a higher integer claims more.
pub fn is_compare_and_delete(body: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(body) else {
        return false;
    };
    if reaches_globals(text) || !argv_only_directly_indexed(text) {
        return false;
    }
    let calls = redis_calls(text);
    if calls.is_empty() || calls.len() != text.matches("redis.").count() {
        return false;
    }
    let (mut gets, mut deletes) = (0, 0);
    for args in &calls {
        let name = args
            .first()
            .and_then(|a| string_literal(a))
            .map(str::to_ascii_lowercase);
        let on_key1 = args.len() == 2 && compact(args[1]) == "KEYS[1]";
        match name.as_deref() {
            Some("get") if on_key1 => gets += 1,
            Some("del" | "unlink") if on_key1 => deletes += 1,
            _ => return false,
        }
    }
    let keys_ok = identifier_uses(text, "KEYS").all(|rest| compact(rest).starts_with("[1]"));
    let argv_uses = identifier_uses(text, "ARGV").count();
    gets > 0 && deletes > 0 && keys_ok && argv_uses > 0 && count_argv_uses(text, 1) == argv_uses
}

/// Could the script set or extend an expiry? Conservative: any mention of a command family
/// that can (`expire`, `set`, `getex`, `restore`, `copy`, `rename`, `move`, `persist`) or of a
/// way to run other code (`eval`, `fcall`), in any case; a body that is not UTF-8 counts too.
pub fn may_set_expiry(body: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(body) else {
        return true;
    };
    let lower = text.to_ascii_lowercase();
    [
        "expire", "set", "getex", "restore", "copy", "rename", "move", "persist", "eval", "fcall",
    ]
    .iter()
    .any(|word| lower.contains(word))
}

/// `text` without whitespace.
fn compact(text: &str) -> String {
    text.chars().filter(|c| !c.is_whitespace()).collect()
}

/// The argument lists (split at top-level commas, trimmed) of every `redis.call(…)` and
/// `redis.pcall(…)` in `text`.
fn redis_calls(text: &str) -> Vec<Vec<&str>> {
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("redis.") {
        rest = &rest[at + "redis.".len()..];
        let after = rest
            .strip_prefix("pcall")
            .or_else(|| rest.strip_prefix("call"));
        let Some(after) = after.map(str::trim_start) else {
            continue;
        };
        let Some(inner) = after.strip_prefix('(') else {
            continue;
        };
        let mut depth = 0usize;
        let mut start = 0usize;
        let mut args = Vec::new();
        let mut quote: Option<char> = None;
        for (i, c) in inner.char_indices() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => quote = Some(c),
                (None, '(' | '[' | '{') => depth += 1,
                (None, ')') if depth == 0 => {
                    args.push(inner[start..i].trim());
                    calls.push(args);
                    break;
                }
                (None, ')' | ']' | '}') => depth = depth.saturating_sub(1),
                (None, ',') if depth == 0 => {
                    args.push(inner[start..i].trim());
                    start = i + 1;
                }
                _ => {}
            }
        }
    }
    calls
}

/// `"px"` / `'px'` → `px`.
fn string_literal(arg: &str) -> Option<&str> {
    let quote = arg.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    arg.strip_prefix(quote)?.strip_suffix(quote)
}

/// `ARGV[2]` or `tonumber(ARGV[2])` (any spacing) → 2.
fn argv_reference(arg: &str) -> Option<usize> {
    let compact = compact(arg);
    let inner = compact
        .strip_prefix("tonumber(")
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or(&compact);
    inner.strip_prefix("ARGV[")?.strip_suffix(']')?.parse().ok()
}

/// How many times `ARGV[n]` appears in `text` (any spacing inside the brackets).
fn count_argv_uses(text: &str, n: usize) -> usize {
    compact(text).matches(&format!("ARGV[{n}]")).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1;

    #[test]
    fn recognised_and_refused_shapes() {
        let cases: &[(&str, Option<(usize, u64)>)] = &[
            // redis-cli / node-redis extend (client-traces)
            (r#"if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("pexpire",KEYS[1],ARGV[2]) else return 0 end"#, Some((2, MS))),
            // redlock v5 extend and acquire
            (include_str!("../tests/scripts/node-redlock-extend.lua"), Some((2, MS))),
            (include_str!("../tests/scripts/node-redlock-acquire.lua"), Some((2, MS))),
            // redis-py reacquire: compare then pexpire ARGV[2]
            (include_str!("../tests/scripts/python-redis-py-reacquire.lua"), Some((2, MS))),
            // redis-py extend computes its TTL from PTTL: not recognised
            (include_str!("../tests/scripts/python-redis-py-extend.lua"), None),
            // releases have no lease
            (include_str!("../tests/scripts/python-redis-py-release.lua"), None),
            (include_str!("../tests/scripts/php-phpredis-release.lua"), None),
            // seconds, with tonumber and odd spacing and case
            ("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call( 'EXPIRE' , KEYS[1], tonumber( ARGV[ 2 ] ) ) end return 0", Some((2, 1000))),
            ("return redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2], 'XX')", Some((2, 1000))),
            // ARGV[2] also used for something else: padding it would change the script
            ("redis.call('pexpire', KEYS[1], ARGV[2]); return redis.call('get', ARGV[2])", None),
            // units disagree
            ("redis.call('pexpire', KEYS[1], ARGV[2]); redis.call('expire', KEYS[2], ARGV[2])", None),
            // TTL is a computed value
            ("redis.call('pexpire', KEYS[1], ARGV[2] * 2)", None),
            ("return 1", None),
            // Redisson's acquire: ARGV[1] is only ever the TTL of a pexpire
            (REDISSON_ACQUIRE, Some((1, MS))),
            // ARGV reached indirectly: padding ARGV[2] could change what the script reads
            ("for i, a in ipairs(ARGV) do end return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("local t = {unpack(ARGV)} return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("if #ARGV > 2 then end return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("local a = ARGV return redis.call('pexpire', KEYS[1], a[2])", None),
            ("local i = 2 redis.call('set', KEYS[1], ARGV[i]) return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("redis.call('set', KEYS[1], ARGV[02]) return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("local g = _G['AR'..'GV'] return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            ("local f = loadstring('return 1') return redis.call('pexpire', KEYS[1], ARGV[2])", None),
            // a literal 'px' used as the key or the value is not an option
            ("return redis.call('set', 'px', ARGV[2])", None),
            ("redis.call('set', KEYS[1], 'px', ARGV[2]) return redis.call('pexpire', KEYS[1], ARGV[2])", None),
        ];
        for (body, expected) in cases {
            let expected = expected.map(|(argv, unit_ms)| LeaseShape { argv, unit_ms });
            assert_eq!(recognise(body.as_bytes()), expected, "{body}");
        }
    }

    const REDISSON_ACQUIRE: &str = "if (redis.call('exists', KEYS[1]) == 0) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; return redis.call('pttl', KEYS[1]);";

    #[test]
    fn compare_and_delete_is_recognised_exactly() {
        let cases: &[(&str, bool)] = &[
            (include_str!("../tests/scripts/python-redis-py-release.lua"), true),
            (include_str!("../tests/scripts/php-phpredis-release.lua"), true),
            (include_str!("../tests/scripts/redis-cli-release.lua"), true),
            (crate::cluster::ROLLBACK_SCRIPT, true),
            ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('unlink', KEYS[1]) end return 0", true),
            // node-redlock's release loops over KEYS and returns a count
            (include_str!("../tests/scripts/node-redlock-release.lua"), false),
            // Redisson's unlock, extends, acquires, unknown shapes
            ("if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then return nil; end; local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); if (counter > 0) then redis.call('pexpire', KEYS[1], ARGV[2]); return 0; else redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], ARGV[1]); return 1; end; return nil;", false),
            (include_str!("../tests/scripts/redis-cli-extend.lua"), false),
            (include_str!("../tests/scripts/node-redlock-acquire.lua"), false),
            ("if redis.call('get', KEYS[1]) == ARGV[2] then return redis.call('del', KEYS[1]) end return 0", false),
            ("if redis.call('get', KEYS[2]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0", false),
            ("return redis.call('get', KEYS[1])", false),
            ("if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('set', KEYS[1], 'x') return redis.call('del', KEYS[1]) end", false),
            ("return 1", false),
        ];
        for (body, expected) in cases {
            assert_eq!(is_compare_and_delete(body.as_bytes()), *expected, "{body}");
        }
    }

    #[test]
    fn scripts_that_may_set_an_expiry() {
        let cases: &[(&[u8], bool)] = &[
            (
                include_bytes!("../tests/scripts/python-redis-py-extend.lua"),
                true,
            ),
            (
                include_bytes!("../tests/scripts/node-redlock-acquire.lua"),
                true,
            ),
            (REDISSON_ACQUIRE.as_bytes(), true),
            (b"return redis.call('GETEX', KEYS[1], 'PX', 5)", true),
            (b"return redis.call('RESTORE', KEYS[1], 0, ARGV[1])", true),
            (
                include_bytes!("../tests/scripts/redis-cli-release.lua"),
                false,
            ),
            // over-matching is allowed: its comment says "remove" (contains "move")
            (
                include_bytes!("../tests/scripts/node-redlock-release.lua"),
                true,
            ),
            (b"return redis.call('get', KEYS[1])", false),
            (&[0xff, 0xfe], true),
        ];
        for (body, expected) in cases {
            assert_eq!(
                may_set_expiry(body),
                *expected,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn garbage_never_panics() {
        for body in [
            "redis.call(",
            "redis.call('pexpire'",
            "redis.pcall)",
            "redis.",
            "\u{0}\u{ff}",
            "redis.call('set', 'px')",
        ] {
            let _ = recognise(body.as_bytes());
        }
        let _ = recognise(&[0xff, 0xfe]);
    }
}
