//! The listeners: accept clients (up to `maxclients`, plain and TLS together), serve each on
//! its own task, and shut down gracefully (stop accepting, let every connection finish what it
//! has in flight, bounded).
//!
//! A TLS client holds its `maxclients` place from its handshake on; a handshake that does not
//! finish within [`TLS_HANDSHAKE_LIMIT`] is dropped, so silent connections cannot pile up.
//!
//! With `threads` N > 1 the proxy runs N shards ([`crate::shared::Shard`]): this runtime and
//! N − 1 threads with a single-threaded runtime each ([`ShardThreads`]). Clients are handed to
//! the shards in turn as they are accepted, and each is served to the end on its shard's thread,
//! with that shard's own connections to the masters.
//!
//! Beside them run the operations endpoint and the reload task ([`crate::ops`]).

use crate::client_stream::ClientStream;
use crate::config::Config;
use crate::connection;
use crate::error::ProxyError;
use crate::ops::{self, reload::Reload};
use crate::shared::Shared;
use crate::tls::{TlsAcceptorHandle, TlsError};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio::time::Instant;

/// How long shutdown waits for connections to finish their in-flight requests.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);
/// How long a TLS client may take to complete its handshake.
pub const TLS_HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

/// Where clients connect: a plain listener, a TLS listener, or both.
#[derive(Debug, Default)]
pub struct Listeners {
    pub plain: Option<TcpListener>,
    pub tls: Option<(TcpListener, TlsAcceptorHandle)>,
}

/// Why the listeners could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: io::Error },
    #[error(transparent)]
    Tls(#[from] TlsError),
}

impl Listeners {
    /// Opens what `config` asks for: the plain listener on `port` (unless `port` is 0 with
    /// `tls_port` set: TLS only, as Redis) and the TLS listener on `tls_port`, its certificate
    /// read now.
    pub async fn bind(config: &Config) -> Result<Listeners, ListenError> {
        let open = |port: u16| async move {
            TcpListener::bind((config.bind.as_str(), port))
                .await
                .map_err(|source| ListenError::Bind {
                    addr: format!("{}:{port}", config.bind),
                    source,
                })
        };
        let plain = match config.plain_listener() {
            true => Some(open(config.port).await?),
            false => None,
        };
        let tls = match (config.tls_port, config.server_tls()) {
            (Some(port), Some(files)) => {
                let acceptor = TlsAcceptorHandle::load(files)?;
                Some((open(port).await?, acceptor))
            }
            _ => None,
        };
        Ok(Listeners { plain, tls })
    }

    /// The plain listener's address.
    pub fn plain_addr(&self) -> Option<SocketAddr> {
        self.plain.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The TLS listener's address.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// The handle that reloads the TLS certificate (SIGHUP), when TLS is on.
    pub fn tls_acceptor(&self) -> Option<TlsAcceptorHandle> {
        self.tls.as_ref().map(|(_, acceptor)| acceptor.clone())
    }
}

impl From<TcpListener> for Listeners {
    fn from(plain: TcpListener) -> Listeners {
        Listeners {
            plain: Some(plain),
            tls: None,
        }
    }
}

/// The next connection on `listener`; never resolves without one.
async fn accept(listener: Option<&TcpListener>) -> io::Result<TcpStream> {
    match listener {
        Some(listener) => listener.accept().await.map(|(stream, _)| stream),
        None => std::future::pending().await,
    }
}

/// Serves one accepted client, or refuses it past `maxclients`.
async fn serve_or_refuse(
    stream: impl ClientStream + tokio::io::AsyncWrite + Unpin,
    permit: Option<OwnedSemaphorePermit>,
    shared: Arc<Shared>,
    shard: usize,
    stop: watch::Receiver<bool>,
) {
    match permit {
        Some(_permit) => connection::serve(stream, shared, shard, stop).await,
        None => connection::refuse(stream, ProxyError::MaxClients).await,
    }
}

/// What serving an accepted client needs, on the way to its shard with its socket.
struct Accepted {
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    permit: Option<OwnedSemaphorePermit>,
    shared: Arc<Shared>,
    shard: usize,
    stop: watch::Receiver<bool>,
}

impl Accepted {
    /// The TLS handshake (bounded by [`TLS_HANDSHAKE_LIMIT`]) if any, then the client.
    async fn serve(self, stream: TcpStream) {
        let Accepted {
            acceptor,
            permit,
            shared,
            shard,
            stop,
        } = self;
        let Some(acceptor) = acceptor else {
            return serve_or_refuse(stream, permit, shared, shard, stop).await;
        };
        // Boxed: a connection's task is as large as its largest state, and the TLS one (the
        // handshake, then a TLS session) is several KiB larger than a plain session, which
        // every plain connection would otherwise carry.
        Box::pin(async move {
            match tokio::time::timeout(TLS_HANDSHAKE_LIMIT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => serve_or_refuse(stream, permit, shared, shard, stop).await,
                Ok(Err(err)) => tracing::debug!(error = %err, "TLS handshake failed"),
                Err(_) => tracing::debug!("TLS handshake timed out"),
            }
        })
        .await
    }

