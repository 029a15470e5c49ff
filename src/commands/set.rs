//! `SET` (the acquire, and Redis 8.4's conditional `SET`) and `SETNX`.
//!
//! `SET key value NX PX ms` / `NX EX s` (options in any order and case) is a Redlock acquire
//! ([`crate::lock`]): every master is asked to set the key with `PX = ms + drift`; granted only
//! with a quorum of `OK`s and positive validity, otherwise rolled back and answered with null. Any other `SET`
//! is a plain write under the quorum reply rule. A lock without expiry (`SET … NX` without
//! PX/EX, `SETNX`) is refused: it cannot be made safe, since a crashed holder would hold it
//! forever and a restarted master would forget it.
//!
//! `SET key value IFEQ v|IFDEQ digest …` (Redis 8.4) with an expiry is a lock operation: the
//! hand-over of the lock from its holder `v` to `value` ([`crate::lock::Acquirer::hand_over`]:
//! the new value on a majority within the validity, or undone), an extend when `value` is `v`.
//! `IFNE`, `IFDNE` and a condition without expiry are plain conditional writes
//! ([`LockOps::conditional`]). A digest is resolved against the value a majority holds
//! ([`crate::condition`]) and reaches the masters as a condition on that value.

use super::{acquire, forward_request, refuse_acquire, Action, Ctx, LockOps, Session};
use crate::condition::{Condition, OnMasters};
use crate::error::ProxyError;
use crate::lease::Outcome;
use crate::lock::Attempt;
use crate::protocol::{Reply, Request};
use bytes::Bytes;

/// The parsed options of a `SET`.
#[derive(Debug, Default, PartialEq, Eq)]
struct SetOptions {
    nx: bool,
    xx: bool,
    get: bool,
    keep_ttl: bool,
    /// Relative expiry in milliseconds (`EX` × 1000 or `PX`).
    ttl_ms: Option<u64>,
    /// Absolute expiry in ms since the epoch (`EXAT` × 1000 or `PXAT`).
    expire_at_ms: Option<i64>,
    /// Redis 8.4's `IFEQ`, `IFNE`, `IFDEQ`, `IFDNE`.
    condition: Option<Condition>,
}

/// Parses `SET` options like Redis' `parseExtendedStringArgumentsOrReply` (`t_string.c`).
fn parse_set_options(args: &[Bytes]) -> Result<SetOptions, ProxyError> {
    let mut opts = SetOptions::default();
    let mut expire_seen = false;
    let mut i = 0;
    while i < args.len() {
        // Options are at most 7 bytes: upper-case them on the stack.
        let mut upper = [0u8; 8];
        let arg: &[u8] = match args[i].len() {
            n @ 1..=7 => {
                upper[..n].copy_from_slice(&args[i]);
                upper[..n].make_ascii_uppercase();
                &upper[..n]
            }
            _ => b"",
        };
        let next = args.get(i + 1);
        match arg {
            // One of NX, XX and the conditions (Redis 8.4's `t_string.c`).
            b"NX" if !opts.xx && opts.condition.is_none() => opts.nx = true,
            b"XX" if !opts.nx && opts.condition.is_none() => opts.xx = true,
            b"IFEQ" | b"IFNE" | b"IFDEQ" | b"IFDNE"
                if !opts.nx && !opts.xx && opts.condition.is_none() && next.is_some() =>
            {
                opts.condition = next.and_then(|value| Condition::parse(arg, value));
                i += 1;
            }
            b"GET" => opts.get = true,
            b"KEEPTTL" if !expire_seen => {
                opts.keep_ttl = true;
                expire_seen = true;
            }
            b"EX" | b"PX" | b"EXAT" | b"PXAT"
                if !expire_seen && !opts.keep_ttl && next.is_some() =>
            {
                expire_seen = true;
                let value = super::parse_int(next.map(|b| b.as_ref()).unwrap_or_default())?;
                let scale: i64 = if arg.starts_with(b"EX") { 1000 } else { 1 };
                // Redis also refuses an expiry whose absolute time overflows (`t_string.c`).
                let ms = value
                    .checked_mul(scale)
                    .filter(|ms| *ms > 0 && !overflows_from_now(*ms))
                    .ok_or(ProxyError::InvalidExpireTime("set"))?;
                if arg.ends_with(b"AT") {
                    opts.expire_at_ms = Some(ms);
                } else {
                    opts.ttl_ms = Some(ms as u64);
                }
                i += 1;
            }
            _ => return Err(ProxyError::Syntax),
        }
        i += 1;
    }
    Ok(opts)
}

