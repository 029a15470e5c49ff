//! Incremental request parser with Redis' semantics.
//!
//! Invariants:
//! - Never panics and never allocates from a peer-supplied count: argument vectors start at
//!   `min(count, 1024)` and grow as arguments arrive (Redis `processMultibulkBuffer`).
//! - Resumable: a half-received multibulk request is not re-scanned from its start on every
//!   read; the parser keeps the offsets of the arguments it has already seen, so a request with
//!   many arguments costs O(bytes), not O(bytes × reads).
//! - Every error is one of Redis' own protocol error texts (`src/networking.c`); the caller
//!   sends it and closes the connection, exactly as Redis does (`CLIENT_CLOSE_AFTER_REPLY`).
//! - A complete request is split off the read buffer and frozen once; its arguments are
//!   zero-copy slices of those bytes, and `raw` holds the exact bytes for verbatim forwarding.
//! - Bounded by the value cap ([`RequestParser::with_value_cap`]), not by the peer: an
//!   argument announced longer than the cap is read past, not buffered. Its payload, and every
//!   later argument of its request (headers still checked, payloads of any size), are dropped
//!   from the read buffer as they arrive, counting only bytes and arguments; the request then
//!   comes out with the arguments before it and [`Request::oversized`], for the caller to
//!   refuse. A request of 10 MB thus holds one read's worth of memory, not 10 MB.

use bytes::{Buf, Bytes, BytesMut};
use std::ops::Range;

/// Longest inline request or length line Redis accepts (`PROTO_INLINE_MAX_SIZE`).
pub const INLINE_MAX_SIZE: usize = 64 * 1024;

/// Redis' `proto-max-bulk-len` default (512 MB).
pub const DEFAULT_MAX_BULK_LEN: u64 = 512 * 1024 * 1024;

/// Largest multibulk count Redis accepts (`INT_MAX`).
const MAX_MULTIBULK_COUNT: i64 = i32::MAX as i64;

/// Redis preallocates at most this many argument slots, whatever the peer announces.
const PREALLOC_ARGS: usize = 1024;

/// One client request: its arguments, and for multibulk requests the exact bytes received.
#[derive(Debug, Clone)]
pub struct Request {
    /// Command name and arguments (binary-safe). For a multibulk request with an argument over
    /// the value cap, only the arguments before that one (none if it was the name): the rest
    /// were dropped unread.
    pub args: Vec<Bytes>,
    /// The request exactly as received when it came as a RESP multibulk, `None` for inline
    /// and for a request with an argument over the value cap (its bytes were not kept).
    pub raw: Option<Bytes>,
    /// The length of the request's first argument longer than the value cap, if any: the
    /// request is to be refused, never run.
    pub oversized: Option<usize>,
}

impl Request {
    /// Whether it is a line of an HTTP request (`POST …`, a `Host:` header) sent to the RESP
    /// port: what redis-server takes for cross-protocol scripting, a browser made to send an
    /// attacker's commands in the body of a request (`processCommand`: a command named
    /// `post` or `host:`, whatever the case).
    pub fn is_http(&self) -> bool {
        self.args.first().is_some_and(|name| {
            name.eq_ignore_ascii_case(b"post") || name.eq_ignore_ascii_case(b"host:")
        })
    }
}

/// A protocol violation. `Display` gives the text after `-ERR `, as Redis words it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("Protocol error: invalid multibulk length")]
    InvalidMultibulkLength,
    #[error("Protocol error: invalid bulk length")]
    InvalidBulkLength,
    #[error("Protocol error: expected '$', got '{}'", char::from(*.0))]
    ExpectedDollar(u8),
    #[error("Protocol error: too big mbulk count string")]
    TooBigMultibulkCount,
    #[error("Protocol error: too big bulk count string")]
    TooBigBulkCount,
    #[error("Protocol error: too big inline request")]
    TooBigInline,
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
    /// A client that must authenticate sent a multibulk of more than
    /// [`UNAUTHENTICATED_MAX_ARGS`] arguments (Redis' fix for CVE-2021-32675).
    #[error("Protocol error: unauthenticated multibulk length")]
    UnauthenticatedMultibulkLength,
    /// A client that must authenticate sent a bulk longer than [`UNAUTHENTICATED_MAX_BULK`].
    #[error("Protocol error: unauthenticated bulk length")]
    UnauthenticatedBulkLength,
}

/// Most arguments of a request from a client that has not authenticated (Redis: 10).
pub const UNAUTHENTICATED_MAX_ARGS: i64 = 10;
/// Longest bulk from a client that has not authenticated (Redis: 16384).
pub const UNAUTHENTICATED_MAX_BULK: i64 = 16384;

