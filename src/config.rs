//! Configuration: the defaults of docs/PROTOCOL.md §2, a TOML file, and flags on top.

use serde::Deserialize;
use std::path::Path;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Everything the proxy needs to run.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Listen address.
    pub bind: String,
    /// Listen port (`0` = any free port).
    pub port: u16,
    /// Independent Redis masters, `host:port`.
    pub backends: Vec<String>,
    /// Start this many local `redis-server` masters and use them as the backends.
    pub local: Option<usize>,
    /// How long one master may take to answer one request before its vote counts as "no".
    pub node_timeout_ms: u64,
    /// Clock drift allowance: `drift = TTL × F + 2 ms`.
    pub drift_factor: f64,
    pub log_format: LogFormat,
    /// Longest bulk string a client may send (Redis' `proto-max-bulk-len`).
    pub proto_max_bulk_len: u64,
    /// Requests one client may have in flight before the proxy stops reading its socket.
    pub max_inflight_per_client: usize,
    /// Most client connections at once (Redis' `maxclients`).
    pub maxclients: usize,
    /// Serve `SETNX` and `SET … NX` without expiry as plain fanned-out writes instead of
    /// refusing them. Off by default: such a lock can never be made safe.
    pub allow_locks_without_expiry: bool,
    /// How often each master's health (`INFO`) is checked.
    pub health_interval_ms: u64,
    /// Quarantine masters that restarted or lost data until every lease they may have held
    /// has expired. Only tests switch this off (the negative control of the safety suite).
    pub quarantine: bool,
    /// Propose fencing tokens from the masters' clocks, which keeps them increasing when a
    /// master loses its counters. Only tests switch this off (the negative control).
    pub token_clock: bool,
    /// Largest TTL the proxy forwards, whatever sets it (`SET … PX`, `PEXPIRE`, lease
    /// scripts; scripts that compute a TTL are capped on the masters). A master that lost its
    /// data is quarantined for this long plus drift, so every proxy in front of the same
    /// masters must use the same value (the default does).
    pub max_lock_ttl_ms: u64,
    /// Runtime worker threads (1 = everything on one thread).
    pub threads: usize,
    /// Reply bytes waiting for a client that does not read before it is disconnected, like
    /// Redis' `client-output-buffer-limit normal` hard limit (0 = no limit).
    pub client_output_buffer_limit: u64,
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

/// A password or other secret: shown as `<redacted>` by `Debug`, so it never reaches a log.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(secret: String) -> Secret {
        Secret(secret)
    }

    /// The secret itself, for the one place that checks it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// One `[[users]]` table: a Redis ACL user reduced to what a lock service needs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    pub name: String,
    /// A disabled user cannot authenticate (Redis `off`).
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// The password in clear (Redis `>password`).
    #[serde(default)]
    pub password: Option<Secret>,
    /// Passwords as SHA-256 hex digests (Redis `#hash`), e.g. from `echo -n pw | sha256sum`.
    #[serde(default)]
    pub password_sha256: Vec<String>,
    /// Key patterns, Redis ACL glob syntax with or without the `~` (`"app:*"`, `"~jobs:?"`);
    /// `"*"` is every key. None: no key at all. A user with neither password is `nopass`.
    #[serde(default)]
    pub keys: Vec<String>,
}

fn enabled() -> bool {
    true
}

impl Default for Config {
    fn default() -> Self {
        Config {
            bind: "127.0.0.1".into(),
            port: 7379,
            backends: Vec::new(),
            local: None,
            node_timeout_ms: 50,
            drift_factor: 0.01,
            log_format: LogFormat::Text,
            proto_max_bulk_len: crate::protocol::request::DEFAULT_MAX_BULK_LEN,
            max_inflight_per_client: 1024,
            maxclients: 10_000,
            allow_locks_without_expiry: false,
            health_interval_ms: 100,
            quarantine: true,
            token_clock: true,
            max_lock_ttl_ms: 60_000,
            threads: 1,
            client_output_buffer_limit: 64 * 1024 * 1024,
            client_query_buffer_limit: 1024 * 1024 * 1024,
            timeout: 0,
            requirepass: None,
            users: Vec::new(),
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
        if self.client_query_buffer_limit < 1024 * 1024 {
            return invalid(
                "client_query_buffer_limit must be at least 1 MB (1048576), as in Redis",
            );
        }
        crate::auth::Users::from_config(self)?;
        Ok(())
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
        for name in ["local.toml", "five-masters.toml"] {
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
            backends: vec!["127.0.0.1:1".into()],
            ..Config::default()
        };
        config.validate().unwrap();
        config.drift_factor = 2.0;
        assert!(config.validate().is_err());
        config.drift_factor = 0.01;
        config.backends.clear();
        assert!(config.validate().is_err());
    }
}
