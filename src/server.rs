//! The listener: accepts clients (up to `maxclients`), serves each on its own task, and shuts
//! down gracefully (stop accepting, let every connection finish what it has in flight, bounded).

use crate::config::Config;
use crate::connection;
use crate::error::ProxyError;
use crate::shared::Shared;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;

/// How long shutdown waits for connections to finish their in-flight requests.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// Serves clients on `listener` with the masters in `config.backends` until `shutdown`
/// completes, then drains connections and returns.
pub async fn run(config: Config, listener: TcpListener, shutdown: impl Future) {
    let limit = Arc::new(Semaphore::new(config.maxclients));
    let shared = Shared::start(config);
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let permit = limit.clone().try_acquire_owned();
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
}
