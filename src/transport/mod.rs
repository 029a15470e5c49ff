//! One multiplexed, pipelined connection per master ([`Link`]): send, replies in order,
//! reconnect, liveness check, and the clean-ups that must reach the master. It knows nothing of
//! votes, health or locks; whether a master's answers count is for [`crate::masters`] to say.
//!
//! Invariants:
//! - Replies are matched to requests strictly in FIFO order on one connection. Requests are
//!   queued in the in-flight list *before* their bytes are written, so the reader always finds
//!   the request a reply belongs to. A request may expect several replies (a script followed
//!   by its guard): they are delivered together.
//! - **Slow is not dead.** A caller waits at most the node timeout for its reply; a late reply
//!   is a missing reply for that caller only, and the connection keeps serving everything
//!   queued on it. A connection is **retired** (and a fresh one dialled, with backoff) only on
//!   evidence of death: a reset or end of stream, a protocol error, or no progress of the
//!   master (no byte read, none taken of a write that filled the socket's buffer) for the
//!   [`liveness_window`] while requests are in flight. Its callers then get no
//!   reply ([`NoReply`]). What it had written may still run: a paused master (SIGSTOP, swap, a
//!   long script) runs the bytes already in its socket buffer when it resumes, even after the
//!   connection was closed or reset (checked on redis-server 7.0). The acquire protects itself
//!   against that, and against a vote read after its node timeout (a write deadline and an
//!   attempt id in its script: [`crate::lock`]).
//! - **Clean-ups** ([`Link::send_cleanup`]) survive reconnects: a clean-up goes on the current
//!   connection; one not confirmed by a reply when its connection ends is kept and written
//!   first on the next connection, until a reply confirms it. A clean-up is dropped once the
//!   write it undoes has surely expired (its lifetime from when it was first queued), however
//!   many connections it went through, and at most [`cleanups::MAX_PENDING_CLEANUPS`] are kept.
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
//! - A request sent with a confirmation ([`Link::send_commands`]) is answered only once a
//!   `WAIT` written after it on the same connection has answered: its reply if the `WAIT`
//!   counted the replicas asked for, else [`NoReply::Unconfirmed`]. The writer puts one `WAIT`
//!   after each write burst that holds such requests, for all of them; a request sent again
//!   with the script's body after `NOSCRIPT` waits for the `WAIT` after its own write.
//!
//! The byte stream comes from a [`Connect`]: TCP or TLS with its `AUTH` done in production
//! ([`crate::dial`]); the deterministic tests use in-memory pipes to a scripted master and
//! tokio's paused clock. A master that refuses the credentials is kept as
//! [`Link::auth_refused`] (for `INFO`), logged once per change of reason.
//!
//! # Layout
//! A handle and a driver, as in redis-rs's multiplexed connection: [`Link::new`] returns the
//! handle every caller sends through and the [`Driver`] that keeps it connected; the caller
//! spawns the driver's future ([`Driver::run`]). One file per concern:
//! - [`link`]: the link API, the handle ([`Link`]) and one request's reply ([`Pending`]);
//! - [`driver`]: reconnect supervision (backoff, failures logged once per change);
//! - [`connection`]: one connection, its queue, its abort flag, and what goes through it;
//! - [`writer`]: write batching, and the lock operations held to merge them;
//! - [`merge`]: script merging, and the split of a merged reply back to its callers;
//! - [`reader`]: reply reading (FIFO matching, the liveness check, `NOSCRIPT` resends);
//! - [`cleanups`]: clean-ups that survive reconnects.

mod cleanups;
mod connection;
mod driver;
mod link;
mod merge;
mod reader;
mod writer;

pub use driver::Driver;
pub use link::{CallClock, Link, Pending, Witness};

use crate::protocol::{CallBounds, Names, ScriptCall};
use futures::future::BoxFuture;
use std::io;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};

