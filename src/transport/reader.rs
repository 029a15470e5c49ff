//! Reply reading: a connection's reader task ([`read_loop`]) decodes the master's replies,
//! hands each to the oldest request in flight ([`deliver`], [`AwaitingReply::answer`]), and keeps
//! the liveness check that retires a dead connection.
//!
//! Invariants:
//! - Replies are matched to requests strictly in FIFO order; a request that expects several
//!   replies gets them together, as one array. A reply nobody asked for, or bytes that are not
//!   RESP, close the connection.
//! - Slow is not dead: a connection is retired only when requests are in flight and the master
//!   made no progress (no byte read from it, none of a write that filled the socket's buffer
//!   taken by it: [`super::connection::Progress`]) for the liveness window
//!   ([`super::liveness_window`]), counted from the latest progress or the oldest request's
//!   hand-over. A reply later than its caller's node timeout is a missing
//!   reply for that caller only; the connection and everything queued on it stay. Replies
//!   already read are delivered first.
//! - When the connection ends, every request still in flight gets no reply (a timeout if the
//!   liveness check retired it, closed otherwise), and its unconfirmed clean-ups are kept for
//!   the next connection.
//! - A request answered `NOSCRIPT` that can be sent with the script's body is queued again on
//!   the same connection, whether or not its caller still waits.

use super::connection::{
    Answer, AwaitingReply, Connection, Outgoing, Payload, Pipe, Recipients, ReplyTo, Unconfirmed,
};
use super::{liveness_window, Link, NoReply, ReadHalf};
use crate::protocol::{decode_reply, Reply};
use bytes::{Bytes, BytesMut};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio::sync::oneshot::error::TryRecvError;
use tokio::time::{sleep_until, Instant};

pub(super) async fn read_loop(
    mut rd: ReadHalf,
    pipe: Arc<Pipe>,
    conn: Arc<Connection>,
    link: Arc<Link>,
) {
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut aborted_rx = conn.aborted.subscribe();
    let why = loop {
        if *aborted_rx.borrow() {
            break NoReply::Closed;
        }
        let retire_at = dead_at(&pipe, &link);
        tokio::select! {
            // Replies first: the liveness check must not fire while replies sit unread.
            biased;
            read = rd.read_buf(&mut buf) => {
                match read {
                    Ok(0) | Err(_) => break NoReply::Closed,
                    Ok(_) => {
                        let now = Instant::now();
                        pipe.replies.made(now);
                        if !deliver(&mut buf, &pipe.in_flight, &conn.queue, &link, now) {
                            break NoReply::Closed;
                        }
                        pipe.answered.notify_one();
                    }
                }
            }
            _ = pipe.pushed.notified() => {}
            _ = aborted_rx.changed() => {}
            _ = sleep_until(retire_at.unwrap_or_else(Instant::now)), if retire_at.is_some() => {
                // The writer may have made progress meanwhile (a large request going out).
                if dead_at(&pipe, &link).is_some_and(|at| at <= Instant::now()) {
                    break NoReply::Timeout;
                }
            }
        }
    };
    conn.abort();
    // Whatever is still in flight gets no reply: a timeout if the liveness check retired the
    // connection (no byte moved for the liveness window), closed otherwise.
    // Unconfirmed clean-ups are kept for the next connection.
    let left: Vec<AwaitingReply> = pipe
        .in_flight
        .lock()
        .map(|mut q| q.drain(..).collect())
        .unwrap_or_default();
    for mut entry in left {
        if let Some((payload, expires)) = entry.cleanup.take() {
            link.cleanups.keep(&link.addr, payload, expires);
        }
        let now = Instant::now();
        entry.answer(Err(why), &conn.queue, &link, now);
    }
}

