//! The Lua scripts real lock clients send, as they send them (`tests/scripts/*.lua`, checked
//! against their sources by `tests/scripts/SHA1SUMS`): the workload's acquire, extend and
//! clean-up, and any of them by name for the tests.

use std::path::{Path, PathBuf};

/// node-redlock's acquire: `EVAL body 1 key token ttl`; `:1` acquired, `:0` taken. The proxy
/// has no rollback for it: a refused one may leave its token on a minority until it expires.
pub const NODE_REDLOCK_ACQUIRE: &str = include_str!("../../tests/scripts/node-redlock-acquire.lua");
/// node-redlock's release, which node-redlock also sends after a failed acquire ("release any
/// partial lock state that may exist on a minority"): `EVAL body 1 key token`.
pub const NODE_REDLOCK_RELEASE: &str = include_str!("../../tests/scripts/node-redlock-release.lua");
/// redis-cli's extend (compare-then-`PEXPIRE`): `EVAL body 1 key token ttl`; `:1` extended.
pub const REDIS_CLI_EXTEND: &str = include_str!("../../tests/scripts/redis-cli-extend.lua");

/// One script for acquire and extend, as several libraries write it (their own spellings
/// differ): set the key with a TTL while it is free or ours. `EVAL body 1 key token ttl`; `:1`
/// acquired or extended, `:0` taken. Not one client's text: the proxy recognises its lease by
/// effect, not by its spelling.
pub const ACQUIRE_OR_EXTEND: &str = "local v = redis.call('get', KEYS[1]) if v == false or v == ARGV[1] then redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end return 0";

/// redis-semaphore's `Semaphore` acquire (5.7.0, `src/semaphore/acquire/lua.ts`):
/// `EVAL body 1 key limit identifier timeout_ms now_ms`; `:1` admitted (the identifier is a
/// member of the key's sorted set, scored `now_ms`), `:0` full. Released with `ZREM key
/// identifier`.
pub const REDIS_SEMAPHORE_ACQUIRE: &str =
    include_str!("../../tests/scripts/redis-semaphore-acquire.lua");

/// The words of a redis-semaphore acquire of `key` (`limit` permits) for `identifier`, held for
/// `timeout_ms`: `EVAL <script> 1 key limit identifier timeout_ms now_ms`. `now_ms` is the wall
/// clock read now, in ms with µs decimals (redis-semaphore sends `Date.now()`, whole ms: a
/// member scored up to 1 ms early could be dropped up to 1 ms before its holder's lease ends,
/// which the fault suite's checker would count against the proxy).
pub fn semaphore_acquire(
    key: &str,
    limit: usize,
    identifier: &str,
    timeout_ms: u64,
) -> Vec<String> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
    [
        "EVAL",
        REDIS_SEMAPHORE_ACQUIRE,
        "1",
        key,
        &limit.to_string(),
        identifier,
        &timeout_ms.to_string(),
        &format!("{now_ms:.3}"),
    ]
    .map(String::from)
    .to_vec()
}

/// The folder of the scripts.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/scripts")
}

/// The script `tests/scripts/<name>.lua`.
pub fn script(name: &str) -> String {
    let path = dir().join(format!("{name}.lua"));
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}
