//! The keys a client's script may touch on the masters, checked where the script runs.
//!
//! Redis 7 checks a user's key patterns for every key a script's `redis.call` touches, and
//! Redis Cluster requires scripts to declare their keys. The proxy checks the `KEYS` of an
//! `EVAL` before forwarding it (reserved keys, the user's patterns: [`crate::commands`]), but a
//! script can name any key in its body (`redis.call('del', 'redlock-proxy:quarantine')`), which
//! only the master running it sees. So every client script is sent to the masters behind a Lua
//! prelude ([`checked_body`]) that shadows `redis` with a table whose `call` and `pcall` first
//! locate the key arguments of the command (positions from [`SCRIPT_COMMANDS`], as `COMMAND
//! INFO` gives them) and refuse, with the error `redis.call` itself would raise or return:
//! - a key outside the user's patterns, with Redis 7.0's own text for scripts;
//! - a key under [`crate::commands::RESERVED_PREFIX`], with the proxy's reserved-key text;
//! - a key not in the script's `KEYS`;
//! - a command that is not in the table (its keys cannot be located, or it reaches beyond the
//!   keys: `SELECT`, `FLUSHALL`, `KEYS`, `EVAL`…), and `PERSIST` (a key without expiry).
//!
//! The members that run no command and change nothing outside the script (`setresp`,
//! `sha1hex`, `error_reply`, `log`…) are the real table's; any other is refused, and the shadow
//! has no field of its own, so an assignment to it raises (as Redis 7 does for its read-only
//! `redis`) instead of uncovering the real `call` behind it. The prelude is one line inserted before the body's first line (after a
//! `#!` line), so the body keeps its line numbers in Redis' error texts, and it is the same
//! for every user: the user's patterns travel as extra `ARGV` entries ([`access_args`]) that
//! the prelude takes off again before the body runs, so each client script is one script in
//! a master's cache, whoever runs it.
//!
//! The shadow holds only if the body cannot reach the real `redis` around it: through the
//! globals table (`_G`, `getfenv`, `rawget`), code loaded at run time (`loadstring`), or the
//! `debug` library (upvalues of the shadow), and it stays whole only if the body cannot give it
//! fields (`rawset`). Such scripts are refused before they reach the masters
//! ([`crate::lease_script::reaches_globals`]); the shadow's metatables are protected.

use crate::auth::KeyPatterns;
use crate::error::ProxyError;
use crate::on_master::{compact, PRELUDE_SOURCE, RESERVED_PREFIX, TOKEN_KEY_PREFIX};
use bytes::{Bytes, BytesMut};
use std::sync::LazyLock;

/// A command a client script may run, and where its keys are (`COMMAND INFO`'s first key,
/// last key (negative: counted from the end) and step; first 0: no keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScriptCommand {
    pub name: &'static str,
    pub first: i64,
    pub last: i64,
    pub step: i64,
    /// Redis flags it `write`: a script calling it is followed by the guard.
    pub write: bool,
}

const fn read(name: &'static str, first: i64, last: i64, step: i64) -> ScriptCommand {
    ScriptCommand {
        name,
        first,
        last,
        step,
        write: false,
    }
}

const fn write(name: &'static str, first: i64, last: i64, step: i64) -> ScriptCommand {
    ScriptCommand {
        name,
        first,
        last,
        step,
        write: true,
    }
}

