//! The listener: accepts clients (up to `maxclients`), serves each on its own task, and shuts
//! down gracefully (stop accepting, let every connection finish what it has in flight, bounded).
//! Beside it run the operations endpoint and the reload task ([`crate::ops`]).

use crate::config::Config;
use crate::connection;
use crate::error::ProxyError;
use crate::ops::{self, reload::Reload};
use crate::shared::Shared;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;

/// How long shutdown waits for connections to finish their in-flight requests.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// Serves clients on `listener` with the masters in `config.backends` until `shutdown`
/// completes, then drains connections and returns. The metrics endpoint, if configured and
/// it cannot listen, is only logged: [`run_with`] refuses to start instead.
pub async fn run(config: Config, listener: TcpListener, shutdown: impl Future) {
    if let Err(err) = run_with(config, listener, shutdown, None).await {
        tracing::error!(error = %err, "metrics endpoint cannot listen");
    }
}

/// [`run`], reloading the configuration on `reload`'s requests; fails at once if the
/// metrics endpoint cannot listen.
pub async fn run_with(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future,
    reload: Option<Reload>,
) -> std::io::Result<()> {
    let metrics = config.metrics.clone();
    let shared = Shared::start(config, crate::commands::COMMANDS.len());
    let limit = shared.client_slots.clone();
    let (stop_tx, stop_rx) = watch::channel(false);
    if let Some(addr) = metrics {
        if let Err(err) = ops::http::start(&addr, shared.clone(), stop_rx.clone()).await {
            shared.masters.stop();
            return Err(std::io::Error::new(err.kind(), format!("{addr}: {err}")));
        }
    }
    if let Some(reload) = reload {
        ops::reload::spawn(shared.clone(), reload, stop_rx.clone());
    }
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    shared.stats.connections_received.inc();
                    let permit = limit.clone().try_acquire_owned();
                    if permit.is_err() {
                        shared.stats.rejected_connections.inc();
                    }
                    let shared = shared.clone();
                    let stop = stop_rx.clone();
                    tokio::spawn(async move {
                        match permit {
                            Ok(_permit) => connection::serve(stream, shared, stop).await,
                            Err(_) => connection::refuse(stream, ProxyError::MaxClients).await,
                        }
                    });
                }
                Err(err) => {
                    // EMFILE and friends: keep serving the clients we have (Redis CVE-2025-48367
                    // was an accept-error loop), retry shortly.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    stop_tx.send_replace(true);
    let deadline = Instant::now() + DRAIN_LIMIT;
    while shared.clients.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shared.masters.stop();
    Ok(())
}
