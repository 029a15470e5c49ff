//! The replies of one connection between encoding and the socket ([`Output`]): the encoded
//! bytes, and the lock grants among them until each is completely handed to the socket.
//!
//! Invariants:
//! - A lock grant is handed to the socket as `OK` only if its validity deadline has not passed
//!   at that moment: checked when the reply is encoded ([`Output::push`]), and again right
//!   before every write while none of its bytes has been written ([`Output::write_now`]);
//!   otherwise it is rolled back and written as null.
//! - A reply completely handed to the socket is the client's and is never rolled back; every
//!   grant not completely handed to the socket when the connection ends is rolled back
//!   ([`Output::abandon`]), not left held until its TTL.
//! - Writing never waits on the client: [`Output::write_now`] hands the socket what it takes
//!   now and notes when it is full ([`Output::unblock`] once it is writable again).

use super::KEEP_BUFFER;
use crate::client_stream::ReplyWriter;
use crate::lease::{Lease, Outcome, Rollback};
use crate::protocol::{Protocol, Reply};
use bytes::{Buf, BytesMut};
use futures::future::BoxFuture;
use std::collections::VecDeque;
use std::io::ErrorKind;
use tokio::time::Instant;

/// A granted lease whose `OK` is encoded in [`Output::buf`] but not completely handed to the
/// socket yet.
struct Grant {
    /// Where the reply lies in the connection's output stream (byte offsets from its start).
    start: u64,
    end: u64,
    deadline: Instant,
    /// The reply written instead if the deadline passes before the first byte is written, and
    /// its protocol: encoded only then (rarely), not for every grant.
    expired: (Protocol, Reply),
    rollback: Option<Box<dyn Rollback>>,
}

/// Replies encoded and not yet handed to the socket, and the grants among them.
#[derive(Default)]
pub(super) struct Output {
    buf: BytesMut,
    /// Bytes handed to the socket so far: the stream offset of `buf[0]`.
    sent: u64,
    /// In stream order; a grant leaves once its last byte is handed to the socket.
    grants: VecDeque<Grant>,
    /// No grant whose first byte is still unwritten expires before this.
    recheck_at: Option<Instant>,
    /// The last write found the socket full: wait for it to become writable.
    blocked: bool,
}

impl Output {
    /// Bytes encoded and not yet handed to the socket.
    pub(super) fn len(&self) -> usize {
        self.buf.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Bytes handed to the socket so far.
    pub(super) fn sent(&self) -> u64 {
        self.sent
    }

    /// The socket became writable again.
    pub(super) fn unblock(&mut self) {
        self.blocked = false;
    }

    fn end(&self) -> u64 {
        self.sent + self.buf.len() as u64
    }

    /// Encodes a reply that promises nothing (a pub/sub message).
    pub(super) fn encode(&mut self, protocol: Protocol, reply: &Reply) {
        reply.encode(protocol, &mut self.buf);
    }

    /// Encodes a reply. A lease is settled now: a grant whose deadline has passed is rolled
    /// back and becomes its refusal; a valid one is written as granted, re-checked at the write.
    pub(super) async fn push(&mut self, protocol: Protocol, outcome: Outcome) {
        let lease = match outcome {
            Outcome::Reply(reply) => return reply.encode(protocol, &mut self.buf),
            Outcome::Lease(lease) => lease,
        };
        // One clock read: the validity check and the validity the reply states agree.
        let now = Instant::now();
        if now >= lease.deadline {
            return lease.settle().await.encode(protocol, &mut self.buf);
        }
        let Lease {
            deadline,
            granted,
            expired,
            rollback,
        } = lease;
        let start = self.end();
        granted.reply(now, deadline).encode(protocol, &mut self.buf);
        self.recheck_at = Some(self.recheck_at.map_or(deadline, |at| at.min(deadline)));
        self.grants.push_back(Grant {
            start,
            end: self.end(),
            deadline,
            expired: (protocol, expired),
            rollback,
        });
    }

    /// The validity re-check right before a write: every grant none of whose bytes was handed
    /// to the socket yet and whose deadline has passed is replaced, in place, by its refusal.
    /// Returns their rollbacks, to be run before the refusals are written.
    fn expire_stale(&mut self, now: Instant) -> Vec<BoxFuture<'static, ()>> {
        let mut rollbacks = Vec::new();
        if self.recheck_at.is_none_or(|at| now < at) {
            return rollbacks;
        }
        let base = self.sent;
        let old = std::mem::take(&mut self.buf);
        // Bytes of `old` before stream offset `copied` are in `self.buf` already (rewritten).
        let mut copied = base;
        let mut recheck_at: Option<Instant> = None;
        let mut kept = VecDeque::with_capacity(self.grants.len());
        for mut grant in std::mem::take(&mut self.grants) {
            let unstarted = grant.start >= base;
            if unstarted && grant.deadline <= now {
                self.buf.extend_from_slice(
                    &old[(copied - base) as usize..(grant.start - base) as usize],
                );
                let (protocol, refusal) = &grant.expired;
                refusal.encode(*protocol, &mut self.buf);
                copied = grant.end;
                rollbacks.extend(grant.rollback.take().map(Rollback::run));
                continue;
            }
            // Offsets at or after `copied` move by what the replacements so far changed.
            let moved = |at: u64| at - copied + base + self.buf.len() as u64;
            if unstarted {
                grant.start = moved(grant.start);
                recheck_at = Some(recheck_at.map_or(grant.deadline, |at| at.min(grant.deadline)));
            }
            grant.end = moved(grant.end);
            kept.push_back(grant);
        }
        self.buf.extend_from_slice(&old[(copied - base) as usize..]);
        self.grants = kept;
        self.recheck_at = recheck_at;
        rollbacks
    }

