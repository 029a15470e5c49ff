//! A client's session ([`ClientSession`]): the one task that serves a connection, as a loop of
//! named steps in the manner of twemproxy's `recv_next` / `recv_done` / `send_next` /
//! `send_done`:
//! - admit ([`ClientSession::admit`]): parse what is buffered and dispatch it, up to the
//!   in-flight bound and never past a pending barrier;
//! - wait ([`ClientSession::next_event`]): the only place the session waits, a biased
//!   `select!` over replies, socket readiness, reads, signals and timers;
//! - reply burst ([`ClientSession::reply_burst`]): encode every reply that is ready;
//! - read ([`ClientSession::read_done`]): note the bytes the client sent;
//! - flush ([`ClientSession::flush`]): hand the socket what it takes now;
//! - close ([`ClientSession::close`]): give back what the client was not given.
//!
//! What the connection is doing (serving, closing; a subscribed mode later) is state of this
//! struct that these steps consult, not a loop of its own.
//!
//! Invariants (the parent module's, in full there):
//! - The loop never waits on the client: writing is a branch of its `select!` (readiness,
//!   then a non-blocking write), so with the client's socket full it still drives the
//!   requests in flight and still reads, within its bounds.
//! - Bounded memory: the socket is not read with `max_inflight_per_client` requests in
//!   flight, nor past [`BARRIER_READ_AHEAD`] unparsed bytes behind a barrier (read that far
//!   so a blocked client's disconnection is seen); past `client_query_buffer_limit` bytes of
//!   requests, or `client_output_buffer_limit` bytes of replies (0 = none), the client is
//!   closed at once. A request with an argument over `max_value_bytes` is read past, not
//!   buffered (the parser drops its bytes as they come, read [`SKIP_READ_CHUNK`] at a time),
//!   and answered with the refusal; the connection goes on.
//! - Replies that are ready are encoded first, then written in one write per burst (early
//!   once [`FLUSH_AT`] bytes wait).
//! - An HTTP request line (`POST`, `Host:`: [`Request::is_http`]) closes the connection at
//!   once, without a reply, nor the replies not yet written, as redis-server does
//!   (`securityWarningCommand`), and is logged with its text at most once a minute
//!   ([`ATTACK_LOG_EVERY`]).
//! - Closing writes what is left while the client takes it; a client that takes nothing for
//!   [`CLOSE_STALL`] is dropped. A client with nothing in flight or to write that sends
//!   nothing for `timeout` seconds is closed (Redis' `clientsCronHandleTimeout`).

use super::in_flight::{abandon_in_flight, InFlight, Slot};
use super::output::Output;
use super::KEEP_BUFFER;
use crate::client_registry::ClientHandle;
use crate::client_stream::ReplyWriter;
use crate::commands::{self, Action, Ctx, Session};
use crate::error::ProxyError;
use crate::lease::Outcome;
use crate::protocol::{Protocol, Request, RequestParser};
use crate::pubsub::{Inbox, Message};
use crate::shared::Shared;
use bytes::BytesMut;
use futures::FutureExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
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
/// Read buffer headroom while the parser reads past an argument over `max_value_bytes`: its
/// bytes are dropped as they come, so larger reads cost no memory that stays, and 10 MB is
/// 160 reads, not 2,560.
const SKIP_READ_CHUNK: usize = 64 * 1024;
/// Request bytes read ahead while a barrier waits (a blocked `BLPOP`): enough to see the
/// client's stream end, as Redis frees a blocked client that disconnects, and bounded.
const BARRIER_READ_AHEAD: usize = 16 * 1024;
/// Read buffer headroom while a barrier waits with nothing buffered: a blocked client usually
/// sends nothing more, and thousands of them wait at once, so their buffers are given back and
/// a read then takes a small one.
const BARRIER_READ_CHUNK: usize = 256;
/// When closing, how long a client may take none of the replies left before it is dropped.
pub(super) const CLOSE_STALL: Duration = Duration::from_secs(1);
/// Request bytes buffered, and reply bytes queued, for a client that must still authenticate
/// (Redis: 1 MB of query buffer before authentication).
const UNAUTHENTICATED_BUFFER_LIMIT: u64 = 1024 * 1024;
/// A cross-protocol attack is logged at most this often, as redis-server logs it: a page that
/// makes every visitor's browser post to the port would otherwise flood the log.
const ATTACK_LOG_EVERY: Duration = Duration::from_secs(60);
/// When a cross-protocol attack was last logged (by any session of the process).
static ATTACK_LOGGED: Mutex<Option<Instant>> = Mutex::new(None);

