//! Property tests of the client request parser (stable, in CI; modest case counts):
//! - any valid multibulk request, encoded and cut at arbitrary read boundaries, parses back to
//!   the same arguments and the same raw bytes; so does an inline request whose words are
//!   quoted with `\xHH` escapes;
//! - a value cap changes only the requests with an argument over it: they come with the
//!   arguments before that one and its length, and their bytes are dropped as they arrive,
//!   never piled up in the read buffer;
//! - the limits (`proto-max-bulk-len`, the multibulk count, the 64 KiB line) give Redis' exact
//!   error texts, and a claimed length or count is never allocated up-front;
//! - arbitrary bytes never panic, and the outcome does not depend on how they were read (with
//!   or without a value cap).

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use redlock_proxy::fuzzing::{
    encode_command, request_parser, ParseError, Request, RequestParser, DEFAULT_MAX_BULK_LEN,
    INLINE_MAX_SIZE,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Records the largest single allocation made by the current thread, so a test can show that
/// a peer's claimed length was not allocated (other tests run on other threads).
struct LargestAllocation;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for LargestAllocation {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(layout.size())));
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(new_size)));
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

/// The largest single allocation `work` made on this thread.
fn largest_allocation_in<T>(work: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    let out = work();
    (out, LARGEST.with(Cell::get))
}

/// How a connection ends up: its requests (arguments, raw bytes, the length of an argument
/// over the value cap), then the protocol error that closed it, if any.
type Outcome = (
    Vec<(Vec<Bytes>, Option<Bytes>, Option<usize>)>,
    Option<ParseError>,
);

/// Feeds `input` to `parser` cut at `cuts` (offsets, any order, out-of-range ones ignored).
fn parse_cut(parser: RequestParser, input: &[u8], cuts: &[usize]) -> Outcome {
    parse_cut_holding(parser, input, cuts).0
}

/// [`parse_cut`], and the most bytes the read buffer held after a parse, beyond those of the
/// read just parsed, while a request was being read past.
fn parse_cut_holding(mut parser: RequestParser, input: &[u8], cuts: &[usize]) -> (Outcome, usize) {
    let mut bounds: Vec<usize> = cuts.iter().copied().filter(|c| *c < input.len()).collect();
    bounds.push(input.len());
    bounds.sort_unstable();
    let mut buf = BytesMut::new();
    let mut requests = Vec::new();
    let (mut start, mut held) = (0, 0);
    for end in bounds {
        buf.extend_from_slice(&input[start..end]);
        let read = end - start;
        start = end;
        loop {
            match parser.next(&mut buf) {
                Ok(Some(Request {
                    args,
                    raw,
                    oversized,
                })) => requests.push((args, raw, oversized)),
                Ok(None) => break,
                Err(err) => return ((requests, Some(err)), held),
            }
        }
        if parser.skipping() {
            held = held.max(buf.len().saturating_sub(read));
        }
    }
    ((requests, None), held)
}

fn parse_whole(input: &[u8]) -> Outcome {
    parse_cut(request_parser(), input, &[])
}

fn command() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..6)
}

