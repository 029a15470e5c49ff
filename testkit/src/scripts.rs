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

/// redis-semaphore's `Semaphore` acquire (5.7.0, `src/semaphore/acquire/lua.ts`):
/// `EVAL body 1 key limit identifier timeout_ms now_ms`; `:1` admitted (the identifier is a
/// member of the key's sorted set, scored `now_ms`), `:0` full. Released with `ZREM key
/// identifier`.
pub const REDIS_SEMAPHORE_ACQUIRE: &str =
    include_str!("../../tests/scripts/redis-semaphore-acquire.lua");

/// The folder of the scripts.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/scripts")
}

/// The script `tests/scripts/<name>.lua`.
pub fn script(name: &str) -> String {
    let path = dir().join(format!("{name}.lua"));
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}