    /// Serves `stream` on this runtime (shard 0), or hands it to its shard's runtime: a socket
    /// is bound to the runtime that registered it, so it crosses as a std socket.
    fn dispatch(self, stream: TcpStream, shards: &ShardThreads) {
        let Some(runtime) = self
            .shard
            .checked_sub(1)
            .and_then(|i| shards.handles.get(i))
        else {
            tokio::spawn(self.serve(stream));
            return;
        };
        let Ok(std_stream) = stream.into_std() else {
            return;
        };
        runtime.spawn(async move {
            if let Ok(stream) = TcpStream::from_std(std_stream) {
                self.serve(stream).await;
            }
        });
    }
}

/// The threads of shards 1 to N − 1, each running a single-threaded runtime until dropped.
struct ShardThreads {
    handles: Vec<Handle>,
    /// Set (or dropped) to end every shard thread.
    stop: watch::Sender<bool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl ShardThreads {
    /// Starts `n` threads (none for `n` = 0).
    fn start(n: usize) -> io::Result<ShardThreads> {
        let mut shards = ShardThreads {
            handles: Vec::with_capacity(n),
            stop: watch::Sender::new(false),
            threads: Vec::with_capacity(n),
        };
        for i in 1..=n {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let mut stopped = shards.stop.subscribe();
            shards.handles.push(runtime.handle().clone());
            let thread = std::thread::Builder::new()
                .name(format!("redlock-proxy-shard-{i}"))
                .spawn(move || {
                    // Runs the shard's tasks until told to stop (or the sender is gone).
                    runtime.block_on(async move {
                        let _ = stopped.wait_for(|stop| *stop).await;
                    });
                })?;
            shards.threads.push(thread);
        }
        Ok(shards)
    }
}

impl Drop for ShardThreads {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Serves clients on `listeners` with the masters in `config.backends` until `shutdown`
/// completes, then drains connections and returns. The metrics endpoint, if configured and
/// it cannot listen, is only logged: [`run_with`] refuses to start instead.
pub async fn run(config: Config, listeners: impl Into<Listeners>, shutdown: impl Future) {
    if let Err(err) = run_with(config, listeners, shutdown, None).await {
        tracing::error!(error = %err, "metrics endpoint cannot listen");
    }
}

/// [`run`], reloading the configuration on `reload`'s requests; fails at once if the
/// metrics endpoint cannot listen.
pub async fn run_with(
    config: Config,
    listeners: impl Into<Listeners>,
    shutdown: impl Future,
    reload: Option<Reload>,
) -> std::io::Result<()> {
    let Listeners { plain, tls } = listeners.into();
    let metrics = config.metrics.clone();
    let shard_threads = ShardThreads::start(config.threads.saturating_sub(1))?;
    let shared = Shared::start(
        config,
        crate::commands::COMMANDS.len(),
        &shard_threads.handles,
    );
    let mut next_shard = 0;
    let limit = shared.client_slots.clone();
    let (stop_tx, stop_rx) = watch::channel(false);
    if let Some(addr) = metrics {
        if let Err(err) = ops::http::start(&addr, shared.clone(), stop_rx.clone()).await {
            shared.stop_masters();
            return Err(std::io::Error::new(err.kind(), format!("{addr}: {err}")));
        }
    }
    if let Some(reload) = reload {
        ops::reload::spawn(shared.clone(), reload, stop_rx.clone());
    }
    tokio::pin!(shutdown);
    loop {
        let (accepted, over_tls) = tokio::select! {
            accepted = accept(plain.as_ref()) => (accepted, false),
            accepted = accept(tls.as_ref().map(|(l, _)| l)) => (accepted, true),
            _ = &mut shutdown => break,
        };
        match accepted {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                shared.stats.connections_received.inc();
                let permit = limit.clone().try_acquire_owned().ok();
                if permit.is_none() {
                    shared.stats.rejected_connections.inc();
                }
                let acceptor = match (&tls, over_tls) {
                    (Some((_, handle)), true) => Some(handle.acceptor()),
                    _ => None,
                };
                let accepted = Accepted {
                    acceptor,
                    permit,
                    shared: shared.clone(),
                    shard: next_shard,
                    stop: stop_rx.clone(),
                };
                next_shard = (next_shard + 1) % shared.shards.len();
                accepted.dispatch(stream, &shard_threads);
            }
            Err(err) => {
                // EMFILE and friends: keep serving the clients we have (Redis CVE-2025-48367
                // was an accept-error loop), retry shortly.
                tracing::warn!(error = %err, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    drop((plain, tls));
    // Connections read `stop` on every turn of their loop; those waiting are woken through
    // the registry (a connection not registered yet reads `stop` before it first waits).
    stop_tx.send_replace(true);
    shared.registry.stop_all();
    let deadline = Instant::now() + DRAIN_LIMIT;
    while shared.clients.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shared.stop_masters();
    Ok(())
}
