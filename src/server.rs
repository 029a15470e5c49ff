//! The listener: accepts clients (up to `maxclients`), serves each on its own task, and shuts
//! down gracefully (stop accepting, let every connection finish what it has in flight, bounded).

use crate::cluster::Cluster;
use crate::config::Config;
use crate::connection;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;

/// How long shutdown waits for connections to finish their in-flight requests.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// State shared by every connection.
pub struct Shared {
    pub cluster: Arc<Cluster>,
    pub config: Config,
    pub started: Instant,
    pub clients: AtomicUsize,
    /// Per-key single flight of acquires.
    pub acquires: Arc<crate::commands::lock::Flights>,
    next_client_id: AtomicU64,
}

impl Shared {
    pub fn next_client_id(&self) -> u64 {
        self.next_client_id.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// Serves clients on `listener` with the masters in `config.backends` until `shutdown`
/// completes, then drains connections and returns.
pub async fn run(config: Config, listener: TcpListener, shutdown: impl Future) {
    let cluster = Cluster::start(&config);
    let limit = Arc::new(Semaphore::new(config.maxclients));
    let shared = Arc::new(Shared {
        cluster: cluster.clone(),
        config,
        started: Instant::now(),
        clients: AtomicUsize::new(0),
        acquires: Arc::default(),
        next_client_id: AtomicU64::new(0),
    });
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
                            Err(_) => connection::refuse(stream, "ERR max number of clients reached").await,
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
    cluster.stop();
}
