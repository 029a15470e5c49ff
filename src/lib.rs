//! redlock-proxy: a Redis-compatible proxy that turns each lock operation into the Redlock
//! algorithm over N independent Redis masters.
//!
//! # Layers
//! Each module uses only modules of its own layer and of the layers above it (lower numbers),
//! and no modules use each other in a cycle. A module "beside" another is in its layer. Test
//! code (the `#[cfg(test)]` `tests` modules, and `fake_master`) may use any module.
//! `tests/layers.rs` checks this on every `crate::` path under `src/` (one module per path: no
//! `crate::{…}` groups), reading the list below: the modules of a numbered item are those it
//! links, so other modules are named there unlinked.
//!
//! 1. Leaves, no I/O: [`on_master`] (every Lua script the proxy runs on the masters, and the
//!    names of its own keys there; public, for tests and tools that inspect the masters),
//!    [`protocol`] (RESP both ways: client requests, replies, commands to the
//!    masters), [`redlock`] (the pure Redlock decisions: quorum, validity, merge rules),
//!    [`lease_script`] (what a client's Lua script means), [`script_keys`] (the checks a
//!    client's script runs under on the masters), [`error`] (every error reply the
//!    proxy makes), [`lease`] (a reply that promises a lock until a deadline), [`secret`] (a
//!    password that never prints), [`backend`] (a master's address as configured), [`auth`]
//!    (users, password checks, key patterns), [`live`] (durations a reload changes),
//!    [`cluster`] (Redis Cluster's hash slots, the proxy's keys per slot, the slot map),
//!    [`condition`] (Redis 8.4's `IFEQ`/`IFNE`/`IFDEQ`/`IFDNE` conditions and XXH3 `DIGEST`).
//! 2. [`transport`]: one pipelined FIFO connection per master (send, replies in order,
//!    reconnect, liveness check, clean-ups that survive reconnects). Knows nothing of votes.
//!    Beside it [`admission`]: the adaptive limit on fan-outs in progress, and how long an
//!    acquire may wait for a place. [`dial`] opens its streams: TCP or TLS, `AUTH`. Beside it [`pubsub`]: the clients'
//!    subscriptions and one subscriber connection per master for them all. [`tls`] loads the
//!    TLS material of both sides (rustls). Beside them [`config`]: the defaults, a TOML file
//!    and flags on top, whose checks build the users and load the masters' TLS files.
//! 3. [`health`]: whether each master may vote (the monitor, quarantine of masters that lost
//!    data, clock readings), behind [`health::MasterHealth`]; for a master that is a Redis
//!    Cluster, its primaries' links and health and each slot's, behind
//!    [`health::ClusterMaster`].
//! 4. [`masters`]: the voting set, one voter (link + health) per master, and the fan-out into
//!    a slot vector of votes.
//! 5. [`lock`] (the acquire: single flight, rollback, its scripts) and [`script_cache`].
//! 6. [`shared`]: the state every connection shares; beside it [`stats`] (client and command
//!    counters) and [`client_registry`] (the connected clients, for `CLIENT LIST` / `KILL`).
//! 7. [`commands`]: the command table and one module per command family.
//! 8. [`connection`]: one client session (ordered replies, bounded pipelining, grant re-check),
//!    over a [`client_stream`] (plain TCP, or TLS).
//! 9. [`server`]: the listeners (plain and TLS), the accept loop and graceful shutdown; beside
//!    it [`ops`] (metrics and probes over HTTP, live reload).
//! 10. Tools on top of the proxy, which nothing in it uses: [`local`] starts child
//!     `redis-server` masters (`--local`, tests, benches), and [`fuzzing`] re-exports the pure
//!     code that reads peers' bytes for the fuzz targets and the property tests.

mod admission;
mod auth;
mod backend;
mod client_registry;
mod client_stream;
pub mod cluster;
mod commands;
mod condition;
mod config;
mod connection;
mod dial;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod health;
mod lease;
mod lease_script;
mod live;
mod local;
mod lock;
mod masters;
pub mod on_master;
mod ops;
mod protocol;
mod pubsub;
mod redlock;
mod script_cache;
mod script_keys;
mod secret;
mod server;
mod shared;
mod stats;
mod tls;
mod transport;

#[cfg(test)]
mod fake_master;

pub use admission::MAX_FANOUTS;
pub use backend::{Backend, BackendError};
pub use config::{Config, ConfigError, LogFormat, NoQuorumReply};
pub use dial::PASSWORD_ENV;
pub use local::{LocalCluster, LocalError, LocalMaster};
pub use ops::metrics::METRIC_NAMES;
pub use ops::reload::{Reload, ReloadHook, Reloader};
pub use ops::status::Status;
pub use redlock::{backend_ttl_ms, drift_ms};
pub use secret::Secret;
pub use server::{run, run_with, ListenError, Listeners};
pub use tls::{ClientCerts, MasterTlsFiles, ServerTlsFiles, TlsAcceptorHandle, TlsError};

/// The checks a client's script runs under on the masters, for the tests that compare them
/// with redis-server's own.
pub mod script_checks {
    pub use crate::script_keys::{checked_body, ScriptCommand, SCRIPT_COMMANDS, SCRIPT_NOPERM};
}
