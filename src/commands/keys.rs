//! Plain key commands (`GET`, `DEL`, `EXISTS`, `PTTL`, `PEXPIRE`, …): sent unchanged to every
//! master (the request's own bytes, no re-encoding) and answered by the quorum reply rule.
//! `PTTL`/`TTL` then take the drift padding off, so they never promise more than the lock holds.

use super::{Action, Ctx, Outcome, Session};
use crate::cluster::{command, quorum_reply, Cluster};
use crate::protocol::Request;
use crate::redlock::conservative_ttl;
use std::sync::Arc;

/// Fans the request out and merges the replies.
pub fn forward(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    forward_request(ctx.cluster(), request)
}

/// Sends `request` to every master as it was received and answers by the quorum rule.
pub fn forward_request(cluster: Arc<Cluster>, request: Request) -> Action {
    let payload = request.raw.unwrap_or_else(|| command(&request.args));
    Action::Defer(Box::pin(async move {
        Outcome::Reply(quorum_reply(&cluster, &payload).await)
    }))
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
        let merged = quorum_reply(&cluster, &payload).await;
        Outcome::Reply(conservative_ttl(merged, unit_ms, cluster.drift_factor))
    }))
}
