//! One multiplexed, pipelined connection per master ([`Link`]): send, replies in order,
//! reconnect, watchdog, and the clean-ups that must reach the master. It knows nothing of
//! votes, health or locks; whether a master's answers count is for [`crate::masters`] to say.
//!
//! Invariants:
//! - Replies are matched to requests strictly in FIFO order on one connection. Requests are
//!   queued in the in-flight list *before* their bytes are written, so the reader always finds
//!   the request a reply belongs to. A request may expect several replies (a script followed
//!   by its guard): they are delivered together.
//! - A connection on which a request waited longer than the node timeout is **aborted** and a
//!   fresh connection replaces it (reconnect with backoff). The reason is head-of-line latency:
//!   FIFO matching cannot mismatch a late reply, but every request queued behind a stalled one
//!   would wait too. Its callers get no reply ([`NoReply`]). What it had written may still
//!   run: a paused master (SIGSTOP, swap, a long script) runs the bytes already in its socket
//!   buffer when it resumes, even after the connection was closed or reset (checked on
//!   redis-server 7.0). The acquire protects itself against that (a deadline and an attempt
//!   id in its script: [`crate::lock`]).
//! - **Clean-ups** ([`Link::send_cleanup`]) survive reconnects: a clean-up goes on the current
//!   connection; one not confirmed by a reply when its connection ends is kept and written
//!   first on the next connection, until a reply confirms it. A clean-up is dropped once the
//!   write it undoes has surely expired (its lifetime from when it was first queued), however
//!   many connections it went through, and at most [`MAX_PENDING_CLEANUPS`] are kept.
//! - Writes are batched: the writer drains everything queued since its last write into one
//!   buffer and writes it with one call (one syscall per burst across all clients).
//! - Calls of a [`SharedScript`] (the acquire) queued one after another leave as **one** script
//!   call for all of them ([`Link::send_script`]), whose reply array is split back, one element
//!   per caller. A master pays a script's fixed cost (argument tables, set-up, reply) once per
//!   burst instead of once per acquire. Nothing else changes for a caller: the master runs the
//!   calls in queue order and atomically (a script runs alone), as it would have run them one
//!   after another, and each caller gets its own answer, or the same error as every caller of
//!   the merged call. A master that lost the script (restart, `SCRIPT FLUSH`) answers
//!   `NOSCRIPT`: the link sends the same calls again at once with the body, whether or not their
//!   callers still wait (a release whose quorum was reached without this master must still
//!   delete the key there).
//! - A caller never waits longer than the node timeout for one reply ([`Pending::wait`]).
//!
//! The byte stream comes from a [`Connect`]: TCP or TLS with its `AUTH` done in production
//! ([`crate::dial`]); the deterministic tests use in-memory pipes to a scripted master and
//! tokio's paused clock. A master that refuses the credentials is kept as
//! [`Link::auth_refused`] (for `INFO`), logged once per change of reason.

use crate::live::LiveDuration;
use crate::protocol::{decode_reply, encode_script_call, Invoke, Reply, ScriptCall};
use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::time::{sleep, sleep_until, timeout, timeout_at, Instant};

/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Largest batch the writer gathers before writing.
const WRITE_BATCH: usize = 256 * 1024;
/// Most calls merged into one script call: enough to amortise the script's fixed cost, few
/// enough that one call keeps the master busy for well under a millisecond.
const MAX_MERGED_CALLS: usize = 64;
/// How many requests may be unanswered on a connection before the writer holds the lock
/// operations queued behind them, to merge them into one call ([`write_loop`]). With one, a
/// connection that is not loaded still waits a round trip for each call (−20 % throughput at 5
/// clients over 1 master); with two, it never waits, and under load the calls are as large.
const IN_FLIGHT_BEFORE_HOLDING: usize = 2;
/// Most clean-ups kept for a master that cannot be reached. Each undoes one refused acquire's
/// write and dies with its lease; beyond this many, the oldest is dropped (with a warning): a
/// dropped clean-up can only leave a key that nobody was granted until it expires.
pub const MAX_PENDING_CLEANUPS: usize = 100_000;

/// The reading half of a connection to a master.
pub type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// The writing half of a connection to a master.
pub type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// A connection failure that is the master refusing our credentials: its error text
/// (`WRONGPASS …`), with `,` made `;` (it is shown in `INFO`'s comma-separated fields).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct AuthRefused(pub String);

/// Opens byte streams to one master. A connector that authenticates reports a refusal as an
/// `io::Error` wrapping [`AuthRefused`].
pub trait Connect: Send + Sync + 'static {
    fn connect(&self) -> BoxFuture<'static, io::Result<(ReadHalf, WriteHalf)>>;
}

/// Why a request got no reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoReply {
    /// There was no usable connection when it was sent.
    NoLink,
    /// No reply within the wait (the node timeout).
    Timeout,
    /// The connection ended before the reply came.
    Closed,
}

/// A clean-up that has not been confirmed yet.
struct PendingCleanup {
    payload: Bytes,
    /// Dropped after this instant: the write it undoes has expired by then.
    expires: Instant,
}

