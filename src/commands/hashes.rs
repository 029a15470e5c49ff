//! Hashes: `HSET`, `HINCRBY`, `HDEL`, `HGET`, `HEXISTS`, `HGETALL`, `HLEN`, the plain commands
//! that Redisson-style lock clients send besides their scripts (a lock kept as a hash of
//! holder → reentrancy count).
//!
//! Each is sent unchanged to every master and answered by the quorum reply rule
//! ([`MergeRule::Known`](crate::redlock::MergeRule::Known)), as the plain key commands of
//! `keys.rs`: the reply Q masters agree on, else the Q-th largest count, else null for a
//! mix of one value and null, else `NOQUORUM`. Arguments are checked by the masters, so every
//! error is Redis' own text.
//!
//! `HSET` and `HINCRBY` can create a key, and a key they create has no expiry: each is followed
//! on every master, in the same pipeline, by the script guard over its key
//! ([`super::guarded_write`]), so no key written through the proxy outlives the lease
//! bound (a key without expiry, or with a longer one, gets the bound; a shorter TTL is kept),
//! and a master the guard finds unarmed or quarantined does not vote. The reply is the
//! command's own even where the guard gave the key its TTL, as for `ZADD`. `HDEL` only removes
//! fields (a key emptied is deleted) and the others only read, so they need no guard.
//!
//! The masters are spoken to in RESP2; a RESP3 client gets Redis 7's RESP3 shape of `HGETALL`,
//! a map.

use super::{guarded_write, pairs, resp3, shaped, Action, Ctx, Session};
use crate::protocol::{Reply, Request};

/// `HSET key field value …` / `HINCRBY key field increment`: fanned out with the guard after
/// it.
pub fn write(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    guarded_write(ctx, request, |reply| reply)
}

/// `HGETALL key`.
pub fn hgetall(ctx: &Ctx<'_>, session: &mut Session, request: Request) -> Action {
    let shape = resp3(session, true, as_map);
    shaped(ctx, request, shape)
}

/// `field, value, …` as RESP3's map of field → value.
fn as_map(reply: Reply) -> Reply {
    pairs(reply).map_or_else(|other| other, Reply::Map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hgetall_is_a_map_in_resp3() {
        assert_eq!(
            as_map(Reply::Array(vec![
                Reply::bulk("f"),
                Reply::bulk("1"),
                Reply::bulk("g"),
                Reply::bulk("2"),
            ])),
            Reply::Map(vec![
                (Reply::bulk("f"), Reply::bulk("1")),
                (Reply::bulk("g"), Reply::bulk("2")),
            ])
        );
        assert_eq!(as_map(Reply::Array(vec![])), Reply::Map(vec![]));
        let err = Reply::error("WRONGTYPE Operation against a key holding the wrong kind of value");
        assert_eq!(as_map(err.clone()), err);
    }
}