/// State of a multibulk request whose bytes have not all arrived yet.
#[derive(Debug, Default)]
struct Partial {
    /// Announced argument count.
    expected: usize,
    /// Where parsing resumes.
    pos: usize,
}

/// State of a multibulk request being read past, from the first argument over the value cap
/// to its end: nothing of it stays in the read buffer, and what is kept does not grow with
/// the bytes or the arguments still to come.
#[derive(Debug)]
struct Skip {
    /// The arguments before the oversized one (they were in the buffer already).
    kept: Vec<Bytes>,
    /// The oversized argument's length.
    len: usize,
    /// Arguments whose `$` line is still to come.
    left: usize,
    /// Bytes of the current argument (payload and the two after it) still to drop.
    remaining: u64,
}

/// Parses requests out of a connection's read buffer.
#[derive(Debug)]
pub struct RequestParser {
    max_bulk_len: u64,
    /// Longest argument kept; a longer one is read past ([`Skip`]).
    value_cap: u64,
    partial: Option<Partial>,
    /// The request being read past, if one is: then `partial` is `None`.
    skip: Option<Skip>,
    /// Byte ranges (in the read buffer) of the partial request's arguments received so far.
    /// Kept from one request to the next, so that parsing allocates only the request's own
    /// argument vector.
    ranges: Vec<Range<usize>>,
    /// The client must still authenticate: Redis' pre-auth limits apply.
    pub unauthenticated: bool,
}

impl RequestParser {
    /// A parser that refuses bulk strings longer than `max_bulk_len` (Redis' `proto-max-bulk-len`).
    /// Every argument up to that length is kept: no value cap.
    pub fn new(max_bulk_len: u64) -> Self {
        Self {
            max_bulk_len,
            value_cap: u64::MAX,
            partial: None,
            skip: None,
            ranges: Vec::new(),
            unauthenticated: false,
        }
    }

    /// The same parser, reading past arguments longer than `cap` instead of buffering them:
    /// their requests come with [`Request::oversized`] set. A length above `max_bulk_len`
    /// stays a protocol error.
    pub fn with_value_cap(mut self, cap: u64) -> Self {
        self.value_cap = cap;
        self
    }

    /// Whether a request is being read past: its bytes are dropped as they come, so the caller
    /// may read in larger pieces without holding more memory.
    pub fn skipping(&self) -> bool {
        self.skip.is_some()
    }

    /// Returns the next complete request, `Ok(None)` if more bytes are needed.
    /// Empty requests (`*0`, `*-1`, blank inline lines) are skipped, as Redis does.
    pub fn next(&mut self, buf: &mut BytesMut) -> Result<Option<Request>, ParseError> {
        loop {
            if self.skip.is_some() {
                return self.skip_rest(buf);
            }
            if self.partial.is_none() {
                if buf.is_empty() {
                    return Ok(None);
                }
                if buf[0] != b'*' {
                    match parse_inline(buf, self.value_cap)? {
                        Some(Some(req)) => return Ok(Some(req)),
                        Some(None) => continue,
                        None => return Ok(None),
                    }
                }
            }
            match self.parse_multibulk(buf)? {
                Some(Some(req)) => return Ok(Some(req)),
                Some(None) => continue,
                None => return Ok(None),
            }
        }
    }

    /// `Some(None)` = an empty request was consumed; `None` = incomplete.
    fn parse_multibulk(
        &mut self,
        buf: &mut BytesMut,
    ) -> Result<Option<Option<Request>>, ParseError> {
        let max_bulk_len = self.max_bulk_len;
        let value_cap = self.value_cap;
        let unauthenticated = self.unauthenticated;
        let partial = match &mut self.partial {
            Some(p) => p,
            None => {
                let Some((line_end, count)) = multibulk_count(buf)? else {
                    return Ok(None);
                };
                if unauthenticated && count > UNAUTHENTICATED_MAX_ARGS {
                    return Err(ParseError::UnauthenticatedMultibulkLength);
                }
                if count <= 0 {
                    buf.advance(line_end + 2);
                    return Ok(Some(None));
                }
                let expected = count as usize;
                self.ranges.clear();
                self.ranges.reserve(expected.min(PREALLOC_ARGS));
                self.partial.insert(Partial {
                    expected,
                    pos: line_end + 2,
                })
            }
        };
        while self.ranges.len() < partial.expected {
            let Some((line_end, len)) =
                bulk_header(buf, partial.pos, max_bulk_len, unauthenticated)?
            else {
                return Ok(None);
            };
            if len > value_cap {
                self.start_skip(buf, line_end, len);
                return self.skip_rest(buf).map(|req| req.map(Some));
            }
            let start = line_end + 2;
            // Redis skips the two bytes after the payload without checking them.
            let end = start + len as usize;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            partial.pos = end + 2;
            self.ranges.push(start..end);
        }
        let Partial { pos, .. } = self.partial.take().unwrap_or_default();
        let raw = buf.split_to(pos).freeze();
        let args = self.take_args(&raw);
        Ok(Some(Some(Request {
            args,
            raw: Some(raw),
            oversized: None,
        })))
    }

