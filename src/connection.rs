//! One client connection: read requests, run them concurrently, write replies in request order.
//!
//! Invariants:
//! - Requests reach the masters in the order the client sent them. A request that has to
//!   wait its turn (an acquire queued behind another acquire of the same key) is a barrier:
//!   nothing after it is dispatched until it is answered.
//! - Every request, local or fanned out, gets a slot in `in_flight` (a `FuturesOrdered`), so
//!   replies leave in exactly the order requests arrived, whatever order they complete in.
//! - At most `max_inflight_per_client` requests are in flight; beyond that the socket is not
//!   read (backpressure), so a deep pipeline cannot grow memory without bound. A client that
//!   does not read its replies blocks our writes, which stops our reads the same way.
//! - Replies are gathered and written once per burst (when nothing else is ready).
//! - A lock grant is written as `OK` only if its validity deadline has not passed at the moment
//!   of writing; otherwise it is rolled back and written as null.
//! - A protocol error is answered with Redis' text and the connection is closed after the
//!   replies of the requests before it.

use crate::commands::{self, Action, Ctx, Outcome, Session};
use crate::protocol::{Protocol, Reply, RequestParser};
use crate::server::Shared;
use bytes::BytesMut;
use futures::future::BoxFuture;
use futures::stream::{FuturesOrdered, StreamExt};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

/// Write once this much reply data is buffered, even if more replies are ready.
const FLUSH_AT: usize = 64 * 1024;
/// Read buffer headroom requested before each read.
const READ_CHUNK: usize = 4 * 1024;
/// Buffers larger than this are released once empty (a big request must not pin memory).
const KEEP_BUFFER: usize = 64 * 1024;

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

/// What woke the connection loop.
enum Event {
    Done((Protocol, Outcome)),
    Read(bool),
    Stop,
}

/// Answers a connection the proxy will not serve (too many clients) and closes it.
pub async fn refuse(mut stream: TcpStream, message: &str) {
    let mut out = BytesMut::new();
    Reply::error(message).encode(Protocol::Resp2, &mut out);
    let _ = stream.write_all(&out).await;
}

/// Serves one client until it disconnects, sends `QUIT`, breaks the protocol, or `stop` is set.
pub async fn serve(stream: TcpStream, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    shared.clients.fetch_add(1, Ordering::Relaxed);
    let _ = stream.set_nodelay(true);
    let (Ok(peer), Ok(local)) = (stream.peer_addr(), stream.local_addr()) else {
        shared.clients.fetch_sub(1, Ordering::Relaxed);
        return;
    };
    let (mut rd, mut wr) = stream.into_split();
    let mut session = Session {
        id: shared.next_client_id(),
        protocol: Protocol::Resp2,
        name: None,
        lib_name: None,
        lib_ver: None,
        peer,
        local,
    };
    let max_inflight = shared.config.max_inflight_per_client;
    let mut parser = RequestParser::new(shared.config.proto_max_bulk_len);
    let mut rbuf = BytesMut::new();
    let mut wbuf = BytesMut::new();
    let mut in_flight: FuturesOrdered<Slot> = FuturesOrdered::new();
    let mut closing = false;
    let mut received_at = Instant::now();
    // Requests pushed and answered so far, and the sequence number of a pending barrier.
    let (mut pushed, mut answered) = (0u64, 0u64);
    let mut barrier: Option<u64> = None;

    loop {
        // Parse what is buffered, up to the in-flight bound, unless a barrier is pending.
        if barrier.is_some_and(|b| answered > b) {
            barrier = None;
        }
        while !closing && barrier.is_none() && in_flight.len() < max_inflight {
            let request = match parser.next(&mut rbuf) {
                Ok(Some(request)) => request,
                Ok(None) => break,
                Err(err) => {
                    let reply = Reply::error(format!("ERR {err}"));
                    in_flight
                        .push_back(Slot::Ready(Some((session.protocol, Outcome::Reply(reply)))));
                    closing = true;
                    break;
                }
            };
            let ctx = Ctx {
                shared: &shared,
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
            in_flight.push_back(slot);
            pushed += 1;
        }
        if rbuf.is_empty() && rbuf.capacity() > KEEP_BUFFER {
            rbuf = BytesMut::new();
        }
        if closing && in_flight.is_empty() {
            break;
        }
        closing |= *stop.borrow();
        let can_read = !closing && barrier.is_none() && in_flight.len() < max_inflight;
        let event = tokio::select! {
            biased;
            Some(done) = in_flight.next(), if !in_flight.is_empty() => Event::Done(done),
            read = read_more(&mut rd, &mut rbuf), if can_read => Event::Read(read),
            _ = stop.changed(), if !closing => Event::Stop,
        };
        match event {
            Event::Done((protocol, outcome)) => {
                answered += 1;
                let reply = match outcome {
                    Outcome::Reply(reply) => reply,
                    Outcome::Lease(lease) => lease.settle().await,
                };
                reply.encode(protocol, &mut wbuf);
                if (in_flight.is_empty() || wbuf.len() >= FLUSH_AT)
                    && !flush(&mut wr, &mut wbuf).await
                {
                    break;
                }
            }
            Event::Read(read) => {
                received_at = Instant::now();
                if !read {
                    closing = true;
                }
            }
            Event::Stop => closing = true,
        }
    }
    flush(&mut wr, &mut wbuf).await;
    shared.clients.fetch_sub(1, Ordering::Relaxed);
}

/// Reads more bytes; false at end of stream or on error.
async fn read_more(rd: &mut tokio::net::tcp::OwnedReadHalf, buf: &mut BytesMut) -> bool {
    buf.reserve(READ_CHUNK);
    matches!(rd.read_buf(buf).await, Ok(n) if n > 0)
}

async fn flush(wr: &mut tokio::net::tcp::OwnedWriteHalf, buf: &mut BytesMut) -> bool {
    if buf.is_empty() {
        return true;
    }
    let ok = wr.write_all(buf).await.is_ok();
    buf.clear();
    if buf.capacity() > KEEP_BUFFER {
        *buf = BytesMut::new();
    }
    ok
}