/// What woke the session.
enum Event {
    Done((Protocol, Outcome)),
    /// A pub/sub message for the client.
    Message(Message),
    Writable(bool),
    /// Bytes were read (`read`: false at the stream's end); `unparsed`: bytes read earlier
    /// were still waiting to be parsed.
    Read {
        read: bool,
        unparsed: bool,
    },
    Stop,
    Stalled,
    Idle,
    /// `CLIENT KILL`: closed at once, like Redis.
    Killed,
}

/// What the session does once an event is handled.
enum Flow {
    /// Admit what can be admitted, then wait again.
    Continue,
    /// Write what is encoded first.
    Flush,
    /// Close the connection now.
    Close,
}

/// The limits as last reloaded when the connection started, fixed for its life.
struct Limits {
    max_inflight: usize,
    /// Reply bytes queued for an authenticated client (0 = no limit).
    output: u64,
    /// Request bytes buffered for an authenticated client.
    query: u64,
    idle_timeout: Option<Duration>,
}

/// One client connection being served, from its first read to its close.
pub(super) struct ClientSession<'a, R, W> {
    shared: &'a Arc<Shared>,
    /// The shard serving this client (its masters and acquire service).
    shard: usize,
    /// What commands read and change (protocol, user, names); its `client` is this client's
    /// entry in the registry, which also carries the shutdown and `CLIENT KILL` signals.
    session: Session,
    limits: Limits,
    stop: watch::Receiver<bool>,
    rd: R,
    wr: W,
    parser: RequestParser,
    rbuf: BytesMut,
    in_flight: InFlight,
    out: Output,
    /// No further request is admitted; the session ends once what is left is written.
    closing: bool,
    /// An HTTP request came ([`Request::is_http`]): the session ends now, writing nothing.
    aborted: bool,
    /// When the oldest bytes not yet parsed were read (the last read, when everything before
    /// it was parsed): the validity clock of the requests among them starts there, never
    /// later than their bytes arrived.
    received_at: Instant,
    /// The last read, or write that made progress: the start of the idle timeout.
    last_activity: Instant,
    /// Once only replies are left to write: when the client will have taken none for too long.
    stall_at: Option<Instant>,
}

