//! The one RESP client of the tests and the benchmark, on the `redis-protocol` crate: commands
//! are encoded by its RESP2 encoder, replies decoded by its RESP2 decoder (and its RESP3
//! decoder for the types RESP2 lacks) into a typed [`Reply`], whose `Display` is the compact
//! text the tests compare against (`+OK`, `-ERR …`, `:1`, `$value`, `$nil`, `_`, `*[a,b]`,
//! `%{k:v}`, `=txt:…`).
//!
//! [`Client`] is one connection: send a command or raw bytes (malformed input included), read
//! one reply (typed, or as text), pipeline many commands. The benchmark's load generator uses
//! it too: it writes pre-encoded pipelines with [`Client::write`] and reads their replies with
//! [`Client::read_reply`], which decodes in place (no copy, no allocation beyond what
//! `redis-protocol` does for aggregates).
//!
//! Also here: [`blocking_cmd`] (one command on a blocking socket, for threads outside the
//! runtime), [`Silent`] (a client that sends and never reads) and [`redis_cli`].

use bytes::{Buf, Bytes, BytesMut};
use redis_protocol::error::RedisProtocolError;
use redis_protocol::resp2::decode::decode_range as decode_resp2;
use redis_protocol::resp2::encode::extend_encode_borrowed;
use redis_protocol::resp2::types::{BorrowedFrame, RangeFrame as Frame2};
use redis_protocol::resp3::decode::complete::decode_range as decode_resp3;
use redis_protocol::resp3::types::{RangeFrame as Frame3, VerbatimStringFormat};
use std::fmt;
use std::io::{self, Read, Write};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::error::Elapsed;

/// How long the text helpers ([`Client::read`], [`Client::cmd`]) wait for a reply.
pub const REPLY_LIMIT: Duration = Duration::from_secs(10);
/// How long [`Client::connect`] and [`Client::try_connect`] wait for the connection.
pub const CONNECT_LIMIT: Duration = Duration::from_secs(2);
/// What one read asks the socket for at least.
const READ_CHUNK: usize = 16 * 1024;

/// One reply, typed. RESP2 and RESP3 nulls stay apart (`$-1`, `*-1`, `_`), as do arrays,
/// sets and pushes; map entries keep their order on the wire.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// `+text`
    Status(Bytes),
    /// `-text`, or a RESP3 blob error (`!`)
    Error(Bytes),
    /// `:n`
    Int(i64),
    /// `$len` and its bytes
    Bulk(Bytes),
    /// RESP2 `$-1`
    Nil,
    /// RESP2 `*-1` as a whole reply (nested in an array, the decoder cannot tell it from `$-1`)
    NilArray,
    /// RESP3 `_`
    Null,
    /// `*n`
    Array(Vec<Reply>),
    /// RESP3 `~n`, in wire order
    Set(Vec<Reply>),
    /// RESP3 `>n`
    Push(Vec<Reply>),
    /// RESP3 `%n`, in wire order
    Map(Vec<(Reply, Reply)>),
    /// RESP3 `=`: format (`txt`, `mkd`) and text
    Verbatim(&'static str, Bytes),
    /// RESP3 `,`
    Double(f64),
    /// RESP3 `#`
    Boolean(bool),
    /// RESP3 `(`
    BigNumber(Bytes),
}

impl Reply {
    /// `+OK`
    pub fn is_ok(&self) -> bool {
        matches!(self, Reply::Status(s) if s.as_ref() == b"OK")
    }

    /// Any null (`$-1`, `*-1`, `_`).
    pub fn is_null(&self) -> bool {
        matches!(self, Reply::Nil | Reply::NilArray | Reply::Null)
    }

    /// The text of a bulk, status or verbatim reply (lossy UTF-8).
    pub fn text(&self) -> Option<String> {
        match self {
            Reply::Bulk(b) | Reply::Status(b) | Reply::Verbatim(_, b) => {
                Some(String::from_utf8_lossy(b).into_owned())
            }
            _ => None,
        }
    }
}

fn lossy(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

fn write_list(f: &mut fmt::Formatter<'_>, open: &str, items: &[Reply]) -> fmt::Result {
    f.write_str(open)?;
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(",")?;
        }
        write!(f, "{item}")?;
    }
    f.write_str("]")
}

