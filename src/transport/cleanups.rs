//! Clean-ups that survive reconnects ([`Cleanups`]): the clean-ups of a link whose connection
//! ended before a reply confirmed them, kept for the next connection.
//!
//! Invariants:
//! - A clean-up is kept until a reply confirms it: one never written, or written and not
//!   answered when its connection ends, is kept here, and the driver queues every kept one
//!   first on the next connection, before anything else can go there.
//! - A clean-up is dropped once the write it undoes has surely expired (its lifetime from when
//!   it was first queued), however many connections it went through.
//! - At most [`MAX_PENDING_CLEANUPS`] are kept; beyond, the oldest is dropped with a warning.

use super::connection::{Outgoing, Payload};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Mutex;
use tokio::time::Instant;

/// Most clean-ups kept for a master that cannot be reached. Each undoes one refused acquire's
/// write and dies with its lease; beyond this many, the oldest is dropped (with a warning): a
/// dropped clean-up can only leave a key that nobody was granted until it expires.
pub const MAX_PENDING_CLEANUPS: usize = 100_000;

/// A clean-up that has not been confirmed yet.
struct PendingCleanup {
    payload: Bytes,
    /// Dropped after this instant: the write it undoes has expired by then.
    expires: Instant,
}

/// The clean-ups of one link whose connection ended before they were confirmed, oldest first.
#[derive(Default)]
pub(super) struct Cleanups {
    pending: Mutex<VecDeque<PendingCleanup>>,
}

impl Cleanups {
    /// How many are kept.
    pub(super) fn len(&self) -> usize {
        self.pending.lock().map_or(0, |p| p.len())
    }

    /// Keeps a request that was never written if it is a clean-up (other requests are
    /// dropped: their callers see their channel close). `addr` names the master in the log.
    pub(super) fn keep_unwritten(&self, addr: &str, out: Outgoing) {
        if let (Payload::Commands(payload), Some(expires)) = (out.payload, out.cleanup_expires) {
            self.keep(addr, payload, expires);
        }
    }

    /// Keeps an unconfirmed clean-up for the next connection.
    pub(super) fn keep(&self, addr: &str, payload: Bytes, expires: Instant) {
        let Ok(mut pending) = self.pending.lock() else {
            return;
        };
        if pending.len() >= MAX_PENDING_CLEANUPS {
            pending.pop_front();
            tracing::warn!(master = %addr, "too many clean-ups pending for an unreachable master; dropped the oldest (its key expires by itself)");
        }
        pending.push_back(PendingCleanup { payload, expires });
    }

    /// Takes the kept clean-ups that have not expired, oldest first, as requests nobody waits
    /// for.
    pub(super) fn take(&self) -> Vec<Outgoing> {
        let now = Instant::now();
        let Ok(mut pending) = self.pending.lock() else {
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
                confirm: None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    //! Deterministic: in-memory pipes to a scripted master, and tokio's paused clock.
    use super::super::tests::{connected, ping, LIMIT};
    use super::super::NoReply;
    use crate::fake_master::{command, until, FakeMaster};
    use crate::protocol::Reply;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_clean_up_cut_off_by_a_retirement_goes_first_on_the_next_connection() {
        let fake = FakeMaster::new();
        let (link, _stop) = connected(&fake).await;
        fake.stall();
        let cleanup = link.send_cleanup(command(&["DEL", "k"]), Duration::from_secs(30));
        assert_eq!(cleanup.wait().await, Err(NoReply::Timeout));
        // Its caller gave up, but the connection is retired only once no byte moved for the
        // liveness window: then the unconfirmed clean-up is kept for the next one.
        until(LIMIT, || link.retired_count() == 1).await;
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