/// Whether `now + ms` (ms since the epoch) overflows. The clock is read only for an `ms` that
/// could: up to half the range, any `ms` fits with the clock of the next 146 million years.
fn overflows_from_now(ms: i64) -> bool {
    ms > i64::MAX / 2 && ms.checked_add(unix_now_ms()).is_none()
}

fn unix_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// `SET key value [NX|XX] [GET] [EX s|PX ms|EXAT|PXAT|KEEPTTL]`.
pub fn set(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let opts = match parse_set_options(&request.args[3..]) {
        Ok(opts) => opts,
        Err(err) => return Action::error(err),
    };
    // Every TTL forwarded is capped (see `Policy::lease_bound`): `SET … XX PX` extends a lock.
    // `EXAT`/`PXAT` are measured from this proxy's clock.
    let relative = opts.ttl_ms.or_else(|| {
        opts.expire_at_ms
            .map(|at| at.saturating_sub(unix_now_ms()).max(0) as u64)
    });
    if let Some(Err(err)) = relative.map(|ms| ctx.shared.policy.check_ttl(ms)) {
        return if opts.nx {
            refuse_acquire(ctx, err)
        } else {
            Action::error(err)
        };
    }
    if let Some(condition) = opts.condition.clone() {
        return conditional(ctx, request, &opts, condition, relative);
    }
    if !opts.nx {
        return forward_request(ctx.masters(), request);
    }
    if ctx.shared.config.allow_locks_without_expiry && relative.is_none() {
        return forward_request(ctx.masters(), request);
    }
    let ttl_ms = match (opts.get, opts.expire_at_ms.is_some(), opts.ttl_ms) {
        (true, _, _) => return refuse_acquire(ctx, ProxyError::SetNxGet),
        (_, true, _) => return refuse_acquire(ctx, ProxyError::SetNxAbsoluteExpiry),
        (_, _, None) => return refuse_acquire(ctx, ProxyError::SetNxWithoutExpiry),
        (_, _, Some(ttl_ms)) => ttl_ms,
    };
    let (key, value) = (request.args[1].clone(), request.args[2].clone());
    acquire(
        ctx,
        Attempt::new(key, value, ttl_ms, ctx.received_at, false),
    )
}

/// `SET key value <condition> [GET] [expiry]` (see the module doc). `relative` is the expiry
/// in ms from now, if one was given (`EXAT`/`PXAT` measured from this proxy's clock).
fn conditional(
    ctx: &Ctx<'_>,
    request: Request,
    opts: &SetOptions,
    condition: Condition,
    relative: Option<u64>,
) -> Action {
    // The lease of a lock operation: `Some(None)` keeps the TTL.
    let lease = match (relative, opts.keep_ttl) {
        (Some(ms), _) => Some(Some(ms)),
        (None, true) => Some(None),
        (None, false) => None,
    };
    let holder_condition = matches!(condition, Condition::Eq(_) | Condition::DigestEq(_));
    if lease.is_none() && holder_condition && !ctx.shared.config.allow_locks_without_expiry {
        return Action::error(ProxyError::SetIfEqWithoutExpiry);
    }
    // A plain write's expiry as the masters take it (the client's own, as a plain `SET`).
    let expiry: [Bytes; 2] = match (opts.ttl_ms, opts.expire_at_ms, opts.keep_ttl) {
        (Some(ms), _, _) => [Bytes::from_static(b"PX"), Bytes::from(ms.to_string())],
        (_, Some(at), _) => [Bytes::from_static(b"PXAT"), Bytes::from(at.to_string())],
        (_, _, true) => [Bytes::from_static(b"KEEPTTL"), Bytes::new()],
        _ => [Bytes::new(), Bytes::new()],
    };
    let ops = LockOps::of(ctx);
    let get = opts.get;
    let (key, value) = (request.args[1].clone(), request.args[2].clone());
    Action::Defer(Box::pin(async move {
        let (current, on_masters) = match ops.resolve(&key, &condition).await {
            Ok(resolved) => resolved,
            Err(reply) => return Outcome::Reply(reply),
        };
        let (mode, compared) = match (on_masters, lease) {
            // With GET, Redis answers the old value whether or not it set.
            (OnMasters::Never, _) => {
                let old = current.filter(|_| get).map_or(Reply::Null, Reply::Bulk);
                return Outcome::Reply(old);
            }
            (OnMasters::Holds(holder), Some(ttl_ms)) => {
                return hand_over(&ops, &key, (holder, value), ttl_ms, get).await;
            }
            (OnMasters::Holds(holder), None) => (b"eq", holder),
            (OnMasters::Differs(other), _) => (b"ne", other),
            (OnMasters::Missing, _) => (b"nx", Bytes::new()),
        };
        let get_flag: &[u8] = if get { b"1" } else { b"0" };
        let args: [&[u8]; 7] = [
            b"set", mode, &compared, &value, get_flag, &expiry[0], &expiry[1],
        ];
        Outcome::Reply(ops.conditional(&key, &args).await)
    }))
}

