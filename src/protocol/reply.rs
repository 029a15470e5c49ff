//! The client-visible reply type and its RESP2/RESP3 encodings.
//!
//! Invariant: the protocol a reply is encoded in is the one the client had negotiated when it
//! *sent* the request (a pipelined `GET` before `HELLO 3` still gets a RESP2 reply), so the
//! connection records the protocol with each request and passes it here.

use bytes::{Bytes, BytesMut};

/// Protocol negotiated with `HELLO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Resp2,
    Resp3,
}

/// A reply, from a master or made by the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`
    Simple(Bytes),
    /// `-ERR ...`: the text without `-` and CRLF, starting with its upper-case code.
    Error(Bytes),
    Integer(i64),
    Bulk(Bytes),
    /// RESP2 `$-1`, RESP3 `_`.
    Null,
    /// RESP2 `*-1` (Redis' null array: a blocking pop that timed out), RESP3 `_`.
    NullArray,
    Array(Vec<Reply>),
    /// RESP3 map; RESP2 gets a flat array of alternating keys and values.
    Map(Vec<(Reply, Reply)>),
    /// RESP3 verbatim text (`=txt:`), as Redis 7 answers `INFO`; RESP2 gets a bulk string.
    Verbatim(Bytes),
    /// RESP3 double (`,1.5`), as Redis 7 answers a sorted set's scores; RESP2 gets a bulk
    /// string of the same text (the text a master answered in RESP2).
    Double(Bytes),
    /// RESP3 push (`>`), as Redis sends a RESP3 client its pub/sub messages and subscription
    /// confirmations; RESP2 gets an array (a client in subscribed mode tells them apart by
    /// their first element).
    Push(Vec<Reply>),
    /// Several top-level replies to one request, written one after the other (`SUBSCRIBE a b`
    /// answers one confirmation per channel).
    Frames(Vec<Reply>),
}

impl Reply {
    pub fn ok() -> Reply {
        Reply::Simple(Bytes::from_static(b"OK"))
    }

    pub fn simple(text: &'static str) -> Reply {
        Reply::Simple(Bytes::from_static(text.as_bytes()))
    }

    /// An error reply; `text` must start with its code (`ERR ...`, `NOSCRIPT ...`).
    pub fn error(text: impl Into<String>) -> Reply {
        Reply::Error(Bytes::from(text.into()))
    }

