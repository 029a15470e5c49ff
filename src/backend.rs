//! One multiplexed, pipelined connection per master, and the clean-ups that must reach it.
//!
//! Invariants:
//! - Replies are matched to requests strictly in FIFO order on one TCP connection. Requests
//!   are queued in the in-flight list *before* their bytes are written, so the reader always
//!   finds the request a reply belongs to. A request may expect several replies (a script
//!   followed by its guard, [`crate::cluster`]): they are delivered together.
//! - A connection on which a request waited longer than the node timeout is **aborted** and a
//!   fresh connection replaces it (reconnect with backoff). The reason is head-of-line latency
//!   (FIFO matching cannot mismatch a late reply, but every request behind a stalled one would
//!   wait too). Its callers get no reply: their votes are missing. What it had written may
//!   still run: a paused master (SIGSTOP, swap, a long script) runs the bytes already in its
//!   socket buffer when it resumes, even after the connection was closed or reset (checked on
//!   redis-server 7.0). The acquire protects itself against that (a deadline and an attempt id
//!   in its script, [`crate::cluster::ACQUIRE_SCRIPT`]).
//! - **Clean-ups** ([`Master::undo`]) survive reconnects: a clean-up goes on the current
//!   connection; one not confirmed by a reply when its connection ends is kept in the master's
//!   pending list and written first on the next connection, until a reply confirms it. A
//!   clean-up is dropped once the lease it undoes has surely expired (`ttl` after the clean-up
//!   was first queued; the final clean-up of a write is queued after the write could last have
//!   run), however many connections it went through, and the list is capped.
//! - Writes are batched: the writer drains everything queued since its last write into one
//!   buffer and writes it with one call (one syscall per burst across all clients).
//! - A caller never waits longer than the node timeout for one reply; a missing reply is a
//!   "no" vote ([`Vote::Missing`]), never an error that stops the fan-out.

use crate::health::MasterHealth;
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

/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Largest batch the writer gathers before writing.
const WRITE_BATCH: usize = 256 * 1024;
/// Most clean-ups kept for a master that cannot be reached. Each undoes one refused acquire's
/// write and dies with its lease; beyond this many, the oldest is dropped (with a warning): a
/// dropped clean-up can only leave a key that nobody was granted until it expires.
const MAX_PENDING_UNDO: usize = 100_000;

/// Counters shown by `INFO`.
#[derive(Debug, Default)]
pub struct MasterStats {
    pub replies: AtomicU64,
    pub missing: AtomicU64,
    pub connects: AtomicU64,
    pub retired: AtomicU64,
}

/// A clean-up that has not been confirmed yet.
struct PendingUndo {
    payload: Bytes,
    /// Dropped after this instant: the lease it undoes has expired by then.
    expires: Instant,
}

/// One independent Redis master and its current connection.
pub struct Master {
    pub addr: String,
    node_timeout: Duration,
    link: Mutex<Option<Arc<Link>>>,
    pub stats: MasterStats,
    connected: AtomicBool,
    /// Health monitor's verdicts ([`crate::health`]).
    pub health: MasterHealth,
    new_connection: Notify,
    /// Clean-ups whose connection ended before they were confirmed.
    pending_undo: Mutex<VecDeque<PendingUndo>>,
}

impl std::fmt::Debug for Master {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Master").field("addr", &self.addr).finish()
    }
}

/// A request handed to a connection.
struct Outgoing {
    payload: Bytes,
    /// Replies this payload produces (one per command in it).
    replies: usize,
    reply: Option<oneshot::Sender<Reply>>,
    /// Set for a clean-up: kept (pending) until a reply confirms it ran, or until this instant.
    undo_expires: Option<Instant>,
    /// When the caller handed it over (and started its own node timeout).
    queued_at: Instant,
}

/// A written request waiting for its replies.
struct InFlight {
    out: Outgoing,
    got: Vec<Reply>,
}

/// One TCP connection to a master: a writer task, a reader task, and the FIFO between them.
struct Link {
    queue: mpsc::UnboundedSender<Outgoing>,
    aborted: watch::Sender<bool>,
}

