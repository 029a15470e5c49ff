//! The lock extension commands, for clients that want fencing tokens or a release and an
//! extend without Lua (docs/PROTOCOL.md §10):
//! - `LOCK.ACQUIRE key value ttl_ms` → `[token, validity_ms]` or null: the Redlock acquire of
//!   `SET key value NX PX ttl_ms`, answering the grant's fencing token ([`crate::lock`]).
//! - `LOCK.TOKEN key value` → the token of the grant `value` holds on `key`, or null if it does
//!   not hold it on a majority (so unmodified acquire code adds fencing with one call).
//! - `LOCK.RELEASE key value` → `1` / `0`: the compare-and-delete, under the release rule.
//! - `LOCK.EXTEND key value ttl_ms` → the new `validity_ms`, or null: a compare-and-extend
//!   with the acquire's padding, validity rule and write deadline, counted only on armed,
//!   unquarantined masters, undone where it took effect if refused ([`crate::lock`]); it also
//!   keeps the key's token counter at least as long as the lock.

use super::set::{acquire, refuse_acquire};
use super::{Action, Ctx, Session};
use crate::cluster::keys::token_key_on;
use crate::error::ProxyError;
use crate::lease::Outcome;
use crate::masters::{slot_of, Forms, Masters};
use crate::on_master::TOKEN_SCRIPT;
use crate::protocol::{encode_command, Request};
use crate::redlock::MergeRule;
use bytes::Bytes;

/// A positive TTL in ms from `arg`, within the cap, with Redis' texts for a bad one.
fn ttl_arg(ctx: &Ctx<'_>, arg: &[u8], command: &'static str) -> Result<u64, ProxyError> {
    let ttl = super::parse_int(arg)?;
    let ttl_ms = u64::try_from(ttl)
        .ok()
        .filter(|t| *t > 0)
        .ok_or(ProxyError::InvalidExpireTime(command))?;
    ctx.shared.policy.check_ttl(ttl_ms)?;
    Ok(ttl_ms)
}

/// `LOCK.ACQUIRE key value ttl_ms`
pub fn lock_acquire(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    match ttl_arg(ctx, &request.args[3], "lock.acquire") {
        Ok(ttl_ms) => acquire(ctx, &request, ttl_ms, true),
        Err(err) => refuse_acquire(ctx, err),
    }
}

/// `LOCK.TOKEN key value`: the masters that hold the value answer the same token (one grant
/// wrote it), the others null: null unless a majority answers that one token
/// ([`MergeRule::Identical`]).
pub fn lock_token(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let (key, value) = (&request.args[1], &request.args[2]);
    let payload = token_read(&ctx.masters(), key, value);
    eval_by_quorum(ctx, slot_of(&[key]), payload, MergeRule::Identical)
}

/// The token of `key`'s grant to `value` on each master ([`TOKEN_SCRIPT`]; the counter's name
/// differs on a cluster master: in the key's slot).
pub(crate) fn token_read(masters: &Masters, key: &[u8], value: &[u8]) -> Forms {
    Forms::new(masters, |cluster| {
        let token_key = token_key_on(cluster, key);
        let script = TOKEN_SCRIPT.text().as_bytes();
        encode_command(&[b"EVAL", script, b"2", key, &token_key, value])
    })
}

/// `LOCK.RELEASE key value`
pub fn lock_release(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let (key, value) = (request.args[1].clone(), request.args[2].clone());
    release(ctx, key, value)
}

/// The compare-and-delete of `key` if it holds `value`, on every master, answered by the
/// release rule ([`crate::lock::Acquirer::release`]): `LOCK.RELEASE`, and the recognised
/// compare-and-delete script of every client library.
pub fn release(ctx: &Ctx<'_>, key: Bytes, value: Bytes) -> Action {
    let acquirer = ctx.shard.acquirer.clone();
    let stats = ctx.shared.stats.clone();
    Action::Defer(Box::pin(async move {
        let reply = acquirer.release(&key, &value).await;
        stats.count_if_release(MergeRule::Release, &reply);
        Outcome::Reply(reply)
    }))
}

/// `payload` (an `EVAL` on keys of `slot`) on every master, answered by the quorum rule
/// `rule`.
fn eval_by_quorum(ctx: &Ctx<'_>, slot: u16, payload: Forms, rule: MergeRule) -> Action {
    let masters = ctx.masters();
    let stats = ctx.shared.stats.clone();
    Action::Defer(Box::pin(async move {
        let reply = masters.quorum_reply_forms(slot, &payload, rule).await;
        stats.count_if_release(rule, &reply);
        Outcome::Reply(reply)
    }))
}

/// `LOCK.EXTEND key value ttl_ms` ([`crate::lock::Acquirer::extend`]).
pub fn lock_extend(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let ttl_ms = match ttl_arg(ctx, &request.args[3], "lock.extend") {
        Ok(ttl_ms) => ttl_ms,
        Err(err) => return Action::error(err),
    };
    let acquirer = ctx.shard.acquirer.clone();
    let (key, value) = (request.args[1].clone(), request.args[2].clone());
    let received_at = ctx.received_at;
    Action::Defer(Box::pin(async move {
        acquirer.extend(&key, &value, ttl_ms, received_at).await
    }))
}