    /// The `$` line ending at `buf[line_end]` announces `len`, over the value cap: the request
    /// is read past from here. The arguments before it are split off `buf` and kept; the line
    /// is dropped, and [`RequestParser::skip_rest`] drops the rest as it comes.
    fn start_skip(&mut self, buf: &mut BytesMut, line_end: usize, len: u64) {
        let Partial { expected, pos } = self.partial.take().unwrap_or_default();
        let head = buf.split_to(pos).freeze();
        let kept = self.take_args(&head);
        buf.advance(line_end + 2 - pos);
        self.skip = Some(Skip {
            left: expected - kept.len() - 1,
            kept,
            len: len as usize,
            remaining: len + 2,
        });
    }

    /// Drops what `buf` holds of the request being read past; the request (its kept
    /// arguments, [`Request::oversized`]) once its last argument is gone, `None` until then.
    /// The `$` lines are checked as everywhere else: a bad one is the connection's end.
    fn skip_rest(&mut self, buf: &mut BytesMut) -> Result<Option<Request>, ParseError> {
        let Some(skip) = &mut self.skip else {
            return Ok(None);
        };
        loop {
            // The payload and the two bytes after it, unchecked as Redis skips them.
            let drop = skip.remaining.min(buf.len() as u64);
            buf.advance(drop as usize);
            skip.remaining -= drop;
            if skip.remaining > 0 {
                return Ok(None);
            }
            if skip.left == 0 {
                break;
            }
            let Some((line_end, len)) =
                bulk_header(buf, 0, self.max_bulk_len, self.unauthenticated)?
            else {
                return Ok(None);
            };
            buf.advance(line_end + 2);
            skip.left -= 1;
            skip.remaining = len + 2;
        }
        Ok(self.skip.take().map(|Skip { kept, len, .. }| Request {
            args: kept,
            raw: None,
            oversized: Some(len),
        }))
    }

    /// The arguments whose ranges were noted, as slices of `bytes` (the request's bytes, from
    /// its start).
    fn take_args(&mut self, bytes: &Bytes) -> Vec<Bytes> {
        let args = self.ranges.drain(..).map(|r| bytes.slice(r)).collect();
        // A request with many arguments must not pin their ranges' memory.
        if self.ranges.capacity() > PREALLOC_ARGS {
            self.ranges = Vec::new();
        }
        args
    }
}

/// The `*` line at the start of `buf`: where it ends (its `\r`) and the argument count it
/// announces, `None` until the line and the byte after it are here.
fn multibulk_count(buf: &[u8]) -> Result<Option<(usize, i64)>, ParseError> {
    if let Some(short) = short_number(buf, 1) {
        return Ok(Some(short));
    }
    let Some(line_end) = line_end(buf, 0, 1, ParseError::TooBigMultibulkCount)? else {
        return Ok(None);
    };
    let count = parse_strict_i64(&buf[1..line_end])
        .filter(|n| *n <= MAX_MULTIBULK_COUNT)
        .ok_or(ParseError::InvalidMultibulkLength)?;
    Ok(Some((line_end, count)))
}

/// The `$` line starting at `buf[pos]`: where it ends (its `\r`) and the length it announces,
/// `None` until the line and the byte after it are here. The length is checked against
/// `max_bulk_len`, and against Redis' pre-auth limit for a client not yet authenticated.
fn bulk_header(
    buf: &[u8],
    pos: usize,
    max_bulk_len: u64,
    unauthenticated: bool,
) -> Result<Option<(usize, u64)>, ParseError> {
    let Some((line_end, len)) = bulk_length(buf, pos)? else {
        return Ok(None);
    };
    if len < 0 || len as u64 > max_bulk_len {
        return Err(ParseError::InvalidBulkLength);
    }
    if unauthenticated && len > UNAUTHENTICATED_MAX_BULK {
        return Err(ParseError::UnauthenticatedBulkLength);
    }
    Ok(Some((line_end, len as u64)))
}