/// The commands client scripts may run: those lock libraries and their neighbours use whose
/// keys `first/last/step` locate completely. Left out on purpose: commands with keys found by
/// a count or keyword (`ZUNIONSTORE`, `XREAD`, `SORT … BY`), keys in another database
/// (`MOVE`, `COPY … DB`, `SELECT`, `SWAPDB`), every key at once (`KEYS`, `SCAN`, `FLUSHALL`),
/// other code (`EVAL`, `FCALL`), `PERSIST`, and administration. `PUBLISH` has no key (Redisson
/// announces its unlocks with it).
pub const SCRIPT_COMMANDS: &[ScriptCommand] = &[
    read("get", 1, 1, 1),
    write("set", 1, 1, 1),
    write("setnx", 1, 1, 1),
    write("setex", 1, 1, 1),
    write("psetex", 1, 1, 1),
    write("getset", 1, 1, 1),
    write("getdel", 1, 1, 1),
    write("getex", 1, 1, 1),
    write("append", 1, 1, 1),
    read("strlen", 1, 1, 1),
    write("incr", 1, 1, 1),
    write("incrby", 1, 1, 1),
    write("incrbyfloat", 1, 1, 1),
    write("decr", 1, 1, 1),
    write("decrby", 1, 1, 1),
    read("getrange", 1, 1, 1),
    write("setrange", 1, 1, 1),
    read("mget", 1, -1, 1),
    write("mset", 1, -1, 2),
    write("msetnx", 1, -1, 2),
    write("del", 1, -1, 1),
    write("unlink", 1, -1, 1),
    read("exists", 1, -1, 1),
    read("touch", 1, -1, 1),
    read("type", 1, 1, 1),
    write("expire", 1, 1, 1),
    write("pexpire", 1, 1, 1),
    write("expireat", 1, 1, 1),
    write("pexpireat", 1, 1, 1),
    read("ttl", 1, 1, 1),
    read("pttl", 1, 1, 1),
    read("expiretime", 1, 1, 1),
    read("pexpiretime", 1, 1, 1),
    write("rename", 1, 2, 1),
    write("renamenx", 1, 2, 1),
    read("hget", 1, 1, 1),
    write("hset", 1, 1, 1),
    write("hsetnx", 1, 1, 1),
    write("hmset", 1, 1, 1),
    read("hmget", 1, 1, 1),
    read("hgetall", 1, 1, 1),
    write("hdel", 1, 1, 1),
    read("hexists", 1, 1, 1),
    write("hincrby", 1, 1, 1),
    write("hincrbyfloat", 1, 1, 1),
    read("hlen", 1, 1, 1),
    read("hkeys", 1, 1, 1),
    read("hvals", 1, 1, 1),
    read("hstrlen", 1, 1, 1),
    write("lpush", 1, 1, 1),
    write("rpush", 1, 1, 1),
    write("lpushx", 1, 1, 1),
    write("rpushx", 1, 1, 1),
    write("lpop", 1, 1, 1),
    write("rpop", 1, 1, 1),
    read("llen", 1, 1, 1),
    read("lrange", 1, 1, 1),
    write("lrem", 1, 1, 1),
    read("lindex", 1, 1, 1),
    write("lset", 1, 1, 1),
    write("ltrim", 1, 1, 1),
    read("lpos", 1, 1, 1),
    write("linsert", 1, 1, 1),
    write("rpoplpush", 1, 2, 1),
    write("lmove", 1, 2, 1),
    write("sadd", 1, 1, 1),
    write("srem", 1, 1, 1),
    read("smembers", 1, 1, 1),
    read("sismember", 1, 1, 1),
    read("smismember", 1, 1, 1),
    read("scard", 1, 1, 1),
    write("spop", 1, 1, 1),
    read("srandmember", 1, 1, 1),
    write("smove", 1, 2, 1),
    read("sinter", 1, -1, 1),
    read("sunion", 1, -1, 1),
    read("sdiff", 1, -1, 1),
    write("sinterstore", 1, -1, 1),
    write("sunionstore", 1, -1, 1),
    write("sdiffstore", 1, -1, 1),
    write("zadd", 1, 1, 1),
    write("zrem", 1, 1, 1),
    read("zscore", 1, 1, 1),
    read("zmscore", 1, 1, 1),
    write("zincrby", 1, 1, 1),
    read("zcard", 1, 1, 1),
    read("zcount", 1, 1, 1),
    read("zrange", 1, 1, 1),
    read("zrangebyscore", 1, 1, 1),
    read("zrevrange", 1, 1, 1),
    read("zrevrangebyscore", 1, 1, 1),
    read("zrank", 1, 1, 1),
    read("zrevrank", 1, 1, 1),
    write("zremrangebyscore", 1, 1, 1),
    write("zremrangebyrank", 1, 1, 1),
    write("zremrangebylex", 1, 1, 1),
    read("zrangebylex", 1, 1, 1),
    read("zrevrangebylex", 1, 1, 1),
    read("zlexcount", 1, 1, 1),
    write("zpopmin", 1, 1, 1),
    write("zpopmax", 1, 1, 1),
    write("zrangestore", 1, 2, 1),
    write("xadd", 1, 1, 1),
    read("xlen", 1, 1, 1),
    read("xrange", 1, 1, 1),
    read("xrevrange", 1, 1, 1),
    write("xtrim", 1, 1, 1),
    write("xdel", 1, 1, 1),
    write("xack", 1, 1, 1),
    write("setbit", 1, 1, 1),
    read("getbit", 1, 1, 1),
    read("bitcount", 1, 1, 1),
    read("ping", 0, 0, 0),
    read("echo", 0, 0, 0),
    read("time", 0, 0, 0),
    read("publish", 0, 0, 0),
];

