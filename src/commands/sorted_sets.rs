//! Sorted sets: `ZADD`, `ZREM`, `ZCARD`, `ZRANGE`, `ZRANK`, `ZSCORE`, `ZREMRANGEBYSCORE`, the
//! plain commands that semaphores over sorted sets send besides their acquire script
//! (redis-semaphore's `Semaphore` releases with `ZREM`; docs/SAFETY.md, "Semaphores over sorted
//! sets", says what such a semaphore gets through the proxy).
//!
//! Each is sent unchanged to every master and answered by the quorum reply rule
//! ([`MergeRule::Known`](crate::redlock::MergeRule::Known)), as the plain key commands of
//! `keys.rs`: the reply Q masters agree on, else the Q-th largest count, else null for a
//! mix of one value and null, else `NOQUORUM`. Arguments are checked by the masters, so every
//! error is Redis' own text.
//!
//! `ZADD` is the one that can create a key, and a key it creates has no expiry: it is followed
//! on every master, in the same pipeline, by the script guard over its key
//! ([`super::guarded_write`]), so no key written through the proxy outlives the lease
//! bound (a key without expiry, or with a longer one, gets the bound; a shorter TTL is kept),
//! and a master the guard finds unarmed or quarantined does not vote. Unlike a script's, the
//! reply is `ZADD`'s own even where the guard gave the key its TTL: `ZADD` cannot carry an
//! expiry, and recipes set theirs with `PEXPIRE` next. The other commands only read or remove
//! members (a key emptied is deleted), so they need no guard.
//!
//! The masters are spoken to in RESP2; a RESP3 client gets Redis 7's RESP3 shapes back: scores
//! as doubles (`ZSCORE`, `ZADD … INCR`) and `ZRANGE … WITHSCORES` as `[member, score]` pairs.

use super::{guarded_write, pairs, resp3, shaped, Action, Ctx, Session};
use crate::protocol::{Reply, Request};

/// `ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member …`: fanned out with the guard after it.
pub fn zadd(ctx: &Ctx<'_>, session: &mut Session, request: Request) -> Action {
    let incr = request.args[2..]
        .iter()
        .take_while(|a| is_any(a, &[b"nx", b"xx", b"gt", b"lt", b"ch", b"incr"]))
        .any(|a| a.eq_ignore_ascii_case(b"incr"));
    let shape = resp3(session, incr, as_double);
    guarded_write(ctx, request, shape)
}

/// `ZSCORE key member`.
pub fn zscore(ctx: &Ctx<'_>, session: &mut Session, request: Request) -> Action {
    let shape = resp3(session, true, as_double);
    shaped(ctx, request, shape)
}

/// `ZRANGE key start stop [BYSCORE|BYLEX] [REV] [LIMIT offset count] [WITHSCORES]`.
pub fn zrange(ctx: &Ctx<'_>, session: &mut Session, request: Request) -> Action {
    let scores = request.args[4..]
        .iter()
        .any(|a| a.eq_ignore_ascii_case(b"withscores"));
    let shape = resp3(session, scores, score_pairs);
    shaped(ctx, request, shape)
}

fn is_any(arg: &[u8], words: &[&[u8]]) -> bool {
    words.iter().any(|w| arg.eq_ignore_ascii_case(w))
}

/// A score: Redis' RESP2 bulk string, as a RESP3 double (same text).
fn as_double(reply: Reply) -> Reply {
    match reply {
        Reply::Bulk(text) => Reply::Double(text),
        other => other,
    }
}

/// `member, score, …` as RESP3's `[member, score]` pairs.
fn score_pairs(reply: Reply) -> Reply {
    let pair = |(member, score)| Reply::Array(vec![member, as_double(score)]);
    match pairs(reply) {
        Ok(pairs) => Reply::Array(pairs.into_iter().map(pair).collect()),
        Err(other) => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn resp3_shapes() {
        let b = |s: &'static str| Reply::Bulk(Bytes::from_static(s.as_bytes()));
        let d = |s: &'static str| Reply::Double(Bytes::from_static(s.as_bytes()));
        assert_eq!(as_double(b("1.5")), d("1.5"));
        assert_eq!(as_double(Reply::Null), Reply::Null);
        assert_eq!(
            score_pairs(Reply::Array(vec![b("a"), b("1"), b("b"), b("inf")])),
            Reply::Array(vec![
                Reply::Array(vec![b("a"), d("1")]),
                Reply::Array(vec![b("b"), d("inf")]),
            ])
        );
        let err = Reply::error("ERR syntax error");
        assert_eq!(score_pairs(err.clone()), err);
    }
}
