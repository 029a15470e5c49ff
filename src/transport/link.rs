//! The link API: [`Link`], the handle every caller sends through (its current connection,
//! the clean-ups waiting for one, connection counts), and [`Pending`], one request's reply.
//!
//! Invariants:
//! - [`Link::new`] makes the handle and its [`Driver`]; nothing connects until the caller
//!   spawns the driver's future ([`Driver::run`]). Without a connection a request gets
//!   [`NoReply::NoLink`] at once, and a clean-up is kept for the next connection.
//! - Nothing new goes on an aborted connection: a request finds none until the driver
//!   installs the next one.
//! - A caller never waits longer than the node timeout for one reply, counted from when it
//!   handed the request over ([`Pending::wait`]). A timeout is a missing reply for that one
//!   request: the connection stays (slow is not dead; the reader retires it only once it stops
//!   making progress: [`super::reader`]). While the master looks unresponsive (nothing read
//!   for a node timeout, its oldest request older than that) a new request is not sent and gets
//!   [`NoReply::Unresponsive`] at once; clean-ups are still queued.

use super::cleanups::Cleanups;
use super::connection::{Answer, Connection, Outgoing, Payload};
use super::{Connect, Driver, NoReply, SharedScript};
use crate::live::LiveDuration;
use crate::protocol::{Reply, ScriptCall};
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::{timeout_at, Instant};

/// One master: its current connection, the clean-ups waiting for one, and connection counts.
/// The [`Driver`] made with it keeps it connected.
pub struct Link {
    /// The master's address, for logs and `INFO`.
    pub addr: String,
    pub(super) node_timeout: LiveDuration,
    current: Mutex<Option<Arc<Connection>>>,
    connected: AtomicBool,
    pub(super) connects: AtomicU64,
    /// Connection attempts concluded, successful or not.
    pub(super) attempts: AtomicU64,
    pub(super) retired: AtomicU64,
    /// Why the last connection attempt failed, if the master refused our credentials (cleared
    /// by the next connection that succeeds).
    auth_refused: Mutex<Option<String>>,
    /// Why the master is not connected otherwise: the last attempt's failure ("connection
    /// refused"), or the end of the last connection (cleared by the next that succeeds).
    down_reason: Mutex<Option<String>>,
    pub(super) new_connection: Notify,
    /// Clean-ups whose connection ended before they were confirmed.
    pub(super) cleanups: Cleanups,
    /// What the master acknowledged of the proxy's lock writes ([`Witness`]).
    pub witness: Witness,
    /// Judges the master's clock as each merged lock call read it ([`CallClock`]).
    pub call_clock: CallClock,
}

/// The judge of the master's clock as each merged lock call read it (docs/SAFETY.md, "Master
/// clocks: steps and rates between two looks"): installed by whoever watches the master's
/// health (none: every reading passes). It is given the master's clock (µs) the call read, and
/// when the call was handed over (no later than written) and its reply read on this proxy's
/// monotonic clock, and answers
/// whether the master's clock is ahead of what the clock rule allows (it then has the master
/// judged at once); every acquire the call answered `OK` is then not a vote.
#[derive(Default)]
pub struct CallClock(std::sync::OnceLock<Box<JudgeCallClock>>);

/// See [`CallClock`]: `(master µs, written, read) -> ahead`.
pub type JudgeCallClock = dyn Fn(u64, Instant, Instant) -> bool + Send + Sync;

impl CallClock {
    /// Installs the judge (once; a second one is ignored).
    pub fn install(&self, judge: Box<JudgeCallClock>) {
        let _ = self.0.set(judge);
    }

    /// Whether the master's clock `master_us`, read by a call handed over at `written` whose
    /// reply was read at `read`, is ahead of what the clock rule allows.
    pub(crate) fn ahead(&self, master_us: u64, written: Instant, read: Instant) -> bool {
        self.0
            .get()
            .is_some_and(|judge| judge(master_us, written, read))
    }
}

impl std::fmt::Debug for CallClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallClock")
            .field("installed", &self.0.get().is_some())
            .finish()
    }
}

