//! One client connection: read requests, run them concurrently, write replies in request order.
//!
//! [`serve`] registers the client and runs its session ([`session::ClientSession`]: the loop
//! of named steps). The requests between dispatch and reply are [`in_flight`]'s; the replies
//! between encoding and the socket, and the lock grants among them, are [`output`]'s.
//!
//! Invariants (each enforced in the module named):
//! - Requests reach the masters in the order the client sent them. A request that has to
//!   wait its turn (an acquire queued behind another acquire of the same key) is a barrier:
//!   nothing after it is dispatched until it is answered ([`in_flight`]).
//! - Every request, local or fanned out, gets a slot in `in_flight` ([`in_flight::InFlight`]),
//!   so replies leave in exactly the order requests arrived, whatever order they complete in.
//! - At most `max_inflight_per_client` requests are in flight; beyond that the socket is not
//!   read (backpressure), so a deep pipeline cannot grow memory without bound ([`session`]).
//!   Behind a barrier, at most a small fixed read-ahead is read: enough to see a blocked
//!   client (`BLPOP`) disconnect, which ends its wait as Redis frees it.
//! - The loop never waits on the client: writing is one branch of its `select!` (socket
//!   readiness, then a non-blocking write), so while the client's socket is full the loop still
//!   drives `in_flight` (fan-outs finish and give back their permits, acquires are decided)
//!   and still reads, within the bounds here ([`session`]).
//! - Replies that are ready are encoded before anything is written, and written together (one
//!   write per burst) as soon as no further reply is ready, whatever is still in flight; a
//!   burst is also written early once `FLUSH_AT` bytes wait ([`session`]).
//! - Reply bytes waiting for the client (encoded, not yet taken by its socket) are bounded by
//!   `client_output_buffer_limit`, like Redis' `client-output-buffer-limit normal` hard limit:
//!   past it the connection is closed at once, without flushing (0 = no limit) ([`session`]).
//! - A lock grant is handed to the socket as `OK` only if its validity deadline has not passed
//!   at that moment: checked when the reply is encoded, and again right before every write
//!   while none of its bytes has been written; otherwise it is rolled back and written as null
//!   ([`output`]).
//! - A grant the client was not given is rolled back, not left held until its TTL: when the
//!   connection ends (client gone, output limit, stalled close), every lease whose reply was
//!   not completely handed to the socket is rolled back ([`output`]), and the requests still
//!   in flight are driven to completion in the background, every lease among them rolled back
//!   ([`in_flight`]). A reply completely handed to the socket is the client's and is never
//!   rolled back.
//! - A protocol error is answered with Redis' text and the connection is closed after the
//!   replies of the requests before it ([`session`]).
//! - An HTTP request sent to the port (a `POST` or `Host:` line: cross-protocol scripting)
//!   closes the connection at once, without a reply, as redis-server does ([`session`]).
//! - Closing (`QUIT`, protocol error, end of the client's stream, shutdown) writes what is left
//!   as long as the client takes it; a client that takes nothing for `CLOSE_STALL` (1 s) is
//!   dropped, so a client that does not read cannot hold its task ([`session`]).

mod in_flight;
mod output;
mod session;
#[cfg(test)]
mod tests;

use crate::client_stream::{self, ClientStream};
use crate::error::ProxyError;
use crate::protocol::{Protocol, Reply};
use crate::shared::Shared;
use bytes::BytesMut;
use session::ClientSession;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

/// Buffers larger than this are released once empty (a big request must not pin memory).
const KEEP_BUFFER: usize = 64 * 1024;

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
    let halves = stream.split();
    let id = shared.next_client_id();
    // Listed in `CLIENT LIST` until this task ends, however it ends.
    let registration = shared.registry.register(id, peer, local);
    let mut client = ClientSession::new(&shared, shard, registration.handle.clone(), halves, stop);
    client.run().await;
    shared.clients.fetch_sub(1, Ordering::Relaxed);
    // Out of the count and of `CLIENT LIST` before its socket closes: a client that saw its
    // connection end does not find itself still listed.
    drop(registration);
    drop(client);
}
