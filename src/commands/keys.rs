//! Plain key commands (`GET`, `DEL`, `EXISTS`, `PTTL`, `PEXPIRE`, …): sent unchanged to every
//! master (the request's own bytes, no re-encoding) and answered by the quorum reply rule.
//! `PTTL`/`TTL` then take the drift padding off, so they never promise more than the lock holds.
//!
//! Also the two fan-outs the typed families ([`super::sorted_sets`], [`super::hashes`]) share:
//! a reply read in RESP2 and shaped for a RESP3 client ([`shaped`]), and a command that can
//! create a key, followed on every master by the script guard over it ([`guarded_write`]).

use super::scripts::{guard_command, guarded};
use super::{Action, Ctx, Session};
use crate::lease::Outcome;
use crate::masters::{slot_of, Forms, Masters};
use crate::protocol::{encode_command, Protocol, Reply, Request};
use crate::redlock::{conservative_ttl, MergeRule};
use bytes::{Bytes, BytesMut};
use std::sync::Arc;

/// How a reply read in RESP2 becomes Redis 7's reply to a RESP3 client.
pub(super) type Shape = fn(Reply) -> Reply;

/// A flat `a, b, a, b, …` array (as the masters answer in RESP2) as its pairs, for the RESP3
/// shapes built from them; any other reply comes back as it is.
pub(super) fn pairs(reply: Reply) -> Result<Vec<(Reply, Reply)>, Reply> {
    match reply {
        Reply::Array(flat) if flat.len() % 2 == 0 => {
            let mut pairs = Vec::with_capacity(flat.len() / 2);
            let mut items = flat.into_iter();
            while let (Some(a), Some(b)) = (items.next(), items.next()) {
                pairs.push((a, b));
            }
            Ok(pairs)
        }
        other => Err(other),
    }
}

/// Fans the request out and merges the replies.
pub fn forward(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    forward_request(ctx.masters(), request)
}

/// The bytes to send the masters: the request as it was received, or re-encoded (inline).
pub(super) fn payload(request: Request) -> Bytes {
    request.raw.unwrap_or_else(|| encode_command(&request.args))
}

/// The slot of a forwarded command: that of its key, which every command forwarded here has
/// first (`args[1]`) if it has one (a command of keys of several slots is refused where a
/// master is a cluster: [`super::dispatch`]).
pub(super) fn request_slot(request: &Request) -> u16 {
    slot_of(request.args.get(1..2).unwrap_or_default())
}

/// Sends `request` to every master as it was received and answers by the quorum rule.
pub fn forward_request(masters: Arc<Masters>, request: Request) -> Action {
    let slot = request_slot(&request);
    let payload = payload(request);
    Action::Defer(Box::pin(async move {
        Outcome::Reply(masters.quorum_reply(slot, &payload, MergeRule::Known).await)
    }))
}

/// `shape` for a RESP3 session when `applies`, else the reply as the masters gave it.
pub(super) fn resp3(session: &Session, applies: bool, shape: Shape) -> Shape {
    match (session.protocol, applies) {
        (Protocol::Resp3, true) => shape,
        _ => |reply| reply,
    }
}

/// Fans `request` out under the quorum rule and shapes the merged reply.
pub(super) fn shaped(ctx: &Ctx<'_>, request: Request, shape: Shape) -> Action {
    match forward_request(ctx.masters(), request) {
        Action::Defer(reply) => Action::Defer(Box::pin(async move {
            match reply.await {
                Outcome::Reply(reply) => Outcome::Reply(shape(reply)),
                other => other,
            }
        })),
        other => other,
    }
}

/// A command that can create its key (`args[1]`), sent to every master followed in the same
/// pipeline by the script guard over that key ([`guard_command`]): a key without expiry, or
/// with one longer than the lease bound, gets the bound; a shorter TTL is kept. The merged
/// reply (quorum rule, counting only the masters the guard vouched for) is the command's own,
/// shaped.
pub(super) fn guarded_write(ctx: &Ctx<'_>, request: Request, shape: Shape) -> Action {
    guarded_write_at(ctx, request, 1, shape)
}

/// [`guarded_write`] for a command whose key is `args[key]`.
pub(super) fn guarded_write_at(
    ctx: &Ctx<'_>,
    request: Request,
    key: usize,
    shape: Shape,
) -> Action {
    let masters = ctx.masters();
    let guarded_key = request.args[key].clone();
    let slot = slot_of(&[&guarded_key]);
    let both = with_guard(ctx, &payload(request), &guarded_key);
    Action::Defer(Box::pin(async move {
        let ask = masters.ask_forms(&both);
        let reply = guarded(&masters, slot, ask, MergeRule::Known).await.reply;
        Outcome::Reply(shape(reply))
    }))
}

/// `command` (encoded) followed, in the same pipeline, by the script guard over `key`
/// ([`guard_command`]), in each master's form (a cluster's guard checks the slot's markers).
pub(super) fn with_guard(ctx: &Ctx<'_>, command: &[u8], key: &Bytes) -> Forms {
    let policy = &ctx.shared.policy;
    Forms::new(&ctx.masters(), |cluster| {
        let mut both = BytesMut::from(command);
        both.extend_from_slice(&guard_command(std::slice::from_ref(key), policy, cluster));
        both.freeze()
    })
}

/// `PEXPIRE` / `EXPIRE`: the new TTL must not exceed `max_lock_ttl_ms` (every TTL the proxy
/// forwards is capped: see [`crate::redlock::Policy::lease_bound`]); a bad integer gets
/// Redis' own text.
pub fn expire(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let ttl = match super::parse_int(&request.args[2]) {
        Ok(ttl) => ttl,
        Err(err) => return Action::error(err),
    };
    let unit: i64 = if request.args[0].eq_ignore_ascii_case(b"expire") {
        1000
    } else {
        1
    };
    let ttl_ms = u64::try_from(ttl.saturating_mul(unit)).unwrap_or(0);
    if let Err(err) = ctx.shared.policy.check_ttl(ttl_ms) {
        return Action::error(err);
    }
    forward_request(ctx.masters(), request)
}

/// `PTTL` / `TTL`: the majority's remaining time minus the drift allowance.
pub fn ttl(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let masters = ctx.masters();
    let drift_factor = ctx.shared.policy.drift_factor;
    let unit_ms = if request.args[0].eq_ignore_ascii_case(b"ttl") {
        1000
    } else {
        1
    };
    let slot = request_slot(&request);
    let payload = payload(request);
    Action::Defer(Box::pin(async move {
        let merged = masters.quorum_reply(slot, &payload, MergeRule::Known).await;
        Outcome::Reply(conservative_ttl(merged, unit_ms, drift_factor))
    }))
}
