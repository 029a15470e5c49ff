//! The lock commands of Redis 8.4 and Valkey 9 besides `SET`'s conditions: `DELEX key [IFEQ v |
//! IFNE v | IFDEQ digest | IFDNE digest]`, Valkey's `DELIFEQ key v`, and `DIGEST key`.
//!
//! `DELEX … IFEQ v` and `DELIFEQ` are releases ([`super::release`]: every master, the release
//! rule, counted as releases), and so is a digest condition once resolved to the value a
//! majority holds ([`crate::condition`]): each master deletes only that value. `DELEX … IFNE`
//! is a plain conditional delete under the quorum rule, and `DELEX key` a `DEL key`. `DIGEST`
//! answers Redis 8.4's XXH3 digest of the value a majority holds. Replies and errors are Redis
//! 8.4's (`WRONGTYPE` from the masters for a key that is not a string), in RESP2 and RESP3.

use super::{forward_request, release, Action, Ctx, LockOps, Session};
use crate::condition::{digest as digest_of, Condition, OnMasters};
use crate::error::ProxyError;
use crate::lease::Outcome;
use crate::protocol::{encode_command, Reply, Request};

/// `DELEX key [IFEQ v | IFNE v | IFDEQ digest | IFDNE digest]`
pub fn delex(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let args = &request.args;
    let key = args[1].clone();
    let condition = match args.len() {
        // No condition: the key goes whatever it holds, as `DEL key`.
        2 => {
            let del = Request {
                raw: Some(encode_command(&[b"DEL".as_ref(), &key])),
                ..request
            };
            return forward_request(ctx.masters(), del);
        }
        4 => Condition::parse(&args[2], &args[3]),
        _ => None,
    };
    let Some(condition) = condition else {
        return Action::error(ProxyError::Syntax);
    };
    if let Condition::Eq(value) = condition {
        return release(ctx, key, value);
    }
    let ops = LockOps::of(ctx);
    Action::Defer(Box::pin(async move {
        let on_masters = match ops.resolve(&key, &condition).await {
            Ok((_, on_masters)) => on_masters,
            Err(reply) => return Outcome::Reply(reply),
        };
        Outcome::Reply(match on_masters {
            OnMasters::Holds(value) => ops.release(&key, &value).await,
            OnMasters::Differs(value) => ops.conditional(&key, &[b"del", b"ne", &value]).await,
            OnMasters::Missing | OnMasters::Never => Reply::Integer(0),
        })
    }))
}

/// `DELIFEQ key value` (Valkey 9.0): `DELEX key IFEQ value`.
pub fn delifeq(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let (key, value) = (request.args[1].clone(), request.args[2].clone());
    release(ctx, key, value)
}

/// `DIGEST key`: the digest of the value a majority holds, null if none, or the masters' error.
pub fn digest(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let ops = LockOps::of(ctx);
    let key = request.args[1].clone();
    Action::Defer(Box::pin(async move {
        Outcome::Reply(match ops.value(&key).await {
            Ok(Some(value)) => Reply::bulk(digest_of(&value)),
            Ok(None) => Reply::Null,
            Err(reply) => reply,
        })
    }))
}
