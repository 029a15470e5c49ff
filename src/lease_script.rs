//! Recognises lock scripts that set a lease from an argument (compare-then-`PEXPIRE`,
//! compare-then-`SET … PX`, redlock's `EXISTS`-then-`SET … PX`), so that they get the
//! acquire's treatment: the TTL argument is padded by drift on the masters and a success is
//! only reported while `TTL − elapsed − drift > 0`.
//!
//! Pure text analysis, no Lua execution. A script is recognised only when **every** use of
//! some `ARGV[n]` is the TTL of a `pexpire`/`expire` call or the value after `"PX"`/`"EX"` in a
//! `set` call (possibly wrapped in `tonumber(…)`), and all those uses agree on the unit. That
//! condition is what makes padding safe: `ARGV[n]` means nothing to the script but a TTL, so
//! replacing it by a larger TTL changes nothing else. A script that computes its TTL
//! (redis-py's `extend`, which adds to the current `PTTL`) is not recognised and runs
//! unchanged under the plain quorum reply rule.

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
    let compact: String = arg.chars().filter(|c| !c.is_whitespace()).collect();
    let inner = compact
        .strip_prefix("tonumber(")
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or(&compact);
    inner.strip_prefix("ARGV[")?.strip_suffix(']')?.parse().ok()
}

/// How many times `ARGV[n]` appears in `text` (any spacing inside the brackets).
fn count_argv_uses(text: &str, n: usize) -> usize {
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    compact.matches(&format!("ARGV[{n}]")).count()
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
        ];
        for (body, expected) in cases {
            let expected = expected.map(|(argv, unit_ms)| LeaseShape { argv, unit_ms });
            assert_eq!(recognise(body.as_bytes()), expected, "{body}");
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