/// How long a connection with requests in flight may see no progress of its master (no byte
/// read, none of a write that filled the socket's buffer taken) before it is taken
/// for dead and replaced: twenty node timeouts, and at least a second. Long enough that a
/// master answering several node timeouts late, or reading a large request, keeps its
/// connection (its late replies are missing votes, not a reconnect); short enough that a
/// master paused or cut off is redialled within a second or two. The opening command of a new
/// connection must be answered within it too ([`crate::dial::Dial::answering_within`]).
pub fn liveness_window(node_timeout: Duration) -> Duration {
    (node_timeout * 20).max(Duration::from_secs(1))
}

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

    /// Resolves when the server behind this connector changed (a Sentinel `+switch-master`):
    /// the live connection is dropped and a new one made. Never, for a fixed address.
    fn changed(&self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::pending())
    }
}

/// Why a request got no reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoReply {
    /// There was no usable connection when it was sent.
    NoLink,
    /// No reply within the wait (the node timeout).
    Timeout,
    /// Not sent: the master left an older request unanswered past the node timeout and sent
    /// nothing since ([`connection::Pipe::unresponsive`]); this one would have timed out too.
    Unresponsive,
    /// The connection ended before the reply came.
    Closed,
    /// The reply came, but the `WAIT` after it did not count the replicas asked for
    /// ([`Link::send_commands`]).
    Unconfirmed,
}

/// A script that many requests call (see the module header): its SHA1 for the call, its body
/// for a master that lost it, and how its merged calls are laid out.
#[derive(Debug)]
pub struct SharedScript {
    pub sha: String,
    pub body: &'static str,
    /// Its calls' key names go in the arguments, counted (a Redis Cluster node's merged call,
    /// whose keys span slots: [`Names::Counted`]).
    pub names_in_argv: bool,
    /// What leads the arguments of each merged call, before the [`CallBounds`] of its
    /// acquires.
    pub floor: Floor,
    /// Its reply array ends with the master's clock (µs) as the call read it, which the link's
    /// [`CallClock`] judges before the answers are handed over (the lock script of a single
    /// master).
    pub answers_clock: bool,
}

/// The number that leads the arguments of a merged call of a [`SharedScript`], read when the
/// writer encodes the call (docs/SAFETY.md, "Acknowledged writes").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Floor {
    /// None (a Redis Cluster node's lock script: those masters keep no witness).
    None,
    /// The link's highest write witness ([`Witness::floor`]): the lock script takes no key on
    /// a master whose witness is below it.
    Witness,
    /// `0`, which every witness passes: the check off (the negative control of the tests).
    Off,
}

impl SharedScript {
    /// What leads the arguments of a merged call of `calls` on a link whose master answered
    /// `witness`: its floor, if it has one, then the bounds of its acquires; the first `.1` of
    /// the four are used.
    pub(crate) fn lead(&self, witness: &Witness, calls: &[ScriptCall]) -> ([u64; 4], usize) {
        let [deadline, earliest, life] = CallBounds::of(calls.iter()).lead();
        let floor = match self.floor {
            Floor::None => return ([deadline, earliest, life, 0], 3),
            Floor::Witness => witness.floor(),
            Floor::Off => 0,
        };
        ([floor, deadline, earliest, life], 4)
    }

    /// How its merged calls pass their key names.
    pub(crate) fn names(&self) -> Names {
        match self.names_in_argv {
            true => Names::Counted,
            false => Names::Declared,
        }
    }
}

#[cfg(test)]
mod tests {
    //! What the tests of every part of the link share: a link to a scripted master, connected
    //! (deterministic: in-memory pipes and tokio's paused clock).
    use super::Link;
    use crate::fake_master::{command, until, FakeMaster};
    use bytes::Bytes;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::sync::watch;

    pub(super) const NODE_TIMEOUT: Duration = Duration::from_millis(500);
    /// Long enough for any number of reconnects on the paused clock.
    pub(super) const LIMIT: Duration = Duration::from_secs(10);

    /// A link to `fake`, connected; it runs until the returned sender is dropped.
    pub(super) async fn connected(fake: &Arc<FakeMaster>) -> (Arc<Link>, watch::Sender<bool>) {
        let (link, driver) = fake.link("fake", NODE_TIMEOUT);
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(driver.run(stopped));
        until(LIMIT, || link.is_connected()).await;
        (link, stop)
    }

    pub(super) fn ping() -> Bytes {
        command(&["PING"])
    }
}