impl<'a, R, W> ClientSession<'a, R, W>
where
    R: AsyncRead + Unpin,
    W: ReplyWriter,
{
    /// A session for `client` over `rd` and `wr`, served by shard `shard` until it ends or
    /// `stop` is set.
    pub(super) fn new(
        shared: &'a Arc<Shared>,
        shard: usize,
        client: Arc<ClientHandle>,
        (rd, wr): (R, W),
        stop: watch::Receiver<bool>,
    ) -> Self {
        let settings = shared.live_config();
        let limits = Limits {
            max_inflight: settings.max_inflight_per_client,
            output: settings.client_output_buffer_limit,
            query: settings.client_query_buffer_limit,
            idle_timeout: (settings.timeout > 0).then(|| Duration::from_secs(settings.timeout)),
        };
        let now = Instant::now();
        ClientSession {
            session: Session::new(shared, client, settings.max_value_bytes),
            shared,
            shard,
            limits,
            stop,
            rd,
            wr,
            // The same cap as the session's: what the parser reads past is what it refuses.
            parser: RequestParser::new(settings.proto_max_bulk_len)
                .with_value_cap(settings.max_value_bytes),
            rbuf: BytesMut::new(),
            in_flight: InFlight::default(),
            out: Output::default(),
            closing: false,
            aborted: false,
            received_at: now,
            last_activity: now,
            stall_at: None,
        }
    }

    /// Serves the client until it disconnects, sends `QUIT`, breaks the protocol, does not
    /// read its replies (past the output limit, or for [`CLOSE_STALL`] when closing), stays
    /// idle past `timeout`, is killed, or `stop` is set; then closes.
    pub(super) async fn run(&mut self) {
        loop {
            self.admit();
            if self.aborted || self.finished() {
                break;
            }
            let flow = match self.next_event().await {
                Event::Done(done) => self.reply_burst(done).await,
                Event::Message(message) => self.message_burst(message),
                Event::Writable(true) => {
                    self.out.unblock();
                    Flow::Flush
                }
                Event::Read { read, unparsed } => self.read_done(read, unparsed),
                Event::Stop => {
                    self.closing = true;
                    Flow::Continue
                }
                Event::Idle => {
                    let client = &self.session.client;
                    tracing::info!(client = client.id, peer = %client.peer, "closing idle client");
                    Flow::Close
                }
                Event::Writable(false) | Event::Stalled | Event::Killed => Flow::Close,
            };
            let open = match flow {
                Flow::Continue => true,
                Flow::Flush => self.flush().await,
                Flow::Close => false,
            };
            if !open {
                break;
            }
        }
        self.close();
    }

    /// Parses what is buffered and dispatches it, up to the in-flight bound, unless a barrier
    /// is pending or the connection is closing.
    fn admit(&mut self) {
        while !self.closing && self.in_flight.accepts(self.limits.max_inflight) {
            self.parser.unauthenticated = self.session.user.is_none();
            match self.parser.next(&mut self.rbuf) {
                Ok(Some(request)) if request.is_http() => {
                    self.cross_protocol_attack();
                    return;
                }
                Ok(Some(request)) => self.dispatch(request),
                Ok(None) => break,
                Err(err) => {
                    let reply = ProxyError::from(err).into();
                    self.in_flight
                        .push(Slot::ready(self.session.protocol, reply));
                    self.closing = true;
                }
            }
        }
        // Not while a request is read past: each of its reads leaves the buffer empty, and its
        // allocation is reused by the next.
        if self.rbuf.is_empty() && self.rbuf.capacity() > KEEP_BUFFER && !self.parser.skipping() {
            self.rbuf = BytesMut::new();
        }
    }

    /// An HTTP request line came: the session ends at once (redis-server frees the client
    /// without writing what it still had for it), and the log says so, in Redis' words.
    fn cross_protocol_attack(&mut self) {
        self.aborted = true;
        let now = Instant::now();
        let mut logged = ATTACK_LOGGED.lock().unwrap_or_else(|e| e.into_inner());
        if logged.is_none_or(|at| now.duration_since(at) >= ATTACK_LOG_EVERY) {
            *logged = Some(now);
            let client = &self.session.client;
            tracing::warn!(
                client = client.id,
                peer = %client.peer,
                "Possible SECURITY ATTACK detected. It looks like somebody is sending POST or Host: commands to Redis. This is likely due to an attacker attempting to use Cross Protocol Scripting to compromise your Redis instance. Connection aborted."
            );
        }
    }

    /// Runs one request's command and gives it its slot in the reply order.
    fn dispatch(&mut self, request: Request) {
        let ctx = Ctx {
            shared: self.shared,
            shard: &self.shared.shards[self.shard],
            received_at: self.received_at,
        };
        let action = commands::dispatch(&ctx, &mut self.session, request);
        // The protocol in force once the command ran, as in Redis: `HELLO 3` is answered
        // in RESP3, a request pipelined before it in RESP2.
        let protocol = self.session.protocol;
        match action {
            Action::Ready(reply) => self.in_flight.push(Slot::ready(protocol, reply)),
            Action::Close(reply) => {
                self.closing = true;
                self.in_flight.push(Slot::ready(protocol, reply));
            }
            Action::Defer(fut) => self.in_flight.push(Slot::Pending(protocol, fut)),
            Action::Barrier(fut) => self.in_flight.push_barrier(Slot::Pending(protocol, fut)),
        }
    }

    /// Closing, and every reply handed to the socket: nothing is left to do.
    fn finished(&self) -> bool {
        self.closing && self.in_flight.is_empty() && self.out.is_empty() && !self.wr.has_buffered()
    }

    /// Waits for what the session does next. Branches in order of priority (`biased`):
    /// replies first, then writing, reading, and the signals and timers.
    async fn next_event(&mut self) -> Event {
        self.closing |= *self.stop.borrow();
        let closing = self.closing;
        let barrier = self.in_flight.barrier_pending();
        let read_ahead = barrier && self.rbuf.len() < BARRIER_READ_AHEAD;
        if barrier && self.rbuf.is_empty() {
            self.rbuf = BytesMut::new();
            self.out.release_if_empty();
        }
        // (headroom wanted, headroom below which the buffer is grown)
        let chunk = if barrier {
            (BARRIER_READ_CHUNK, READ_MIN.min(BARRIER_READ_CHUNK))
        } else if self.parser.skipping() {
            // What is read now is dropped, not kept: growing the buffer takes its allocation
            // back in place (a fresh one only if earlier requests still point into it).
            (SKIP_READ_CHUNK, SKIP_READ_CHUNK)
        } else {
            (READ_CHUNK, READ_MIN)
        };
        let can_read = !closing && (self.in_flight.accepts(self.limits.max_inflight) || read_ahead);
        let unparsed = !self.rbuf.is_empty();
        let in_flight = !self.in_flight.is_empty();
        let to_write = !self.out.is_empty() || self.wr.has_buffered();
        let only_writes_left = closing && !in_flight;
        // Read from the clock only once closing: not on every turn of the loop.
        let stall_deadline = only_writes_left.then(|| {
            *self
                .stall_at
                .get_or_insert_with(|| Instant::now() + CLOSE_STALL)
        });
        // Idle: nothing in flight, nothing to write, nothing read for `timeout` (Redis'
        // `clientsCronHandleTimeout`).
        // A subscriber waits for messages, not for itself: never idle (Redis exempts
        // `CLIENT_PUBSUB` clients).
        let idle = !closing && !in_flight && self.out.is_empty() && !self.session.pubsub.active();
        // Messages wait while a barrier (a subscribe) is unanswered: a client reads a
        // channel's confirmation before its messages.
        let messages = !closing && self.session.pubsub.inbox.is_some() && !barrier;
        let idle_deadline = self.limits.idle_timeout.map(|t| self.last_activity + t);
        let client = &self.session.client;
        tokio::select! {
            biased;
            Some(done) = self.in_flight.next(), if in_flight => Event::Done(done),
            message = next_message(&mut self.session.pubsub.inbox), if messages => {
                Event::Message(message)
            }
            ready = self.wr.ready(), if to_write => Event::Writable(ready.is_ok()),
            read = read_more(&mut self.rd, &mut self.rbuf, chunk), if can_read => {
                Event::Read { read, unparsed }
            }
            _ = client.stopped(), if !closing => Event::Stop,
            _ = commands::sleep_until_some(stall_deadline), if only_writes_left => Event::Stalled,
            _ = commands::sleep_until_some(idle_deadline), if idle => Event::Idle,
            _ = client.killed() => Event::Killed,
        }
    }

    /// Encodes `first` and every further reply already complete, as one burst, written (by
    /// [`ClientSession::flush`]) as soon as no further reply is ready.
    async fn reply_burst(&mut self, first: (Protocol, Outcome)) -> Flow {
        let mut next = Some(first);
        while let Some((protocol, outcome)) = next.take() {
            self.out.push(protocol, outcome).await;
            // Mid-burst, write early what has piled up (and, before judging the limit, what the
            // socket takes now).
            if (self.out.len() >= FLUSH_AT || self.over_output_limit())
                && !self.out.write_now(&mut self.wr).await
            {
                return Flow::Close;
            }
            if self.over_output_limit() {
                tracing::warn!(
                    client = self.session.client.id,
                    peer = %self.session.client.peer,
                    queued_bytes = self.out.len(),
                    limit = self.limits.output,
                    "client does not read its replies: output buffer limit reached, closing the connection"
                );
                return Flow::Close;
            }
            // The replies complete already join this burst. Polled without the task's waker:
            // the `select!` polls `in_flight` again, with it, before waiting.
            next = self.in_flight.next().now_or_never().flatten();
        }
        // No further reply is ready: the burst is written now, not on another turn of the loop.
        Flow::Flush
    }

    /// Encodes `first` and every further message already waiting (up to [`FLUSH_AT`] bytes),
    /// written as one burst. A client whose messages overflowed its inbox is closed, as Redis
    /// closes a subscriber past its `pubsub` output limit.
    fn message_burst(&mut self, first: Message) -> Flow {
        let protocol = self.session.protocol;
        let mut next = Some(first);
        while let Some(message) = next.take() {
            self.out.encode(protocol, &message.reply());
            if self.out.len() < FLUSH_AT {
                next = self.session.pubsub.inbox.as_mut().and_then(Inbox::try_next);
            }
        }
        if self.over_output_limit()
            || self
                .session
                .pubsub
                .inbox
                .as_ref()
                .is_some_and(Inbox::overflowed)
        {
            tracing::warn!(
                client = self.session.client.id,
                peer = %self.session.client.peer,
                limit = crate::pubsub::INBOX_MESSAGES,
                "subscriber does not read its messages: closing the connection"
            );
            return Flow::Close;
        }
        Flow::Flush
    }

    /// Reply bytes queued past the output limit.
    fn over_output_limit(&self) -> bool {
        let limit = buffer_limit(&self.session, self.limits.output);
        limit > 0 && self.out.len() as u64 > limit
    }

    /// Bytes were read (`read`), or the client's stream ended: the start of the validity clock
    /// of the requests among them (unless older bytes still wait: theirs stays), and activity.
    /// Past the query buffer limit the connection is closed.
    fn read_done(&mut self, read: bool, unparsed: bool) -> Flow {
        let now = Instant::now();
        if !unparsed {
            self.received_at = now;
        }
        self.last_activity = now;
        if !read {
            self.closing = true;
            // Redis frees a client whose stream ended at once: a blocked command stops
            // waiting (and pops nothing) instead of being driven to its end.
            self.session.end();
        }
        let limit = buffer_limit(&self.session, self.limits.query);
        if self.rbuf.len() as u64 > limit {
            // Redis closes such a client without a reply.
            tracing::warn!(
                client = self.session.client.id,
                peer = %self.session.client.peer,
                query_buffer_bytes = self.rbuf.len(),
                limit,
                "closing client that reached max query buffer length"
            );
            return Flow::Close;
        }
        Flow::Continue
    }

    /// Hands the socket what it takes now; false if the client is gone. Progress is activity,
    /// and restarts the stall clock.
    async fn flush(&mut self) -> bool {
        let sent = self.out.sent();
        if !self.out.write_now(&mut self.wr).await {
            return false;
        }
        if self.out.sent() > sent {
            self.stall_at = None;
            if self.limits.idle_timeout.is_some() {
                self.last_activity = Instant::now();
            }
        }
        true
    }

    /// Whatever was not handed to the socket is dropped with the connection: the grants in it
    /// and those still in flight are rolled back.
    fn close(&mut self) {
        self.session.pubsub.leave_all(&self.shared.pubsub);
        self.session.end();
        std::mem::take(&mut self.out).abandon();
        let in_flight = std::mem::take(&mut self.in_flight);
        if !in_flight.is_empty() {
            tokio::spawn(abandon_in_flight(in_flight.into_ordered()));
        }
    }
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

/// The next message of `inbox`, or never without one.
async fn next_message(inbox: &mut Option<Inbox>) -> Message {
    match inbox {
        Some(inbox) => inbox.next().await,
        None => std::future::pending().await,
    }
}

/// Reads more bytes, with at least `chunk` bytes of headroom when it is below `low`; false at
/// end of stream or on error.
async fn read_more(
    rd: &mut (impl AsyncRead + Unpin),
    buf: &mut BytesMut,
    (chunk, low): (usize, usize),
) -> bool {
    if buf.capacity() - buf.len() < low {
        buf.reserve(chunk);
    }
    matches!(rd.read_buf(buf).await, Ok(n) if n > 0)
}
