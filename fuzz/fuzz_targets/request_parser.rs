//! The client request parser on arbitrary bytes. The first byte picks how the rest is cut
//! into reads, (its low bit) whether the client has authenticated and (its next bit) whether
//! arguments over [`VALUE_CAP`] bytes are read past; the same bytes parsed in one read must
//! give the same requests and the same error, every multibulk request's `raw` bytes must
//! parse back to the same arguments on their own, every request re-encoded as a multibulk
//! must parse back to itself, and a request is marked oversized exactly when it met an
//! argument over the cap (keeping none past it).
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use redlock_proxy::fuzzing::{
    encode_command, request_parser, ParseError, Request, INLINE_MAX_SIZE,
};
use redlock_proxy_fuzz::reads;

/// The value cap when the first byte asks for one: small, so that short inputs cross it.
const VALUE_CAP: u64 = 8;

/// What a connection would see: its requests in order, then the protocol error that closed
/// it (if any).
#[derive(Debug, PartialEq)]
struct Session {
    requests: Vec<Vec<Bytes>>,
    error: Option<ParseError>,
    raws: Vec<Option<Bytes>>,
    oversized: Vec<Option<usize>>,
}

fn parse_in_reads(input: &[u8], unauthenticated: bool, cap: u64, pattern: Option<u8>) -> Session {
    let mut parser = request_parser().with_value_cap(cap);
    parser.unauthenticated = unauthenticated;
    let mut buf = BytesMut::new();
    let mut session = Session {
        requests: Vec::new(),
        error: None,
        raws: Vec::new(),
        oversized: Vec::new(),
    };
    for read in reads(input, pattern) {
        buf.extend_from_slice(read);
        loop {
            match parser.next(&mut buf) {
                Ok(Some(Request {
                    args,
                    raw,
                    oversized,
                })) => {
                    assert!(
                        !args.is_empty() || oversized.is_some(),
                        "an empty request is skipped, not returned"
                    );
                    match oversized {
                        Some(len) => {
                            assert!(len as u64 > cap, "oversized at {len}, cap {cap}");
                            // Its bytes are not kept (a multibulk's were dropped unread).
                            assert!(raw.is_none());
                        }
                        None => assert!(args.iter().all(|a| a.len() as u64 <= cap)),
                    }
                    session.requests.push(args);
                    session.raws.push(raw);
                    session.oversized.push(oversized);
                }
                Ok(None) => break,
                Err(err) => {
                    assert!(err.to_string().starts_with("Protocol error: "));
                    session.error = Some(err);
                    return session;
                }
            }
        }
    }
    session
}

/// Parses `bytes` as the only input of a fresh connection: exactly one request, nothing left.
fn parse_alone(bytes: &[u8]) -> Vec<Bytes> {
    let mut parser = request_parser();
    let mut buf = BytesMut::from(bytes);
    let request = parser
        .next(&mut buf)
        .expect("a request's own bytes parse")
        .expect("a request's own bytes are complete");
    assert!(buf.is_empty(), "a request's own bytes are consumed whole");
    request.args
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, input)) = data.split_first() else {
        return;
    };
    let unauthenticated = cut & 1 == 1;
    let cap = if cut & 2 == 2 { VALUE_CAP } else { u64::MAX };
    let whole = parse_in_reads(input, unauthenticated, cap, None);
    let pieces = parse_in_reads(input, unauthenticated, cap, Some(cut));
    // Past the line limit, where the "too big" errors fall depends on the reads, in Redis too.
    if input.len() <= INLINE_MAX_SIZE {
        assert_eq!(
            whole, pieces,
            "the parse depends on how the bytes were read"
        );
    }
    for (args, raw) in whole.requests.iter().zip(&whole.raws) {
        if let Some(raw) = raw {
            assert_eq!(&parse_alone(raw), args);
        }
        // An oversized request may keep no argument at all: nothing to re-encode.
        if !args.is_empty() {
            assert_eq!(&parse_alone(&encode_command(args)), args);
        }
    }
});