/// The master's write witness as this link saw it (docs/SAFETY.md, "Acknowledged writes"): the
/// highest value of `redlock-proxy:witness` a merged lock call that took a key answered (the
/// master counts such calls in the same script, so every acquire it acknowledged here is at or
/// below it), and whether a lock write outside those calls (an extend, a lease script) was
/// acknowledged since the last such answer, which no witness value covers yet.
#[derive(Debug, Default)]
pub struct Witness {
    highest: AtomicU64,
    uncovered: AtomicBool,
}

impl Witness {
    /// A merged lock call answered `value`: it covers every write acknowledged before it.
    pub(crate) fn saw(&self, value: u64) {
        self.highest.fetch_max(value, Ordering::Relaxed);
        self.uncovered.store(false, Ordering::Relaxed);
    }

    /// A lock write outside the merged lock calls was acknowledged.
    pub fn uncovered_write(&self) {
        self.uncovered.store(true, Ordering::Relaxed);
    }

    /// The highest witness seen: what the master's must be at least, unless it lost writes it
    /// acknowledged (the floor its merged lock calls carry).
    pub fn floor(&self) -> u64 {
        self.highest.load(Ordering::Relaxed)
    }

    /// The highest witness seen, and whether a write since is not covered by one.
    pub fn acknowledged(&self) -> (u64, bool) {
        (
            self.highest.load(Ordering::Relaxed),
            self.uncovered.load(Ordering::Relaxed),
        )
    }

