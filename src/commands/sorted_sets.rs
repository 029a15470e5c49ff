//! Sorted sets: `ZADD`, `ZREM`, `ZCARD`, `ZRANGE`, `ZRANK`, `ZSCORE`, `ZREMRANGEBYSCORE`, the
//! plain commands that semaphores over sorted sets send besides their acquire script
//! (redis-semaphore's `Semaphore` releases with `ZREM`; docs/SAFETY.md, "Semaphores over sorted
//! sets", says what such a semaphore gets through the proxy).
//!
//! Each is sent unchanged to every master and answered by the quorum reply rule
//! ([`MergeRule::Known`]), as the plain key commands of [`super::keys`]: the reply Q masters
//! agree on, else the Q-th largest count, else null for a mix of one value and null, else
//! `NOQUORUM`. Arguments are checked by the masters, so every error is Redis' own text.
//!
//! `ZADD` is the one that can create a key, and a key it creates has no expiry: it is followed
//! on every master, in the same pipeline, by the script guard over its key
//! ([`super::scripts::guard_command`]), so no key written through the proxy outlives the lease
//! bound (a key without expiry, or with a longer one, gets the bound; a shorter TTL is kept),
//! and a master the guard finds unarmed or quarantined does not vote. Unlike a script's, the
//! reply is `ZADD`'s own even where the guard gave the key its TTL: `ZADD` cannot carry an
//! expiry, and recipes set theirs with `PEXPIRE` next. The other commands only read or remove
//! members (a key emptied is deleted), so they need no guard.

use super::keys::payload;
use super::scripts::{guard_command, guarded};
use super::{Action, Ctx, Session};
use crate::lease::Outcome;
use crate::masters::Ask;
use crate::protocol::Request;
use crate::redlock::MergeRule;
use bytes::BytesMut;

/// `ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member …`: fanned out with the guard after it.
pub fn zadd(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let masters = ctx.masters();
    let guard = guard_command(&request.args[1..2], &ctx.shared.policy);
    let mut both = BytesMut::from(payload(request).as_ref());
    both.extend_from_slice(&guard);
    let both = both.freeze();
    Action::Defer(Box::pin(async move {
        let ask = |_| Some(Ask::Commands(both.clone()));
        let (reply, _capped) = guarded(&masters, ask, MergeRule::Known).await;
        Outcome::Reply(reply)
    }))
}
