//! Live reload: a re-read configuration applied to a running proxy (the binary does it on
//! SIGHUP).
//!
//! - What is safe to change live is applied: the per-connection limits
//!   (`max_inflight_per_client`, `proto_max_bulk_len`, `client_output_buffer_limit`, read by
//!   each new connection), `maxclients` (the permits of new connections), the health poll
//!   interval, the node timeout (from each request sent after it), the users (`requirepass`, `[[users]]`: each connection follows its user's new
//!   definition at its next command, and ends if its user was removed or disabled), the idle
//!   `timeout` and `client_query_buffer_limit` (new connections), and whatever the registered
//!   [`ReloadHook`]s re-read (the binary registers the log level and the TLS certificate
//!   files).
//! - A change of what only a restart may change (the masters, the drift factor, the lock TTL
//!   bound whose quarantine every proxy must share, the listeners, …) refuses the whole
//!   reload: nothing changes, and the log names the keys and says a restart is needed.
//! - A file that does not parse or validate changes nothing; the log says why (the TOML
//!   error names the line).
//!
//! Other parts hook in with [`Reloader::on_reload`]: the hook gets the new configuration after
//! the checks passed and before the live settings are swapped; an error from any hook is
//! logged and the rest of the reload still applies (each hook owns its own part).

use crate::config::{Config, ConfigError};
use crate::shared::Shared;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Re-reads what one part owns from a new configuration.
pub type ReloadHook = Box<dyn Fn(&Config) -> Result<(), String> + Send + Sync>;

/// The hooks run on every reload, in registration order.
#[derive(Default)]
pub struct Reloader {
    hooks: Mutex<Vec<(&'static str, ReloadHook)>>,
}

impl Reloader {
    /// Registers `hook` for the part named `what` (used in the log).
    pub fn on_reload(&self, what: &'static str, hook: ReloadHook) {
        if let Ok(mut hooks) = self.hooks.lock() {
            hooks.push((what, hook));
        }
    }

    fn run_hooks(&self, config: &Config) {
        let Ok(hooks) = self.hooks.lock() else { return };
        for (what, hook) in hooks.iter() {
            if let Err(err) = hook(config) {
                let err = one_line(&err);
                tracing::error!(part = what, "reload: {what} not changed: {err}");
            }
        }
    }
}

/// Where reloads come from: `requests` asks, `read` produces the new configuration (the file
/// with the command line's flags on top, validated).
pub struct Reload {
    pub read: Box<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>,
    pub requests: mpsc::Receiver<()>,
    pub hooks: Arc<Reloader>,
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("changing {0} needs a restart")]
    NeedsRestart(String),
}

/// The keys whose values differ between two configurations, by what may change them.
#[derive(Debug, Default, PartialEq)]
struct Changes {
    /// Keys only a restart may change.
    restart: Vec<&'static str>,
    /// Keys a reload changes live.
    live: Vec<&'static str>,
}

/// Classifies every field of [`Config`] as restart-only or live, and names those whose values
/// differ between `$old` and `$new` (the config keys are the field names). The pattern has no
/// `..`: a field added to `Config` and left out of both lists does not compile (rustc, the
/// pattern being built by a macro, says "pattern requires `..` due to inaccessible fields"),
/// nor does one in both lists (bound twice).
macro_rules! changes {
    ($old:expr, $new:expr; restart: $($restart:ident),+; live: $($live:ident),+ $(,)?) => {{
        let Config { $($restart,)+ $($live,)+ } = $new;
        let mut changes = Changes::default();
        $(
            if $old.$restart != *$restart {
                changes.restart.push(stringify!($restart));
            }
        )+
        $(
            if $old.$live != *$live {
                changes.live.push(stringify!($live));
            }
        )+
        changes
    }};
}

/// What differs between `old` and `new`.
fn changes(old: &Config, new: &Config) -> Changes {
    let mut changes = changes!(old, new;
        // The TLS listener and the masters' TLS: the files are re-read from the paths the
        // proxy started with (the certificate hook); other paths, or another mode, need a
        // restart.
        restart: backends, local, drift_factor, max_lock_ttl_ms, wait_replicas, quarantine,
        token_clock, witness_floor, clock_per_call, bind, port, threads, log_format, metrics, tls_port,
        tls_cert_file, tls_key_file, tls_ca_cert_file, tls_auth_clients,
        backend_tls_ca_cert_file, backend_tls_cert_file, backend_tls_key_file,
        allow_locks_without_expiry, allow_debug_command, no_quorum_reply;
        live: maxclients, max_inflight_per_client, proto_max_bulk_len, max_value_bytes,
        client_output_buffer_limit, log_level, node_timeout_ms, timeout,
        client_query_buffer_limit, requirepass, users, health_interval_ms,
    );
    // With `local`, `backends` are the addresses of the masters the proxy started itself.
    if new.local.is_some() {
        changes.restart.retain(|key| *key != "backends");
    }
    changes
}