impl fmt::Display for Reply {
    /// The compact text: `+OK`, `-ERR …`, `:1`, `$value`, `$nil`, `*nil`, `_`, `*[a,b]` (arrays
    /// and sets), `>[a,b]`, `%{k:v,k:v}`, `=txt:text`, `,1.5`, `#t`, `(123`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Status(s) => write!(f, "+{}", lossy(s)),
            Reply::Error(e) => write!(f, "-{}", lossy(e)),
            Reply::Int(n) => write!(f, ":{n}"),
            Reply::Bulk(b) => write!(f, "${}", lossy(b)),
            Reply::Nil => f.write_str("$nil"),
            Reply::NilArray => f.write_str("*nil"),
            Reply::Null => f.write_str("_"),
            Reply::Array(items) | Reply::Set(items) => write_list(f, "*[", items),
            Reply::Push(items) => write_list(f, ">[", items),
            Reply::Map(pairs) => {
                f.write_str("%{")?;
                for (i, (k, v)) in pairs.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{k}:{v}")?;
                }
                f.write_str("}")
            }
            Reply::Verbatim(format, text) => write!(f, "={format}:{}", lossy(text)),
            Reply::Double(d) => write!(f, ",{d}"),
            Reply::Boolean(b) => f.write_str(if *b { "#t" } else { "#f" }),
            Reply::BigNumber(n) => write!(f, "({}", lossy(n)),
        }
    }
}

/// Appends one command (an array of bulk strings) to `out`, encoded by `redis-protocol`.
pub fn encode_into(out: &mut BytesMut, args: &[&[u8]]) {
    let frames: Vec<BorrowedFrame<'_>> =
        args.iter().map(|a| BorrowedFrame::BulkString(a)).collect();
    extend_encode_borrowed(out, &BorrowedFrame::Array(&frames), false)
        .expect("a command of bulk strings always encodes");
}

/// One command, encoded.
pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode_into(&mut out, args);
    out.to_vec()
}

/// One command of text arguments, encoded.
pub fn encode_str(args: &[&str]) -> Vec<u8> {
    encode(&as_bytes(args))
}

fn as_bytes<'a>(args: &[&'a str]) -> Vec<&'a [u8]> {
    args.iter().map(|a| a.as_bytes()).collect()
}

/// Decodes the reply at the front of `buf` and removes its bytes from `buf`; `Ok(None)` while
/// it is incomplete. The reply's strings are views into `buf`'s memory, not copies (and `+OK`,
/// integers and nulls take nothing from it).
pub fn decode(buf: &mut BytesMut) -> Result<Option<Reply>, RedisProtocolError> {
    match decode_resp2(buf) {
        Ok(None) => Ok(None),
        Ok(Some((frame, used))) => {
            // Nothing to keep from the buffer for these (the load generator's replies).
            let reply = match frame {
                Frame2::Integer(n) => Reply::Int(n),
                Frame2::Null if buf[0] == b'*' => Reply::NilArray,
                Frame2::Null => Reply::Nil,
                Frame2::SimpleString((s, e)) if &buf[s..e] == b"OK" => {
                    Reply::Status(Bytes::from_static(b"OK"))
                }
                frame => return Ok(Some(from_resp2(&buf.split_to(used).freeze(), frame))),
            };
            buf.advance(used);
            Ok(Some(reply))
        }
        // Not RESP2: a type only RESP3 has, somewhere in the reply.
        Err(not_resp2) => match decode_resp3(buf) {
            Ok(None) => Ok(None),
            Ok(Some((frame, used))) => {
                let bytes = buf.split_to(used).freeze();
                from_resp3(&bytes, frame).map(Some)
            }
            Err(_) => Err(not_resp2),
        },
    }
}

fn from_resp2(bytes: &Bytes, frame: Frame2) -> Reply {
    match frame {
        Frame2::SimpleString((s, e)) => Reply::Status(bytes.slice(s..e)),
        Frame2::Error((s, e)) => Reply::Error(bytes.slice(s..e)),
        Frame2::Integer(n) => Reply::Int(n),
        Frame2::BulkString((s, e)) => Reply::Bulk(bytes.slice(s..e)),
        Frame2::Array(items) => {
            Reply::Array(items.into_iter().map(|i| from_resp2(bytes, i)).collect())
        }
        Frame2::Null => Reply::Nil,
    }
}