/// When the connection is to be taken for dead, if a request is in flight: the liveness
/// window after the latest of its two kinds of progress and the oldest request's hand-over.
///
/// Only this retires a connection; a caller's node timeout does not. A master that answers
/// late (overloaded, reading a large request, working through a long queue) is alive: dropping
/// its connection would fail every request queued on it and cost a reconnect, turning one late
/// vote into hundreds of missing ones (issue 38: 43 reconnects in 3 s to a master answering
/// 150 ms late, 70 per master while one client sent a 10 MB value). A paused or cut-off master
/// moves no byte and is retired one window after its last; the acquire protects itself against
/// the bytes it runs when it resumes (a write deadline in its script: [`crate::lock`]).
fn dead_at(pipe: &Pipe, link: &Link) -> Option<Instant> {
    let oldest = pipe
        .in_flight
        .lock()
        .ok()
        .and_then(|q| q.front().map(|p| p.queued_at))?;
    let since = oldest.max(pipe.replies.last()).max(pipe.drained.last());
    Some(since + liveness_window(link.node_timeout.get()))
}

/// Decodes every complete reply in `buf` and hands each to the oldest in-flight request.
/// Returns false on a protocol error or a reply nobody asked for (the connection must close).
fn deliver(
    buf: &mut BytesMut,
    in_flight: &Mutex<VecDeque<AwaitingReply>>,
    resend: &mpsc::UnboundedSender<Outgoing>,
    link: &Link,
    read_at: Instant,
) -> bool {
    let addr = &link.addr;
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
        done.answer(Ok(reply), resend, link, read_at);
    }
}

impl AwaitingReply {
    /// Hands over the reply (`Err`: none will come), read at `read_at`; requests the master
    /// answered `NOSCRIPT` are queued again on `resend`, with the body.
    fn answer(
        self,
        answer: Answer,
        resend: &mpsc::UnboundedSender<Outgoing>,
        link: &Link,
        read_at: Instant,
    ) {
        match self.to {
            Recipients::One(Some(tx)) => answer_one(
                tx,
                answer,
                self.replies,
                self.by_body,
                self.confirm,
                self.queued_at,
                resend,
            ),
            Recipients::One(None) => {}
            Recipients::Merged(merged) => {
                merged.answer(answer, (self.queued_at, read_at), resend, link)
            }
            Recipients::Confirm { replicas, requests } => confirm(&answer, replicas, requests),
        }
    }
}

/// Hands each request written before a `WAIT` (answered `wait`) its answer, if the `WAIT`
/// counted `replicas` replicas; else [`NoReply::Unconfirmed`]. An answer not delivered yet
/// belongs to a request sent again with the script's body after `NOSCRIPT`, after this `WAIT`,
/// with a confirmation of its own: its answer is passed on as that one settles it.
fn confirm(wait: &Answer, replicas: u32, requests: Vec<Unconfirmed>) {
    let confirmed = matches!(wait, Ok(Reply::Integer(acks)) if *acks >= i64::from(replicas));
    for Unconfirmed {
        mut answered,
        caller,
    } in requests
    {
        let answer = match answered.try_recv() {
            Ok(Ok(reply)) if confirmed => Ok(reply),
            Ok(Ok(_)) => Err(NoReply::Unconfirmed),
            Ok(Err(why)) => Err(why),
            Err(TryRecvError::Closed) => Err(NoReply::Closed),
            Err(TryRecvError::Empty) => {
                tokio::spawn(async move {
                    let _ = caller.send(answered.await.unwrap_or(Err(NoReply::Closed)));
                });
                continue;
            }
        };
        let _ = caller.send(answer);
    }
}

/// Hands one caller its reply (its `replies` replies, as an array if several), or queues its
/// commands again with the body (`by_body`) if the first reply is `NOSCRIPT`.
fn answer_one(
    tx: ReplyTo,
    answer: Answer,
    replies: usize,
    by_body: Option<Bytes>,
    confirm: Option<u32>,
    queued_at: Instant,
    resend: &mpsc::UnboundedSender<Outgoing>,
) {
    let first = match &answer {
        Ok(Reply::Array(items)) if replies > 1 => items.first(),
        Ok(reply) => Some(reply),
        Err(_) => None,
    };
    match by_body {
        Some(by_body) if first.is_some_and(|r| r.is_error_code("NOSCRIPT")) => {
            let again = Outgoing {
                payload: Payload::Commands(by_body),
                replies,
                reply: Some(tx),
                cleanup_expires: None,
                queued_at,
                // Its own `WAIT` follows it: the one after the first write cannot vouch for it.
                confirm,
            };
            // A closed queue drops the request: its caller sees the channel close.
            let _ = resend.send(again);
        }
        _ => {
            let _ = tx.send(answer);
        }
    }
}

