//! Plain key commands (`GET`, `DEL`, `EXISTS`, `PTTL`, `PEXPIRE`, …): sent unchanged to every
//! master (the request's own bytes, no re-encoding) and answered by the quorum reply rule.
//! `PTTL`/`TTL` then take the drift padding off, so they never promise more than the lock holds.

use super::{Action, Ctx, Outcome, Session};
use crate::cluster::{command, quorum_reply, Cluster};
use crate::protocol::Request;
use crate::redlock::{conservative_ttl, MergeRule};
use std::sync::Arc;

/// Fans the request out and merges the replies.
pub fn forward(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    forward_request(ctx.cluster(), request)
}

/// Sends `request` to every master as it was received and answers by the quorum rule.
pub fn forward_request(cluster: Arc<Cluster>, request: Request) -> Action {
    let payload = request.raw.unwrap_or_else(|| command(&request.args));
    Action::Defer(Box::pin(async move {
        Outcome::Reply(quorum_reply(&cluster, &payload, MergeRule::Known).await)
    }))
}

/// `PEXPIRE` / `EXPIRE`: the new TTL must not exceed `max_lock_ttl_ms` (every TTL the proxy
/// forwards is capped: see `Cluster::lease_bound`); a bad integer gets Redis' own text.
pub fn expire(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let Some(ttl) = super::parse_int(&request.args[2]) else {
        return Action::Ready(super::not_an_integer());
    };
    let unit: i64 = if request.args[0].eq_ignore_ascii_case(b"expire") {
        1000
    } else {
        1
    };
    let ttl_ms = u64::try_from(ttl.saturating_mul(unit)).unwrap_or(0);
    let cluster = ctx.cluster();
    if let Err(reply) = cluster.check_ttl(ttl_ms) {
        return Action::Ready(reply);
    }
    forward_request(cluster, request)
}

/// `PTTL` / `TTL`: the majority's remaining time minus the drift allowance.
pub fn ttl(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let cluster = ctx.cluster();
    let unit_ms = if request.args[0].eq_ignore_ascii_case(b"ttl") {
        1000
    } else {
        1
    };
    let payload = request.raw.unwrap_or_else(|| command(&request.args));
    Action::Defer(Box::pin(async move {
        let merged = quorum_reply(&cluster, &payload, MergeRule::Known).await;
        Outcome::Reply(conservative_ttl(merged, unit_ms, cluster.drift_factor))
    }))
}