/// A script that many requests call (see the module header): its SHA1 for the call, its body
/// for a master that lost it, and the keys every call shares (they are passed once).
#[derive(Debug)]
pub struct SharedScript {
    pub sha: String,
    pub body: &'static str,
    pub shared_keys: Vec<Bytes>,
}

/// A request's reply, or why none will come.
type Answer = Result<Reply, NoReply>;
/// Where a request's answer goes.
type ReplyTo = oneshot::Sender<Answer>;

/// What a request sends.
enum Payload {
    /// Commands, encoded.
    Commands(Bytes),
    /// Commands led by an `EVALSHA`, and the same commands with the script's body (`EVAL`),
    /// written instead if the master answers the `EVALSHA` with `NOSCRIPT` (it never saw the
    /// script, or lost its cache): a long body crosses the wire once per master, not per call.
    BySha { by_sha: Bytes, by_body: Bytes },
    /// A share of a script call that the writer merges with the calls of the same script
    /// queued right after it.
    Script {
        script: Arc<SharedScript>,
        call: ScriptCall,
        invoke_by_body: bool,
    },
}

/// A request handed to a connection.
struct Outgoing {
    payload: Payload,
    /// Replies this payload produces (one per command in it).
    replies: usize,
    reply: Option<ReplyTo>,
    /// Set for a clean-up: kept until a reply confirms it ran, or until this instant.
    cleanup_expires: Option<Instant>,
    /// When the caller handed it over (and started its own node timeout).
    queued_at: Instant,
}

/// Where a written request's replies go.
enum Recipients {
    /// One request: its replies (an array if it expects several).
    One(Option<ReplyTo>),
    /// Merged script calls: element `i` of the reply array goes to caller `i`.
    Merged(MergedCalls),
}

/// The calls of one merged script call, kept until answered (to send again with the body).
struct MergedCalls {
    script: Arc<SharedScript>,
    by_body: bool,
    calls: Vec<ScriptCall>,
    replies: Vec<Option<ReplyTo>>,
}

/// A written request waiting for its replies.
struct InFlight {
    replies: usize,
    got: Vec<Reply>,
    to: Recipients,
    /// A clean-up's payload and expiry, kept for the next connection if no reply confirms it.
    cleanup: Option<(Bytes, Instant)>,
    /// The commands to send again, with the script's body, if the first reply is `NOSCRIPT`
    /// ([`Payload::BySha`]).
    by_body: Option<Bytes>,
    /// When its oldest caller handed it over.
    queued_at: Instant,
}

impl InFlight {
    /// A written request with one caller.
    fn one(
        replies: usize,
        reply: Option<ReplyTo>,
        queued_at: Instant,
        cleanup: Option<(Bytes, Instant)>,
        by_body: Option<Bytes>,
    ) -> InFlight {
        InFlight {
            replies,
            got: Vec::with_capacity(replies),
            to: Recipients::One(reply),
            cleanup,
            by_body,
            queued_at,
        }
    }

    /// Hands over the reply (`Err`: none will come); merged calls the master answered
    /// `NOSCRIPT` are queued again on `resend`, with the body.
    fn answer(self, answer: Answer, resend: &mpsc::UnboundedSender<Outgoing>) {
        let merged = match self.to {
            Recipients::One(Some(tx)) => {
                let first = match &answer {
                    Ok(Reply::Array(items)) if self.replies > 1 => items.first(),
                    Ok(reply) => Some(reply),
                    Err(_) => None,
                };
                match self.by_body {
                    Some(by_body) if first.is_some_and(|r| r.is_error_code("NOSCRIPT")) => {
                        let again = Outgoing {
                            payload: Payload::Commands(by_body),
                            replies: self.replies,
                            reply: Some(tx),
                            cleanup_expires: None,
                            queued_at: self.queued_at,
                        };
                        // A closed queue drops the request: its caller sees the channel close.
                        let _ = resend.send(again);
                    }
                    _ => {
                        let _ = tx.send(answer);
                    }
                }
                return;
            }
            Recipients::One(None) => return,
            Recipients::Merged(merged) => merged,
        };
        if !merged.by_body && matches!(&answer, Ok(r) if r.is_error_code("NOSCRIPT")) {
            for (call, reply) in merged.calls.into_iter().zip(merged.replies) {
                let again = Outgoing {
                    payload: Payload::Script {
                        script: merged.script.clone(),
                        call,
                        invoke_by_body: true,
                    },
                    replies: 1,
                    reply,
                    cleanup_expires: None,
                    queued_at: self.queued_at,
                };
                // A closed queue drops the request: its caller sees the channel close.
                let _ = resend.send(again);
            }
            return;
        }
        let txs = merged.replies;
        match answer {
            Ok(Reply::Array(items)) if items.len() == txs.len() => {
                for (tx, item) in txs.into_iter().zip(items) {
                    if let Some(tx) = tx {
                        let _ = tx.send(Ok(item));
                    }
                }
            }
            // An error (`BUSY`, `OOM`, …) concerns every caller of the call alike.
            other => {
                for tx in txs.into_iter().flatten() {
                    let _ = tx.send(other.clone());
                }
            }
        }
    }
}

/// One connection to a master: a writer task, a reader task, and the FIFO between them.
struct Connection {
    queue: mpsc::UnboundedSender<Outgoing>,
    aborted: watch::Sender<bool>,
}