impl Link {
    fn abort(&self) {
        self.aborted.send_replace(true);
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
            health: MasterHealth::default(),
            new_connection: Notify::new(),
            pending_undo: Mutex::new(VecDeque::new()),
        })
    }

    /// May this master's votes count right now? Only on a connection the health monitor has
    /// judged, outside quarantine, and in a safe configuration.
    pub fn eligible(&self) -> bool {
        self.is_connected() && self.health.eligible(self.connect_count())
    }

    /// `up`, `down`, `connecting`, `quarantined (…)` or `unsafe (…)`, for `INFO`.
    pub fn state(&self) -> String {
        if !self.is_connected() {
            return "down".into();
        }
        self.health.state(self.connect_count())
    }

    /// Number of connections made so far (changes on every reconnect).
    pub fn connect_count(&self) -> u64 {
        self.stats.connects.load(Ordering::Relaxed)
    }

    /// Resolves once a connection newer than connection number `seen` exists.
    pub async fn wait_new_connection(&self, seen: u64) {
        loop {
            let notified = self.new_connection.notified();
            if self.connect_count() != seen {
                return;
            }
            notified.await;
        }
    }

    /// Whether a usable connection exists right now.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Clean-ups not yet confirmed on any connection (for `INFO`).
    pub fn pending_undo_count(&self) -> usize {
        self.pending_undo.lock().map_or(0, |p| p.len())
    }

    /// Starts the task that keeps one connection open, until `stop` becomes true.
    pub fn spawn(self: &Arc<Self>, stop: watch::Receiver<bool>) {
        tokio::spawn(supervise(self.clone(), stop));
    }

    /// Queues `payload` (`replies` replies) on the current connection. `None` when there is no
    /// connection: the vote is missing at once.
    fn send(
        &self,
        payload: Bytes,
        replies: usize,
    ) -> Option<(oneshot::Receiver<Reply>, Arc<Link>)> {
        let link = self.link.lock().ok()?.clone()?;
        if *link.aborted.borrow() {
            // Aborted but not yet replaced: nothing new goes on it.
            return None;
        }
        let (tx, rx) = oneshot::channel();
        link.queue
            .send(Outgoing {
                payload,
                replies,
                reply: Some(tx),
                undo_expires: None,
                queued_at: Instant::now(),
            })
            .ok()?;
        Some((rx, link))
    }

    /// Queues a clean-up of a write whose value lives at most `ttl` once applied (see the
    /// module header: kept across reconnects until confirmed, or until `ttl` from now). The
    /// receiver, if any, gets the clean-up's reply on this connection.
    pub fn undo(&self, payload: Bytes, ttl: Duration) -> Option<oneshot::Receiver<Reply>> {
        let (tx, rx) = oneshot::channel();
        let now = Instant::now();
        let out = Outgoing {
            payload,
            replies: 1,
            reply: Some(tx),
            undo_expires: Some(now + ttl),
            queued_at: now,
        };
        let link = self.link.lock().ok().and_then(|l| l.clone());
        match link {
            Some(link) => match link.queue.send(out) {
                Ok(()) => Some(rx),
                Err(mpsc::error::SendError(out)) => {
                    self.keep_undo(out);
                    None
                }
            },
            None => {
                self.keep_undo(out);
                None
            }
        }
    }

    /// Keeps an unconfirmed clean-up for the next connection.
    fn keep_undo(&self, out: Outgoing) {
        let Some(expires) = out.undo_expires else {
            return;
        };
        let Ok(mut pending) = self.pending_undo.lock() else {
            return;
        };
        if pending.len() >= MAX_PENDING_UNDO {
            pending.pop_front();
            tracing::warn!(master = %self.addr, "too many clean-ups pending for an unreachable master; dropped the oldest (its key expires by itself)");
        }
        pending.push_back(PendingUndo {
            payload: out.payload,
            expires,
        });
    }

    /// Takes the pending clean-ups that have not expired, oldest first.
    fn take_pending_undo(&self) -> Vec<Outgoing> {
        let now = Instant::now();
        let Ok(mut pending) = self.pending_undo.lock() else {
            return Vec::new();
        };
        pending
            .drain(..)
            .filter(|p| p.expires > now)
            .map(|p| Outgoing {
                payload: p.payload,
                replies: 1,
                reply: None,
                undo_expires: Some(p.expires),
                queued_at: now,
            })
            .collect()
    }

    /// Sends one request and waits at most the node timeout for its reply. A master that is
    /// not [eligible](Master::eligible) still gets the request (a release must reach it too)
    /// but its vote is [`Vote::Missing`] at once ([`Vote::Fenced`] while quarantined).
    pub async fn call(&self, payload: Bytes, replies: usize) -> Vote {
        if !self.eligible() {
            drop(self.send(payload, replies));
            return self.absent_vote();
        }
        self.probe_with(payload, replies).await
    }

    /// The vote of a master that is not asked: [`Vote::Fenced`] while quarantined, else
    /// [`Vote::Missing`].
    pub fn absent_vote(&self) -> Vote {
        self.stats.missing.fetch_add(1, Ordering::Relaxed);
        if self.health.quarantined() {
            Vote::Fenced
        } else {
            Vote::Missing
        }
    }

    /// Like [`Master::call`] but regardless of eligibility: for the health monitor.
    pub async fn probe(&self, payload: Bytes) -> Vote {
        self.probe_with(payload, 1).await
    }

    async fn probe_with(&self, payload: Bytes, replies: usize) -> Vote {
        let vote = match self.send(payload, replies) {
            None => Vote::Missing,
            Some((rx, link)) => {
                let vote = wait_reply(rx, self.node_timeout).await;
                if vote == Vote::Missing {
                    // The caller gave up: the connection is stalled. Its watchdog would abort it
                    // too, but on a busy machine that task may run later than this one, and a
                    // request handed to the connection in between (the next batch of acquires
                    // of the same key, say) would wait out a second node timeout.
                    link.abort();
                }
                vote
            }
        };
        let counter = match vote {
            Vote::Replied(_) => &self.stats.replies,
            _ => &self.stats.missing,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        vote
    }

    /// The node timeout callers wait for one reply.
    pub fn node_timeout(&self) -> Duration {
        self.node_timeout
    }

    fn install(&self, link: Option<Arc<Link>>) {
        self.connected.store(link.is_some(), Ordering::Relaxed);
        if let Ok(mut slot) = self.link.lock() {
            *slot = link;
        }
    }
}

