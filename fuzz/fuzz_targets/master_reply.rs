//! The masters' side on arbitrary bytes: the reply decoder (cut into reads as the first byte
//! says, compared with one read), each reply's encodings to clients, and what the proxy makes
//! of masters' replies without a connection: the quorum merge under each rule, the acquire
//! decision, the token floor, the `PTTL`/`TTL` answer, `TIME` and `INFO` readings.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use redlock_proxy::fuzzing::{
    acquire_decision, conservative_ttl, decode_reply, judge, merge, parse_info, parse_time, quorum,
    token_floor, AcquireDecision, MergeRule, Protocol, Reply, Vote,
};
use redlock_proxy_fuzz::reads;

/// The replies decoded from `input` read as `pattern` says, and whether the stream ended in a
/// protocol error.
fn decode_in_reads(input: &[u8], pattern: Option<u8>) -> (Vec<Reply>, bool) {
    let mut buf = BytesMut::new();
    let mut replies = Vec::new();
    for read in reads(input, pattern) {
        buf.extend_from_slice(read);
        loop {
            match decode_reply(&mut buf) {
                Ok(Some(reply)) => replies.push(reply),
                Ok(None) => break,
                Err(_) => return (replies, true),
            }
        }
    }
    (replies, false)
}

/// `reply` as a client sees it after RESP2 encoding: simple strings and errors cannot carry
/// CR or LF, the encoder turns them into spaces.
fn as_sent(reply: &Reply) -> Reply {
    let spaced = |text: &Bytes| -> Bytes {
        text.iter()
            .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b })
            .collect()
    };
    match reply {
        Reply::Simple(text) => Reply::Simple(spaced(text)),
        Reply::Error(text) => Reply::Error(spaced(text)),
        Reply::Array(items) => Reply::Array(items.iter().map(as_sent).collect()),
        other => other.clone(),
    }
}

fn check_encodings(reply: &Reply) {
    let mut resp2 = BytesMut::new();
    reply.encode(Protocol::Resp2, &mut resp2);
    let again = decode_reply(&mut resp2)
        .expect("the proxy's RESP2 encoding decodes")
        .expect("the proxy's RESP2 encoding is complete");
    assert_eq!(again, as_sent(reply));
    assert!(resp2.is_empty());
    let mut resp3 = BytesMut::new();
    reply.encode(Protocol::Resp3, &mut resp3);
}

fn check_ttl_answer(reply: &Reply) {
    for unit_ms in [1, 1000] {
        let answer = conservative_ttl(reply.clone(), unit_ms, 0.01);
        match (reply, &answer) {
            (Reply::Integer(t), Reply::Integer(kept)) if *t > 0 => {
                assert!((0..=*t).contains(kept), "{t} -> {kept}")
            }
            _ => assert_eq!(&answer, reply),
        }
    }
}

/// The merge rules' promises on votes that all answered.
fn check_merge(votes: &[Vote], replies: &[Reply]) {
    let q = quorum(votes.len());
    let given_by_quorum = |r: &Reply| replies.iter().filter(|x| *x == r).count() >= q;
    for rule in [MergeRule::Strict, MergeRule::Known, MergeRule::Release] {
        let merged = merge(votes, rule).expect("no vote is pending");
        let refused = matches!(&merged, Reply::Error(e) if e.starts_with(b"NOQUORUM"));
        if refused || given_by_quorum(&merged) {
            continue;
        }
        assert_ne!(rule, MergeRule::Strict, "strict merge invented {merged:?}");
        match merged {
            Reply::Integer(v) => {
                let at_least = replies
                    .iter()
                    .filter(|r| matches!(r, Reply::Integer(i) if *i >= v))
                    .count();
                let deleted_claim = rule == MergeRule::Release && v == 1;
                assert!(at_least >= q || deleted_claim, "{v} claimed by {at_least}");
            }
            Reply::Null => assert!(replies.contains(&Reply::Null)),
            other => panic!("{rule:?} merge invented {other:?}"),
        }
    }
    let oks = replies.iter().filter(|r| **r == Reply::ok()).count();
    let expected = if oks >= q {
        AcquireDecision::Quorum
    } else {
        AcquireDecision::Refused
    };
    assert_eq!(acquire_decision(votes), expected);
    token_floor(votes);
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, input)) = data.split_first() else {
        return;
    };
    let whole = decode_in_reads(input, None);
    let pieces = decode_in_reads(input, Some(cut));
    assert_eq!(
        whole, pieces,
        "the decoding depends on how the bytes were read"
    );
    let replies = whole.0;
    let mut last_seen = None;
    for reply in &replies {
        check_encodings(reply);
        check_ttl_answer(reply);
        match reply {
            Reply::Array(items) => {
                parse_time(items);
            }
            Reply::Bulk(text) => {
                let seen = parse_info(&String::from_utf8_lossy(text));
                judge(last_seen.as_ref(), &seen, last_seen.as_ref(), 1, false);
                last_seen = Some(seen);
            }
            _ => {}
        }
    }
    for masters in 1..=replies.len().min(7) {
        let votes: Vec<Vote> = replies[..masters]
            .iter()
            .cloned()
            .map(Vote::Replied)
            .collect();
        check_merge(&votes, &replies[..masters]);
    }
});
