//! One multiplexed, pipelined connection per master.
//!
//! Invariants:
//! - Replies are matched to requests strictly in FIFO order on one TCP connection. Requests
//!   are queued in the in-flight list *before* their bytes are written, so the reader always
//!   finds the request a reply belongs to.
//! - A connection on which any request waited longer than the node timeout is **retired**: it
//!   takes no new request (a late reply must never be matched to a later request). A fresh
//!   connection replaces it (reconnect with backoff). The retired connection keeps reading for
//!   a grace period so that late replies can still run their late hooks (the clean-up of a
//!   value that was set after its acquire had been refused), then it is closed.
//! - Writes are batched: the writer drains everything queued since its last write into one
//!   buffer and writes it with one call (one syscall per burst across all clients).
//! - A caller never waits longer than the node timeout for one reply; a missing reply is a
//!   "no" vote ([`Vote::Missing`]), never an error that stops the fan-out.

use crate::protocol::Reply;
use crate::redlock::Vote;
use bytes::{Bytes, BytesMut};
use redis_protocol::resp2::{decode::decode_bytes_mut, types::BytesFrame};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::time::{sleep, sleep_until, timeout, Instant};

/// How long a retired connection keeps reading late replies before it is closed.
const RETIRED_GRACE: Duration = Duration::from_secs(10);
/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Largest batch the writer gathers before writing.
const WRITE_BATCH: usize = 256 * 1024;

/// Runs when a reply arrives after its caller stopped waiting (timed out or decided early).
pub type LateHook = Box<dyn FnOnce(Reply) + Send>;

/// Counters shown by `INFO`.
#[derive(Debug, Default)]
pub struct MasterStats {
    pub replies: AtomicU64,
    pub missing: AtomicU64,
    pub connects: AtomicU64,
    pub retired: AtomicU64,
}

/// One independent Redis master and its current connection.
pub struct Master {
    pub addr: String,
    node_timeout: Duration,
    link: Mutex<Option<Arc<Link>>>,
    pub stats: MasterStats,
    connected: AtomicBool,
}

impl std::fmt::Debug for Master {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Master").field("addr", &self.addr).finish()
    }
}

struct Outgoing {
    payload: Bytes,
    reply: oneshot::Sender<Reply>,
    late: Option<LateHook>,
}

struct InFlight {
    reply: oneshot::Sender<Reply>,
    late: Option<LateHook>,
    sent_at: Instant,
}

/// One TCP connection to a master: a writer task, a reader task, and the FIFO between them.
struct Link {
    queue: mpsc::UnboundedSender<Outgoing>,
    retired: watch::Sender<bool>,
}

impl Link {
    fn retire(&self) {
        self.retired.send_replace(true);
    }
}

impl Master {
    /// A master at `addr`; call [`Master::spawn`] to start connecting.
    pub fn new(addr: String, node_timeout: Duration) -> Arc<Master> {
        Arc::new(Master {
            addr,
            node_timeout,
            link: Mutex::new(None),
            stats: MasterStats::default(),
            connected: AtomicBool::new(false),
        })
    }

    /// Whether a usable connection exists right now.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Starts the task that keeps one connection open, until `stop` becomes true.
    pub fn spawn(self: &Arc<Self>, stop: watch::Receiver<bool>) {
        tokio::spawn(supervise(self.clone(), stop));
    }

    /// Queues `payload` (one or more encoded commands giving one reply) on the current
    /// connection. `None` when there is no connection: the vote is missing at once.
    fn send(&self, payload: Bytes, late: Option<LateHook>) -> Option<oneshot::Receiver<Reply>> {
        let link = self.link.lock().ok()?.clone()?;
        let (tx, rx) = oneshot::channel();
        link.queue
            .send(Outgoing {
                payload,
                reply: tx,
                late,
            })
            .ok()?;
        Some(rx)
    }