/// Waits at most `limit` for a reply.
pub async fn wait_reply(rx: oneshot::Receiver<Reply>, limit: Duration) -> Vote {
    match timeout(limit, rx).await {
        Ok(Ok(reply)) => Vote::Replied(reply),
        _ => Vote::Missing,
    }
}

/// Keeps one live connection to the master, replacing it whenever it is aborted or fails.
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
                let (link, mut aborted) = start_link(stream, &master);
                // Clean-ups left by older connections go first, before anything else can.
                for out in master.take_pending_undo() {
                    if let Err(mpsc::error::SendError(out)) = link.queue.send(out) {
                        master.keep_undo(out);
                    }
                }
                master.install(Some(link.clone()));
                master.new_connection.notify_waiters();
                tokio::select! {
                    _ = aborted.wait_for(|r| *r) => {}
                    _ = stop.wait_for(|s| *s) => link.abort(),
                }
                master.install(None);
                master.stats.retired.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(master = %master.addr, "connection aborted");
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

fn start_link(stream: TcpStream, master: &Arc<Master>) -> (Arc<Link>, watch::Receiver<bool>) {
    let (rd, wr) = stream.into_split();
    let (queue, rx) = mpsc::unbounded_channel();
    let (aborted, aborted_rx) = watch::channel(false);
    let in_flight = Arc::new(Mutex::new(VecDeque::new()));
    let pushed = Arc::new(Notify::new());
    let link = Arc::new(Link { queue, aborted });
    tokio::spawn(write_loop(
        wr,
        rx,
        in_flight.clone(),
        pushed.clone(),
        aborted_rx.clone(),
        master.clone(),
    ));
    tokio::spawn(read_loop(
        rd,
        in_flight,
        pushed,
        link.clone(),
        master.clone(),
    ));
    (link, aborted_rx)
}