/// Where a RESP3 frame's data starts in the buffer (to put map entries and set members back
/// in wire order); `usize::MAX` for frames without data in the buffer.
fn wire_start(frame: &Frame3) -> usize {
    match frame {
        Frame3::BlobString { data, .. }
        | Frame3::BlobError { data, .. }
        | Frame3::SimpleString { data, .. }
        | Frame3::SimpleError { data, .. }
        | Frame3::BigNumber { data, .. }
        | Frame3::VerbatimString { data, .. } => data.0,
        Frame3::Array { data, .. } | Frame3::Push { data, .. } => {
            data.iter().map(wire_start).min().unwrap_or(usize::MAX)
        }
        _ => usize::MAX,
    }
}

fn from_resp3(bytes: &Bytes, frame: Frame3) -> Result<Reply, RedisProtocolError> {
    let many = |items: Vec<Frame3>| -> Result<Vec<Reply>, RedisProtocolError> {
        items.into_iter().map(|i| from_resp3(bytes, i)).collect()
    };
    // Hashed by the decoder: sorted back into wire order (then by text, for frames without a
    // position, so that the order is at least stable).
    let in_wire_order = |mut entries: Vec<(usize, Reply, Reply)>| {
        entries.sort_by_cached_key(|(at, k, _)| (*at, k.to_string()));
        entries
    };
    Ok(match frame {
        Frame3::BlobString { data: (s, e), .. } => Reply::Bulk(bytes.slice(s..e)),
        Frame3::SimpleString { data: (s, e), .. } => Reply::Status(bytes.slice(s..e)),
        Frame3::BlobError { data: (s, e), .. } | Frame3::SimpleError { data: (s, e), .. } => {
            Reply::Error(bytes.slice(s..e))
        }
        Frame3::Number { data, .. } => Reply::Int(data),
        Frame3::Double { data, .. } => Reply::Double(data),
        Frame3::Boolean { data, .. } => Reply::Boolean(data),
        Frame3::BigNumber { data: (s, e), .. } => Reply::BigNumber(bytes.slice(s..e)),
        Frame3::Null => Reply::Null,
        Frame3::VerbatimString {
            data: (s, e),
            format,
            ..
        } => {
            let format = match format {
                VerbatimStringFormat::Text => "txt",
                VerbatimStringFormat::Markdown => "mkd",
            };
            Reply::Verbatim(format, bytes.slice(s..e))
        }
        Frame3::Array { data, .. } => Reply::Array(many(data)?),
        Frame3::Push { data, .. } => Reply::Push(many(data)?),
        Frame3::Set { data, .. } => {
            let mut members = Vec::with_capacity(data.len());
            for m in data {
                members.push((wire_start(&m), from_resp3(bytes, m)?, Reply::Null));
            }
            Reply::Set(in_wire_order(members).into_iter().map(|m| m.1).collect())
        }
        Frame3::Map { data, .. } => {
            let mut entries = Vec::with_capacity(data.len());
            for (k, v) in data {
                entries.push((wire_start(&k), from_resp3(bytes, k)?, from_resp3(bytes, v)?));
            }
            Reply::Map(
                in_wire_order(entries)
                    .into_iter()
                    .map(|(_, k, v)| (k, v))
                    .collect(),
            )
        }
        Frame3::Hello { .. } | Frame3::ChunkedString(_) => {
            return Err(RedisProtocolError::new(
                redis_protocol::error::RedisProtocolErrorKind::DecodeError,
                "a HELLO or streamed frame where a reply was expected",
            ))
        }
    })
}

fn invalid(err: RedisProtocolError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("invalid RESP: {err:?}"))
}

/// One connection to a server (a proxy or a redis-server) on loopback.
pub struct Client {
    stream: TcpStream,
    buf: BytesMut,
    arrived: Instant,
}

impl Client {
    /// Connects within `limit` (`TCP_NODELAY` on).
    pub async fn open(port: u16, limit: Duration) -> io::Result<Client> {
        let stream = tokio::time::timeout(limit, TcpStream::connect(("127.0.0.1", port)))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
        stream.set_nodelay(true)?;
        Ok(Client {
            stream,
            buf: BytesMut::new(),
            arrived: Instant::now(),
        })
    }

    /// Connects (within [`CONNECT_LIMIT`]) or panics.
    pub async fn connect(port: u16) -> Client {
        Client::try_connect(port).await.expect("connect")
    }

    /// Connects within [`CONNECT_LIMIT`], `None` if it cannot.
    pub async fn try_connect(port: u16) -> Option<Client> {
        Client::open(port, CONNECT_LIMIT).await.ok()
    }

    /// When the bytes of the most recently decoded reply arrived.
    pub fn arrived(&self) -> Instant {
        self.arrived
    }

    /// The connection itself (what was read and not decoded yet is dropped).
    pub fn into_stream(self) -> TcpStream {
        self.stream
    }

