//! Plain key commands (`GET`, `DEL`, `EXISTS`, `PTTL`, `PEXPIRE`, …): sent unchanged to every
//! master (the request's own bytes, no re-encoding) and answered by the quorum reply rule.
//! `PTTL`/`TTL` then take the drift padding off, so they never promise more than the lock holds.

use super::{forward_request, payload, request_slot, Action, Ctx, Session};
use crate::lease::Outcome;
use crate::protocol::Request;
use crate::redlock::{conservative_ttl, MergeRule};

/// Fans the request out and merges the replies.
pub fn forward(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    forward_request(ctx.masters(), request)
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
