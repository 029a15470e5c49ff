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
//!
//! Each is one spelling of an operation of [`crate::lock::Acquirer`], reached through the
//! helpers of [`super`] that every other spelling uses too.

use super::{acquire, refuse_acquire, release, Action, Ctx, Session};
use crate::error::ProxyError;
use crate::lease::Outcome;
use crate::lock::Attempt;
use crate::protocol::Request;

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
        Ok(ttl_ms) => {
            let (key, value) = (request.args[1].clone(), request.args[2].clone());
            acquire(ctx, Attempt::new(key, value, ttl_ms, ctx.received_at, true))
        }
        Err(err) => refuse_acquire(ctx, err),
    }
}

/// `LOCK.TOKEN key value`: the masters that hold the value answer the same token (one grant
/// wrote it), the others null: null unless a majority answers that one token.
pub fn lock_token(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let acquirer = ctx.shard.acquirer.clone();
    Action::Defer(Box::pin(async move {
        Outcome::Reply(acquirer.token(&request.args[1], &request.args[2]).await)
    }))
}

/// `LOCK.RELEASE key value`
pub fn lock_release(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let (key, value) = (request.args[1].clone(), request.args[2].clone());
    release(ctx, key, value)
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