/// The hand-over of `key` from `holder` to `value` (an extend if they are one), answering `OK`
/// or, with `GET`, the holder's value. Refused with `GET`: what a majority holds now, never the
/// holder's own value (a client reads that as "still mine").
async fn hand_over(
    ops: &LockOps,
    key: &Bytes,
    (holder, value): (Bytes, Bytes),
    ttl_ms: Option<u64>,
    get: bool,
) -> Outcome {
    let answer = match get {
        true => Reply::Bulk(holder.clone()),
        false => Reply::ok(),
    };
    let pair = (&holder, &value);
    let outcome = (ops.acquirer)
        .hand_over(key, pair, ttl_ms, ops.received_at, answer)
        .await;
    match outcome {
        Outcome::Reply(Reply::Null) if get => Outcome::Reply(match ops.value(key).await {
            Ok(Some(now)) if now != holder => Reply::Bulk(now),
            Ok(_) => Reply::Null,
            Err(reply) => reply,
        }),
        other => other,
    }
}

/// `SETNX key value` has no expiry: refused unless the configuration allows it as a plain write.
pub fn setnx(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    if ctx.shared.config.allow_locks_without_expiry {
        return forward_request(ctx.masters(), request);
    }
    refuse_acquire(ctx, ProxyError::Setnx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(list: &[&str]) -> Result<SetOptions, ProxyError> {
        let args: Vec<Bytes> = list
            .iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect();
        parse_set_options(&args)
    }

    #[test]
    fn set_option_parsing_matches_redis() {
        let acquire = |ms| SetOptions {
            nx: true,
            ttl_ms: Some(ms),
            ..Default::default()
        };
        assert_eq!(opts(&["NX", "PX", "30000"]), Ok(acquire(30000)));
        assert_eq!(opts(&["px", "30000", "nx"]), Ok(acquire(30000)));
        assert_eq!(opts(&["ex", "30", "nx"]), Ok(acquire(30000)));
        assert_eq!(
            opts(&["NX"]),
            Ok(SetOptions {
                nx: true,
                ..Default::default()
            })
        );
        let syntax = Err(ProxyError::Syntax);
        assert_eq!(opts(&["NX", "XX"]), syntax);
        assert_eq!(opts(&["PX", "1", "EX", "1"]), syntax);
        assert_eq!(opts(&["PX"]), syntax);
        assert_eq!(opts(&["BOGUS"]), syntax);
        assert_eq!(opts(&["NX", "PX", "abc"]), Err(ProxyError::NotAnInteger));
        let invalid = Err(ProxyError::InvalidExpireTime("set"));
        assert_eq!(opts(&["NX", "PX", "0"]), invalid);
        assert_eq!(opts(&["NX", "PX", "-1"]), invalid);
        assert_eq!(opts(&["NX", "EX", "9223372036854775807"]), invalid);
        assert_eq!(opts(&["NX", "PX", "9223372036854775807"]), invalid);
    }
}
