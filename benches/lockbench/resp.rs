//! Raw RESP2: request encoding, a reply parser reduced to what the benchmark checks, and a
//! minimal async connection.

use crate::RELEASE_SCRIPT;
use bytes::{Buf, BytesMut};
use std::io::{Read, Write};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A reply, reduced to what the benchmark looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Ok,
    Null,
    Int(i64),
    Error(String),
    Bulk(Vec<u8>),
    Other,
}

impl std::fmt::Display for Reply {
    /// Like redis-cli without a terminal: `OK`, `nil`, `(integer) 1`, `-ERR …`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reply::Ok => write!(f, "OK"),
            Reply::Null => write!(f, "nil"),
            Reply::Int(n) => write!(f, "(integer) {n}"),
            Reply::Error(e) => write!(f, "-{e}"),
            Reply::Bulk(b) => write!(f, "{:?}", String::from_utf8_lossy(b)),
            Reply::Other => write!(f, "(other reply)"),
        }
    }
}

pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn line_end(buf: &[u8], from: usize) -> Option<usize> {
    buf.get(from..)?
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|p| from + p)
}

fn parse_int(bytes: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad integer {:?}", String::from_utf8_lossy(bytes)))
}

/// Parses one reply at `buf[from..]`: `Ok(None)` if incomplete, else the reply and its end.
pub fn parse_reply(buf: &[u8], from: usize) -> Result<Option<(Reply, usize)>, String> {
    let Some(eol) = line_end(buf, from) else {
        return Ok(None);
    };
    let line = &buf[from + 1..eol];
    let next = eol + 2;
    let reply = match buf[from] {
        b'+' if line == b"OK" => Reply::Ok,
        b'+' => Reply::Other,
        b'-' => Reply::Error(String::from_utf8_lossy(line).into_owned()),
        b':' => Reply::Int(parse_int(line)?),
        b'_' => Reply::Null,
        b'$' => {
            let len = parse_int(line)?;
            if len < 0 {
                Reply::Null
            } else {
                let end = next + len as usize;
                if buf.len() < end + 2 {
                    return Ok(None);
                }
                return Ok(Some((Reply::Bulk(buf[next..end].to_vec()), end + 2)));
            }
        }
        b'*' => {
            let len = parse_int(line)?;
            if len < 0 {
                Reply::Null
            } else {
                let mut at = next;
                for _ in 0..len {
                    match parse_reply(buf, at)? {
                        Some((_, end)) => at = end,
                        None => return Ok(None),
                    }
                }
                return Ok(Some((Reply::Other, at)));
            }
        }
        other => return Err(format!("unexpected reply type byte {other:#04x}")),
    };
    Ok(Some((reply, next)))
}

/// A raw RESP2 connection.
pub struct RawConn {
    pub stream: TcpStream,
    pub buf: BytesMut,
    /// When the bytes of the most recently parsed reply arrived.
    pub arrived: Instant,
}

impl RawConn {
    pub async fn connect(port: u16) -> std::io::Result<RawConn> {
        let stream = tokio::time::timeout(
            Duration::from_secs(5),
            TcpStream::connect(("127.0.0.1", port)),
        )
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
        stream.set_nodelay(true)?;
        Ok(RawConn {
            stream,
            buf: BytesMut::with_capacity(16 * 1024),
            arrived: Instant::now(),
        })
    }

    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await
    }

    /// One reply; fails at `deadline`, at end of stream, or on a protocol error.
    pub async fn read(&mut self, deadline: Instant) -> std::io::Result<Reply> {
        loop {
            match parse_reply(&self.buf, 0) {
                Ok(Some((reply, end))) => {
                    self.buf.advance(end);
                    return Ok(reply);
                }
                Ok(None) => {}
                Err(err) => return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, err)),
            }
            self.buf.reserve(16 * 1024);
            let read =
                tokio::time::timeout_at(deadline.into(), self.stream.read_buf(&mut self.buf))
                    .await
                    .map_err(|_| {
                        std::io::Error::new(std::io::ErrorKind::TimedOut, "reply timed out")
                    })??;
            if read == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.arrived = Instant::now();
        }
    }

    pub async fn cmd(&mut self, args: &[&[u8]]) -> std::io::Result<Reply> {
        self.send(&encode(args)).await?;
        self.read(Instant::now() + Duration::from_secs(10)).await
    }
}

/// One command on a fresh blocking connection (for work outside the async runtime).
pub fn blocking_cmd(port: u16, args: &[&[u8]]) -> std::io::Result<Reply> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.write_all(&encode(args))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match parse_reply(&buf, 0) {
            Ok(Some((reply, _))) => return Ok(reply),
            Ok(None) => {}
            Err(err) => return Err(io_err(err)),
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

pub fn io_err(message: String) -> std::io::Error {
    std::io::Error::other(message)
}

/// Waits until the server (a redis-server or a fresh proxy) is ready for a cell: every master
/// the proxy lists in `INFO masters` is `state=up` (not connecting, down or quarantined), and
/// the release script is loaded (`SCRIPT LOAD` fans out through the proxy). Returns its SHA1.
pub async fn prepare(port: u16) -> std::io::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut conn = RawConn::connect(port).await?;
    loop {
        let info = match conn.cmd(&[b"INFO", b"masters"]).await? {
            Reply::Bulk(text) => String::from_utf8_lossy(&text).into_owned(),
            _ => String::new(),
        };
        let waiting: Vec<&str> = info
            .lines()
            .filter(|l| l.contains("state=") && !l.contains("state=up"))
            .collect();
        let script = if waiting.is_empty() {
            conn.cmd(&[b"SCRIPT", b"LOAD", RELEASE_SCRIPT.as_bytes()])
                .await?
        } else {
            Reply::Other
        };
        match script {
            Reply::Bulk(sha) => return Ok(String::from_utf8_lossy(&sha).into_owned()),
            other if Instant::now() > deadline => {
                return Err(io_err(format!(
                    "port {port} not ready after 10 s: masters {waiting:?}, SCRIPT LOAD {other}"
                )))
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}
