//! redlock-proxy: a Redis-compatible proxy that turns each lock operation into the Redlock
//! algorithm over N independent Redis masters.
//!
//! # Layout
//! - [`protocol`]: client-facing RESP (requests with Redis' limits and errors; RESP2/RESP3 replies).
//! - [`connection`]: one client session (ordered replies, bounded pipelining, grant re-check).
//! - [`commands`]: the command table and one module per command family.
//! - [`redlock`]: the pure decision logic (quorum, validity, merge rule), no I/O.
//! - [`cluster`]: fan-out to every master and the script cache.
//! - [`backend`]: one pipelined connection per master, timeouts, retirement, reconnects.
//! - [`health`]: master health watching, quarantine of masters that lost data, unsafe configs.
//! - [`server`]: the accept loop and graceful shutdown; [`config`]; [`local`] (child masters).

pub mod backend;
pub mod cluster;
pub mod commands;
pub mod config;
pub mod connection;
pub mod health;
pub mod lease_script;
pub mod local;
pub mod protocol;
pub mod redlock;
pub mod server;

pub use config::Config;
pub use server::run;

pub use cluster::MAX_FANOUTS;
pub use config::{ConfigError, LogFormat};
pub use local::{LocalCluster, LocalMaster};
pub use redlock::{backend_ttl_ms, drift_ms};

/// What the proxy keeps on every master, for tests and tools that inspect the masters.
pub mod on_master {
    pub use crate::cluster::{
        attempt_key, script_sha, ACQUIRE_SCRIPT, ROLLBACK_SCRIPT as COMPARE_AND_DELETE, UNDO_SCRIPT,
    };
    pub use crate::health::{ARMED_KEY, QUARANTINE_KEY};
}
