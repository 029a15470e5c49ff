//! The session on tokio's paused clock, over in-memory sockets (no real I/O lets time slip):
//! the barrier, the stall of a closing client, the idle timeout and the output limit. The
//! proxy reaches no master here: local commands are answered, acquires are refused.

use super::session::{ClientSession, CLOSE_STALL};
use crate::client_registry::ClientHandle;
use crate::client_stream::ReplyWriter;
use crate::config::Config;
use crate::lock::{Attempt, Started};
use crate::shared::Shared;
use bytes::Bytes;
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::io;
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, DuplexStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

/// Bytes the session's socket to the client takes before it is full (the kernel's send
/// buffer), in the tests that make a client stop reading.
const SOCKET: usize = 1024;
/// Longer than any wait a test expects to end: a test that would hang fails instead.
const BOUND: Duration = Duration::from_secs(600);

/// The replies' direction of an in-memory socket: up to `capacity` bytes the session wrote
/// and the client did not read yet. Closed when either end is dropped.
struct Pipe {
    bytes: VecDeque<u8>,
    capacity: usize,
    closed: bool,
    reader: Option<Waker>,
    writer: Option<Waker>,
}

fn close(pipe: &Mutex<Pipe>) {
    let mut pipe = pipe.lock().unwrap();
    pipe.closed = true;
    for waker in [pipe.reader.take(), pipe.writer.take()]
        .into_iter()
        .flatten()
    {
        waker.wake();
    }
}

/// The session's end of the replies' pipe, as a client socket's writing half.
struct SessionEnd(Arc<Mutex<Pipe>>);

impl Drop for SessionEnd {
    fn drop(&mut self) {
        close(&self.0);
    }
}

impl ReplyWriter for SessionEnd {
    fn ready(&mut self) -> impl Future<Output = io::Result<()>> + Send {
        poll_fn(|cx| {
            let mut pipe = self.0.lock().unwrap();
            // Like a socket whose peer is gone: writable, and the write fails.
            if pipe.closed || pipe.bytes.len() < pipe.capacity {
                return Poll::Ready(Ok(()));
            }
            pipe.writer = Some(cx.waker().clone());
            Poll::Pending
        })
    }

    fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut pipe = self.0.lock().unwrap();
        if pipe.closed {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let n = buf.len().min(pipe.capacity - pipe.bytes.len());
        if n == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        pipe.bytes.extend(&buf[..n]);
        if let Some(reader) = pipe.reader.take() {
            reader.wake();
        }
        Ok(n)
    }

    fn has_buffered(&self) -> bool {
        false
    }
}

/// A client of a session running in its own task.
struct Client {
    shared: Arc<Shared>,
    handle: Arc<ClientHandle>,
    requests: DuplexStream,
    replies: Arc<Mutex<Pipe>>,
    /// Ends when the session does.
    session: JoinHandle<()>,
    ended: bool,
    _stop: watch::Sender<bool>,
}

impl Client {
    /// A session with `config`'s limits, whose socket to the client takes `socket` bytes.
    fn start(config: Config, socket: usize) -> Client {
        let config = Config {
            // One master, never dialled: `rediss://` without a CA fails every connect before a
            // socket is opened, so nothing does real I/O on the paused clock. Acquires are
            // refused (no quorum).
            backends: vec!["rediss://127.0.0.1:1".parse().unwrap()],
            ..config
        };
        let shared = Shared::start(config, crate::commands::COMMANDS.len(), &[]);
        let addr = "127.0.0.1:6379".parse().unwrap();
        let registration = shared
            .registry
            .register(shared.next_client_id(), addr, addr);
        let handle = registration.handle.clone();
        let (requests, session_requests) = tokio::io::duplex(1 << 20);
        let replies = Arc::new(Mutex::new(Pipe {
            bytes: VecDeque::new(),
            capacity: socket,
            closed: false,
            reader: None,
            writer: None,
        }));
        let (stop_tx, stop) = watch::channel(false);
        let session = tokio::spawn({
            let (shared, handle) = (shared.clone(), handle.clone());
            let halves = (session_requests, SessionEnd(replies.clone()));
            async move {
                let _registration = registration;
                let mut session = ClientSession::new(&shared, 0, handle, halves, stop);
                session.run().await;
            }
        });
        Client {
            shared,
            handle,
            requests,
            replies,
            session,
            ended: false,
            _stop: stop_tx,
        }
    }