impl Connection {
    fn abort(&self) {
        self.aborted.send_replace(true);
    }
}

/// The reply to one request, once it comes.
#[must_use = "a request's reply is waited for with `wait`; drop it to send without waiting"]
pub struct Pending {
    /// `None`: there was no connection to send it on.
    sent: Option<(oneshot::Receiver<Answer>, Arc<Connection>)>,
    node_timeout: Duration,
    /// When it was handed to the link: the start of its node timeout.
    pub queued_at: Instant,
}

impl Pending {
    /// Waits at most the node timeout. On a timeout the connection is aborted: it is stalled.
    /// Its watchdog would abort it too, but on a busy machine that task may run later than
    /// this one, and a request handed to the connection in between (the next batch of
    /// acquires of the same key, say) would wait out a second node timeout.
    pub async fn wait(self) -> Result<Reply, NoReply> {
        let deadline = self.timeout_at();
        let Some((rx, conn)) = self.sent else {
            return Err(NoReply::NoLink);
        };
        let result = receive(rx, deadline).await;
        if result == Err(NoReply::Timeout) {
            conn.abort();
        }
        result
    }

    /// When its node timeout runs out.
    pub fn timeout_at(&self) -> Instant {
        self.queued_at + self.node_timeout
    }

    /// The answer if it has come; otherwise `cx` is woken when it does.
    pub fn poll_answer(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Answer> {
        match &mut self.sent {
            None => std::task::Poll::Ready(Err(NoReply::NoLink)),
            Some((rx, _)) => std::future::Future::poll(std::pin::Pin::new(rx), cx)
                .map(|answer| answer.unwrap_or(Err(NoReply::Closed))),
        }
    }

    /// Gives up at the node timeout ([`Pending::timeout_at`]), aborting the connection as
    /// [`Pending::wait`] does.
    pub fn time_out(self) -> NoReply {
        if let Some((_, conn)) = self.sent {
            conn.abort();
        }
        NoReply::Timeout
    }

    /// Waits at most `limit`, leaving the connection as it is.
    pub async fn wait_at_most(self, limit: Duration) -> Result<Reply, NoReply> {
        match self.sent {
            Some((rx, _conn)) => receive(rx, Instant::now() + limit).await,
            None => Err(NoReply::NoLink),
        }
    }
}

/// The answer on `rx`, waiting until `deadline` at most.
async fn receive(rx: oneshot::Receiver<Answer>, deadline: Instant) -> Answer {
    match timeout_at(deadline, rx).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err(NoReply::Closed),
        Err(_) => Err(NoReply::Timeout),
    }
}

/// One master: its current connection, the clean-ups waiting for one, and connection counts.
pub struct Link {
    /// The master's address, for logs and `INFO`.
    pub addr: String,
    connector: Box<dyn Connect>,
    node_timeout: LiveDuration,
    current: Mutex<Option<Arc<Connection>>>,
    connected: AtomicBool,
    connects: AtomicU64,
    /// Connection attempts concluded, successful or not.
    attempts: AtomicU64,
    retired: AtomicU64,
    /// Why the last connection attempt failed, if the master refused our credentials (cleared
    /// by the next connection that succeeds).
    auth_refused: Mutex<Option<String>>,
    new_connection: Notify,
    /// Clean-ups whose connection ended before they were confirmed.
    cleanups: Mutex<VecDeque<PendingCleanup>>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("addr", &self.addr).finish()
    }
}

impl Link {
    /// A link that opens its connections with `connector` (for the masters:
    /// [`crate::dial::Dial`]); call [`Link::spawn`] to start connecting.
    pub fn with_connector(
        addr: String,
        connector: Box<dyn Connect>,
        node_timeout: LiveDuration,
    ) -> Arc<Link> {
        Arc::new(Link {
            addr,
            connector,
            node_timeout,
            current: Mutex::new(None),
            connected: AtomicBool::new(false),
            connects: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
            retired: AtomicU64::new(0),
            auth_refused: Mutex::new(None),
            new_connection: Notify::new(),
            cleanups: Mutex::new(VecDeque::new()),
        })
    }

    /// Starts the task that keeps one connection open, until `stop` becomes true.
    pub fn spawn(self: &Arc<Self>, stop: watch::Receiver<bool>) {
        tokio::spawn(supervise(self.clone(), stop));
    }

    /// Number of connections made so far (changes on every reconnect).
    pub fn connect_count(&self) -> u64 {
        self.connects.load(Ordering::Relaxed)
    }

    /// Connections aborted or lost so far.
    pub fn retired_count(&self) -> u64 {
        self.retired.load(Ordering::Relaxed)
    }

    /// Whether a usable connection exists right now.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
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

    /// Whether a connection attempt has concluded (connected, refused, timed out).
    pub fn attempted(&self) -> bool {
        self.attempts.load(Ordering::Relaxed) > 0
    }

    /// Resolves once a connection attempt has concluded.
    pub async fn wait_attempted(&self) {
        loop {
            let notified = self.new_connection.notified();
            if self.attempted() {
                return;
            }
            notified.await;
        }
    }

    /// The master's refusal of our credentials on the last attempt, while not connected.
    pub fn auth_refused(&self) -> Option<String> {
        self.auth_refused.lock().ok()?.clone()
    }