    /// Starts afresh from what the master holds now (after its loss was quarantined).
    pub fn reset(&self, value: u64) {
        self.highest.store(value, Ordering::Relaxed);
        self.uncovered.store(false, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("addr", &self.addr).finish()
    }
}

impl Link {
    /// A link to the master at `addr` whose connections `connector` opens (for the masters:
    /// [`crate::dial::Dial`]), and its driver: the caller spawns [`Driver::run`] to connect.
    pub fn new(
        addr: String,
        connector: Box<dyn Connect>,
        node_timeout: LiveDuration,
    ) -> (Arc<Link>, Driver) {
        let link = Arc::new(Link {
            addr,
            node_timeout,
            current: Mutex::new(None),
            connected: AtomicBool::new(false),
            connects: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
            retired: AtomicU64::new(0),
            auth_refused: Mutex::new(None),
            down_reason: Mutex::new(None),
            new_connection: Notify::new(),
            cleanups: Cleanups::default(),
            witness: Witness::default(),
            call_clock: CallClock::default(),
        });
        let driver = Driver::new(link.clone(), connector);
        (link, driver)
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

    pub(super) fn set_auth_refused(&self, reason: Option<String>) {
        if let Ok(mut slot) = self.auth_refused.lock() {
            *slot = reason;
        }
    }

    /// Why the master is not connected (other than a refusal of the credentials), while it
    /// is not: for `INFO`, `/readyz` and the status page.
    pub fn down_reason(&self) -> Option<String> {
        self.down_reason.lock().ok()?.clone()
    }

    pub(super) fn set_down_reason(&self, reason: Option<String>) {
        if let Ok(mut slot) = self.down_reason.lock() {
            *slot = reason;
        }
    }

    /// Clean-ups not yet confirmed on any connection (for `INFO`).
    pub fn pending_cleanups(&self) -> usize {
        self.cleanups.len()
    }

    /// Queues `payload` (which produces `replies` replies) on the current connection, now.
    pub fn send(&self, payload: Bytes, replies: usize) -> Pending {
        self.send_commands(payload, replies, None)
    }

    /// [`Link::send`], confirmed by `confirm` replicas if given: the answer comes once a
    /// `WAIT <confirm>` the writer puts after it on the same connection has answered, and is
    /// [`NoReply::Unconfirmed`] unless that `WAIT` counted as many replicas (one `WAIT` after
    /// each write burst serves every request in it: [`super::writer`]). So does the `confirm`
    /// of [`Link::send_by_sha`] and [`Link::send_script`].
    pub fn send_commands(&self, payload: Bytes, replies: usize, confirm: Option<u32>) -> Pending {
        self.send_payload(Payload::Commands(payload), replies, confirm)
    }

    /// Queues commands led by an `EVALSHA` (`by_sha`); if the master answers it `NOSCRIPT`,
    /// the same commands with the body (`by_body`) go out at once in their place.
    pub fn send_by_sha(
        &self,
        by_sha: Bytes,
        by_body: Bytes,
        replies: usize,
        confirm: Option<u32>,
    ) -> Pending {
        self.send_payload(Payload::BySha { by_sha, by_body }, replies, confirm)
    }

    /// Queues a call of `script` by SHA1 with this request's keys and arguments; the writer
    /// merges it with the calls of `script` queued right after it (module header). The reply is
    /// what the script's reply array holds for this call.
    pub fn send_script(
        &self,
        script: Arc<SharedScript>,
        call: ScriptCall,
        confirm: Option<u32>,
    ) -> Pending {
        let payload = Payload::Script {
            script,
            call,
            invoke_by_body: false,
        };
        self.send_payload(payload, 1, confirm)
    }

    fn send_payload(&self, payload: Payload, replies: usize, confirm: Option<u32>) -> Pending {
        let (tx, rx) = oneshot::channel();
        let queued_at = Instant::now();
        let out = Outgoing {
            payload,
            replies,
            reply: Some(tx),
            cleanup_expires: None,
            queued_at,
            confirm,
        };
        let node_timeout = self.node_timeout.get();
        let sent = match self.usable_connection() {
            None => Err(NoReply::NoLink),
            Some(conn) if conn.pipe.unresponsive(queued_at, node_timeout) => {
                Err(NoReply::Unresponsive)
            }
            Some(conn) => conn
                .queue
                .send(out)
                .map(|()| rx)
                .map_err(|_| NoReply::NoLink),
        };
        Pending {
            sent,
            node_timeout,
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
            confirm: None,
        };
        let conn = self.current.lock().ok().and_then(|c| c.clone());
        let sent = match conn {
            Some(conn) => match conn.queue.send(out) {
                Ok(()) => Ok(rx),
                Err(mpsc::error::SendError(out)) => {
                    self.cleanups.keep_unwritten(&self.addr, out);
                    Err(NoReply::NoLink)
                }
            },
            None => {
                self.cleanups.keep_unwritten(&self.addr, out);
                Err(NoReply::NoLink)
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
        (!conn.is_aborted()).then_some(conn)
    }

    /// Makes `conn` the connection new requests go on (`None`: there is none).
    pub(super) fn install(&self, conn: Option<Arc<Connection>>) {
        self.connected.store(conn.is_some(), Ordering::Relaxed);
        if let Ok(mut slot) = self.current.lock() {
            *slot = conn;
        }
    }
}

/// The reply to one request, once it comes.
#[must_use = "a request's reply is waited for with `wait`; drop it to send without waiting"]
pub struct Pending {
    /// Why it was not sent, if it was not.
    sent: Result<oneshot::Receiver<Answer>, NoReply>,
    node_timeout: Duration,
    /// When it was handed to the link: the start of its node timeout.
    pub queued_at: Instant,
}

impl Pending {
    /// Waits at most the node timeout. A timeout leaves the connection as it is: the master
    /// may be slow, not dead, and whatever else is queued on it still gets its answer.
    pub async fn wait(self) -> Result<Reply, NoReply> {
        let deadline = self.timeout_at();
        receive(self.sent?, deadline).await
    }

    /// When its node timeout runs out.
    pub fn timeout_at(&self) -> Instant {
        self.queued_at + self.node_timeout
    }

    /// The answer if it has come; otherwise `cx` is woken when it does.
    pub fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<Answer> {
        match &mut self.sent {
            Err(why) => Poll::Ready(Err(*why)),
            Ok(rx) => std::future::Future::poll(std::pin::Pin::new(rx), cx)
                .map(|answer| answer.unwrap_or(Err(NoReply::Closed))),
        }
    }

    /// Waits at most `limit`, leaving the connection as it is.
    pub async fn wait_at_most(self, limit: Duration) -> Result<Reply, NoReply> {
        receive(self.sent?, Instant::now() + limit).await
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
