//! Reconnect supervision: the [`Driver`] of a [`Link`], whose future ([`Driver::run`]) keeps
//! one live connection to the master, replacing it whenever it is aborted or fails, until told
//! to stop. The handle/driver split follows redis-rs's multiplexed connection: [`Link::new`]
//! returns both, and the caller spawns the driver's future.
//!
//! Invariants:
//! - One connection at a time: the next attempt starts only once the current connection is
//!   aborted (by its reader, its writer, a caller's timeout, or the stop), and after a backoff
//!   that doubles from [`BACKOFF_MIN`] to [`BACKOFF_MAX`] while attempts fail.
//! - The clean-ups left by older connections are queued first on a new connection, before it
//!   is installed for anyone else to send on.
//! - A connection attempt is counted ([`Link::attempted`]) once its connection is usable, so a
//!   waiter woken by it can send at once.
//! - A failure is logged once per change of reason, not per retry; a refusal of the
//!   credentials is kept for `INFO` ([`Link::auth_refused`]) until a connection succeeds, and
//!   so is any other reason the master is not connected ([`Link::down_reason`]).

use super::connection::Connection;
use super::{AuthRefused, Connect, Link, ReadHalf, WriteHalf};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep, timeout};

/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Why connecting failed, as far as logging goes: logged once per change, not per retry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    Unreachable,
    TimedOut,
    AuthRefused(String),
}

impl Failure {
    /// The failure of a connector's error.
    fn of(err: &io::Error) -> Failure {
        match err.get_ref().and_then(|e| e.downcast_ref::<AuthRefused>()) {
            Some(refused) => Failure::AuthRefused(refused.0.clone()),
            None => Failure::Unreachable,
        }
    }
}

/// An I/O error as a person reads it in a state: "connection refused", without the
/// `(os error 111)` that `io::Error` adds and with a lower-case start.
fn plain_reason(err: &io::Error) -> String {
    let text = err.to_string();
    let text = match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => &text[..at],
        _ => &text,
    };
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_lowercase().chain(chars).collect()
    })
}

/// What keeps a [`Link`] connected: its connector, and the link whose state it updates.
pub struct Driver {
    link: Arc<Link>,
    connector: Box<dyn Connect>,
}

impl Driver {
    pub(super) fn new(link: Arc<Link>, connector: Box<dyn Connect>) -> Driver {
        Driver { link, connector }
    }

    /// Keeps one live connection to the master, replacing it whenever it is aborted or fails,
    /// until `stop` becomes true.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let link = &self.link;
        let mut backoff = BACKOFF_MIN;
        let mut failing: Option<Failure> = None;
        while !*stop.borrow() {
            let attempt = timeout(CONNECT_TIMEOUT, self.connector.connect()).await;
            // A master that took the connection but did not answer its opening command within
            // the liveness window ([`crate::dial`]) is retried as one whose connection the
            // liveness check retired: after the shortest backoff, so that a link healed after a
            // cut that still accepted connections votes again at once.
            let unanswered =
                matches!(&attempt, Ok(Err(err)) if err.kind() == io::ErrorKind::TimedOut);
            if unanswered {
                backoff = BACKOFF_MIN;
            }
            match attempt {
                Ok(Ok((rd, wr))) => {
                    link.connects.fetch_add(1, Ordering::Relaxed);
                    link.set_auth_refused(None);
                    link.set_down_reason(None);
                    if failing.take().is_some() {
                        tracing::info!(master = %link.addr, "master reachable again");
                    }
                    backoff = BACKOFF_MIN;
                    self.serve(rd, wr, &mut stop).await;
                }
                Ok(Err(err)) => self.failed(Failure::of(&err), Some(&err), &mut failing),
                Err(_) => self.failed(Failure::TimedOut, None, &mut failing),
            }
            tokio::select! {
                _ = sleep(backoff) => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            if !unanswered {
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }

    /// Installs a connection over `rd` and `wr` and waits until it is aborted, or `stop`
    /// (which aborts it); then it is retired.
    async fn serve(&self, rd: ReadHalf, wr: WriteHalf, stop: &mut watch::Receiver<bool>) {
        let link = &self.link;
        let (conn, mut aborted) = Connection::start(rd, wr, link);
        // Clean-ups left by older connections go first, before anything else can.
        for out in link.cleanups.take() {
            if let Err(mpsc::error::SendError(out)) = conn.queue.send(out) {
                link.cleanups.keep_unwritten(&link.addr, out);
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
            _ = self.connector.changed() => {
                tracing::info!(master = %link.addr, "the master moved: reconnecting");
                conn.abort();
            }
        }
        link.install(None);
        link.set_down_reason(Some("connection lost".into()));
        link.retired.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(master = %link.addr, "connection aborted");
    }

    /// Records a failed attempt (`err`: the connector's error, `None` if it timed out), logged
    /// only if the reason differs from the previous attempt's (`failing`, updated).
    fn failed(&self, failure: Failure, err: Option<&io::Error>, failing: &mut Option<Failure>) {
        let link = &self.link;
        link.set_auth_refused(match &failure {
            Failure::AuthRefused(reason) => Some(reason.clone()),
            _ => None,
        });
        link.set_down_reason(match (&failure, err) {
            (Failure::AuthRefused(_), _) => None,
            (_, Some(err)) => Some(plain_reason(err)),
            (_, None) => Some(format!(
                "connect timed out after {} s",
                CONNECT_TIMEOUT.as_secs()
            )),
        });
        if failing.as_ref() != Some(&failure) {
            match (&failure, err) {
                (Failure::AuthRefused(reason), _) => {
                    tracing::error!(master = %link.addr, %reason, "master refused the credentials; retrying")
                }
                (_, Some(err)) => {
                    tracing::warn!(master = %link.addr, error = %err, "master unreachable; retrying")
                }
                _ => tracing::warn!(master = %link.addr, "connect timed out; retrying"),
            }
        }
        link.attempts.fetch_add(1, Ordering::Relaxed);
        // Wakes [`Link::wait_attempted`] (and, harmlessly, connection waiters).
        link.new_connection.notify_waiters();
        *failing = Some(failure);
    }
}
