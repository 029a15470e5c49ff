//! A TCP fault relay between the proxy and one master: forwards both directions, and on demand
//! delays every chunk, blackholes traffic (accepts and reads, forwards nothing), or resets
//! every connection. Settings apply to live connections at once. The relay counts what its
//! faults cut (chunks discarded, connections dropped), so a fault can be shown to have acted.

use redlock_proxy::LocalCluster;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    Pass = 0,
    Blackhole = 1,
    Reset = 2,
}

#[derive(Default)]
struct State {
    delay_ms: AtomicU64,
    mode: AtomicU8,
    closed: AtomicBool,
    /// Chunks discarded by a blackhole, connections dropped by a reset.
    cut: AtomicU64,
    /// Connections relayed now.
    live: AtomicU64,
    /// Chunks forwarded so far: the relay is in the path.
    forwarded: AtomicU64,
    /// Counts resets: each one closes every live connection at once. A connection waits for
    /// no byte to be reset: the proxy sends nothing to a master it finds unresponsive (slow is
    /// not dead, issue 38), so a connection that lost bytes in a blackhole would otherwise live
    /// on, desynchronised, until the proxy's liveness window.
    resets: tokio::sync::watch::Sender<u64>,
}

/// A running relay; dropped = stops accepting.
pub struct Relay {
    pub port: u16,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    pub async fn start(upstream_port: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State::default());
        let st = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let st = st.clone();
                tokio::spawn(async move {
                    if Mode::Reset as u8 == st.mode.load(Ordering::Relaxed) {
                        st.cut.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let mut resets = st.resets.subscribe();
                    let counts = st.clone();
                    counts.live.fetch_add(1, Ordering::Relaxed);
                    tokio::select! {
                        _ = async { tokio::join!(pipe(cr, sw, st.clone()), pipe(sr, cw, st)) } => {}
                        // Dropping both streams closes both sides.
                        _ = resets.changed() => {
                            counts.cut.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    counts.live.fetch_sub(1, Ordering::Relaxed);
                });
            }
        });
        Relay { port, state, task }
    }

    /// One relay in front of each master, in order.
    pub async fn start_each(masters: &LocalCluster) -> Vec<Relay> {
        let mut relays = Vec::new();
        for m in &masters.masters {
            relays.push(Relay::start(m.port).await);
        }
        relays
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn set_delay(&self, delay: Duration) {
        self.state
            .delay_ms
            .store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    /// `Mode::Reset` also closes every live connection at once.
    pub fn set_mode(&self, mode: Mode) {
        self.state.mode.store(mode as u8, Ordering::Relaxed);
        if mode == Mode::Reset {
            self.state.resets.send_modify(|n| *n += 1);
        }
    }

    /// How many chunks a blackhole discarded and connections a reset dropped, so far.
    pub fn cut_count(&self) -> u64 {
        self.state.cut.load(Ordering::Relaxed)
    }

    /// How many connections it relays now.
    pub fn live_connections(&self) -> u64 {
        self.state.live.load(Ordering::Relaxed)
    }

    /// How many chunks it forwarded so far (more than none: it is in the path).
    pub fn forwarded_count(&self) -> u64 {
        self.state.forwarded.load(Ordering::Relaxed)
    }

    /// Ends a blackhole or reset (blocking): the relay's blackhole *discards* bytes, which a
    /// real partition does not (TCP retransmits), and forwarding again on a connection that
    /// lost bytes mid-stream would desynchronise RESP and fabricate replies. So the link ends
    /// its fault like a real long partition: every live connection is closed at once (each may
    /// have lost bytes) and new ones are refused for three node timeouts, then only new
    /// connections pass, without delay.
    pub fn heal_blocking(&self, node_timeout: Duration) {
        self.set_mode(Mode::Reset);
        std::thread::sleep(node_timeout * 3 + Duration::from_millis(20));
        self.set_delay(Duration::ZERO);
        self.set_mode(Mode::Pass);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.state.closed.store(true, Ordering::Relaxed);
        self.task.abort();
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    state: Arc<State>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if state.closed.load(Ordering::Relaxed) {
            return;
        }
        match state.mode.load(Ordering::Relaxed) {
            m if m == Mode::Reset as u8 => {
                state.cut.fetch_add(1, Ordering::Relaxed);
                return;
            }
            m if m == Mode::Blackhole as u8 => {
                state.cut.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            _ => {}
        }
        let delay = state.delay_ms.load(Ordering::Relaxed);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        state.forwarded.fetch_add(1, Ordering::Relaxed);
    }
}