async fn write_loop(
    wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    in_flight: Arc<Mutex<VecDeque<InFlight>>>,
    pushed: Arc<Notify>,
    mut aborted: watch::Receiver<bool>,
    master: Arc<Master>,
) {
    let mut wr = wr;
    let mut buf = BytesMut::with_capacity(16 * 1024);
    loop {
        let first = tokio::select! {
            next = rx.recv() => next,
            _ = aborted.wait_for(|r| *r) => None,
        };
        let Some(first) = first else { break };
        {
            let Ok(mut queue) = in_flight.lock() else {
                break;
            };
            let mut next = Some(first);
            while let Some(out) = next {
                buf.extend_from_slice(&out.payload);
                queue.push_back(InFlight {
                    got: Vec::with_capacity(out.replies),
                    out,
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
            _ = aborted.wait_for(|r| *r) => false,
        };
        if !written {
            break;
        }
        buf.clear();
    }
    // Requests queued but never written: callers see their channel close; clean-ups wait for
    // the next connection.
    rx.close();
    while let Ok(out) = rx.try_recv() {
        master.keep_undo(out);
    }
    drop(wr);
}

async fn read_loop(
    mut rd: OwnedReadHalf,
    in_flight: Arc<Mutex<VecDeque<InFlight>>>,
    pushed: Arc<Notify>,
    link: Arc<Link>,
    master: Arc<Master>,
) {
    let node_timeout = master.node_timeout;
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut aborted_rx = link.aborted.subscribe();
    loop {
        if *aborted_rx.borrow() {
            break;
        }
        let oldest = in_flight
            .lock()
            .ok()
            .and_then(|q| q.front().map(|p| p.out.queued_at));
        // Watchdog: the oldest request waited past the node timeout, so what this connection
        // still answers is late: abort it and use a fresh one. The proxy's own backlog cannot
        // trip it: fan-outs wait for a permit before any request is queued here
        // (`cluster::MAX_FANOUTS`), and replies are read before the timer is looked at
        // (`biased`), so under overload requests queue outside the node timeout instead of
        // turning into a reconnect storm (found by the benchmark at 500 connections × 16).
        // It fires a millisecond before the caller's own timeout (both count from when the
        // request was handed over), so the connection is already gone when the caller gives
        // up and whatever it sends next (a queued acquire of the same key, say) goes on a
        // fresh connection instead of waiting out a second node timeout on this one.
        let watchdog = oldest.map(|t| t + node_timeout.saturating_sub(Duration::from_millis(1)));
        tokio::select! {
            // Replies first: under load the watchdog must not fire while replies sit unread.
            biased;
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
            _ = pushed.notified() => {}
            _ = aborted_rx.changed() => {}
            _ = sleep_until(watchdog.unwrap_or_else(Instant::now)), if watchdog.is_some() => break,
        }
    }
    link.abort();
    // Whatever is still in flight gets no reply (dropping the senders tells the callers);
    // unconfirmed clean-ups are kept for the next connection.
    let left: Vec<InFlight> = in_flight
        .lock()
        .map(|mut q| q.drain(..).collect())
        .unwrap_or_default();
    for entry in left {
        master.keep_undo(entry.out);
    }
    drop(rd);
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
        let Ok(mut queue) = in_flight.lock() else {
            return false;
        };
        let Some(front) = queue.front_mut() else {
            tracing::warn!("reply from master with no request in flight; closing connection");
            return false;
        };
        front.got.push(to_reply(frame));
        if front.got.len() < front.out.replies {
            continue;
        }
        let Some(mut done) = queue.pop_front() else {
            return false;
        };
        drop(queue);
        let reply = if done.got.len() == 1 {
            done.got.pop().unwrap_or(Reply::Null)
        } else {
            Reply::Array(done.got)
        };
        if let Some(tx) = done.out.reply.take() {
            let _ = tx.send(reply);
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