/// The row of `name` (any case), if scripts may run it.
pub fn script_command(name: &str) -> Option<&'static ScriptCommand> {
    SCRIPT_COMMANDS
        .iter()
        .find(|c| c.name.eq_ignore_ascii_case(name))
}

/// Why `PERSIST` is refused, in scripts as outside them (the command table's reason).
const PERSIST_REFUSED: &str = "a lock without expiry cannot be made safe; use PEXPIRE";

/// Redis 7.0's answer when a script's command names a key outside the user's patterns
/// (`scriptVerifyACL`, `ACL_DENIED_KEY`).
pub const SCRIPT_NOPERM: &str = "ERR The user executing the script can't access at least one of the keys mentioned in the command arguments";

/// What every command of a script that reached its master past its write deadline answers
/// (see [`access_args`]): it runs none, so it writes nothing.
pub const LATE: &str = "ERR this script reached the master past its write deadline (held up beyond the node timeout) and ran no command (redlock-proxy)";

/// The prelude on one line, ending with a space after its `;` (a body starting with `(` must
/// not continue the prelude's last expression).
/// The prelude (`src/on_master/prelude.lua`, where each part is explained) on one line, with
/// its placeholders filled: the command table, the reserved prefix and the error texts.
static PRELUDE: LazyLock<String> = LazyLock::new(|| {
    let spec: String = SCRIPT_COMMANDS
        .iter()
        .map(|c| {
            let last = match c.last {
                -1 => "-".to_string(),
                last => last.to_string(),
            };
            // Leases by effect: `m` a TTL in ms as the third argument, `s` in seconds, `o` in
            // a `PX`/`EX` option.
            let lease = match c.name {
                "pexpire" | "psetex" => "m",
                "expire" | "setex" => "s",
                "set" | "getex" => "o",
                _ => "",
            };
            format!("|{}:{}{}{}{lease}", c.name, c.first, last, c.step)
        })
        .chain(std::iter::once("|".to_string()))
        .collect();
    let persist = ProxyError::Refused {
        command: "PERSIST".into(),
        reason: PERSIST_REFUSED,
    };
    compact(PRELUDE_SOURCE)
        .replace("@SPEC@", &spec)
        .replace("@RESERVED@", &lua_string(RESERVED_PREFIX))
        .replace("@PERSIST@", &lua_string(&persist.to_string()))
        .replace("@NOPERM@", &lua_string(SCRIPT_NOPERM))
        .replace("@LATE@", &lua_string(LATE))
        .replace(
            "@RESERVED_KEY@",
            &lua_string(&ProxyError::ReservedKey.to_string()),
        )
        + " "
});

