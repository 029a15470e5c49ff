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

use crate::health::{judge, Observation};
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

/// Called with `(master index, reply)` when a reply arrives after its caller stopped waiting
/// (timed out, or the fan-out was decided early). One handler serves all masters of a fan-out.
pub type LateHandler = Arc<dyn Fn(usize, Reply) + Send + Sync>;

/// A late-reply handler bound to one master.
pub struct LateHook {
    pub index: usize,
    pub handler: LateHandler,
}

/// Counters shown by `INFO`.
#[derive(Debug, Default)]
pub struct MasterStats {
    pub replies: AtomicU64,
    pub missing: AtomicU64,
    pub connects: AtomicU64,
    pub retired: AtomicU64,
}

/// What the health monitor last concluded about a master ([`crate::health`]).
#[derive(Debug, Default)]
struct HealthState {
    last: Option<Observation>,
    /// Connection number (see [`MasterStats::connects`]) the last observation was made on.
    checked_connect: u64,
    quarantined_until: Option<Instant>,
    quarantine_reason: Option<String>,
    unsafe_reason: Option<String>,
}

/// One independent Redis master and its current connection.
pub struct Master {
    pub addr: String,
    node_timeout: Duration,
    link: Mutex<Option<Arc<Link>>>,
    pub stats: MasterStats,
    connected: AtomicBool,
    health: Mutex<HealthState>,
    new_connection: Notify,
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
    /// When the caller handed it over (and started its own node timeout).
    queued_at: Instant,
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
            health: Mutex::new(HealthState::default()),
            new_connection: Notify::new(),
        })
    }

    /// May this master's votes count right now? Only on a connection whose `INFO` has been
    /// judged, outside quarantine, and in a safe configuration.
    pub fn eligible(&self) -> bool {
        if !self.is_connected() {
            return false;
        }
        let connects = self.connect_count();
        let Ok(h) = self.health.lock() else {
            return false;
        };
        h.checked_connect == connects
            && h.unsafe_reason.is_none()
            && h.quarantined_until.is_none_or(|t| Instant::now() >= t)
    }

    /// `up`, `down`, `connecting`, `quarantined (…)` or `unsafe (…)`, for `INFO`.
    pub fn state(&self) -> String {
        if !self.is_connected() {
            return "down".into();
        }
        let connects = self.connect_count();
        let Ok(h) = self.health.lock() else {
            return "unknown".into();
        };
        let now = Instant::now();
        if let Some(reason) = &h.unsafe_reason {
            return format!("unsafe ({reason})");
        }
        if let (Some(until), Some(reason)) = (h.quarantined_until, &h.quarantine_reason) {
            if now < until {
                return format!(
                    "quarantined ({reason}; {} ms left)",
                    (until - now).as_millis()
                );
            }
        }
        if h.checked_connect != connects {
            return "connecting".into();
        }
        "up".into()
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

    /// Records a health observation made on connection number `connect`. A loss of data
    /// starts a quarantine of `quarantine` (when quarantine is on) from `now`.
    pub fn observe(
        &self,
        obs: Observation,
        connect: u64,
        quarantine: Option<Duration>,
        now: Instant,
    ) {
        let Ok(mut h) = self.health.lock() else {
            return;
        };
        let verdict = judge(h.last.as_ref(), &obs);
        if let (None, Some(wait)) = (&h.last, quarantine) {
            // First sight of this master: it may have restarted empty just before this proxy
            // started. Its uptime (whole seconds, rounded down: never too long) tells how much
            // of the longest lease could still be running.
            let up = Duration::from_secs(obs.uptime_secs);
            if up < wait {
                h.quarantined_until = Some(now + (wait - up));
                h.quarantine_reason = Some(format!("started {}s ago", obs.uptime_secs));
                // Worth a line only when it keeps the master out noticeably (with no lease
                // granted yet the wait is just the 2 ms drift floor).
                if wait - up >= Duration::from_secs(1) {
                    tracing::warn!(master = %self.addr, uptime_s = obs.uptime_secs, wait_ms = (wait - up).as_millis() as u64, "master started recently: quarantined until the longest lease it may have forgotten has expired");
                }
            }
        }
        if let Some(reason) = verdict.lost {
            self.lost_data(&mut h, reason, quarantine, now);
        }
        if verdict.unsafe_config != h.unsafe_reason {
            match &verdict.unsafe_config {
                Some(reason) => {
                    tracing::error!(master = %self.addr, %reason, "master refused: unsafe for locks")
                }
                None => tracing::info!(master = %self.addr, "master configuration safe again"),
            }
            h.unsafe_reason = verdict.unsafe_config;
        }
        h.last = Some(obs);
        h.checked_connect = connect;
    }

    /// Whether a health observation of this master was ever made (its canary was set then).
    pub fn seen_before(&self) -> bool {
        self.health.lock().is_ok_and(|h| h.last.is_some())
    }

    /// This proxy's canary key is gone from the master (seen by an acquire or the health
    /// check): it lost its data. Quarantined at once (the next `INFO` may come too late).
    pub fn report_wipe(&self, quarantine: Option<Duration>, now: Instant) {
        if let Ok(mut h) = self.health.lock() {
            self.lost_data(
                &mut h,
                "canary key gone (data wiped)".into(),
                quarantine,
                now,
            );
        }
    }

    fn lost_data(
        &self,
        h: &mut HealthState,
        reason: String,
        quarantine: Option<Duration>,
        now: Instant,
    ) {
        match quarantine {
            Some(wait) => {
                tracing::warn!(master = %self.addr, %reason, wait_ms = wait.as_millis() as u64, "master lost data: quarantined until every lease it held has expired");
                h.quarantined_until = Some(now + wait);
                h.quarantine_reason = Some(reason);
            }
            None => {
                tracing::warn!(master = %self.addr, %reason, "master lost data (quarantine is off)")
            }
        }
    }

    /// Whether a usable connection exists right now.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Starts the task that keeps one connection open, until `stop` becomes true.
    pub fn spawn(self: &Arc<Self>, stop: watch::Receiver<bool>) {
        tokio::spawn(supervise(self.clone(), stop));
    }

    /// Queues `payload` without waiting for the reply (which is dropped when it comes).
    pub fn forget(&self, payload: Bytes) {
        drop(self.send(payload, None));
    }

    /// Queues `payload` (one or more encoded commands giving one reply) on the current
    /// connection. `None` when there is no connection: the vote is missing at once.
    fn send(&self, payload: Bytes, late: Option<LateHook>) -> Option<oneshot::Receiver<Reply>> {
        let link = self.link.lock().ok()?.clone()?;
        if *link.retired.borrow() {
            // Retired but not yet replaced: nothing new goes on it.
            return None;
        }
        let (tx, rx) = oneshot::channel();
        link.queue
            .send(Outgoing {
                payload,
                reply: tx,
                late,
                queued_at: Instant::now(),
            })
            .ok()?;
        Some(rx)
    }

    /// Sends one request and waits at most the node timeout for its reply. A master that is
    /// not [eligible](Master::eligible) still gets the request (a rollback or release must
    /// reach it too) but its vote is [`Vote::Missing`] at once.
    pub async fn call(&self, payload: Bytes, late: Option<LateHook>) -> Vote {
        if !self.eligible() {
            drop(self.send(payload, late));
            self.stats.missing.fetch_add(1, Ordering::Relaxed);
            return Vote::Missing;
        }
        self.probe_with(payload, late).await
    }

    /// Like [`Master::call`] but regardless of eligibility: for the health monitor.
    pub async fn probe(&self, payload: Bytes) -> Vote {
        self.probe_with(payload, None).await
    }

    async fn probe_with(&self, payload: Bytes, late: Option<LateHook>) -> Vote {
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
                master.new_connection.notify_waiters();
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
                    sent_at: out.queued_at,
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
        // Watchdog: the oldest request waited past the node timeout, so what this connection
        // still answers is late: retire it and use a fresh one. The proxy's own backlog cannot
        // trip it: fan-outs wait for a permit before any request is queued here
        // (`cluster::MAX_FANOUTS`), and replies are read before the timer is looked at
        // (`biased`), so under overload requests queue outside the node timeout instead of
        // turning into a reconnect storm (found by the benchmark at 500 connections × 16).
        // It fires a millisecond before the caller's own timeout (both count from when the
        // request was handed over), so the connection is already retired when the caller
        // gives up and whatever it sends next (a queued acquire of the same key, say) goes on
        // a fresh connection instead of waiting out a second node timeout on this one.
        let watchdog = oldest
            .filter(|_| !retired)
            .map(|t| t + node_timeout.saturating_sub(Duration::from_millis(1)));
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
                (hook.handler)(hook.index, reply);
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