    /// Sends `commands`, pipelined in one write.
    async fn send(&mut self, commands: &[&[&str]]) {
        let mut bytes = Vec::new();
        for args in commands {
            bytes.extend(format!("*{}\r\n", args.len()).as_bytes());
            for arg in *args {
                bytes.extend(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
            }
        }
        self.requests.write_all(&bytes).await.unwrap();
    }

    /// Up to `max` reply bytes, once there are some; empty once the session closed and every
    /// byte was read.
    async fn read(&self, max: usize) -> Vec<u8> {
        let read = poll_fn(|cx| {
            let mut pipe = self.replies.lock().unwrap();
            if pipe.bytes.is_empty() && !pipe.closed {
                pipe.reader = Some(cx.waker().clone());
                return Poll::Pending;
            }
            let n = max.min(pipe.bytes.len());
            let bytes: Vec<u8> = pipe.bytes.drain(..n).collect();
            if let Some(writer) = pipe.writer.take() {
                writer.wake();
            }
            Poll::Ready(bytes)
        });
        timeout(BOUND, read).await.expect("a reply, or the end")
    }

    /// Reads until the replies read end with `suffix`.
    async fn read_until(&self, suffix: &[u8]) -> Vec<u8> {
        let mut got = Vec::new();
        while !got.ends_with(suffix) {
            let chunk = self.read(usize::MAX).await;
            assert!(!chunk.is_empty(), "closed after {:?}", Bytes::from(got));
            got.extend(chunk);
        }
        got
    }

    /// Every reply byte left, once the session has closed.
    async fn read_to_end(&mut self) -> Vec<u8> {
        assert!(self.ends_within(BOUND).await, "the session ends");
        self.read(usize::MAX).await
    }

    /// Whether the session has ended, waiting up to `wait` for it.
    async fn ends_within(&mut self, wait: Duration) -> bool {
        if !self.ended {
            if let Ok(ended) = timeout(wait, &mut self.session).await {
                ended.expect("the session does not panic");
                self.ended = true;
            }
        }
        self.ended
    }
}

/// An `ECHO` of `text`.
fn echo(text: &str) -> [&str; 2] {
    ["ECHO", text]
}

fn echo_reply(text: &str) -> Vec<u8> {
    format!("${}\r\n{text}\r\n", text.len()).into_bytes()
}

#[tokio::test(start_paused = true)]
async fn nothing_after_a_barrier_is_dispatched_until_it_is_answered() {
    let mut client = Client::start(Config::default(), 1 << 16);
    // An acquire of `k` in flight on the shard (held here, never polled): the client's own
    // acquire of `k` queues behind it, a barrier.
    let leader = client.shared.shards[0].acquirer.acquire(Attempt {
        key: Bytes::from_static(b"k"),
        value: Bytes::from_static(b"theirs"),
        ttl_ms: 10_000,
        received_at: Instant::now(),
        with_token: false,
    });
    assert!(matches!(leader, Started::Leading(_)));
    client
        .send(&[
            &["PING"],
            &["SET", "k", "mine", "NX", "PX", "10000"],
            &["CLIENT", "SETNAME", "after"],
        ])
        .await;
    // The reply before the barrier is written; however long the barrier then waits, the
    // request after it does not run (it would have been dispatched with the others).
    assert_eq!(client.read(usize::MAX).await, b"+PONG\r\n");
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(client.handle.names().name, None);
    // The leader gone, the queued acquire tries for itself (refused: no masters here); once
    // it is answered the request after it runs.
    drop(leader);
    let rest = client.read_until(b"+OK\r\n").await;
    assert!(
        rest.len() > b"+OK\r\n".len(),
        "the acquire's reply comes first"
    );
    assert_eq!(client.handle.names().name.as_deref(), Some(&b"after"[..]));
}

#[tokio::test(start_paused = true)]
async fn an_idle_client_is_closed_after_timeout_and_activity_restarts_the_clock() {
    let timeout_secs = 10;
    let idle = Duration::from_secs(timeout_secs);
    let config = Config {
        timeout: timeout_secs,
        ..Config::default()
    };
    let mut client = Client::start(config, 1 << 16);
    client.send(&[&["PING"]]).await;
    assert_eq!(client.read(usize::MAX).await, b"+PONG\r\n");
    tokio::time::sleep(idle - Duration::from_secs(1)).await;
    client.send(&[&["PING"]]).await;
    assert_eq!(client.read(usize::MAX).await, b"+PONG\r\n");
    // Open until `timeout` has passed since its last request, closed then.
    assert!(!client.ends_within(idle - Duration::from_millis(1)).await);
    assert!(client.ends_within(Duration::from_millis(2)).await);
    assert_eq!(client.read_to_end().await, b"");
}

#[tokio::test(start_paused = true)]
async fn past_the_output_limit_a_client_that_does_not_read_is_closed_at_once() {
    let config = Config {
        client_output_buffer_limit: 4096,
        ..Config::default()
    };
    let mut client = Client::start(config, SOCKET);
    let text = "x".repeat(1000);
    let echo = echo(&text);
    // 3027 bytes of replies: the socket takes 1024, and 2003 stay queued, under the limit.
    client.send(&[&echo[..]; 3]).await;
    assert!(!client.ends_within(Duration::from_secs(60)).await);
    // Four more: past the limit before they are all encoded.
    let sent = Instant::now();
    client.send(&[&echo[..]; 4]).await;
    assert!(client.ends_within(BOUND).await);
    assert_eq!(sent.elapsed(), Duration::ZERO, "closed at once");
    // What the socket had taken, and nothing that was queued.
    assert_eq!(client.read_to_end().await.len(), SOCKET);
}

#[tokio::test(start_paused = true)]
async fn a_closing_client_that_takes_nothing_is_dropped_after_the_stall() {
    let mut client = Client::start(Config::default(), SOCKET);
    let text = "x".repeat(1000);
    let echo = echo(&text);
    client.send(&[&echo, &echo, &echo, &["QUIT"]]).await;
    assert!(
        !client
            .ends_within(CLOSE_STALL - Duration::from_millis(1))
            .await
    );
    assert!(client.ends_within(Duration::from_millis(2)).await);
    // What the socket had taken; the rest, `QUIT`'s `OK` with it, is dropped.
    assert_eq!(client.read_to_end().await.len(), SOCKET);
}

#[tokio::test(start_paused = true)]
async fn a_closing_client_that_reads_slowly_gets_every_reply() {
    let mut client = Client::start(Config::default(), SOCKET);
    let text = "x".repeat(1000);
    let echo = echo(&text);
    client.send(&[&echo, &echo, &echo, &["QUIT"]]).await;
    let started = Instant::now();
    let mut got = Vec::new();
    for _ in 0..100 {
        // Less often than the stall allows, but something every time.
        tokio::time::sleep(CLOSE_STALL * 9 / 10).await;
        let chunk = client.read(SOCKET / 2).await;
        if chunk.is_empty() {
            break;
        }
        got.extend(chunk);
    }
    let mut expected = echo_reply(&text).repeat(3);
    expected.extend(b"+OK\r\n");
    assert_eq!(Bytes::from(got), Bytes::from(expected));
    assert!(
        started.elapsed() > CLOSE_STALL * 5,
        "{:?}",
        started.elapsed()
    );
    assert!(client.ends_within(Duration::ZERO).await);
}