/// An inline word that `sdssplitargs` reads back as `word`: double-quoted, every byte `\xHH`.
fn quoted(word: &[u8]) -> String {
    let mut out = String::from("\"");
    for b in word {
        out.push_str(&format!("\\x{b:02x}"));
    }
    out.push('"');
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn multibulk_requests_survive_any_cuts(
        commands in prop::collection::vec(command(), 1..5),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let frames: Vec<Bytes> = commands.iter().map(|c| encode_command(c)).collect();
        let input = frames.concat();
        let cuts: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
        let (requests, error) = parse_cut(request_parser(), &input, &cuts);
        prop_assert_eq!(error, None);
        prop_assert_eq!(requests.len(), commands.len());
        for ((args, raw, oversized), (command, frame)) in
            requests.iter().zip(commands.iter().zip(&frames))
        {
            prop_assert_eq!(args, command);
            prop_assert_eq!(raw.as_ref(), Some(frame));
            prop_assert_eq!(*oversized, None);
        }
    }

    #[test]
    fn a_value_cap_changes_only_the_requests_over_it(
        commands in prop::collection::vec(command(), 1..5),
        cap in 0u64..40,
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let frames: Vec<Bytes> = commands.iter().map(|c| encode_command(c)).collect();
        let input = frames.concat();
        let cuts: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
        let parser = request_parser().with_value_cap(cap);
        let ((requests, error), held) = parse_cut_holding(parser, &input, &cuts);
        prop_assert_eq!(error, None);
        let expected: Vec<_> = commands
            .iter()
            .zip(&frames)
            .map(|(command, frame)| {
                let command: Vec<Bytes> = command.iter().map(|a| Bytes::copy_from_slice(a)).collect();
                match command.iter().position(|a| a.len() as u64 > cap) {
                    Some(i) => (command[..i].to_vec(), None, Some(command[i].len())),
                    None => (command, Some(frame.clone()), None),
                }
            })
            .collect();
        prop_assert_eq!(requests, expected);
        // While a request is read past, the buffer holds at most the last read and what came
        // of a `$` line before it.
        prop_assert!(held <= 4, "held {} bytes more than the last read", held);
    }

    #[test]
    fn quoted_inline_requests_survive_any_cuts(
        commands in prop::collection::vec(command(), 1..4),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
        crlf in any::<bool>(),
    ) {
        let end = if crlf { "\r\n" } else { "\n" };
        let input: String = commands
            .iter()
            .map(|c| c.iter().map(|w| quoted(w)).collect::<Vec<_>>().join(" ") + end)
            .collect();
        let cuts: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
        let (requests, error) = parse_cut(request_parser(), input.as_bytes(), &cuts);
        prop_assert_eq!(error, None);
        let args: Vec<&Vec<Bytes>> = requests.iter().map(|(args, ..)| args).collect();
        prop_assert_eq!(args.len(), commands.len());
        for (args, command) in args.into_iter().zip(&commands) {
            prop_assert_eq!(args, command);
        }
    }

    #[test]
    fn bulk_lengths_over_the_cap_are_refused_unallocated(
        cap in 0u64..=DEFAULT_MAX_BULK_LEN,
        over in 1u64..=u64::MAX / 2,
    ) {
        let claimed = cap.saturating_add(over).min(i64::MAX as u64);
        let input = format!("*1\r\n${claimed}\r\n");
        let (outcome, largest) =
            largest_allocation_in(|| parse_cut(RequestParser::new(cap), input.as_bytes(), &[]));
        prop_assert_eq!(outcome.1.map(|e| e.to_string()),
            Some("Protocol error: invalid bulk length".to_string()));
        prop_assert!(largest < 64 * 1024, "allocated {} bytes", largest);
    }

    #[test]
    fn claimed_sizes_within_the_limits_are_not_allocated_up_front(
        count in 1i64..=i32::MAX as i64,
        len in 1u64..=DEFAULT_MAX_BULK_LEN,
    ) {
        // A count and a bulk length Redis accepts, with none of the promised bytes sent: the
        // parser waits for them without reserving room for them.
        let input = format!("*{count}\r\n${len}\r\nab");
        let (outcome, largest) = largest_allocation_in(|| parse_whole(input.as_bytes()));
        prop_assert_eq!(outcome, (vec![], None));
        prop_assert!(largest < 64 * 1024, "allocated {} bytes", largest);
    }

    #[test]
    fn multibulk_counts_over_int_max_are_refused(count in (i32::MAX as i64 + 1)..=i64::MAX) {
        let outcome = parse_whole(format!("*{count}\r\n").as_bytes());
        prop_assert_eq!(outcome.1.map(|e| e.to_string()),
            Some("Protocol error: invalid multibulk length".to_string()));
    }

    #[test]
    fn lines_past_the_inline_limit_are_refused(
        extra in 1usize..4096,
        filler in prop::sample::select(&b"a0 x\t"[..]),
        kind in 0usize..3,
    ) {
        // No line end at all: inline request, multibulk count line, bulk length line.
        let (prefix, text): (&[u8], &str) = [
            (&b""[..], "Protocol error: too big inline request"),
            (&b"*"[..], "Protocol error: too big mbulk count string"),
            (&b"*1\r\n$"[..], "Protocol error: too big bulk count string"),
        ][kind];
        let mut input = prefix.to_vec();
        input.resize(prefix.len() + INLINE_MAX_SIZE + extra, filler);
        let (requests, error) = parse_whole(&input);
        prop_assert!(requests.is_empty());
        prop_assert_eq!(error.map(|e| e.to_string()), Some(text.to_string()));
        // At the limit, the parser still waits for the line to end.
        let (requests, error) = parse_whole(&input[..prefix.len() + INLINE_MAX_SIZE - 1]);
        prop_assert!(requests.is_empty() && error.is_none());
    }

    #[test]
    fn garbage_never_panics_and_reads_do_not_matter(
        input in prop::collection::vec(
            prop_oneof![
                4 => any::<u8>(),
                6 => prop::sample::select(&b"*$\r\n-0123456789\"' \\x"[..]),
            ],
            0..300,
        ),
        cuts in prop::collection::vec(any::<usize>(), 0..16),
        cap in prop_oneof![Just(u64::MAX), 0u64..8],
    ) {
        let cuts: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
        let parser = || request_parser().with_value_cap(cap);
        prop_assert_eq!(parse_cut(parser(), &input, &cuts), parse_cut(parser(), &input, &[]));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Before authentication, Redis' tighter limits (10 arguments, 16 KiB bulks) and texts.
    #[test]
    fn pre_auth_limits_have_redis_texts(
        count in 11i64..=i32::MAX as i64,
        len in 16_385u64..=DEFAULT_MAX_BULK_LEN,
        bulk in any::<bool>(),
    ) {
        let mut parser = request_parser();
        parser.unauthenticated = true;
        let (input, text) = if bulk {
            (format!("*2\r\n$4\r\nAUTH\r\n${len}\r\n"), "Protocol error: unauthenticated bulk length")
        } else {
            (format!("*{count}\r\n"), "Protocol error: unauthenticated multibulk length")
        };
        let (requests, error) = parse_cut(parser, input.as_bytes(), &[]);
        prop_assert!(requests.is_empty());
        prop_assert_eq!(error.map(|e| e.to_string()), Some(text.to_string()));
    }
}
