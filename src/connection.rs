//! One client connection: read requests, run them concurrently, write replies in request order.
//!
//! Invariants:
//! - Requests reach the masters in the order the client sent them. A request that has to
//!   wait its turn (an acquire queued behind another acquire of the same key) is a barrier:
//!   nothing after it is dispatched until it is answered.
//! - Every request, local or fanned out, gets a slot in `in_flight` ([`InFlight`]), so
//!   replies leave in exactly the order requests arrived, whatever order they complete in.
//! - At most `max_inflight_per_client` requests are in flight; beyond that the socket is not
//!   read (backpressure), so a deep pipeline cannot grow memory without bound.
//! - The loop never waits on the client: writing is one branch of its `select!` (socket
//!   readiness, then a non-blocking write), so while the client's socket is full the loop still
//!   drives `in_flight` (fan-outs finish and give back their permits, acquires are decided)
//!   and still reads, within the bounds here.
//! - Replies that are ready are encoded before anything is written, and written together (one
//!   write per burst) as soon as no further reply is ready, whatever is still in flight; a
//!   burst is also written early once `FLUSH_AT` bytes wait.
//! - Reply bytes waiting for the client (encoded, not yet taken by its socket) are bounded by
//!   `client_output_buffer_limit`, like Redis' `client-output-buffer-limit normal` hard limit:
//!   past it the connection is closed at once, without flushing (0 = no limit).
//! - A lock grant is handed to the socket as `OK` only if its validity deadline has not passed
//!   at that moment: checked when the reply is encoded, and again right before every write
//!   while none of its bytes has been written; otherwise it is rolled back and written as null.
//! - A grant the client was not given is rolled back, not left held until its TTL: when the
//!   connection ends (client gone, output limit, stalled close), every lease whose reply was
//!   not completely handed to the socket is rolled back, and the requests still in flight are
//!   driven to completion in the background, every lease among them rolled back. A reply
//!   completely handed to the socket is the client's and is never rolled back.
//! - A protocol error is answered with Redis' text and the connection is closed after the
//!   replies of the requests before it.
//! - Closing (`QUIT`, protocol error, end of the client's stream, shutdown) writes what is left
//!   as long as the client takes it; a client that takes nothing for `CLOSE_STALL` (1 s) is
//!   dropped, so a client that does not read cannot hold its task.

use crate::client_stream::{self, ClientStream, ReplyWriter};
use crate::commands::{self, Action, Ctx, Session};
use crate::error::ProxyError;
use crate::lease::{Lease, Outcome, Rollback};
use crate::protocol::{Protocol, Reply, RequestParser};
use crate::shared::Shared;
use bytes::{Buf, BytesMut};
use futures::future::BoxFuture;
use futures::stream::{FuturesOrdered, StreamExt};
use futures::FutureExt;
use std::collections::VecDeque;
use std::future::Future;
use std::io::ErrorKind;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;

/// Write once this much reply data is buffered, even if more replies are ready.
const FLUSH_AT: usize = 64 * 1024;
/// Read buffer headroom requested when it runs low (below [`READ_MIN`]).
const READ_CHUNK: usize = 4 * 1024;
/// Headroom below which the read buffer is grown before a read. Not on every read: the loop
/// polls a read while requests are in flight, whose arguments still point into the buffer's
/// allocation, and `reserve` would then allocate a fresh buffer for every request.
const READ_MIN: usize = 1024;
/// Buffers larger than this are released once empty (a big request must not pin memory).
const KEEP_BUFFER: usize = 64 * 1024;
/// When closing, how long a client may take none of the replies left before it is dropped.
const CLOSE_STALL: Duration = Duration::from_secs(1);
/// Request bytes buffered, and reply bytes queued, for a client that must still authenticate
/// (Redis: 1 MB of query buffer before authentication).
const UNAUTHENTICATED_BUFFER_LIMIT: u64 = 1024 * 1024;

/// A request's place in the reply order: answered already, or waiting on the masters.
enum Slot {
    Ready(Option<(Protocol, Outcome)>),
    Pending(Protocol, BoxFuture<'static, Outcome>),
}

impl Future for Slot {
    type Output = (Protocol, Outcome);
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Slot::Ready(done) => match done.take() {
                Some(out) => Poll::Ready(out),
                None => Poll::Pending,
            },
            Slot::Pending(protocol, fut) => fut.as_mut().poll(cx).map(|o| (*protocol, o)),
        }
    }
}