/// `text` as a Lua string literal.
fn lua_string(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// `body` with the prelude before its first line, or after its `#!` line (Redis 7 reads
/// flags there and keeps the line feed, so line numbers stay the body's own). A `#!` line
/// without a line feed is sent as it is: Redis refuses it without running anything.
///
/// With `report_leases` (scripts that may write), the body runs as a function whose reply
/// goes through the prelude's `__done`, which adds the leases it noted (see `src/on_master/prelude.lua`):
/// the wrap opens on the prelude's line and closes on a line after the body's last.
pub fn checked_body(body: &[u8], report_leases: bool) -> Bytes {
    let split = if body.starts_with(b"#!") {
        match body.iter().position(|&b| b == b'\n') {
            Some(nl) => nl + 1,
            None => return Bytes::copy_from_slice(body),
        }
    } else {
        0
    };
    let (open, close): (&[u8], &[u8]) = match report_leases {
        true => (b"return __done((function(...) ", b"\nend)(...))"),
        false => (b"", b""),
    };
    let mut out = BytesMut::with_capacity(body.len() + PRELUDE.len() + open.len() + close.len());
    out.extend_from_slice(&body[..split]);
    out.extend_from_slice(PRELUDE.as_bytes());
    out.extend_from_slice(open);
    out.extend_from_slice(&body[split..]);
    out.extend_from_slice(close);
    out.freeze()
}

/// Where [`access_args`] puts the token counters' prefix among its entries (set per master:
/// [`crate::cluster::keys::token_prefix_on`]).
pub const COUNTERS_AT: usize = 0;
/// Where [`access_args`] puts the write deadline among its entries (set per master).
pub const DEADLINE_AT: usize = 6;

/// The fencing token a client script's run may take on a master when it makes a new holder of
/// a key (docs/SAFETY.md, "Tokens for locks taken by scripts"): the counter record
/// `<token, 16 digits>:<proxy instance>` (the proposal is its first 16 bytes), the master
/// clocks (ms) between which a master may take it, and how long a counter it writes lives at
/// least (ms; at least as long as the lock, too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenOffer {
    pub record: Bytes,
    pub earliest_ms: u64,
    pub latest_ms: u64,
    pub life_ms: u64,
}