    /// Sends one request and waits at most the node timeout for its reply.
    pub async fn call(&self, payload: Bytes, late: Option<LateHook>) -> Vote {
        let vote = match self.send(payload, late) {
            None => Vote::Missing,
            Some(rx) => match timeout(self.node_timeout, rx).await {
                Ok(Ok(reply)) => Vote::Replied(reply),
                _ => Vote::Missing,
            },
        };
        let counter = match vote {
            Vote::Replied(_) => &self.stats.replies,
            _ => &self.stats.missing,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        vote
    }

    fn install(&self, link: Option<Arc<Link>>) {
        self.connected.store(link.is_some(), Ordering::Relaxed);
        if let Ok(mut slot) = self.link.lock() {
            *slot = link;
        }
    }
}

/// Keeps one live connection to the master, replacing it whenever it is retired or fails.
async fn supervise(master: Arc<Master>, mut stop: watch::Receiver<bool>) {
    let mut backoff = BACKOFF_MIN;
    let mut warned = false;
    while !*stop.borrow() {
        let attempt = timeout(CONNECT_TIMEOUT, TcpStream::connect(&master.addr)).await;
        match attempt {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                master.stats.connects.fetch_add(1, Ordering::Relaxed);
                if warned {
                    tracing::info!(master = %master.addr, "master reachable again");
                }
                warned = false;
                backoff = BACKOFF_MIN;
                let (link, mut retired) = start_link(stream, master.node_timeout);
                master.install(Some(link.clone()));
                tokio::select! {
                    _ = retired.wait_for(|r| *r) => {}
                    _ = stop.wait_for(|s| *s) => link.retire(),
                }
                master.install(None);
                master.stats.retired.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(master = %master.addr, "connection retired");
            }
            Ok(Err(err)) if !warned => {
                tracing::warn!(master = %master.addr, error = %err, "master unreachable; retrying");
                warned = true;
            }
            Err(_) if !warned => {
                tracing::warn!(master = %master.addr, "connect timed out; retrying");
                warned = true;
            }
            _ => {}
        }
        tokio::select! {
            _ = sleep(backoff) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

fn start_link(stream: TcpStream, node_timeout: Duration) -> (Arc<Link>, watch::Receiver<bool>) {
    let (rd, wr) = stream.into_split();
    let (queue, rx) = mpsc::unbounded_channel();
    let (retired, retired_rx) = watch::channel(false);
    let in_flight = Arc::new(Mutex::new(VecDeque::new()));
    let pushed = Arc::new(Notify::new());
    let link = Arc::new(Link { queue, retired });
    tokio::spawn(write_loop(
        wr,
        rx,
        in_flight.clone(),
        pushed.clone(),
        retired_rx.clone(),
    ));
    tokio::spawn(read_loop(rd, in_flight, pushed, link.clone(), node_timeout));
    (link, retired_rx)
}

async fn write_loop(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    in_flight: Arc<Mutex<VecDeque<InFlight>>>,
    pushed: Arc<Notify>,
    mut retired: watch::Receiver<bool>,
) {
    let mut buf = BytesMut::with_capacity(16 * 1024);
    loop {
        let first = tokio::select! {
            next = rx.recv() => next,
            _ = retired.wait_for(|r| *r) => None,
        };
        let Some(first) = first else { break };
        let now = Instant::now();
        {
            let Ok(mut queue) = in_flight.lock() else {
                break;
            };
            let mut next = Some(first);
            while let Some(out) = next {
                buf.extend_from_slice(&out.payload);
                queue.push_back(InFlight {
                    reply: out.reply,
                    late: out.late,
                    sent_at: now,
                });
                next = if buf.len() < WRITE_BATCH {
                    rx.try_recv().ok()
                } else {
                    None
                };
            }
        }
        pushed.notify_one();
        let written = tokio::select! {
            res = wr.write_all(&buf) => res.is_ok(),
            _ = retired.wait_for(|r| *r) => false,
        };
        if !written {
            break;
        }
        buf.clear();
    }
    // Requests still queued but never written: their callers see the channel close.
    rx.close();
}

async fn read_loop(
    mut rd: OwnedReadHalf,
    in_flight: Arc<Mutex<VecDeque<InFlight>>>,
    pushed: Arc<Notify>,
    link: Arc<Link>,
    node_timeout: Duration,
) {
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut retired_rx = link.retired.subscribe();
    let mut grace_until: Option<Instant> = None;
    loop {
        let retired = *retired_rx.borrow();
        let oldest = in_flight
            .lock()
            .ok()
            .and_then(|q| q.front().map(|p| p.sent_at));
        if retired {
            if oldest.is_none() {
                break;
            }
            grace_until.get_or_insert_with(|| Instant::now() + RETIRED_GRACE);
        }
        // Watchdog: the oldest request waited past the node timeout, so a reply may now be
        // arbitrarily late: stop using this connection for anything new.
        let watchdog = oldest.filter(|_| !retired).map(|t| t + node_timeout);
        tokio::select! {
            read = rd.read_buf(&mut buf) => {
                match read {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if !deliver(&mut buf, &in_flight) {
                            break;
                        }
                    }
                }
            }
            _ = pushed.notified(), if !retired => {}
            _ = retired_rx.changed(), if !retired => {}
            _ = sleep_until(watchdog.unwrap_or_else(Instant::now)), if watchdog.is_some() => {
                link.retire();
            }
            _ = sleep_until(grace_until.unwrap_or_else(Instant::now)), if grace_until.is_some() => break,
        }
    }
    link.retire();
    // Whatever is still in flight gets no reply: dropping the senders tells the callers.
    if let Ok(mut queue) = in_flight.lock() {
        queue.clear();
    }
}

/// Decodes every complete reply in `buf` and hands each to the oldest in-flight request.
/// Returns false on a protocol error or a reply nobody asked for (the link must close).
fn deliver(buf: &mut BytesMut, in_flight: &Mutex<VecDeque<InFlight>>) -> bool {
    loop {
        let frame = match decode_bytes_mut(buf) {
            Ok(Some((frame, _, _))) => frame,
            Ok(None) => return true,
            Err(err) => {
                tracing::warn!(error = %err, "undecodable reply from master; closing connection");
                return false;
            }
        };
        let Some(waiter) = in_flight.lock().ok().and_then(|mut q| q.pop_front()) else {
            tracing::warn!("reply from master with no request in flight; closing connection");
            return false;
        };
        if let Err(reply) = waiter.reply.send(to_reply(frame)) {
            if let Some(hook) = waiter.late {
                hook(reply);
            }
        }
    }
}

fn to_reply(frame: BytesFrame) -> Reply {
    match frame {
        BytesFrame::SimpleString(s) => Reply::Simple(s),
        BytesFrame::Error(e) => Reply::Error(e.into_inner()),
        BytesFrame::Integer(i) => Reply::Integer(i),
        BytesFrame::BulkString(b) => Reply::Bulk(b),
        BytesFrame::Array(items) => Reply::Array(items.into_iter().map(to_reply).collect()),
        BytesFrame::Null => Reply::Null,
    }
}
