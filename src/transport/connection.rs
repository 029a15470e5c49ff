//! One connection to a master ([`Connection`]): the queue its writer drains, its abort flag,
//! the [`Pipe`] between its writer and its reader, and what goes through it: requests queued
//! ([`Outgoing`]) and requests written, waiting for their replies ([`AwaitingReply`]).
//!
//! Invariants:
//! - A connection is started with both of its tasks ([`Connection::start`]): the writer
//!   ([`super::writer`]) and the reader ([`super::reader`]). Either one ending aborts it, and
//!   once aborted nothing new is queued on it ([`super::Link`] checks the flag) and nothing
//!   more is written.
//! - The in-flight list is the FIFO that matches replies to requests: the writer pushes a
//!   request there *before* its bytes are written, the reader pops the oldest per reply.
//! - The master's progress is noted ([`Progress`]): when its bytes last arrived, and when it
//!   last took bytes of a write that had filled the socket's buffer (a large request read
//!   slowly). Together they are the evidence the reader's liveness check asks for.

use super::merge::MergedCalls;
use super::reader::read_loop;
use super::writer::write_loop;
use super::{Link, NoReply, ReadHalf, SharedScript, WriteHalf};
use crate::protocol::{Reply, ScriptCall};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::time::Instant;

/// A request's reply, or why none will come.
pub(super) type Answer = Result<Reply, NoReply>;
/// Where a request's answer goes.
pub(super) type ReplyTo = oneshot::Sender<Answer>;

/// What a request sends.
pub(super) enum Payload {
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
pub(super) struct Outgoing {
    pub(super) payload: Payload,
    /// Replies this payload produces (one per command in it).
    pub(super) replies: usize,
    pub(super) reply: Option<ReplyTo>,
    /// Set for a clean-up: kept until a reply confirms it ran, or until this instant.
    pub(super) cleanup_expires: Option<Instant>,
    /// When the caller handed it over (and started its own node timeout).
    pub(super) queued_at: Instant,
    /// Answer only once a `WAIT` for this many replicas, written after it, has answered
    /// ([`super::Link::send_commands`]).
    pub(super) confirm: Option<u32>,
}

/// Where a written request's replies go.
pub(super) enum Recipients {
    /// One request: its replies (an array if it expects several).
    One(Option<ReplyTo>),
    /// Merged script calls: element `i` of the reply array goes to caller `i`.
    Merged(MergedCalls),
    /// A `WAIT` for `replicas` replicas, and the requests written before it that wait for it:
    /// where each one's answer was delivered, and its caller.
    Confirm {
        replicas: u32,
        requests: Vec<Unconfirmed>,
    },
}

/// A request written with a confirmation: its answer is delivered to `answered` (by the reader,
/// as any answer), and handed to `caller` once the `WAIT` after it has answered.
pub(super) struct Unconfirmed {
    pub(super) answered: oneshot::Receiver<Answer>,
    pub(super) caller: ReplyTo,
}

/// A written request waiting for its replies.
pub(super) struct AwaitingReply {
    pub(super) replies: usize,
    pub(super) got: Vec<Reply>,
    pub(super) to: Recipients,
    /// A clean-up's payload and expiry, kept for the next connection if no reply confirms it.
    pub(super) cleanup: Option<(Bytes, Instant)>,
    /// The commands to send again, with the script's body, if the first reply is `NOSCRIPT`
    /// ([`Payload::BySha`]), and the confirmation they ask for again.
    pub(super) by_body: Option<Bytes>,
    pub(super) confirm: Option<u32>,
    /// When its oldest caller handed it over.
    pub(super) queued_at: Instant,
}

impl AwaitingReply {
    /// A written request with one caller.
    pub(super) fn one(
        replies: usize,
        reply: Option<ReplyTo>,
        queued_at: Instant,
        cleanup: Option<(Bytes, Instant)>,
        by_body: Option<Bytes>,
        confirm: Option<u32>,
    ) -> AwaitingReply {
        AwaitingReply {
            replies,
            got: Vec::with_capacity(replies),
            to: Recipients::One(reply),
            cleanup,
            by_body,
            confirm,
            queued_at,
        }
    }
}

/// What a connection's writer and reader share: the requests written and not yet answered,
/// oldest first, and a signal each way.
#[derive(Default)]
pub(super) struct Pipe {
    pub(super) in_flight: Mutex<VecDeque<AwaitingReply>>,
    /// The writer queued a request: the reader arms its liveness check for it.
    pub(super) pushed: Notify,
    /// The reader answered a request: the writer may send the calls it was holding.
    pub(super) answered: Notify,
    /// When the master's bytes last arrived.
    pub(super) replies: Progress,
    /// When the master last took bytes of a write that had filled the socket's buffer.
    pub(super) drained: Progress,
}

impl Pipe {
    /// Whether the master looks unresponsive: nothing read from it for a node timeout while
    /// its oldest unanswered request waited longer than that. A request sent now would only
    /// wait out its node timeout behind that one; it is answered at once instead (a missing
    /// vote, as a timeout would be), and the connection stays for when the master answers
    /// again. A master working through its queue, however slowly, keeps sending replies.
    /// `now`: the caller's own reading of the clock (a request's hand-over time), so that
    /// the look costs no clock read of its own.
    pub(super) fn unresponsive(&self, now: Instant, node_timeout: Duration) -> bool {
        // The cheap look first: under load replies keep arriving, and the lock is not taken.
        if now < self.replies.last() + node_timeout {
            return false;
        }
        let oldest = self
            .in_flight
            .lock()
            .ok()
            .and_then(|q| q.front().map(|p| p.queued_at));
        oldest.is_some_and(|at| now >= at + node_timeout)
    }
}

/// When a connection last made one kind of progress: a master working through its queue, or
/// still reading a large request, is slow, not dead.
pub(super) struct Progress {
    opened: Instant,
    /// Milliseconds from `opened` to the last progress.
    last_ms: AtomicU64,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            opened: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }
}

impl Progress {
    /// Bytes moved at `now`.
    pub(super) fn made(&self, now: Instant) {
        let ms = now.duration_since(self.opened).as_millis() as u64;
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// When the progress was last made (the connection's opening, before any was).
    pub(super) fn last(&self) -> Instant {
        self.opened + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// One connection to a master: a writer task, a reader task, and the FIFO between them.
pub(super) struct Connection {
    pub(super) queue: mpsc::UnboundedSender<Outgoing>,
    pub(super) aborted: watch::Sender<bool>,
    /// What its writer and reader share (read here for [`Pipe::unresponsive`]).
    pub(super) pipe: Arc<Pipe>,
}

impl Connection {
    /// Starts the writer and the reader of a connection over `rd` and `wr`; also the flag
    /// that becomes true once it is aborted.
    pub(super) fn start(
        rd: ReadHalf,
        wr: WriteHalf,
        link: &Arc<Link>,
    ) -> (Arc<Connection>, watch::Receiver<bool>) {
        let (queue, rx) = mpsc::unbounded_channel();
        let (aborted, aborted_rx) = watch::channel(false);
        let pipe = Arc::new(Pipe::default());
        let conn = Arc::new(Connection {
            queue,
            aborted,
            pipe: pipe.clone(),
        });
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

    pub(super) fn abort(&self) {
        self.aborted.send_replace(true);
    }

    /// Whether it was aborted (nothing new goes on it).
    pub(super) fn is_aborted(&self) -> bool {
        *self.aborted.borrow()
    }
}
