//! redlock-testkit: what the integration tests (`tests/`) and the benchmark
//! (`benches/lockbench`) of redlock-proxy share. Dev-only, never published.
//!
//! # Layout
//! - [`resp`]: the one RESP client (async, pipelined, typed replies and their compact text),
//!   a blocking one-shot command, a client that never reads, and `redis-cli`.
//! - [`http`]: a one-shot HTTP GET for the operations endpoint, and reading a scrape.
//! - [`launcher`]: running a proxy (in-process on an ephemeral port, or the release binary as
//!   a child process) over local masters; [`launcher::Env`] is N masters and a proxy.
//! - [`masters`]: direct access to one master (commands, `GET`, command statistics, signals).
//! - [`clock`]: the clock nemesis, a master whose wall clock steps or runs fast (an
//!   `LD_PRELOAD` shim of `clock_gettime`/`gettimeofday`).
//! - [`redisson`]: a Redisson lock client (its exact scripts, watchdog, waiter over pub/sub,
//!   `RFencedLock`), since Redisson's jars are not installable here.
//! - [`relay`]: a TCP fault relay to put between the proxy and a master.
//! - [`scripts`]: the real lock clients' Lua scripts (`tests/scripts`).
//! - [`workload`]: the lock workload and the history it records.
//! - [`checker`]: the mutual-exclusion (overlap) and validity checker over a history.
//! - [`nemesis`]: the fault injector (process and link faults) and its fault steps.
//! - [`rig`]: the fault-suite rig: masters, relays, proxies and a nemesis; scenario runner
//!   and verdicts.
//! - [`sentinel`]: Sentinel-managed master groups (a primary and a replica each, sentinels).
//!
//! Only the stable root paths of `redlock_proxy` are used (`redlock_proxy::{run, Config, …}`
//! and `redlock_proxy::on_master`).

pub mod checker;
pub mod clock;
pub mod cluster;
pub mod differential;
pub mod http;
pub mod launcher;
pub mod masters;
pub mod nemesis;
pub mod redisson;
pub mod relay;
pub mod resp;
pub mod rig;
pub mod scripts;
pub mod sentinel;
pub mod workload;

/// `(token, validity_ms)` from a granted `LOCK.ACQUIRE` as the kit's client renders it
/// (`*[:token,:validity]`); `None` for anything else (null, an error).
pub fn lock_grant(reply: &str) -> Option<(u64, u64)> {
    let inner = reply.strip_prefix("*[:")?.strip_suffix(']')?;
    let (token, validity) = inner.split_once(",:")?;
    Some((token.parse().ok()?, validity.parse().ok()?))
}

/// Polls `check` every 10 ms until it holds, at most `limit`; whether it held.
pub async fn eventually(limit: std::time::Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// A fresh key name for one test (distinct per test process).
pub fn key(name: &str) -> String {
    format!("test:{name}:{}", std::process::id())
}