    fn set_auth_refused(&self, reason: Option<String>) {
        if let Ok(mut slot) = self.auth_refused.lock() {
            *slot = reason;
        }
    }

    /// Clean-ups not yet confirmed on any connection (for `INFO`).
    pub fn pending_cleanups(&self) -> usize {
        self.cleanups.lock().map_or(0, |p| p.len())
    }

    /// Queues `payload` (which produces `replies` replies) on the current connection, now.
    pub fn send(&self, payload: Bytes, replies: usize) -> Pending {
        self.send_payload(Payload::Commands(payload), replies)
    }

    /// Queues commands led by an `EVALSHA` (`by_sha`); if the master answers it `NOSCRIPT`,
    /// the same commands with the body (`by_body`) go out at once in their place.
    pub fn send_by_sha(&self, by_sha: Bytes, by_body: Bytes, replies: usize) -> Pending {
        self.send_payload(Payload::BySha { by_sha, by_body }, replies)
    }

    /// Queues a call of `script` by SHA1 with this request's keys and arguments; the writer
    /// merges it with the calls of `script` queued right after it (module header). The reply is
    /// what the script's reply array holds for this call.
    pub fn send_script(&self, script: Arc<SharedScript>, call: ScriptCall) -> Pending {
        let payload = Payload::Script {
            script,
            call,
            invoke_by_body: false,
        };
        self.send_payload(payload, 1)
    }

    fn send_payload(&self, payload: Payload, replies: usize) -> Pending {
        let (tx, rx) = oneshot::channel();
        let queued_at = Instant::now();
        let out = Outgoing {
            payload,
            replies,
            reply: Some(tx),
            cleanup_expires: None,
            queued_at,
        };
        let sent = self
            .usable_connection()
            .and_then(|conn| conn.queue.send(out).ok().map(|()| (rx, conn)));
        Pending {
            sent,
            node_timeout: self.node_timeout.get(),
            queued_at,
        }
    }

    /// Queues a clean-up of a write that lives at most `lives` once applied: kept across
    /// reconnects until a reply confirms it, or until `lives` from now (module header).
    pub fn send_cleanup(&self, payload: Bytes, lives: Duration) -> Pending {
        let (tx, rx) = oneshot::channel();
        let now = Instant::now();
        let out = Outgoing {
            payload: Payload::Commands(payload),
            replies: 1,
            reply: Some(tx),
            cleanup_expires: Some(now + lives),
            queued_at: now,
        };
        let conn = self.current.lock().ok().and_then(|c| c.clone());
        let sent = match conn {
            Some(conn) => match conn.queue.send(out) {
                Ok(()) => Some((rx, conn)),
                Err(mpsc::error::SendError(out)) => {
                    self.keep_unwritten(out);
                    None
                }
            },
            None => {
                self.keep_unwritten(out);
                None
            }
        };
        Pending {
            sent,
            node_timeout: self.node_timeout.get(),
            queued_at: now,
        }
    }

    /// The current connection, unless it was aborted and not yet replaced (nothing new goes
    /// on an aborted one).
    fn usable_connection(&self) -> Option<Arc<Connection>> {
        let conn = self.current.lock().ok()?.clone()?;
        let aborted = *conn.aborted.borrow();
        (!aborted).then_some(conn)
    }

    /// Keeps a request that was never written for the next connection if it is a clean-up
    /// (other requests are dropped: their callers see their channel close).
    fn keep_unwritten(&self, out: Outgoing) {
        if let (Payload::Commands(payload), Some(expires)) = (out.payload, out.cleanup_expires) {
            self.keep_cleanup(payload, expires);
        }
    }

    /// Keeps an unconfirmed clean-up for the next connection.
    fn keep_cleanup(&self, payload: Bytes, expires: Instant) {
        let Ok(mut pending) = self.cleanups.lock() else {
            return;
        };
        if pending.len() >= MAX_PENDING_CLEANUPS {
            pending.pop_front();
            tracing::warn!(master = %self.addr, "too many clean-ups pending for an unreachable master; dropped the oldest (its key expires by itself)");
        }
        pending.push_back(PendingCleanup { payload, expires });
    }

    /// Takes the pending clean-ups that have not expired, oldest first.
    fn take_cleanups(&self) -> Vec<Outgoing> {
        let now = Instant::now();
        let Ok(mut pending) = self.cleanups.lock() else {
            return Vec::new();
        };
        pending
            .drain(..)
            .filter(|p| p.expires > now)
            .map(|p| Outgoing {
                payload: Payload::Commands(p.payload),
                replies: 1,
                reply: None,
                cleanup_expires: Some(p.expires),
                queued_at: now,
            })
            .collect()
    }

    fn install(&self, conn: Option<Arc<Connection>>) {
        self.connected.store(conn.is_some(), Ordering::Relaxed);
        if let Ok(mut slot) = self.current.lock() {
            *slot = conn;
        }
    }
}

/// Why connecting failed, as far as logging goes: logged once per change, not per retry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    Unreachable,
    TimedOut,
    AuthRefused(String),
}