#[cfg(test)]
mod tests {
    //! Deterministic: in-memory pipes to a scripted master, and tokio's paused clock.
    use super::super::tests::{connected, ping, LIMIT, NODE_TIMEOUT};
    use super::super::{liveness_window, NoReply};
    use crate::fake_master::{command, until, FakeMaster};
    use crate::protocol::Reply;
    use std::time::Duration;
    use tokio::time::Instant;

    #[tokio::test(start_paused = true)]
    async fn a_stalled_master_costs_its_callers_one_node_timeout_and_keeps_its_connection() {
        let fake = FakeMaster::new();
        let (link, _stop) = connected(&fake).await;
        assert_eq!(link.send(ping(), 1).wait().await, Ok(Reply::simple("PONG")));
        fake.stall();
        let asked = Instant::now();
        assert_eq!(link.send(ping(), 1).wait().await, Err(NoReply::Timeout));
        assert_eq!(asked.elapsed(), NODE_TIMEOUT);
        // Nothing read for a node timeout, the oldest request older than that: the next one is
        // not sent, and answered at once.
        let asked = Instant::now();
        assert_eq!(
            link.send(ping(), 1).wait().await,
            Err(NoReply::Unresponsive)
        );
        assert_eq!(asked.elapsed(), Duration::ZERO);
        // Slow is not dead: the connection stays, and once the master answers again its late
        // reply goes to the caller that gave up, the next one to the next caller.
        fake.set("next", "1");
        fake.resume();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            link.send(command(&["GET", "next"]), 1).wait().await,
            Ok(Reply::Bulk("1".into()))
        );
        assert_eq!((link.connect_count(), link.retired_count()), (1, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_master_answering_twice_the_node_timeout_late_votes_again_on_the_same_connection() {
        let fake = FakeMaster::new();
        let (link, _stop) = connected(&fake).await;
        // Every reply two node timeouts late, for ten requests: each one's caller gives up.
        for _ in 0..10 {
            fake.stall();
            let late = link.send(ping(), 1);
            tokio::time::sleep(2 * NODE_TIMEOUT).await;
            fake.resume();
            assert_eq!(late.wait().await, Err(NoReply::Timeout));
            // Its late reply arrives, and the next request is sent again.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // The delay ends: the next request is answered at once, on the first connection.
        let asked = Instant::now();
        assert_eq!(link.send(ping(), 1).wait().await, Ok(Reply::simple("PONG")));
        assert!(asked.elapsed() < NODE_TIMEOUT);
        assert_eq!((link.connect_count(), link.retired_count()), (1, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_moves_no_byte_for_the_liveness_window_is_retired_unasked() {
        let fake = FakeMaster::new();
        let (link, _stop) = connected(&fake).await;
        fake.stall();
        drop(link.send(ping(), 1));
        let window = liveness_window(NODE_TIMEOUT);
        tokio::time::sleep(window - Duration::from_millis(2)).await;
        assert_eq!(
            link.retired_count(),
            0,
            "retired before the liveness window"
        );
        tokio::time::sleep(Duration::from_millis(3)).await;
        assert_eq!(
            link.retired_count(),
            1,
            "not retired at the liveness window"
        );
        fake.resume();
        until(LIMIT, || link.connect_count() == 2 && link.is_connected()).await;
        assert_eq!(link.send(ping(), 1).wait().await, Ok(Reply::simple("PONG")));
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
}