/// The `$` line starting at `buf[pos]`: where it ends (its `\r`) and the length it announces,
/// `None` until the line and the byte after it are here.
fn bulk_length(buf: &[u8], pos: usize) -> Result<Option<(usize, i64)>, ParseError> {
    let Some(&first) = buf.get(pos) else {
        return Ok(None);
    };
    if first == b'$' {
        if let Some(short) = short_number(buf, pos + 1) {
            return Ok(Some(short));
        }
    }
    let Some(line_end) = line_end(buf, pos, pos, ParseError::TooBigBulkCount)? else {
        return Ok(None);
    };
    if first != b'$' {
        return Err(ParseError::ExpectedDollar(first));
    }
    let len = parse_strict_i64(&buf[pos + 1..line_end]).ok_or(ParseError::InvalidBulkLength)?;
    Ok(Some((line_end, len)))
}

/// The end (the `\r`, searched for from `from`) of the line starting at `buf[start]`, `None`
/// until it and the byte after it are here; a line longer than Redis' limit with no end yet
/// is `too_big`.
fn line_end(
    buf: &[u8],
    start: usize,
    from: usize,
    too_big: ParseError,
) -> Result<Option<usize>, ParseError> {
    let Some(end) = find_cr(buf, from) else {
        if buf.len() - start > INLINE_MAX_SIZE {
            return Err(too_big);
        }
        return Ok(None);
    };
    Ok((end + 1 < buf.len()).then_some(end))
}

/// Inline command (`PING\r\n`, `set "a b" c\n`): `Some(None)` = blank line consumed. Its
/// arguments are all kept (the line is at most 64 KiB), the first over `value_cap` noted.
fn parse_inline(buf: &mut BytesMut, value_cap: u64) -> Result<Option<Option<Request>>, ParseError> {
    let Some(nl) = find_byte(buf, 0, b'\n') else {
        if buf.len() > INLINE_MAX_SIZE {
            return Err(ParseError::TooBigInline);
        }
        return Ok(None);
    };
    let line = buf.split_to(nl + 1);
    let mut text = &line[..nl];
    if text.last() == Some(&b'\r') {
        text = &text[..text.len() - 1];
    }
    let args = split_args(text).ok_or(ParseError::UnbalancedQuotes)?;
    if args.is_empty() {
        return Ok(Some(None));
    }
    let oversized = args
        .iter()
        .map(Bytes::len)
        .find(|&len| len as u64 > value_cap);
    Ok(Some(Some(Request {
        args,
        raw: None,
        oversized,
    })))
}

/// Position of the first `target` at or after `from`. Like Redis' `strchr` on the query
/// buffer, the search stops at a NUL byte: a line with a NUL before its end is not complete
/// (Redis waits for more input, up to the 64 KiB line limit).
fn find_byte(buf: &[u8], from: usize, target: u8) -> Option<usize> {
    let rest = buf.get(from..)?;
    let at = rest.iter().position(|&b| b == target || b == 0)?;
    (rest[at] == target).then_some(at + from)
}

/// The number of a line of one or two digits starting at `buf[start]` (after its `*` or `$`),
/// followed by `\r` and one more byte: the line's end (its `\r`) and the number. Nearly every
/// line of a request is one, and this takes it without the search and the general parse;
/// anything else (longer, signed, a leading zero, not all here yet) is `None` and goes the
/// general way, which gives the same answer for these.
fn short_number(buf: &[u8], start: usize) -> Option<(usize, i64)> {
    let digit = |d: u8| i64::from(d - b'0');
    match *buf.get(start..start + 4)? {
        [d, b'\r', _, _] if d.is_ascii_digit() => Some((start + 1, digit(d))),
        [d @ b'1'..=b'9', e, b'\r', _] if e.is_ascii_digit() => {
            Some((start + 2, digit(d) * 10 + digit(e)))
        }
        _ => None,
    }
}

fn find_cr(buf: &[u8], from: usize) -> Option<usize> {
    find_byte(buf, from, b'\r')
}

/// Redis' `string2ll`: optional `-`, digits, no `+`, no leading zeros, no spaces, fits in i64.
pub fn parse_strict_i64(s: &[u8]) -> Option<i64> {
    let (negative, digits) = match s.split_first()? {
        (b'-', rest) => (true, rest),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 19 || (digits[0] == b'0' && (s.len() > 1)) {
        return None;
    }
    let mut value: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        let digit = i64::from(d - b'0');
        value = value.checked_mul(10)?;
        value = if negative {
            value.checked_sub(digit)?
        } else {
            value.checked_add(digit)?
        };
    }
    Some(value)
}