/// The requests in flight, in reply order: `head`, then `rest`. A lone request (the usual case
/// without pipelining) is `head`, polled directly with the connection's waker: no task
/// allocation, ready queue and per-request waker of a `FuturesOrdered`. `head` is set only
/// while `rest` is empty; a second request moves it to the front of `rest`.
#[derive(Default)]
struct InFlight {
    head: Option<Slot>,
    rest: FuturesOrdered<Slot>,
}

impl InFlight {
    fn len(&self) -> usize {
        usize::from(self.head.is_some()) + self.rest.len()
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn push(&mut self, slot: Slot) {
        if self.is_empty() {
            self.head = Some(slot);
            return;
        }
        if let Some(head) = self.head.take() {
            self.rest.push_front(head);
        }
        self.rest.push_back(slot);
    }

    /// The next reply in order, once it is ready.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<(Protocol, Outcome)>> {
        let Some(head) = &mut self.head else {
            return self.rest.poll_next_unpin(cx);
        };
        let done = std::task::ready!(Pin::new(head).poll(cx));
        self.head = None;
        Poll::Ready(Some(done))
    }

    fn next(&mut self) -> impl Future<Output = Option<(Protocol, Outcome)>> + '_ {
        std::future::poll_fn(move |cx| self.poll_next(cx))
    }

    /// Every request still in flight, in order.
    fn into_ordered(self) -> FuturesOrdered<Slot> {
        let mut rest = self.rest;
        if let Some(head) = self.head {
            rest.push_front(head);
        }
        rest
    }
}

/// What woke the connection loop.
enum Event {
    Done((Protocol, Outcome)),
    Writable(bool),
    Read(bool),
    Stop,
    Stalled,
    Idle,
    /// `CLIENT KILL`: closed at once, like Redis.
    Killed,
}

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
struct Output {
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
    fn end(&self) -> u64 {
        self.sent + self.buf.len() as u64
    }