/// Keeps one live connection to the master, replacing it whenever it is aborted or fails.
async fn supervise(link: Arc<Link>, mut stop: watch::Receiver<bool>) {
    let mut backoff = BACKOFF_MIN;
    let mut failing: Option<Failure> = None;
    while !*stop.borrow() {
        let attempt = timeout(CONNECT_TIMEOUT, link.connector.connect()).await;
        let failure = match &attempt {
            Ok(Ok(_)) => None,
            Ok(Err(err)) => Some(
                match err.get_ref().and_then(|e| e.downcast_ref::<AuthRefused>()) {
                    Some(refused) => Failure::AuthRefused(refused.0.clone()),
                    None => Failure::Unreachable,
                },
            ),
            Err(_) => Some(Failure::TimedOut),
        };
        if let Some(failure) = &failure {
            link.set_auth_refused(match failure {
                Failure::AuthRefused(reason) => Some(reason.clone()),
                _ => None,
            });
            if failing.as_ref() != Some(failure) {
                match (failure, &attempt) {
                    (Failure::AuthRefused(reason), _) => {
                        tracing::error!(master = %link.addr, %reason, "master refused the credentials; retrying")
                    }
                    (_, Ok(Err(err))) => {
                        tracing::warn!(master = %link.addr, error = %err, "master unreachable; retrying")
                    }
                    _ => tracing::warn!(master = %link.addr, "connect timed out; retrying"),
                }
            }
        }
        match attempt {
            Ok(Ok((rd, wr))) => {
                link.connects.fetch_add(1, Ordering::Relaxed);
                link.set_auth_refused(None);
                if failing.take().is_some() {
                    tracing::info!(master = %link.addr, "master reachable again");
                }
                backoff = BACKOFF_MIN;
                let (conn, mut aborted) = start_connection(rd, wr, &link);
                // Clean-ups left by older connections go first, before anything else can.
                for out in link.take_cleanups() {
                    if let Err(mpsc::error::SendError(out)) = conn.queue.send(out) {
                        link.keep_unwritten(out);
                    }
                }
                link.install(Some(conn.clone()));
                // Counted once the connection is usable: [`Link::wait_attempted`] callers
                // send on it at once.
                link.attempts.fetch_add(1, Ordering::Relaxed);
                link.new_connection.notify_waiters();
                tokio::select! {
                    _ = aborted.wait_for(|r| *r) => {}
                    _ = stop.wait_for(|s| *s) => conn.abort(),
                }
                link.install(None);
                link.retired.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(master = %link.addr, "connection aborted");
            }
            _ => {
                link.attempts.fetch_add(1, Ordering::Relaxed);
                // Wakes [`Link::wait_attempted`] (and, harmlessly, connection waiters).
                link.new_connection.notify_waiters();
                failing = failure;
            }
        }
        tokio::select! {
            _ = sleep(backoff) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// What a connection's writer and reader share: the requests written and not yet answered,
/// oldest first, and a signal each way.
#[derive(Default)]
struct Pipe {
    in_flight: Mutex<VecDeque<InFlight>>,
    /// The writer queued a request: the reader arms its watchdog for it.
    pushed: Notify,
    /// The reader answered a request: the writer may send the calls it was holding.
    answered: Notify,
}

fn start_connection(
    rd: ReadHalf,
    wr: WriteHalf,
    link: &Arc<Link>,
) -> (Arc<Connection>, watch::Receiver<bool>) {
    let (queue, rx) = mpsc::unbounded_channel();
    let (aborted, aborted_rx) = watch::channel(false);
    let pipe = Arc::new(Pipe::default());
    let conn = Arc::new(Connection { queue, aborted });
    tokio::spawn(write_loop(
        wr,
        rx,
        pipe.clone(),
        aborted_rx.clone(),
        link.clone(),
    ));
    tokio::spawn(read_loop(rd, pipe, conn.clone(), link.clone()));
    (conn, aborted_rx)
}

/// Writes what is queued for this connection, as few writes as it can.
///
/// Lock operations ([`Payload::Script`]) are held while [`IN_FLIGHT_BEFORE_HOLDING`] earlier
/// requests on this connection are unanswered, and written as one merged call when an answer
/// comes (or when 64 are gathered, or anything else must be written). The master would run
/// them after those requests anyway, so holding them costs at most a reply's trip back; it
/// makes the merged calls as large as the load allows, and a call's fixed cost is most of what
/// a lone acquire costs a master (BENCHMARKS.md §10). Nothing waits on a connection that is
/// not loaded. A held operation's
/// node timeout counts from when it was queued (`queued_at`), so holding it can only make its
/// vote count less, never more; and a held acquire that is never written wrote nothing, so it
/// needs no clean-up (its caller sees the connection close).
async fn write_loop(
    mut wr: WriteHalf,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    pipe: Arc<Pipe>,
    mut aborted: watch::Receiver<bool>,
    link: Arc<Link>,
) {
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut merging = Merging::default();
    loop {
        // Something to write, or (while calls are held) an answer that may release them.
        let first = tokio::select! {
            biased;
            _ = aborted.wait_for(|r| *r) => break,
            next = rx.recv() => match next {
                Some(next) => Some(next),
                None => break,
            },
            _ = pipe.answered.notified(), if !merging.calls.is_empty() => None,
        };
        {
            let Ok(mut queue) = pipe.in_flight.lock() else {
                break;
            };
            let mut next = first;
            while let Some(out) = next {
                match out.payload {
                    Payload::Script {
                        script,
                        call,
                        invoke_by_body,
                    } => {
                        if !merging.takes(&script, invoke_by_body) {
                            merging.flush(&mut buf, &mut queue);
                        }
                        merging.push(script, call, invoke_by_body, out.reply, out.queued_at);
                    }
                    Payload::Commands(payload) => {
                        let cleanup = out.cleanup_expires.map(|at| (payload.clone(), at));
                        merging.flush(&mut buf, &mut queue);
                        buf.extend_from_slice(&payload);
                        queue.push_back(InFlight::one(
                            out.replies,
                            out.reply,
                            out.queued_at,
                            cleanup,
                            None,
                        ));
                    }
                    Payload::BySha { by_sha, by_body } => {
                        merging.flush(&mut buf, &mut queue);
                        buf.extend_from_slice(&by_sha);
                        queue.push_back(InFlight::one(
                            out.replies,
                            out.reply,
                            out.queued_at,
                            None,
                            Some(by_body),
                        ));
                    }
                }
                next = if buf.len() < WRITE_BATCH {
                    rx.try_recv().ok()
                } else {
                    None
                };
            }
            let hold = buf.is_empty()
                && queue.len() >= IN_FLIGHT_BEFORE_HOLDING
                && merging.calls.len() < MAX_MERGED_CALLS;
            if !hold {
                merging.flush(&mut buf, &mut queue);
            }
        }
        if buf.is_empty() {
            continue;
        }
        pipe.pushed.notify_one();
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
        link.keep_unwritten(out);
    }
}

/// The calls of one [`SharedScript`] gathered by the writer, not yet encoded.
#[derive(Default)]
struct Merging {
    script: Option<(Arc<SharedScript>, bool)>,
    calls: Vec<ScriptCall>,
    replies: Vec<Option<ReplyTo>>,
    queued_at: Option<Instant>,
}

impl Merging {
    /// Whether a call of `script` can join the calls gathered so far.
    fn takes(&self, script: &Arc<SharedScript>, by_body: bool) -> bool {
        match &self.script {
            None => true,
            Some((gathered, gathered_by_body)) => {
                Arc::ptr_eq(gathered, script)
                    && *gathered_by_body == by_body
                    && self.calls.len() < MAX_MERGED_CALLS
            }
        }
    }

    fn push(
        &mut self,
        script: Arc<SharedScript>,
        call: ScriptCall,
        by_body: bool,
        reply: Option<ReplyTo>,
        queued_at: Instant,
    ) {
        self.script.get_or_insert((script, by_body));
        self.queued_at.get_or_insert(queued_at);
        self.calls.push(call);
        self.replies.push(reply);
    }

    /// Encodes the gathered calls as one call, in flight from now on.
    fn flush(&mut self, buf: &mut BytesMut, queue: &mut VecDeque<InFlight>) {
        let (Some((script, by_body)), Some(queued_at)) =
            (self.script.take(), self.queued_at.take())
        else {
            return;
        };
        let invoke = match by_body {
            true => Invoke::Body(script.body),
            false => Invoke::Sha(&script.sha),
        };
        encode_script_call(buf, invoke, &script.shared_keys, self.calls.iter());
        let merged = MergedCalls {
            script,
            by_body,
            calls: std::mem::take(&mut self.calls),
            replies: std::mem::take(&mut self.replies),
        };
        queue.push_back(InFlight {
            replies: 1,
            got: Vec::with_capacity(1),
            to: Recipients::Merged(merged),
            cleanup: None,
            by_body: None,
            queued_at,
        });
    }
}

async fn read_loop(mut rd: ReadHalf, pipe: Arc<Pipe>, conn: Arc<Connection>, link: Arc<Link>) {
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut aborted_rx = conn.aborted.subscribe();
    let mut why = NoReply::Closed;
    loop {
        if *aborted_rx.borrow() {
            break;
        }
        let oldest = pipe
            .in_flight
            .lock()
            .ok()
            .and_then(|q| q.front().map(|p| p.queued_at));
        // Watchdog: the oldest request waited past the node timeout, so what this connection
        // still answers is late: abort it and use a fresh one. The proxy's own backlog cannot
        // trip it: fan-outs wait for a permit before any request is queued here
        // (`masters::MAX_FANOUTS`), and replies are read before the timer is looked at
        // (`biased`), so under overload requests queue outside the node timeout instead of
        // turning into a reconnect storm (found by the benchmark at 500 connections × 16).
        // It fires a millisecond before the caller's own timeout (both count from when the
        // request was handed over), so the connection is already gone when the caller gives
        // up and whatever it sends next (a queued acquire of the same key, say) goes on a
        // fresh connection instead of waiting out a second node timeout on this one.
        let node_timeout = link.node_timeout.get();
        let watchdog = oldest.map(|t| t + node_timeout.saturating_sub(Duration::from_millis(1)));
        tokio::select! {
            // Replies first: under load the watchdog must not fire while replies sit unread.
            biased;
            read = rd.read_buf(&mut buf) => {
                match read {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if !deliver(&mut buf, &pipe.in_flight, &conn.queue, &link.addr) {
                            break;
                        }
                        pipe.answered.notify_one();
                    }
                }
            }
            _ = pipe.pushed.notified() => {}
            _ = aborted_rx.changed() => {}
            _ = sleep_until(watchdog.unwrap_or_else(Instant::now)), if watchdog.is_some() => {
                why = NoReply::Timeout;
                break;
            }
        }
    }
    conn.abort();
    // Whatever is still in flight gets no reply: a timeout if the watchdog retired the
    // connection (every request on it waited behind the stalled one), closed otherwise.
    // Unconfirmed clean-ups are kept for the next connection.
    let left: Vec<InFlight> = pipe
        .in_flight
        .lock()
        .map(|mut q| q.drain(..).collect())
        .unwrap_or_default();
    for mut entry in left {
        if let Some((payload, expires)) = entry.cleanup.take() {
            link.keep_cleanup(payload, expires);
        }
        entry.answer(Err(why), &conn.queue);
    }
}

/// Decodes every complete reply in `buf` and hands each to the oldest in-flight request.
/// Returns false on a protocol error or a reply nobody asked for (the connection must close).
fn deliver(
    buf: &mut BytesMut,
    in_flight: &Mutex<VecDeque<InFlight>>,
    resend: &mpsc::UnboundedSender<Outgoing>,
    addr: &str,
) -> bool {
    loop {
        let reply = match decode_reply(buf) {
            Ok(Some(reply)) => reply,
            Ok(None) => return true,
            Err(err) => {
                tracing::warn!(master = %addr, error = %err, "closing connection");
                return false;
            }
        };
        let Ok(mut queue) = in_flight.lock() else {
            return false;
        };
        let Some(front) = queue.front_mut() else {
            tracing::warn!(master = %addr, "reply from master with no request in flight; closing connection");
            return false;
        };
        front.got.push(reply);
        if front.got.len() < front.replies {
            continue;
        }
        let Some(mut done) = queue.pop_front() else {
            return false;
        };
        drop(queue);
        let reply = if done.got.len() == 1 {
            done.got.pop().unwrap_or(Reply::Null)
        } else {
            Reply::Array(std::mem::take(&mut done.got))
        };
        done.answer(Ok(reply), resend);
    }
}

#[cfg(test)]
mod tests {
    //! Deterministic: in-memory pipes to a scripted master, and tokio's paused clock.
    use super::*;
    use crate::fake_master::{command, until, FakeMaster};
    use crate::lock::lock_script;
    use crate::on_master::LOCK_SCRIPT;

    const NODE_TIMEOUT: Duration = Duration::from_millis(500);
    /// Long enough for any number of reconnects on the paused clock.
    const LIMIT: Duration = Duration::from_secs(10);

    /// A link to `fake`, connected; it runs until the returned sender is dropped.
    async fn connected(fake: &Arc<FakeMaster>) -> (Arc<Link>, watch::Sender<bool>) {
        let link = fake.link("fake", NODE_TIMEOUT);
        let (stop, stopped) = watch::channel(false);
        link.spawn(stopped);
        until(LIMIT, || link.is_connected()).await;
        (link, stop)
    }

    fn ping() -> Bytes {
        command(&["PING"])
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_master_costs_one_node_timeout_then_a_fresh_connection_answers() {
        let fake = FakeMaster::new();
        let (link, _stop) = connected(&fake).await;
        assert_eq!(link.send(ping(), 1).wait().await, Ok(Reply::simple("PONG")));
        fake.stall();
        let asked = Instant::now();
        assert_eq!(link.send(ping(), 1).wait().await, Err(NoReply::Timeout));
        // The watchdog retires the connection a millisecond before the caller's own timeout.
        let waited = asked.elapsed();
        assert!(
            waited >= NODE_TIMEOUT - Duration::from_millis(1) && waited <= NODE_TIMEOUT,
            "{waited:?}"
        );
        assert_eq!(link.retired_count(), 1);
        fake.resume();
        until(LIMIT, || link.connect_count() == 2 && link.is_connected()).await;
        assert_eq!(link.send(ping(), 1).wait().await, Ok(Reply::simple("PONG")));
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_retires_a_stalled_connection_even_if_nobody_waits() {
        let fake = FakeMaster::new();
        let (link, _stop) = connected(&fake).await;
        fake.stall();
        drop(link.send(ping(), 1));
        tokio::time::sleep(NODE_TIMEOUT - Duration::from_millis(2)).await;
        assert_eq!(link.retired_count(), 0, "retired before the node timeout");
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(link.retired_count(), 1, "not retired at the node timeout");
    }

    #[tokio::test(start_paused = true)]
    async fn requests_behind_a_stalled_one_fail_with_it_and_none_is_answered_out_of_order() {
        let fake = FakeMaster::new();
        let (link, _stop) = connected(&fake).await;
        fake.stall();
        let first = link.send(command(&["SET", "a", "1"]), 1);
        tokio::time::sleep(NODE_TIMEOUT / 2).await;
        let second = link.send(command(&["GET", "a"]), 1);
        let (first, second) = tokio::join!(first.wait(), second.wait());
        assert_eq!(
            (first, second),
            (Err(NoReply::Timeout), Err(NoReply::Timeout))
        );
    }

    /// A link to `fake` that loaded the lock script, as the health monitor does.
    async fn loaded(fake: &Arc<FakeMaster>) -> (Arc<Link>, watch::Sender<bool>) {
        let (link, stop) = connected(fake).await;
        let load = command(&["SCRIPT", "LOAD", LOCK_SCRIPT.text()]);
        assert!(matches!(
            link.send(load, 1).wait().await,
            Ok(Reply::Bulk(_))
        ));
        (link, stop)
    }

    /// Releases of keys nobody holds (each answers 0), as the lock operations the links merge
    /// (the calls of one script, the same `Arc`, as the acquirer sends).
    fn releases(link: &Link, n: usize) -> Vec<Pending> {
        static SCRIPT: std::sync::LazyLock<Arc<SharedScript>> =
            std::sync::LazyLock::new(lock_script);
        let script = &*SCRIPT;
        (0..n)
            .map(|i| {
                let key = format!("k{i}");
                let call = ScriptCall::new(&[key.as_bytes()], &[b"r", b"v"]);
                link.send_script(script.clone(), call)
            })
            .collect()
    }

    /// Stalls `fake` and leaves two requests written to it and unanswered.
    async fn two_unanswered(fake: &FakeMaster, link: &Link) -> [Pending; 2] {
        fake.stall();
        let pings = [link.send(ping(), 1), link.send(ping(), 1)];
        tokio::time::sleep(Duration::from_millis(1)).await;
        pings
    }

    #[tokio::test(start_paused = true)]
    async fn lock_operations_behind_two_unanswered_requests_wait_and_leave_as_one_call() {
        let fake = FakeMaster::new();
        let (link, _stop) = loaded(&fake).await;
        // Not loaded: a lone operation is written at once, as its own call.
        let alone = releases(&link, 1).pop().expect("one");
        assert_eq!(alone.wait().await, Ok(Reply::Integer(0)));
        assert_eq!(fake.acquires(), 1);
        let pings = two_unanswered(&fake, &link).await;
        // What comes now is held, even across the writer's turns, and leaves as one call once
        // an answer comes.
        let mut held = Vec::new();
        for _ in 0..5 {
            held.extend(releases(&link, 1));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(NODE_TIMEOUT / 4).await;
        fake.resume();
        for pending in pings {
            assert_eq!(pending.wait().await, Ok(Reply::simple("PONG")));
        }
        for pending in held {
            assert_eq!(pending.wait().await, Ok(Reply::Integer(0)));
        }
        assert_eq!(fake.acquires(), 2, "{:?}", fake.log());
    }

    #[tokio::test(start_paused = true)]
    async fn held_lock_operations_are_never_written_once_their_connection_is_retired() {
        let fake = FakeMaster::new();
        let (link, _stop) = loaded(&fake).await;
        let pings = two_unanswered(&fake, &link).await;
        let held = releases(&link, 3);
        for pending in pings {
            assert_eq!(pending.wait().await, Err(NoReply::Timeout));
        }
        for pending in held {
            assert!(pending.wait().await.is_err());
        }
        fake.resume();
        until(LIMIT, || link.connect_count() == 2 && link.is_connected()).await;
        assert_eq!(link.send(ping(), 1).wait().await, Ok(Reply::simple("PONG")));
        assert_eq!(fake.acquires(), 0, "{:?}", fake.log());
    }

    #[tokio::test(start_paused = true)]
    async fn a_clean_up_cut_off_by_a_retirement_goes_first_on_the_next_connection() {
        let fake = FakeMaster::new();
        let (link, _stop) = connected(&fake).await;
        fake.stall();
        let cleanup = link.send_cleanup(command(&["DEL", "k"]), Duration::from_secs(30));
        assert_eq!(cleanup.wait().await, Err(NoReply::Timeout));
        assert_eq!(link.pending_cleanups(), 1);
        fake.resume();
        until(LIMIT, || {
            link.connect_count() == 2 && link.pending_cleanups() == 0
        })
        .await;
        assert_eq!(link.send(ping(), 1).wait().await, Ok(Reply::simple("PONG")));
        let second: Vec<String> = fake
            .log()
            .into_iter()
            .filter(|(conn, _)| *conn == 2)
            .map(|(_, cmd)| cmd)
            .collect();
        assert_eq!(
            second.first().map(String::as_str),
            Some("DEL k"),
            "{second:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_clean_up_is_dropped_once_the_write_it_undoes_has_expired() {
        let fake = FakeMaster::new();
        let (link, _stop) = connected(&fake).await;
        fake.set_down(true);
        until(LIMIT, || !link.is_connected()).await;
        drop(link.send_cleanup(command(&["DEL", "k"]), Duration::from_secs(1)));
        assert_eq!(link.pending_cleanups(), 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        fake.set_down(false);
        until(LIMIT, || link.is_connected()).await;
        assert_eq!(link.send(ping(), 1).wait().await, Ok(Reply::simple("PONG")));
        assert_eq!(link.pending_cleanups(), 0);
        assert!(
            fake.log().iter().all(|(_, cmd)| cmd != "DEL k"),
            "an expired clean-up was sent: {:?}",
            fake.log()
        );
    }
}