/// Redis' `sdssplitargs`: whitespace-separated words, `"..."` with C-like escapes (`\n`,
/// `\xHH`, ...), `'...'` with only `\'`. A closing quote must be followed by a space or the
/// end of the line. `None` = unbalanced quotes.
fn split_args(line: &[u8]) -> Option<Vec<Bytes>> {
    let mut args = Vec::new();
    let mut i = 0;
    loop {
        while line.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        if i >= line.len() {
            return Some(args);
        }
        let (arg, next) = split_arg(line, i)?;
        args.push(Bytes::from(arg));
        i = next;
    }
}

/// The word starting at `line[i]`: its bytes, and where the scan goes on after it.
fn split_arg(line: &[u8], mut i: usize) -> Option<(Vec<u8>, usize)> {
    let mut arg = Vec::new();
    while let Some(&c) = line.get(i) {
        match c {
            b'"' => return double_quoted(line, i + 1, &mut arg).map(|next| (arg, next)),
            b'\'' => return single_quoted(line, i + 1, &mut arg).map(|next| (arg, next)),
            c if c.is_ascii_whitespace() => break,
            c => arg.push(c),
        }
        i += 1;
    }
    Some((arg, i))
}

/// The rest of a `"..."` from `line[i]` (after the opening quote) appended to `arg`, escapes
/// decoded: where the scan goes on after the closing quote.
fn double_quoted(line: &[u8], mut i: usize, arg: &mut Vec<u8>) -> Option<usize> {
    loop {
        match *line.get(i)? {
            b'\\' => i = escape(line, i, arg),
            b'"' => return after_closing_quote(line, i),
            c => {
                arg.push(c);
                i += 1;
            }
        }
    }
}

/// The escape at `line[i]` (a `\` within double quotes) appended to `arg`: where the scan
/// goes on after it.
fn escape(line: &[u8], i: usize, arg: &mut Vec<u8>) -> usize {
    if let [b'\\', b'x', h, l, ..] = line[i..] {
        if let (Some(h), Some(l)) = (hex(h), hex(l)) {
            arg.push(h * 16 + l);
            return i + 4;
        }
    }
    let Some(&c) = line.get(i + 1) else {
        arg.push(b'\\');
        return i + 1;
    };
    arg.push(match c {
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        b'b' => 0x08,
        b'a' => 0x07,
        other => other,
    });
    i + 2
}

/// The rest of a `'...'` from `line[i]` (after the opening quote) appended to `arg`, `\'`
/// decoded: where the scan goes on after the closing quote.
fn single_quoted(line: &[u8], mut i: usize, arg: &mut Vec<u8>) -> Option<usize> {
    loop {
        match *line.get(i)? {
            b'\\' if line.get(i + 1) == Some(&b'\'') => {
                arg.push(b'\'');
                i += 2;
            }
            b'\'' => return after_closing_quote(line, i),
            c => {
                arg.push(c);
                i += 1;
            }
        }
    }
}