    /// Encodes a reply. A lease is settled now: a grant whose deadline has passed is rolled
    /// back and becomes its refusal; a valid one is written as granted, re-checked at the write.
    async fn push(&mut self, protocol: Protocol, outcome: Outcome) {
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
    async fn write_now(&mut self, wr: &mut impl ReplyWriter) -> bool {
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
    fn abandon(self) {
        for rollback in self.grants.into_iter().filter_map(|g| g.rollback) {
            tokio::spawn(rollback.run());
        }
    }
}

/// Drives the requests of a closed connection to completion, so a lease granted to a client
/// that is gone is rolled back rather than left held until its TTL.
async fn abandon_in_flight(mut in_flight: FuturesOrdered<Slot>) {
    while let Some((_, outcome)) = in_flight.next().await {
        if let Outcome::Lease(Lease {
            rollback: Some(rollback),
            ..
        }) = outcome
        {
            tokio::spawn(rollback.run());
        }
    }
}

/// Answers a connection the proxy will not serve (too many clients) and closes it.
pub async fn refuse(mut stream: impl AsyncWrite + Unpin, why: ProxyError) {
    let mut out = BytesMut::new();
    Reply::from(why).encode(Protocol::Resp2, &mut out);
    // Shutdown flushes (TLS: what rustls still holds, then its close_notify).
    if stream.write_all(&out).await.is_ok() {
        let _ = stream.shutdown().await;
    }
}

/// Serves one client, with the masters and acquire service of shard `shard` (which runs on
/// the runtime this is called in), until it disconnects, sends `QUIT`, breaks the protocol,
/// does not read its replies past the output limit, or `stop` is set.
pub async fn serve(
    stream: impl ClientStream,
    shared: Arc<Shared>,
    shard: usize,
    stop: watch::Receiver<bool>,
) {
    shared.clients.fetch_add(1, Ordering::Relaxed);
    let Ok((peer, local)) = client_stream::addresses(&stream) else {
        shared.clients.fetch_sub(1, Ordering::Relaxed);
        return;
    };
    let (mut rd, mut wr) = stream.split();
    let id = shared.next_client_id();
    // Listed in `CLIENT LIST` until this task ends, however it ends.
    let registration = shared.registry.register(id, peer, local);
    let mut session = Session::new(&shared, registration.handle.clone());
    // Limits as last reloaded, fixed for the life of the connection.
    let settings = shared.settings();
    let max_inflight = settings.max_inflight_per_client;
    let output_limit = settings.client_output_buffer_limit;
    let query_limit = settings.client_query_buffer_limit;
    let over_limit = |out: &Output, session: &Session| {
        let limit = buffer_limit(session, output_limit);
        limit > 0 && out.buf.len() as u64 > limit
    };
    let idle_timeout = (settings.timeout > 0).then(|| Duration::from_secs(settings.timeout));
    let mut last_activity = Instant::now();
    let mut parser = RequestParser::new(settings.proto_max_bulk_len);
    let mut rbuf = BytesMut::new();
    let mut out = Output::default();
    let mut in_flight = InFlight::default();
    let mut closing = false;
    let mut received_at = Instant::now();
    // Requests pushed and answered so far, and the sequence number of a pending barrier.
    let (mut pushed, mut answered) = (0u64, 0u64);
    let mut barrier: Option<u64> = None;
    // Once only replies are left to write: when the client will have taken none for too long.
    let mut stall_at: Option<Instant> = None;

    'serve: loop {
        // Parse what is buffered, up to the in-flight bound, unless a barrier is pending.
        if barrier.is_some_and(|b| answered > b) {
            barrier = None;
        }
        while !closing && barrier.is_none() && in_flight.len() < max_inflight {
            parser.unauthenticated = session.user.is_none();
            let request = match parser.next(&mut rbuf) {
                Ok(Some(request)) => request,
                Ok(None) => break,
                Err(err) => {
                    let reply = ProxyError::from(err).into();
                    in_flight.push(Slot::Ready(Some((session.protocol, Outcome::Reply(reply)))));
                    closing = true;
                    break;
                }
            };
            let ctx = Ctx {
                shared: &shared,
                shard: &shared.shards[shard],
                received_at,
            };
            let action = commands::dispatch(&ctx, &mut session, request);
            // The protocol in force once the command ran, as in Redis: `HELLO 3` is answered
            // in RESP3, a request pipelined before it in RESP2.
            let protocol = session.protocol;
            let slot = match action {
                Action::Ready(reply) => Slot::Ready(Some((protocol, Outcome::Reply(reply)))),
                Action::Close(reply) => {
                    closing = true;
                    Slot::Ready(Some((protocol, Outcome::Reply(reply))))
                }
                Action::Defer(fut) => Slot::Pending(protocol, fut),
                Action::Barrier(fut) => {
                    barrier = Some(pushed);
                    Slot::Pending(protocol, fut)
                }
            };
            in_flight.push(slot);
            pushed += 1;
        }
        if rbuf.is_empty() && rbuf.capacity() > KEEP_BUFFER {
            rbuf = BytesMut::new();
        }
        if closing && in_flight.is_empty() && out.buf.is_empty() && !wr.has_buffered() {
            break;
        }
        closing |= *stop.borrow();
        let can_read = !closing && barrier.is_none() && in_flight.len() < max_inflight;
        let only_writes_left = closing && in_flight.is_empty();
        // Read from the clock only once closing: not on every turn of the loop.
        let stall_deadline =
            only_writes_left.then(|| *stall_at.get_or_insert_with(|| Instant::now() + CLOSE_STALL));
        // Idle: nothing in flight, nothing to write, nothing read for `timeout` (Redis'
        // `clientsCronHandleTimeout`).
        let idle = !closing && in_flight.is_empty() && out.buf.is_empty();
        let idle_deadline = idle_timeout.map(|t| last_activity + t);
        let event = tokio::select! {
            biased;
            Some(done) = in_flight.next(), if !in_flight.is_empty() => Event::Done(done),
            ready = wr.ready(), if !out.buf.is_empty() || wr.has_buffered() => Event::Writable(ready.is_ok()),
            read = read_more(&mut rd, &mut rbuf), if can_read => Event::Read(read),
            _ = registration.handle.stopped(), if !closing => Event::Stop,
            _ = sleep_until_some(stall_deadline), if only_writes_left => Event::Stalled,
            _ = sleep_until_some(idle_deadline), if idle => Event::Idle,
            _ = registration.handle.killed() => Event::Killed,
        };
        let write = match event {
            Event::Done(done) => {
                let mut next = Some(done);
                while let Some((protocol, outcome)) = next.take() {
                    answered += 1;
                    out.push(protocol, outcome).await;
                    // Mid-burst, write early what has piled up (and, before judging the limit,
                    // what the socket takes now).
                    if (out.buf.len() >= FLUSH_AT || over_limit(&out, &session))
                        && !out.write_now(&mut wr).await
                    {
                        break 'serve;
                    }
                    if over_limit(&out, &session) {
                        tracing::warn!(
                            client = session.client.id,
                            peer = %session.client.peer,
                            queued_bytes = out.buf.len(),
                            limit = output_limit,
                            "client does not read its replies: output buffer limit reached, closing the connection"
                        );
                        break 'serve;
                    }
                    // The replies complete already join this burst. Polled without the task's
                    // waker: the `select!` polls `in_flight` again, with it, before waiting.
                    next = in_flight.next().now_or_never().flatten();
                }
                // No further reply is ready: the burst is written now, not on another turn of
                // the loop.
                true
            }
            Event::Writable(ready) => {
                if !ready {
                    break;
                }
                out.blocked = false;
                true
            }
            Event::Read(read) => {
                received_at = Instant::now();
                last_activity = received_at;
                if !read {
                    closing = true;
                }
                let limit = buffer_limit(&session, query_limit);
                if rbuf.len() as u64 > limit {
                    // Redis closes such a client without a reply.
                    tracing::warn!(
                        client = session.client.id,
                        peer = %session.client.peer,
                        query_buffer_bytes = rbuf.len(),
                        limit,
                        "closing client that reached max query buffer length"
                    );
                    break;
                }
                false
            }
            Event::Idle => {
                tracing::info!(client = session.client.id, peer = %session.client.peer, "closing idle client");
                break;
            }
            Event::Stop => {
                closing = true;
                false
            }
            Event::Stalled | Event::Killed => break,
        };
        if write {
            let sent = out.sent;
            if !out.write_now(&mut wr).await {
                break;
            }
            if out.sent > sent {
                stall_at = None;
                if idle_timeout.is_some() {
                    last_activity = Instant::now();
                }
            }
        }
    }
    // Whatever was not handed to the socket is dropped with the connection: the grants in it
    // and those still in flight are rolled back.
    out.abandon();
    if !in_flight.is_empty() {
        tokio::spawn(abandon_in_flight(in_flight.into_ordered()));
    }
    shared.clients.fetch_sub(1, Ordering::Relaxed);
}

/// A buffer limit for `session`: `authenticated` once it is, else
/// [`UNAUTHENTICATED_BUFFER_LIMIT`]. Before authentication a client gets only short errors,
/// and Redis caps what it may buffer far lower (CVE-2021-32675, CVE-2025-21605).
fn buffer_limit(session: &Session, authenticated: u64) -> u64 {
    if session.user.is_none() {
        UNAUTHENTICATED_BUFFER_LIMIT
    } else {
        authenticated
    }
}

/// Sleeps until `deadline`, or forever without one. Lazy: a branch of the loop's `select!`
/// that is disabled builds no timer (`select!` evaluates every branch's future).
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Reads more bytes; false at end of stream or on error.
async fn read_more(rd: &mut (impl AsyncRead + Unpin), buf: &mut BytesMut) -> bool {
    if buf.capacity() - buf.len() < READ_MIN {
        buf.reserve(READ_CHUNK);
    }
    matches!(rd.read_buf(buf).await, Ok(n) if n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::sync::atomic::AtomicUsize;

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
    async fn replies_leave_in_request_order_whatever_order_they_complete_in() {
        let reply = |text: &'static str| Outcome::Reply(Reply::simple(text));
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let mut in_flight = InFlight::default();
        // Alone, the first request is the head; the next ones move it to the front of the rest.
        in_flight.push(Slot::Pending(
            Protocol::Resp2,
            Box::pin(async move {
                let _ = released.await;
                reply("first")
            }),
        ));
        in_flight.push(Slot::Ready(Some((Protocol::Resp2, reply("second")))));
        in_flight.push(Slot::Pending(
            Protocol::Resp2,
            Box::pin(async move { reply("third") }),
        ));
        assert_eq!(in_flight.len(), 3);
        assert!(
            in_flight.next().now_or_never().is_none(),
            "the first is not done"
        );
        release.send(()).unwrap();
        let mut order = Vec::new();
        while let Some((_, Outcome::Reply(Reply::Simple(text)))) = in_flight.next().await {
            order.push(text);
        }
        assert_eq!(order, ["first", "second", "third"]);
        assert!(in_flight.is_empty());
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