    /// Writes bytes as they are (one command, a pipeline, or malformed input).
    pub async fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes).await
    }

    /// [`Client::write`], panicking on a write error.
    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.write(bytes).await.unwrap();
    }

    /// Sends one command.
    pub async fn send(&mut self, args: &[&str]) {
        self.send_raw(&encode_str(args)).await;
    }

    /// Reads one reply; fails at `deadline`, at end of stream, on a read error, or on bytes
    /// that are not RESP (`InvalidData`).
    pub async fn read_reply(&mut self, deadline: Instant) -> io::Result<Reply> {
        loop {
            if let Some(reply) = decode(&mut self.buf).map_err(invalid)? {
                return Ok(reply);
            }
            self.buf.reserve(READ_CHUNK);
            let read =
                tokio::time::timeout_at(deadline.into(), self.stream.read_buf(&mut self.buf))
                    .await
                    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "reply timed out"))??;
            if read == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.arrived = Instant::now();
        }
    }

    /// Sends one command and reads its reply (within [`REPLY_LIMIT`]).
    pub async fn request(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        self.write(&encode(args)).await?;
        self.read_reply(Instant::now() + REPLY_LIMIT).await
    }

    /// One reply as text, or `None` on timeout, end of stream or a read error. Panics if the
    /// server sent something that is not RESP.
    pub async fn try_read(&mut self, limit: Duration) -> Option<String> {
        match self.read_reply(Instant::now() + limit).await {
            Ok(reply) => Some(reply.to_string()),
            Err(err) if err.kind() == io::ErrorKind::InvalidData => {
                let at = self.stream.peer_addr().map(|a| a.to_string());
                panic!("the server at {} sent {err}", at.unwrap_or_default())
            }
            Err(_) => None,
        }
    }

    /// One reply as text (within [`REPLY_LIMIT`], or panics).
    pub async fn read(&mut self) -> String {
        self.try_read(REPLY_LIMIT)
            .await
            .expect("a reply within 10 s")
    }

    /// Sends a command and reads its reply as text.
    pub async fn cmd(&mut self, args: &[&str]) -> String {
        self.send(args).await;
        self.read().await
    }

    /// Sends a command and reads one reply within `limit`; `None` on a write error, a timeout
    /// or end of stream (the connection must then not be reused: a late reply may follow).
    pub async fn try_cmd(&mut self, args: &[&str], limit: Duration) -> Option<String> {
        self.write(&encode_str(args)).await.ok()?;
        self.try_read(limit).await
    }

    /// Sends every command in one write, then reads their replies as text (in order).
    pub async fn pipeline(&mut self, commands: &[Vec<&str>]) -> Vec<String> {
        let mut bytes = BytesMut::new();
        for args in commands {
            encode_into(&mut bytes, &as_bytes(args));
        }
        self.send_raw(&bytes).await;
        let mut replies = Vec::with_capacity(commands.len());
        for _ in commands {
            replies.push(self.read().await);
        }
        replies
    }

    /// True if the server closed the connection (within 2 s).
    pub async fn is_closed(&mut self) -> bool {
        let mut chunk = Vec::with_capacity(1024);
        matches!(
            tokio::time::timeout(Duration::from_secs(2), self.stream.read_buf(&mut chunk)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }
}

/// Sends `input` on a fresh connection to the proxy and on one to a redis-server, and checks
/// that the replies are the same, byte for byte, reply after reply until 500 ms pass without
/// one (at most 64). Returns both connections, for checks of what follows (close, …).
pub async fn assert_same_replies(
    proxy_port: u16,
    redis_port: u16,
    input: &[u8],
) -> (Client, Client) {
    let mut ours = Client::connect(proxy_port).await;
    let mut theirs = Client::connect(redis_port).await;
    ours.send_raw(input).await;
    theirs.send_raw(input).await;
    for n in 0..64 {
        let limit = Duration::from_millis(500);
        let (a, b) = tokio::join!(ours.try_read(limit), theirs.try_read(limit));
        assert_eq!(a, b, "reply {n} to {:?}", String::from_utf8_lossy(input));
        if a.is_none() {
            break;
        }
    }
    (ours, theirs)
}

/// One command on a fresh blocking connection (for threads outside the runtime: the nemesis,
/// the benchmark between cells); replies must come within `limit`.
pub fn blocking_cmd(port: u16, args: &[&[u8]], limit: Duration) -> io::Result<Reply> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(limit))?;
    stream.write_all(&encode(args))?;
    let mut buf = BytesMut::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(reply) = decode(&mut buf).map_err(invalid)? {
            return Ok(reply);
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A client that sent its requests and reads nothing: the socket stays open while this lives.
pub struct Silent {
    rd: OwnedReadHalf,
    writer: Option<JoinHandle<(Result<bool, Elapsed>, OwnedWriteHalf)>>,
    wr: Option<OwnedWriteHalf>,
}

impl Silent {
    /// Connects and sends `bytes` in one write on its own task (the server may stop reading;
    /// the write gives up after 30 s), then reads nothing.
    pub async fn start(port: u16, bytes: Vec<u8>) -> Silent {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        stream.set_nodelay(true).unwrap();
        let (rd, mut wr) = stream.into_split();
        let writer = tokio::spawn(async move {
            let written = tokio::time::timeout(Duration::from_secs(30), wr.write_all(&bytes))
                .await
                .map(|r| r.is_ok());
            (written, wr)
        });
        Silent {
            rd,
            writer: Some(writer),
            wr: None,
        }
    }

    /// Waits (at most `limit`, else panics) for the write to end: whether every byte was
    /// written, or the 30 s bound ran out. The socket stays open.
    pub async fn write_done(&mut self, limit: Duration) -> Result<bool, Elapsed> {
        let writer = self.writer.take().expect("write_done once");
        let (written, wr) = tokio::time::timeout(limit, writer)
            .await
            .expect("the silent client's write ends")
            .expect("writer task");
        self.wr = Some(wr);
        written
    }

    /// Reads (and drops) what the server sends until it closes the connection or `deadline`:
    /// how many bytes, and whether it closed.
    pub async fn drain(&mut self, deadline: Instant) -> (usize, bool) {
        let mut received = 0usize;
        let mut chunk = vec![0u8; 256 * 1024];
        loop {
            match tokio::time::timeout_at(deadline.into(), self.rd.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return (received, true),
                Ok(Ok(n)) => received += n,
                Err(_) => return (received, false),
            }
        }
    }
}

/// One `redis-cli` command (one-shot mode, output not a terminal) and what it printed.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("redis-cli is installed with redis-server (Debian redis-tools)");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reply in `wire`, rendered, and what was left undecoded.
    fn render_all(wire: &[u8]) -> (Vec<String>, usize) {
        let mut buf = BytesMut::from(wire);
        let mut out = Vec::new();
        while let Some(reply) = decode(&mut buf).unwrap() {
            out.push(reply.to_string());
        }
        (out, buf.len())
    }

    #[test]
    fn resp2_replies_render_compactly() {
        let wire = b"+OK\r\n-ERR no\r\n:-3\r\n$3\r\nabc\r\n$-1\r\n*-1\r\n*2\r\n$1\r\na\r\n:1\r\n$0\r\n\r\n";
        let (out, left) = render_all(wire);
        assert_eq!(
            out,
            ["+OK", "-ERR no", ":-3", "$abc", "$nil", "*nil", "*[$a,:1]", "$"]
        );
        assert_eq!(left, 0);
    }

    #[test]
    fn resp3_replies_keep_wire_order() {
        let wire = b"%3\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.0.0\r\n$5\r\nproto\r\n:3\r\n\
_\r\n=8\r\ntxt:# Se\r\n~2\r\n+b\r\n+a\r\n*2\r\n%1\r\n+k\r\n#t\r\n,1.5\r\n";
        let (out, left) = render_all(wire);
        assert_eq!(
            out,
            [
                "%{$server:$redis,$version:$7.0.0,$proto::3}",
                "_",
                "=txt:# Se",
                "*[+b,+a]",
                "*[%{+k:#t},,1.5]"
            ]
        );
        assert_eq!(left, 0);
    }

    #[test]
    fn incomplete_replies_wait_and_garbage_is_an_error() {
        let mut buf = BytesMut::from(&b"$5\r\nab"[..]);
        assert_eq!(decode(&mut buf).unwrap(), None);
        buf.extend_from_slice(b"cde\r\n");
        assert_eq!(decode(&mut buf).unwrap(), Some(Reply::Bulk("abcde".into())));
        let mut garbage = BytesMut::from(&b"?what\r\n"[..]);
        assert!(decode(&mut garbage).is_err());
    }

    #[test]
    fn commands_encode_as_arrays_of_bulk_strings() {
        assert_eq!(
            encode_str(&["SET", "k", ""]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"
        );
    }
}