/// After the closing quote at `line[i]`: where the scan goes on, `None` if neither a space
/// nor the end of the line follows it.
fn after_closing_quote(line: &[u8], i: usize) -> Option<usize> {
    match line.get(i + 1) {
        Some(c) if !c.is_ascii_whitespace() => None,
        _ => Some(i + 1),
    }
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Args = Vec<Vec<u8>>;

    fn parse_all(input: &[u8]) -> Result<Vec<Args>, ParseError> {
        let mut parser = RequestParser::new(DEFAULT_MAX_BULK_LEN);
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        while let Some(req) = parser.next(&mut buf)? {
            out.push(req.args.iter().map(|a| a.to_vec()).collect());
        }
        Ok(out)
    }

    fn words(list: &[&str]) -> Vec<Vec<u8>> {
        list.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    #[test]
    fn multibulk_and_inline_requests() {
        let cases: &[(&[u8], Vec<Args>)] = &[
            (b"*1\r\n$4\r\nPING\r\n", vec![words(&["PING"])]),
            (b"PING\r\n", vec![words(&["PING"])]),
            (b"PING\n", vec![words(&["PING"])]),
            (b"\r\n\r\nPING\r\n", vec![words(&["PING"])]),
            (b"*0\r\n*-10\r\nPING\r\n", vec![words(&["PING"])]),
            (
                b"set \"a b\" 'c d'\r\n",
                vec![words(&["set", "a b", "c d"])],
            ),
            (b"echo \"\\x41\\n\"\r\n", vec![words(&["echo", "A\n"])]),
            (b"echo 'it\\'s'\r\n", vec![words(&["echo", "it's"])]),
            (
                b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n*1\r\n$4\r\nPING\r\n",
                vec![words(&["SET", "k", ""]), words(&["PING"])],
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(
                &parse_all(input).unwrap(),
                expected,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn pre_auth_limits_are_redis_own() {
        let mut parser = RequestParser::new(DEFAULT_MAX_BULK_LEN);
        parser.unauthenticated = true;
        let eleven = b"*11\r\n".to_vec();
        let big = b"*2\r\n$4\r\nAUTH\r\n$16385\r\n".to_vec();
        let limit = b"*2\r\n$4\r\nAUTH\r\n$16384\r\n".to_vec();
        let mut buf = BytesMut::from(&eleven[..]);
        assert_eq!(
            parser.next(&mut buf).unwrap_err().to_string(),
            "Protocol error: unauthenticated multibulk length"
        );
        let mut buf = BytesMut::from(&big[..]);
        assert_eq!(
            parser.next(&mut buf).unwrap_err().to_string(),
            "Protocol error: unauthenticated bulk length"
        );
        // At the limits: waits for the rest; an invalid length is still reported as invalid.
        let mut buf = BytesMut::from(&limit[..]);
        assert!(parser.next(&mut buf).unwrap().is_none());
        let mut parser = RequestParser::new(DEFAULT_MAX_BULK_LEN);
        parser.unauthenticated = true;
        let mut buf = BytesMut::from(&b"*1\r\n$-1\r\n"[..]);
        assert_eq!(
            parser.next(&mut buf).unwrap_err(),
            ParseError::InvalidBulkLength
        );
        // Once authenticated, the same requests are fine.
        assert!(parse_all(&eleven).unwrap().is_empty());
        assert!(parse_all(&big).unwrap().is_empty());
    }

    #[test]
    fn protocol_errors_use_redis_wording() {
        let cases: &[(&[u8], &str)] = &[
            (
                b"*3000000000\r\n",
                "Protocol error: invalid multibulk length",
            ),
            (b"*x\r\n", "Protocol error: invalid multibulk length"),
            (b"*1\r\n$-10\r\n", "Protocol error: invalid bulk length"),
            (b"*1\r\n$04\r\n", "Protocol error: invalid bulk length"),
            (b"*1\r\n$+4\r\n", "Protocol error: invalid bulk length"),
            (b"*1\r\n$abc\r\n", "Protocol error: invalid bulk length"),
            (
                b"*1\r\n$2000000000\r\n",
                "Protocol error: invalid bulk length",
            ),
            (b"*1\r\nfoo\r\n", "Protocol error: expected '$', got 'f'"),
            (
                b"set \"\"\"k\"\"\" v\r\n",
                "Protocol error: unbalanced quotes in request",
            ),
            (
                b"set \"k v\r\n",
                "Protocol error: unbalanced quotes in request",
            ),
        ];
        for (input, text) in cases {
            let err = parse_all(input).unwrap_err();
            assert_eq!(
                err.to_string(),
                *text,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn oversized_lines_are_refused_without_newline() {
        let big = vec![b'a'; INLINE_MAX_SIZE + 1];
        assert_eq!(parse_all(&big).unwrap_err(), ParseError::TooBigInline);
        let mut mb = b"*".to_vec();
        mb.extend(std::iter::repeat_n(b'1', INLINE_MAX_SIZE + 1));
        assert_eq!(
            parse_all(&mb).unwrap_err(),
            ParseError::TooBigMultibulkCount
        );
        let mut bulk = b"*1\r\n$".to_vec();
        bulk.extend(std::iter::repeat_n(b'1', INLINE_MAX_SIZE + 1));
        assert_eq!(parse_all(&bulk).unwrap_err(), ParseError::TooBigBulkCount);
    }

    #[test]
    fn short_numbers_agree_with_the_general_parse() {
        let mut lines: Vec<String> = (0..=120).map(|n| n.to_string()).collect();
        lines.extend(["00", "05", "-1", "-0", "+1", "1a", "a", ""].map(String::from));
        for line in lines {
            for tail in ["\r\n", "\r", "\n\r\n", "\0\r\n"] {
                let buf = format!("${line}{tail}");
                let buf = buf.as_bytes();
                let general = find_cr(buf, 1).and_then(|end| {
                    (end + 1 < buf.len()).then(|| parse_strict_i64(&buf[1..end]).map(|n| (end, n)))
                });
                if let Some(short) = short_number(buf, 1) {
                    assert_eq!(general, Some(Some(short)), "{buf:?}");
                }
                // Taken whenever the line is complete and the request goes on after it.
                let unsigned = general.flatten().is_some() && !line.starts_with('-');
                if line.len() <= 2 && tail == "\r\n" && unsigned {
                    let more = [buf, b"x"].concat();
                    assert!(short_number(&more, 1).is_some(), "{buf:?}");
                }
            }
        }
    }

    #[test]
    fn configured_bulk_cap_is_enforced() {
        let mut parser = RequestParser::new(4);
        let mut buf = BytesMut::from(&b"*1\r\n$5\r\nhello\r\n"[..]);
        assert_eq!(
            parser.next(&mut buf).unwrap_err(),
            ParseError::InvalidBulkLength
        );
    }

    #[test]
    fn byte_by_byte_feeding_gives_the_same_requests() {
        let input = b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nvalue\r\nGET key\r\n*2\r\n$3\r\nDEL\r\n$3\r\nkey\r\n";
        let mut parser = RequestParser::new(DEFAULT_MAX_BULK_LEN);
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for &b in input.iter() {
            buf.extend_from_slice(&[b]);
            while let Some(req) = parser.next(&mut buf).unwrap() {
                got.push(req.args.iter().map(|a| a.to_vec()).collect::<Vec<_>>());
            }
        }
        assert_eq!(
            got,
            vec![
                words(&["SET", "key", "value"]),
                words(&["GET", "key"]),
                words(&["DEL", "key"])
            ]
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn raw_bytes_are_kept_for_multibulk() {
        let mut parser = RequestParser::new(DEFAULT_MAX_BULK_LEN);
        let input = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";
        let mut buf = BytesMut::from(&input[..]);
        let req = parser.next(&mut buf).unwrap().unwrap();
        assert_eq!(req.raw.unwrap().as_ref(), input);
    }

    /// Random and mutated inputs, whole and split at every chunk size: the parser never
    /// panics, never returns more bytes than it was given, and ends in a request, an error,
    /// or a wait for more input.
    #[test]
    fn arbitrary_bytes_never_panic() {
        let seeds: &[&[u8]] = &[
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n",
            b"PING \"a\\x4\" 'b\\'\r\n",
            b"*1\r\n$-1\r\n*-1\r\n",
            b"$\x00\r\n*\x00\r\n\x00",
        ];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rand = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..3000 {
            let seed = seeds[round % seeds.len()];
            let mut input = seed.to_vec();
            for _ in 0..(rand() % 6) {
                let at = (rand() as usize) % (input.len() + 1);
                let byte = b"*$\r\n-0123456789\"'\\ x\x00"[(rand() as usize) % 20];
                if rand() % 2 == 0 && at < input.len() {
                    input[at] = byte;
                } else {
                    input.insert(at, byte);
                }
            }
            let chunk = 1 + (rand() as usize) % 8;
            // Half the rounds with a value cap small enough for the seeds to cross it.
            let cap = if round % 2 == 0 { u64::MAX } else { rand() % 4 };
            let mut parser = RequestParser::new(1 << 20).with_value_cap(cap);
            let mut buf = BytesMut::new();
            'feed: for piece in input.chunks(chunk) {
                buf.extend_from_slice(piece);
                loop {
                    match parser.next(&mut buf) {
                        Ok(Some(req)) => assert!(req.args.iter().all(|a| a.len() <= input.len())),
                        Ok(None) => break,
                        Err(_) => break 'feed,
                    }
                }
            }
        }
    }

    /// A request as [`parse_capped`] sees it: arguments, whether `raw` was kept, `oversized`.
    type Seen = (Args, bool, Option<usize>);

    /// What a parser with value cap `cap` makes of `input` fed `chunk` bytes at a time: the
    /// requests or the error, and the most bytes the read buffer held after a parse while a
    /// request was read past.
    fn parse_capped(
        cap: u64,
        input: &[u8],
        chunk: usize,
    ) -> (Result<Vec<Seen>, ParseError>, usize) {
        let mut parser = RequestParser::new(DEFAULT_MAX_BULK_LEN).with_value_cap(cap);
        let mut buf = BytesMut::new();
        let (mut out, mut held) = (Vec::new(), 0);
        for piece in input.chunks(chunk) {
            buf.extend_from_slice(piece);
            loop {
                match parser.next(&mut buf) {
                    Ok(Some(req)) => out.push((
                        req.args.iter().map(|a| a.to_vec()).collect(),
                        req.raw.is_some(),
                        req.oversized,
                    )),
                    Ok(None) => break,
                    Err(err) => return (Err(err), held),
                }
            }
            if parser.skipping() {
                held = held.max(buf.len());
            }
        }
        assert!(buf.is_empty(), "every byte consumed");
        (Ok(out), held)
    }

    /// A multibulk of `args`, each `(length, byte)`: `length` times `byte`.
    fn multibulk(args: &[(usize, u8)]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for &(len, byte) in args {
            out.extend(format!("${len}\r\n").bytes());
            out.extend(std::iter::repeat_n(byte, len));
            out.extend(b"\r\n");
        }
        out
    }

    #[test]
    fn an_argument_over_the_value_cap_is_read_past_unbuffered() {
        const CAP: u64 = 1024;
        let big = 100_000;
        let ping = b"*1\r\n$4\r\nPING\r\n".to_vec();
        let pong = (words(&["PING"]), true, None);
        // (request, the arguments kept, oversized)
        let cases: Vec<(Vec<u8>, Args, Option<usize>)> = vec![
            // In the middle: the arguments before it kept, the later ones (one over the cap
            // too, one at it) dropped; the first one's length reported.
            (
                multibulk(&[
                    (3, b'S'),
                    (1, b'k'),
                    (big, b'v'),
                    (2, b'N'),
                    (5000, b'w'),
                    (1024, b'z'),
                ]),
                vec![b"SSS".to_vec(), b"k".to_vec()],
                Some(big),
            ),
            // The command name itself: nothing kept.
            (multibulk(&[(big, b'n'), (1, b'k')]), vec![], Some(big)),
            // The last argument, one byte over the cap.
            (
                multibulk(&[(4, b'E'), (1025, b'x')]),
                vec![b"EEEE".to_vec()],
                Some(1025),
            ),
            // Exactly at the cap: kept, nothing refused.
            (
                multibulk(&[(4, b'E'), (1024, b'x')]),
                vec![b"EEEE".to_vec(), vec![b'x'; 1024]],
                None,
            ),
        ];
        for (request, kept, oversized) in cases {
            let input = [request.as_slice(), &ping].concat();
            for chunk in [1, 7, 4096, input.len()] {
                let (requests, held) = parse_capped(CAP, &input, chunk);
                let first = (kept.clone(), oversized.is_none(), oversized);
                assert_eq!(
                    requests.unwrap(),
                    vec![first, pong.clone()],
                    "chunk {chunk}"
                );
                // What is read past never piles up: at most a read's worth and a `$` line.
                assert!(held <= chunk + 16, "chunk {chunk}: {held} bytes held");
            }
        }
    }

    #[test]
    fn a_bad_line_after_an_argument_over_the_cap_is_still_a_protocol_error() {
        // Three arguments announced; the second over the cap, the third's `$` line `third`.
        let head = format!("*3\r\n$4\r\nECHO\r\n$2000\r\n{}\r\n", "x".repeat(2000));
        let with_third = |third: &[u8]| [head.as_bytes(), third].concat();
        let cases: &[(&[u8], ParseError)] = &[
            (b"$x\r\n", ParseError::InvalidBulkLength),
            (b"$-1\r\n", ParseError::InvalidBulkLength),
            (b"$2000000000\r\n", ParseError::InvalidBulkLength),
            (b"foo\r\n", ParseError::ExpectedDollar(b'f')),
        ];
        for (third, err) in cases {
            let input = with_third(third);
            for chunk in [1, 7, 4096] {
                let (requests, _) = parse_capped(1024, &input, chunk);
                assert_eq!(requests.unwrap_err(), *err, "{third:?}, chunk {chunk}");
            }
        }
        // Before authentication, Redis' pre-auth limit still applies to the later arguments.
        let mut parser = RequestParser::new(DEFAULT_MAX_BULK_LEN).with_value_cap(1024);
        parser.unauthenticated = true;
        let mut buf = BytesMut::from(&with_third(b"$16385\r\n")[..]);
        assert_eq!(
            parser.next(&mut buf).unwrap_err(),
            ParseError::UnauthenticatedBulkLength
        );
    }

    #[test]
    fn an_inline_argument_over_the_cap_is_noted_and_kept() {
        let long = "a".repeat(1025);
        let input = format!("ECHO {long} b\r\nECHO {}\r\n", &long[1..]);
        let (requests, _) = parse_capped(1024, input.as_bytes(), 7);
        assert_eq!(
            requests.unwrap(),
            vec![
                (words(&["ECHO", &long, "b"]), false, Some(1025)),
                (words(&["ECHO", &long[1..]]), false, None),
            ]
        );
    }

    #[test]
    fn strict_integers_like_string2ll() {
        assert_eq!(parse_strict_i64(b"0"), Some(0));
        assert_eq!(parse_strict_i64(b"-5"), Some(-5));
        assert_eq!(parse_strict_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_strict_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b"01"[..],
            b"+1",
            b"",
            b"-",
            b" 1",
            b"1 ",
            b"9223372036854775808",
            b"-0",
        ] {
            assert_eq!(parse_strict_i64(bad), None, "{:?}", bad);
        }
    }
}