    pub fn bulk(data: impl Into<Bytes>) -> Reply {
        Reply::Bulk(data.into())
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// True for an error reply whose code is `code` (`NOSCRIPT`, ...).
    pub fn is_error_code(&self, code: &str) -> bool {
        match self {
            Reply::Error(text) => {
                text.starts_with(code.as_bytes()) && text.get(code.len()).is_none_or(|b| *b == b' ')
            }
            _ => false,
        }
    }

    /// Appends the encoding of `self` in `protocol` to `out`.
    pub fn encode(&self, protocol: Protocol, out: &mut BytesMut) {
        match self {
            Reply::Simple(s) => line(out, b'+', s),
            Reply::Error(s) => line(out, b'-', s),
            Reply::Integer(i) => {
                out.extend_from_slice(b":");
                put_int(out, *i);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Bulk(b) => bulk(out, b'$', b),
            Reply::Null => match protocol {
                Protocol::Resp2 => out.extend_from_slice(b"$-1\r\n"),
                Protocol::Resp3 => out.extend_from_slice(b"_\r\n"),
            },
            Reply::NullArray => match protocol {
                Protocol::Resp2 => out.extend_from_slice(b"*-1\r\n"),
                Protocol::Resp3 => out.extend_from_slice(b"_\r\n"),
            },
            Reply::Array(items) => {
                header(out, b'*', items.len());
                for item in items {
                    item.encode(protocol, out);
                }
            }
            Reply::Push(items) => {
                match protocol {
                    Protocol::Resp2 => header(out, b'*', items.len()),
                    Protocol::Resp3 => header(out, b'>', items.len()),
                }
                for item in items {
                    item.encode(protocol, out);
                }
            }
            Reply::Frames(replies) => {
                for reply in replies {
                    reply.encode(protocol, out);
                }
            }
            Reply::Map(pairs) => {
                match protocol {
                    Protocol::Resp2 => header(out, b'*', pairs.len() * 2),
                    Protocol::Resp3 => header(out, b'%', pairs.len()),
                }
                for (k, v) in pairs {
                    k.encode(protocol, out);
                    v.encode(protocol, out);
                }
            }
            Reply::Double(text) => match protocol {
                Protocol::Resp2 => bulk(out, b'$', text),
                Protocol::Resp3 => line(out, b',', text),
            },
            Reply::Verbatim(text) => match protocol {
                Protocol::Resp2 => bulk(out, b'$', text),
                Protocol::Resp3 => {
                    header(out, b'=', text.len() + 4);
                    out.extend_from_slice(b"txt:");
                    out.extend_from_slice(text);
                    out.extend_from_slice(b"\r\n");
                }
            },
        }
    }
}

fn line(out: &mut BytesMut, prefix: u8, text: &[u8]) {
    out.reserve(text.len() + 3);
    out.extend_from_slice(&[prefix]);
    // A simple string or error must not contain CR or LF; replace them like Redis'
    // addReplyErrorLength does, so a reply can never desynchronise the client.
    if text.iter().any(|&b| b == b'\r' || b == b'\n') {
        out.extend(
            text.iter()
                .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
        );
    } else {
        out.extend_from_slice(text);
    }
    out.extend_from_slice(b"\r\n");
}

// Appended with `extend_from_slice`, which inlines (a constant-size piece is a fixed store), not
// `BufMut::put_slice`, a call and a `memcpy` call per piece: a master command is encoded with
// these for each of its arguments. A header of a length below 100 (nearly every one the proxy
// writes: argument and array lengths) is one constant-size piece, without formatting.
pub(super) fn header(out: &mut BytesMut, prefix: u8, len: usize) {
    match len {
        0..=9 => out.extend_from_slice(&[prefix, digit(len), b'\r', b'\n']),
        10..=99 => out.extend_from_slice(&[prefix, digit(len / 10), digit(len % 10), b'\r', b'\n']),
        _ => {
            out.extend_from_slice(&[prefix]);
            put_int(out, len as i64);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// The ASCII digit of `d` (below 10).
fn digit(d: usize) -> u8 {
    b'0' + d as u8
}

pub(super) fn bulk(out: &mut BytesMut, prefix: u8, data: &[u8]) {
    out.reserve(data.len() + 16);
    header(out, prefix, data.len());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// A bulk string that is the concatenation of `parts`, written without joining them first.
pub(super) fn bulk_of_parts(out: &mut BytesMut, parts: &[&[u8]]) {
    let len = parts.iter().map(|p| p.len()).sum();
    out.reserve(len + 16);
    header(out, b'$', len);
    for part in parts {
        out.extend_from_slice(part);
    }
    out.extend_from_slice(b"\r\n");
}

fn put_int(out: &mut BytesMut, value: i64) {
    let mut buf = itoa::Buffer::new();
    out.extend_from_slice(buf.format(value).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(reply: &Reply, protocol: Protocol) -> String {
        let mut out = BytesMut::new();
        reply.encode(protocol, &mut out);
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn encodings_per_protocol() {
        let map = Reply::Map(vec![(Reply::bulk("proto"), Reply::Integer(3))]);
        let cases = [
            (Reply::ok(), "+OK\r\n", "+OK\r\n"),
            (Reply::Null, "$-1\r\n", "_\r\n"),
            (Reply::NullArray, "*-1\r\n", "_\r\n"),
            (Reply::Integer(-2), ":-2\r\n", ":-2\r\n"),
            (Reply::error("ERR a\r\nb"), "-ERR a  b\r\n", "-ERR a  b\r\n"),
            (
                map,
                "*2\r\n$5\r\nproto\r\n:3\r\n",
                "%1\r\n$5\r\nproto\r\n:3\r\n",
            ),
            (
                Reply::Verbatim(Bytes::from_static(b"a:1")),
                "$3\r\na:1\r\n",
                "=7\r\ntxt:a:1\r\n",
            ),
            (
                Reply::Double(Bytes::from_static(b"1.5")),
                "$3\r\n1.5\r\n",
                ",1.5\r\n",
            ),
            (
                Reply::Push(vec![Reply::bulk("message"), Reply::Integer(1)]),
                "*2\r\n$7\r\nmessage\r\n:1\r\n",
                ">2\r\n$7\r\nmessage\r\n:1\r\n",
            ),
            (
                Reply::Frames(vec![Reply::Integer(1), Reply::Null]),
                ":1\r\n$-1\r\n",
                ":1\r\n_\r\n",
            ),
        ];
        for (reply, two, three) in cases {
            assert_eq!(enc(&reply, Protocol::Resp2), two);
            assert_eq!(enc(&reply, Protocol::Resp3), three);
        }
    }

    #[test]
    fn headers_on_both_sides_of_the_short_forms() {
        for len in [0, 9, 10, 99, 100, 12_345] {
            let mut out = BytesMut::new();
            header(&mut out, b'$', len);
            assert_eq!(out, format!("${len}\r\n").as_bytes(), "{len}");
        }
    }

    #[test]
    fn error_codes() {
        assert!(Reply::error("NOSCRIPT No matching script.").is_error_code("NOSCRIPT"));
        assert!(!Reply::error("NOSCRIPTX y").is_error_code("NOSCRIPT"));
        assert!(Reply::error("BUSY").is_error_code("BUSY"));
    }
}
