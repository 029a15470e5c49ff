//! Configuration: the defaults of docs/PROTOCOL.md §2, a TOML file, and flags on top. Its
//! checks build the users ([`crate::auth`]) and load the masters' TLS files ([`crate::tls`]);
//! what is valid but likely not meant is a warning ([`Config::warnings`]).

use crate::auth::{UserConfig, Users};
use crate::backend::Backend;
use crate::secret::Secret;
use crate::tls::{ClientCerts, MasterTlsFiles, ServerTlsFiles};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// What an acquire answers when too few masters answered to decide it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum NoQuorumReply {
    /// Null, as for a held lock: lock libraries' wait loops ride an outage out.
    #[default]
    Null,
    /// `-NOQUORUM <n> of <N> masters usable, quorum <Q>`, which a client can tell from "held".
    Error,
}

/// Everything the proxy needs to run. Its `Debug` shows no secret (masters' passwords print
/// as `***`).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Listen address.
    pub bind: String,
    /// Listen port (`0` = any free port; with `tls_port` set, `0` = no plain listener, as
    /// Redis).
    pub port: u16,
    /// TLS listen port (Redis' `tls-port`; `0` = any free port). Needs `tls_cert_file` and
    /// `tls_key_file`.
    pub tls_port: Option<u16>,
    /// The listener's certificate chain (PEM), re-read on SIGHUP.
    pub tls_cert_file: Option<PathBuf>,
    /// The listener's private key (PEM), re-read on SIGHUP.
    pub tls_key_file: Option<PathBuf>,
    /// CA of client certificates (PEM), re-read on SIGHUP.
    pub tls_ca_cert_file: Option<PathBuf>,
    /// Whether TLS clients must present a certificate signed by `tls_ca_cert_file`.
    pub tls_auth_clients: ClientCerts,
    /// Independent Redis masters: `host:port`, `redis://[user:password@]host:port` or
    /// `rediss://…` (TLS).
    pub backends: Vec<Backend>,
    /// CA that signs the certificates of `rediss://` masters (PEM).
    pub backend_tls_ca_cert_file: Option<PathBuf>,
    /// Certificate and key the proxy presents to `rediss://` masters (mutual TLS).
    pub backend_tls_cert_file: Option<PathBuf>,
    pub backend_tls_key_file: Option<PathBuf>,
    /// Start this many local `redis-server` masters and use them as the backends.
    pub local: Option<usize>,
    /// How long one master may take to answer one request before its vote counts as "no".
    pub node_timeout_ms: u64,
    /// Clock drift allowance: `drift = ceil(TTL × F) + 2 ms`.
    pub drift_factor: f64,
    pub log_format: LogFormat,
    /// Longest bulk string a client may send (Redis' `proto-max-bulk-len`).
    pub proto_max_bulk_len: u64,
    /// Longest argument a request may carry (a lock value is a token): a request with a
    /// longer one is refused with an error before any master is asked, and no other request
    /// waits for it.
    pub max_value_bytes: u64,
    /// Requests one client may have in flight before the proxy stops reading its socket.
    pub max_inflight_per_client: usize,
    /// Most client connections at once (Redis' `maxclients`).
    pub maxclients: usize,
    /// Serve `SETNX` and `SET … NX` without expiry as plain fanned-out writes instead of
    /// refusing them. Off by default: such a lock can never be made safe.
    pub allow_locks_without_expiry: bool,
    /// Let masters whose `enable-debug-command` is not `no` vote. Off by default: `DEBUG
    /// RELOAD` replaces such a master's data in place, keeping its `run_id`, and a proxy that
    /// starts afterwards cannot tell it lost locks (docs/SAFETY.md, "Acknowledged writes").
    pub allow_debug_command: bool,
    /// What an acquire answers without a quorum of masters (null by default).
    pub no_quorum_reply: NoQuorumReply,
    /// How often each master's health (`INFO`) is checked.
    pub health_interval_ms: u64,
    /// Quarantine masters that restarted or lost data until every lease they may have held
    /// has expired. Only tests switch this off (the negative control of the safety suite).
    pub quarantine: bool,
    /// Propose fencing tokens from the masters' clocks, which keeps them increasing when a
    /// master loses its counters. Only tests switch this off (the negative control).
    pub token_clock: bool,
    /// Send each merged lock call the highest write witness its master answered, so that a
    /// master whose witness is behind it (data replaced in place since) takes no key
    /// (docs/SAFETY.md, "Acknowledged writes"). Only tests switch this off (the negative
    /// control).
    pub witness_floor: bool,
    /// Judge each master's clock as every merged lock call reads it, so that an acquire a
    /// master took while its clock ran ahead of the drift allowance (a step or a rate between
    /// two health polls) is no vote (docs/SAFETY.md, "Master clocks: steps and rates between
    /// two looks"). Only tests switch this off (the negative control).
    pub clock_per_call: bool,
    /// Largest TTL the proxy forwards, whatever sets it (`SET … PX`, `PEXPIRE`, lease
    /// scripts; scripts that compute a TTL are capped on the masters). A master that lost its
    /// data is quarantined for this long plus drift, so every proxy in front of the same
    /// masters must use the same value (the default does).
    pub max_lock_ttl_ms: u64,
    /// A master's vote counts only once `WAIT` confirms this many of its replicas have the
    /// write (0: off). A failover to a replica that had every confirmed write is then no
    /// loss (no quarantine). Set it to the number of replicas of each primary, the same on
    /// every proxy (docs/SAFETY.md, "Confirmed writes").
    pub wait_replicas: u32,
    /// Shards, one thread each, each serving its share of the clients with its own
    /// connections to the masters (0 and 1: everything on one thread).
    pub threads: usize,
    /// Reply bytes waiting for a client that does not read before it is disconnected, like
    /// Redis' `client-output-buffer-limit normal` hard limit (0 = no limit).
    pub client_output_buffer_limit: u64,
    /// `ADDR:PORT` of the HTTP endpoint for `/metrics`, `/healthz` and `/readyz` (off unless
    /// given).
    pub metrics: Option<String>,
    /// The log filter (`info`, `debug`, `redlock_proxy=trace`, …) when `RUST_LOG` is not set;
    /// changed live by a reload.
    pub log_level: String,
    /// Request bytes one client may have buffered (a request still arriving) before it is
    /// disconnected, like Redis' `client-query-buffer-limit` (1 GB; at least 1 MB).
    pub client_query_buffer_limit: u64,
    /// Close a client idle for this many seconds, like Redis' `timeout` (0 = never).
    pub timeout: u64,
    /// The `default` user's password, like Redis' `requirepass`: every client must `AUTH`.
    pub requirepass: Option<Secret>,
    /// Named users, like Redis ACL users (`[[users]]` tables).
    pub users: Vec<UserConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            bind: "127.0.0.1".into(),
            port: 7379,
            tls_port: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_ca_cert_file: None,
            tls_auth_clients: ClientCerts::Yes,
            backends: Vec::new(),
            backend_tls_ca_cert_file: None,
            backend_tls_cert_file: None,
            backend_tls_key_file: None,
            local: None,
            node_timeout_ms: 50,
            drift_factor: 0.01,
            log_format: LogFormat::Text,
            proto_max_bulk_len: crate::protocol::request::DEFAULT_MAX_BULK_LEN,
            max_value_bytes: 64 * 1024,
            max_inflight_per_client: 1024,
            maxclients: 10_000,
            allow_locks_without_expiry: false,
            allow_debug_command: false,
            no_quorum_reply: NoQuorumReply::Null,
            health_interval_ms: 100,
            quarantine: true,
            token_clock: true,
            witness_floor: true,
            clock_per_call: true,
            max_lock_ttl_ms: 60_000,
            wait_replicas: 0,
            threads: 1,
            client_output_buffer_limit: 64 * 1024 * 1024,
            client_query_buffer_limit: 1024 * 1024 * 1024,
            timeout: 0,
            requirepass: None,
            users: Vec::new(),
            metrics: None,
            log_level: "info".into(),
        }
    }
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {source}")]
    Parse {
        path: String,
        source: Box<toml::de::Error>,
    },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// Reads a TOML file (keys as in [`Config`], e.g. `backends = ["127.0.0.1:6379"]`).
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: shown,
            source: Box::new(source),
        })
    }

    /// Checks the values that would make the proxy unsafe or unusable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: &str| Err(ConfigError::Invalid(m.into()));
        if self.backends.is_empty() && self.local.is_none() {
            return invalid("no masters: give --backend HOST:PORT (repeatable) or --local N");
        }
        if self.local == Some(0) {
            return invalid("--local needs at least 1 master");
        }
        // A master listed twice would vote twice: a "majority" could then be a minority of
        // the real masters, and the quorum intersection every argument rests on is gone.
        for (i, backend) in self.backends.iter().enumerate() {
            // Sentinel groups are the same master when they name the same group; a group's
            // sentinels may be shared with other groups. (One redis-server reached under two
            // names is also refused when it answers: the health monitor compares run ids.)
            let group = |b: &Backend| b.sentinel.as_ref().map(|g| g.name.clone());
            // Clusters are the same master when they share a seed node.
            let seeds = |b: &Backend| b.cluster.clone().unwrap_or_default();
            let same = |other: &Backend| {
                let shared_seed = seeds(other).iter().any(|s| seeds(backend).contains(s));
                if backend.cluster.is_some() || other.cluster.is_some() {
                    return shared_seed;
                }
                group(other) == group(backend)
                    && (backend.sentinel.is_some()
                        || other.host.eq_ignore_ascii_case(&backend.host)
                            && other.port == backend.port)
            };
            if self.backends[..i].iter().any(same) {
                return Err(ConfigError::Invalid(format!(
                    "master {backend} is listed twice: each master must be a different redis-server (a master counted twice would vote twice)"
                )));
            }
        }
        if !(0.0..1.0).contains(&self.drift_factor) || self.drift_factor.is_nan() {
            return invalid("drift factor must be in [0, 1)");
        }
        if self.node_timeout_ms == 0 {
            return invalid("node timeout must be at least 1 ms");
        }
        if self.max_inflight_per_client == 0 || self.maxclients == 0 {
            return invalid("max_inflight_per_client and maxclients must be at least 1");
        }
        if self.max_lock_ttl_ms == 0 {
            return invalid("max_lock_ttl_ms must be at least 1 ms");
        }
        if self.proto_max_bulk_len < 1024 {
            return invalid("proto_max_bulk_len must be at least 1024 bytes");
        }
        if self.max_value_bytes < 1024 {
            return invalid("max_value_bytes must be at least 1024 bytes");
        }
        if self.client_query_buffer_limit < 1024 * 1024 {
            return invalid(
                "client_query_buffer_limit must be at least 1 MB (1048576), as in Redis",
            );
        }
        self.users()?;
        if self.tls_port.is_some() && self.server_tls().is_none() {
            return invalid("tls-port needs tls-cert-file and tls-key-file");
        }
        if self.tls_port.is_some()
            && self.tls_auth_clients != ClientCerts::No
            && self.tls_ca_cert_file.is_none()
        {
            return invalid(
                "tls-auth-clients yes|optional needs tls-ca-cert-file (or set tls-auth-clients no)",
            );
        }
        if self.backends.iter().any(|b| b.tls) && self.backend_tls_ca_cert_file.is_none() {
            return invalid("rediss:// masters need backend-tls-ca-cert-file");
        }
        if self.backend_tls_cert_file.is_some() != self.backend_tls_key_file.is_some() {
            return invalid("backend-tls-cert-file and backend-tls-key-file go together");
        }
        if let Some(addr) = &self.metrics {
            if addr
                .rsplit_once(':')
                .is_none_or(|(_, port)| port.parse::<u16>().is_err())
            {
                return invalid("metrics must be ADDR:PORT, e.g. 127.0.0.1:9379");
            }
        }
        if tracing_subscriber::EnvFilter::try_new(&self.log_level).is_err() {
            return invalid(
                "log_level is not a log filter (e.g. info, debug, redlock_proxy=trace)",
            );
        }
        Ok(())
    }

    /// What is valid but likely not meant, for the start-up log and `--check-config`: an even
    /// number of masters, which tolerates no more failures than one master fewer (the quorum
    /// grows with the even one) and only adds a server to every decision.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        // `--local N` replaces the backends listed.
        let n = self.local.unwrap_or(self.backends.len());
        if n >= 2 && n.is_multiple_of(2) {
            let quorum = n / 2 + 1;
            let tolerated = n - quorum;
            warnings.push(format!(
                "{n} masters (quorum {quorum}) tolerate {tolerated} failure{}, as {} would: an even number of masters adds no fault tolerance over {}; use an odd number",
                if tolerated == 1 { "" } else { "s" },
                n - 1,
                n - 1,
            ));
        }
        warnings
    }

    /// The users: `requirepass` is the default user's password, and a `[[users]]` entry named
    /// `default` replaces the default user (to disable it, or limit its keys).
    pub fn users(&self) -> Result<Users, ConfigError> {
        Users::new(self.requirepass.as_ref(), &self.users)
            .map_err(|invalid| ConfigError::Invalid(invalid.to_string()))
    }

    /// Reads the masters' TLS files now, so that unusable ones stop the proxy from starting
    /// rather than leave its `rediss://` masters down.
    pub fn check_files(&self) -> Result<(), ConfigError> {
        if self.backends.iter().any(|b| b.tls) {
            crate::tls::master_client_config(&self.master_tls())
                .map_err(|err| ConfigError::Invalid(err.to_string()))?;
        }
        Ok(())
    }

    /// The TLS listener's files, when `tls_port` and both files are set.
    pub fn server_tls(&self) -> Option<ServerTlsFiles> {
        self.tls_port?;
        Some(ServerTlsFiles {
            cert: self.tls_cert_file.clone()?,
            key: self.tls_key_file.clone()?,
            ca: self.tls_ca_cert_file.clone(),
            client_certs: self.tls_auth_clients,
        })
    }

    /// The TLS files for `rediss://` masters.
    pub fn master_tls(&self) -> MasterTlsFiles {
        MasterTlsFiles {
            ca: self.backend_tls_ca_cert_file.clone(),
            cert: self.backend_tls_cert_file.clone(),
            key: self.backend_tls_key_file.clone(),
        }
    }

    /// Whether the plain (non-TLS) listener is on: always, unless `port` is 0 with `tls_port`
    /// set (TLS only, as Redis).
    pub fn plain_listener(&self) -> bool {
        self.port != 0 || self.tls_port.is_none()
    }

    pub fn node_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.node_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_configs_parse_and_validate() {
        for name in ["local.toml", "five-masters.toml", "secure.toml"] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("configs")
                .join(name);
            let config = Config::from_file(&path).unwrap();
            config.validate().unwrap();
        }
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = toml::from_str::<Config>("bakends = []").unwrap_err();
        assert!(err.to_string().contains("bakends"), "{err}");
    }

    #[test]
    fn bad_values_are_refused() {
        let mut config = Config {
            backends: vec![Backend::plain("127.0.0.1", 1)],
            ..Config::default()
        };
        config.validate().unwrap();
        config.drift_factor = 2.0;
        assert!(config.validate().is_err());
        config.drift_factor = 0.01;
        config.backends.clear();
        assert!(config.validate().is_err());
    }

    #[test]
    fn a_master_listed_twice_is_refused() {
        let backends = |list: &[&str]| list.iter().map(|b| b.parse().unwrap()).collect();
        let mut config = Config {
            backends: backends(&["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]),
            ..Config::default()
        };
        config.validate().unwrap();
        // The same address with another scheme spelling, credentials or host case.
        for list in [
            ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:1"],
            ["redis://:pw@127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:1"],
            ["LOCALHOST:7", "127.0.0.1:2", "localhost:7"],
        ] {
            config.backends = backends(&list);
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains("is listed twice"), "{list:?}: {err}");
        }
    }
}