/// The `ARGV` entries appended for the prelude: the user's patterns and their number, or `-1`
/// for a user with every key. Each pattern is tagged with how the prelude may match it: `=`
/// the whole key (no wildcard), `^` a prefix (`tenant:*`, the usual shape), `*` Redis' glob.
/// A glob in Lua costs about a microsecond a key (measured on redis-server 7.0); the other two
/// are one string comparison.
///
/// Before them goes the write deadline, in the master's clock (ms since the epoch; `0`: none):
/// a script that reaches the master past it (held up in a paused master's socket buffer, a
/// slow link) runs no command, so it writes nothing ([`LATE`]) ([`DEADLINE_AT`] places it).
/// Before it, the drift factor leases are padded by (`0`: none, and no lease is reported; see
/// `src/on_master/prelude.lua`); before it the fencing token the run may take ([`TokenOffer`];
/// four `0`s: none); first what the key's token counter is named with before the key (a
/// single master's, [`COUNTERS_AT`]: a cluster master's names the slot).
pub fn access_args(
    keys: &KeyPatterns,
    drift_factor: f64,
    deadline_ms: u64,
    token: Option<&TokenOffer>,
) -> Vec<Bytes> {
    let number = |n: u64| Bytes::from(n.to_string());
    let token: [Bytes; 4] = match token {
        Some(offer) => [
            offer.record.clone(),
            number(offer.earliest_ms),
            number(offer.latest_ms),
            number(offer.life_ms),
        ],
        None => [0, 0, 0, 0].map(number),
    };
    let pad = Bytes::from(drift_factor.to_string());
    let counters = Bytes::from_static(TOKEN_KEY_PREFIX.as_bytes());
    let fixed = [counters]
        .into_iter()
        .chain(token)
        .chain([pad, number(deadline_ms)]);
    let KeyPatterns::Some(patterns) = keys else {
        return fixed.chain([Bytes::from_static(b"-1")]).collect();
    };
    let special = |b: &u8| matches!(b, b'*' | b'?' | b'[' | b'\\');
    let mut args: Vec<Bytes> = fixed
        .chain(patterns.iter().map(|p| {
            let (tag, rest): (&[u8], &[u8]) = match p.iter().position(special) {
                None => (b"=", p),
                Some(star) if star + 1 == p.len() && p[star] == b'*' => (b"^", &p[..star]),
                Some(_) => (b"*", p),
            };
            Bytes::from([tag, rest].concat())
        }))
        .collect();
    args.push(Bytes::from(patterns.len().to_string()));
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_well_formed() {
        for (i, c) in SCRIPT_COMMANDS.iter().enumerate() {
            assert!(c.name.bytes().all(|b| b.is_ascii_lowercase()), "{}", c.name);
            assert!(
                SCRIPT_COMMANDS[i + 1..].iter().all(|o| o.name != c.name),
                "{} twice",
                c.name
            );
            // One digit each in the prelude's spec (`-` for -1).
            assert!(
                (0..=9).contains(&c.first) && (-1..=9).contains(&c.last),
                "{}",
                c.name
            );
            assert!((0..=9).contains(&c.step), "{}", c.name);
            if c.first == 0 {
                assert_eq!((c.last, c.step, c.write), (0, 0, false), "{}", c.name);
            } else {
                assert!(
                    c.step >= 1 && (c.last < 0 || c.last >= c.first),
                    "{}",
                    c.name
                );
            }
        }
        assert!(script_command("GET").is_some_and(|c| !c.write));
        assert!(script_command("Set").is_some_and(|c| c.write));
        for refused in [
            "persist", "select", "flushall", "keys", "eval", "move", "copy", "sort",
        ] {
            assert!(script_command(refused).is_none(), "{refused}");
        }
    }

    #[test]
    fn texts_agree_with_the_command_table() {
        // The prelude names a key's token counter as the acquire does.
        assert_eq!(
            &crate::on_master::token_key(b"k")[..],
            format!("{RESERVED_PREFIX}token:k").as_bytes()
        );
        let persist = crate::commands::lookup(b"persist").unwrap();
        assert!(matches!(persist.kind, crate::commands::Kind::Refused(r) if r == PERSIST_REFUSED));
        assert_eq!(lua_string(r#"a"b\c"#), r#""a\"b\\c""#);
    }

    #[test]
    fn the_prelude_is_one_line_and_keeps_the_body_s_lines() {
        let p: &str = &PRELUDE;
        assert!(
            !p.contains('\n') && !p.contains("--"),
            "one line, no comment"
        );
        assert!(p.ends_with("; "));
        assert!(
            p.contains("|get:111|") && p.contains("|mset:1-2|") && p.contains("|publish:000|'")
        );
        assert!(!p.contains('@'), "every placeholder filled");
        let plain = checked_body(b"return 1\nreturn 2", false);
        assert_eq!(&plain[..], format!("{p}return 1\nreturn 2").as_bytes());
        let flagged = checked_body(b"#!lua flags=no-writes\nreturn 1", false);
        assert_eq!(
            &flagged[..],
            format!("#!lua flags=no-writes\n{p}return 1").as_bytes()
        );
        assert_eq!(&checked_body(b"#!lua", false)[..], b"#!lua");
        // Reporting leases: the body is a function on the prelude's line, closed after it.
        let wrapped = checked_body(b"#!lua\nreturn 1\n-- end", true);
        assert_eq!(
            &wrapped[..],
            format!("#!lua\n{p}return __done((function(...) return 1\n-- end\nend)(...))")
                .as_bytes()
        );
    }

    #[test]
    fn patterns_travel_as_trailing_argv() {
        let none = ["redlock-proxy:token:", "0", "0", "0", "0"];
        assert_eq!(
            access_args(&KeyPatterns::All, 0.01, 0, None),
            none.iter()
                .chain(&["0.01", "0", "-1"])
                .map(|s| Bytes::from(*s))
                .collect::<Vec<_>>()
        );
        let some = KeyPatterns::Some(
            ["a:*", "b", "a*b", "a?", "*", "x\\*", "[ab]*", ""]
                .map(Bytes::from)
                .to_vec(),
        );
        let offer = TokenOffer {
            record: Bytes::from("0001764140000000:p.1.0"),
            earliest_ms: 1764139985000,
            latest_ms: 1764140015000,
            life_ms: 60602,
        };
        let args = access_args(&some, 0.0, 1234, Some(&offer));
        assert_eq!(args[DEADLINE_AT], Bytes::from("1234"));
        assert_eq!(
            args,
            [
                "redlock-proxy:token:",
                "0001764140000000:p.1.0",
                "1764139985000",
                "1764140015000",
                "60602",
                "0",
                "1234",
                "^a:",
                "=b",
                "*a*b",
                "*a?",
                "^",
                "*x\\*",
                "*[ab]*",
                "=",
                "8"
            ]
            .map(Bytes::from)
            .to_vec()
        );
        assert_eq!(
            access_args(&KeyPatterns::Some(Vec::new()), 0.0, 0, None),
            none.iter()
                .chain(&["0", "0", "0"])
                .map(|s| Bytes::from(*s))
                .collect::<Vec<_>>()
        );
    }
}