/// Applies `new` to the running proxy; returns the live keys it changed.
pub fn apply(
    shared: &Shared,
    hooks: &Reloader,
    new: Result<Config, ConfigError>,
) -> Result<Vec<&'static str>, ReloadError> {
    let new = new?;
    // What only a restart changes is compared with the configuration the proxy started with,
    // the rest with the settings as last reloaded.
    let restart = changes(&shared.config, &new).restart;
    if !restart.is_empty() {
        return Err(ReloadError::NeedsRestart(restart.join(", ")));
    }
    let old = shared.live_config();
    let changed = changes(&old, &new).live;
    // `new` was validated, users included; a table that still fails leaves the old one.
    if old.requirepass != new.requirepass || old.users != new.users {
        match new.users() {
            Ok(users) => shared.replace_users(users),
            Err(err) => tracing::error!("reload: users not changed: {}", one_line(&err)),
        }
    }
    hooks.run_hooks(&new);
    resize_client_slots(shared, old.maxclients, new.maxclients);
    let interval = Duration::from_millis(new.health_interval_ms);
    shared.masters().health_interval().set(interval);
    // Safe live: the validity of a grant counts the time its fan-out actually took, whatever
    // the timeout; requests already waiting keep the timeout they started with.
    shared.masters().live_node_timeout().set(new.node_timeout());
    shared.set_live_config(new);
    Ok(changed)
}

/// Gives `maxclients` its new number of permits; connections above a lower limit are kept,
/// and their permits are retired as they end.
fn resize_client_slots(shared: &Shared, old: usize, new: usize) {
    let slots = &shared.client_slots;
    if new > old {
        slots.add_permits(new - old);
    } else if new < old {
        let retire = old - new;
        let rest = retire - slots.forget_permits(retire);
        if rest > 0 {
            let slots = slots.clone();
            tokio::spawn(async move {
                if let Ok(permits) = slots.acquire_many_owned(rest as u32).await {
                    permits.forget();
                }
            });
        }
    }
}

/// Applies a reload on every request until `stop` becomes true.
pub fn spawn(shared: Arc<Shared>, mut reload: Reload, mut stop: watch::Receiver<bool>) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                asked = reload.requests.recv() => {
                    if asked.is_none() {
                        return;
                    }
                }
                // Only `true` is ever sent: any change is the stop.
                _ = stop.changed() => return,
            }
            match apply(&shared, &reload.hooks, (reload.read)()) {
                Ok(changed) if changed.is_empty() => {
                    tracing::info!("configuration reloaded: nothing changed")
                }
                Ok(changed) => tracing::info!(
                    changed = %changed.join(","),
                    "configuration reloaded: {} changed",
                    changed.join(", ")
                ),
                Err(err) => tracing::error!(
                    "configuration not reloaded, nothing changed: {}",
                    one_line(&err)
                ),
            }
        }
    });
}

/// An error in one log line, its runs of blanks and line breaks as one space: a TOML parse
/// error spans several lines (the line it quotes, a caret under the column), which would
/// split the log line it is in.
fn one_line(err: &impl std::fmt::Display) -> String {
    let text = err.to_string();
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_multi_line_error_is_logged_on_one_line() {
        let toml = "invalid config file c.toml: TOML parse error at line 2, column 19\n  |\n2 | maxclients = \"many\n  |                   ^\ninvalid basic string\n";
        assert_eq!(
            one_line(&toml),
            "invalid config file c.toml: TOML parse error at line 2, column 19 | 2 | maxclients = \"many | ^ invalid basic string"
        );
    }

    use super::*;

    #[test]
    fn restart_only_keys_are_named_and_live_keys_are_not() {
        let old = Config {
            backends: (1..=3)
                .map(|port| crate::backend::Backend::plain("127.0.0.1", port))
                .collect(),
            ..Config::default()
        };
        let mut new = old.clone();
        new.maxclients = 5;
        new.log_level = "debug".into();
        new.health_interval_ms = 250;
        assert_eq!(
            changes(&old, &new),
            Changes {
                restart: vec![],
                live: vec!["maxclients", "log_level", "health_interval_ms"],
            }
        );
        new.backends.pop();
        new.drift_factor = 0.02;
        assert_eq!(
            changes(&old, &new).restart,
            vec!["backends", "drift_factor"]
        );
        // With `local`, the backends are the proxy's own masters: not compared.
        new.local = Some(3);
        assert_eq!(changes(&old, &new).restart, vec!["local", "drift_factor"]);
    }
}