    /// Gives back the buffer's memory if nothing is in it (a client that will wait long: a
    /// blocked pop).
    pub(super) fn release_if_empty(&mut self) {
        if self.buf.is_empty() && self.buf.capacity() > 0 {
            self.buf = BytesMut::new();
        }
    }

    /// `n` more bytes were handed to the socket: a grant written completely is the client's.
    fn advance(&mut self, n: usize) {
        self.buf.advance(n);
        self.sent += n as u64;
        while self.grants.front().is_some_and(|g| g.end <= self.sent) {
            self.grants.pop_front();
        }
        if self.buf.is_empty() && self.buf.capacity() > KEEP_BUFFER {
            self.buf = BytesMut::new();
        }
    }

    /// Hands the socket what it takes now, without waiting for it; false if the client is gone.
    pub(super) async fn write_now(&mut self, wr: &mut impl ReplyWriter) -> bool {
        while !self.buf.is_empty() && !self.blocked {
            let rollbacks = self.expire_stale(Instant::now());
            if !rollbacks.is_empty() {
                // Rolled back before its refusal is written; then check again (time passed).
                futures::future::join_all(rollbacks).await;
                continue;
            }
            match wr.try_write(&self.buf) {
                Ok(0) => return false,
                Ok(n) => self.advance(n),
                Err(err) if err.kind() == ErrorKind::WouldBlock => self.blocked = true,
                Err(err) if err.kind() == ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        true
    }

    /// The connection ends with these bytes unwritten: roll back every grant among them.
    pub(super) fn abandon(self) {
        for rollback in self.grants.into_iter().filter_map(|g| g.rollback) {
            tokio::spawn(rollback.run());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    fn lease(deadline: Instant, rolled_back: &Arc<AtomicUsize>) -> Outcome {
        let rolled_back = rolled_back.clone();
        Outcome::Lease(Lease {
            deadline,
            granted: crate::lease::Granted::Reply(Reply::ok()),
            expired: Reply::Null,
            rollback: Some(Box::new(async move {
                rolled_back.fetch_add(1, Ordering::Relaxed);
            })),
        })
    }

    fn text(out: &Output) -> String {
        String::from_utf8_lossy(&out.buf).into_owned()
    }

    #[tokio::test]
    async fn a_grant_is_rechecked_at_the_write_and_refused_in_place_once_expired() {
        let rolled_back = Arc::new(AtomicUsize::new(0));
        let now = Instant::now();
        let (soon, later) = (
            now + Duration::from_secs(1),
            now + Duration::from_secs(3600),
        );
        let mut out = Output::default();
        let echo = |s: &str| Outcome::Reply(Reply::Bulk(Bytes::copy_from_slice(s.as_bytes())));
        out.push(Protocol::Resp2, echo("ab")).await;
        out.push(Protocol::Resp2, lease(later, &rolled_back)).await;
        out.push(Protocol::Resp2, lease(soon, &rolled_back)).await;
        out.push(Protocol::Resp3, lease(soon, &rolled_back)).await;
        out.push(Protocol::Resp2, lease(later, &rolled_back)).await;
        assert_eq!(text(&out), "$2\r\nab\r\n+OK\r\n+OK\r\n+OK\r\n+OK\r\n");
        // Nothing expired yet: nothing changes.
        assert!(out.expire_stale(now).is_empty());
        assert_eq!(out.grants.len(), 4);
        // The first grant is partly written: it is the client's whatever happens next.
        out.advance(8 + 2);
        assert_eq!(out.sent, 10);
        let rollbacks = out.expire_stale(soon);
        assert_eq!(rollbacks.len(), 2);
        futures::future::join_all(rollbacks).await;
        assert_eq!(rolled_back.load(Ordering::Relaxed), 2);
        assert_eq!(text(&out), "K\r\n$-1\r\n_\r\n+OK\r\n");
        let spans: Vec<(u64, u64)> = out.grants.iter().map(|g| (g.start, g.end)).collect();
        assert_eq!(spans, vec![(8, 13), (21, 26)]);
        assert_eq!(out.recheck_at, Some(later));
        // Written completely: no longer rolled back when the connection ends.
        out.advance(out.buf.len() - 5);
        assert_eq!(out.grants.len(), 1);
        out.advance(5);
        assert!(out.grants.is_empty() && out.buf.is_empty());
    }

    #[tokio::test]
    async fn an_expired_lease_is_rolled_back_before_its_refusal_is_encoded() {
        let rolled_back = Arc::new(AtomicUsize::new(0));
        let mut out = Output::default();
        out.push(Protocol::Resp3, lease(Instant::now(), &rolled_back))
            .await;
        assert_eq!(rolled_back.load(Ordering::Relaxed), 1);
        assert_eq!(text(&out), "_\r\n");
        assert!(out.grants.is_empty());
    }
}
