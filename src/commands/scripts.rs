//! `EVAL`, `EVALSHA` (and their `_RO` forms) and `SCRIPT LOAD|EXISTS|FLUSH|KILL`.
//!
//! A script runs unchanged on every master and its replies are merged by the quorum rule. The
//! proxy remembers every body it sees under its real SHA1 (of the exact bytes), and sends an
//! `EVALSHA` of a known script to the masters as the `EVAL` of its body. So a master that never
//! saw the script or lost its cache (restart, `SCRIPT FLUSH`) runs it like the others, in the
//! same position of the connection's FIFO as the client's request (a `NOSCRIPT`-then-retry
//! would run it later than the client's next command, and run it twice where a retry races),
//! and the client never sees `NOSCRIPT` for a script the proxy knows. Redis caches the
//! compiled script by SHA1 for `EVAL` too, so this costs the masters one SHA1 of the body.
//! An `EVALSHA` of a SHA1 the proxy does not know is sent on as is (another proxy may have
//! loaded it); if a majority of masters do not know it either, the client gets Redis' own
//! `NOSCRIPT No matching script. Please use EVAL.`
//!
//! Lease scripts ([`crate::lease_script`]: compare-then-`PEXPIRE`, `SET … PX ARGV[n]`) get the
//! acquire's treatment: the TTL argument is padded by drift on the masters, and a success is
//! written only while `TTL − elapsed − drift > 0`. Past that, a positive integer success
//! becomes `0` (every recognised library reads 0 as "not extended/not acquired") and any other
//! reply becomes an error, which no convention reads as success.

use super::{not_an_integer, Action, Ctx, Lease, Outcome, Session};
use crate::cluster::{command, quorum_reply, Cluster, Script};
use crate::protocol::{Reply, Request};
use crate::redlock::{backend_ttl_ms, validity_window};
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Checks `numkeys` as Redis' `evalGetKeys` does; returns it.
fn check_numkeys(args: &[Bytes]) -> Result<usize, Reply> {
    let numkeys = super::parse_int(&args[2]).ok_or_else(not_an_integer)?;
    if numkeys < 0 {
        return Err(Reply::error("ERR Number of keys can't be negative"));
    }
    if numkeys as u64 > (args.len() - 3) as u64 {
        return Err(Reply::error(
            "ERR Number of keys can't be greater than number of args",
        ));
    }
    Ok(numkeys as usize)
}

/// `EVAL body numkeys key… arg…`
pub fn eval(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    match check_numkeys(&request.args) {
        Err(reply) => Action::Ready(reply),
        Ok(numkeys) => {
            let script = ctx.shared.cluster.remember_script(request.args[1].clone());
            run(ctx, request, Some(script), numkeys)
        }
    }
}

/// `EVALSHA sha numkeys key… arg…`
pub fn evalsha(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    match check_numkeys(&request.args) {
        Err(reply) => Action::Ready(reply),
        Ok(numkeys) => {
            let script = ctx.shared.cluster.script_by_sha(&request.args[1]);
            run(ctx, request, script, numkeys)
        }
    }
}

/// A lease script's TTL argument: its position in the request and its value in ms.
fn lease_ttl(script: Option<&Script>, args: &[Bytes], numkeys: usize) -> Option<(usize, u64, u64)> {
    let shape = script?.lease?;
    let at = 3 + numkeys + shape.argv - 1;
    let ttl = super::parse_int(args.get(at)?)?;
    let ttl_ms = u64::try_from(ttl).ok()?.checked_mul(shape.unit_ms)?;
    (ttl_ms > 0).then_some((at, ttl_ms, shape.unit_ms))
}

fn run(ctx: &Ctx<'_>, request: Request, script: Option<Script>, numkeys: usize) -> Action {
    let cluster = ctx.cluster();
    let is_evalsha =
        request.args[0].len() >= 7 && request.args[0][..7].eq_ignore_ascii_case(b"EVALSHA");
    let lease = lease_ttl(script.as_ref(), &request.args, numkeys);
    let mut args = request.args;
    let mut deadline = None;
    if let Some((at, ttl_ms, unit_ms)) = lease {
        // Pad the masters' TTL by drift (rounded up to the script's unit).
        let padded = backend_ttl_ms(ttl_ms, cluster.drift_factor).div_ceil(unit_ms);
        args[at] = Bytes::from(padded.to_string());
        let window = validity_window(ttl_ms, cluster.drift_factor).unwrap_or(Duration::ZERO);
        deadline = Some(ctx.received_at + window);
    }
    if let Some(script) = script.filter(|_| is_evalsha) {
        args[0] = if args[0].len() > 7 {
            Bytes::from_static(b"EVAL_RO")
        } else {
            Bytes::from_static(b"EVAL")
        };
        args[1] = script.body;
        return Action::Defer(Box::pin(settle(cluster, command(&args), deadline)));
    }
    let payload = match (&request.raw, lease) {
        (Some(raw), None) => raw.clone(),
        _ => command(&args),
    };
    Action::Defer(Box::pin(settle(cluster, payload, deadline)))
}

async fn settle(cluster: Arc<Cluster>, payload: Bytes, deadline: Option<Instant>) -> Outcome {
    let reply = quorum_reply(&cluster, &payload).await;
    match deadline {
        Some(deadline) if !reply.is_error() => {
            let expired = match reply {
                Reply::Integer(n) if n > 0 => Reply::Integer(0),
                _ => Reply::error(
                    "ERR lease validity expired before a majority answered (redlock-proxy); the lock is not held",
                ),
            };
            Outcome::Lease(Lease {
                deadline,
                granted: reply,
                expired,
                rollback: None,
            })
        }
        _ => Outcome::Reply(reply),
    }
}

/// `SCRIPT LOAD|EXISTS|FLUSH|KILL|HELP`
pub fn script(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let sub = request.args[1].to_ascii_uppercase();
    let cluster = ctx.cluster();
    match (sub.as_slice(), request.args.len()) {
        (b"LOAD", 3) => {
            cluster.remember_script(request.args[2].clone());
            super::keys::forward_request(cluster, request)
        }
        (b"EXISTS", n) if n >= 3 => {
            let known = request.args[2..]
                .iter()
                .map(|sha| Reply::Integer(i64::from(cluster.script_by_sha(sha).is_some())))
                .collect();
            Action::Ready(Reply::Array(known))
        }
        (b"FLUSH", 2 | 3) => {
            cluster.scripts.clear();
            super::keys::forward_request(cluster, request)
        }
        (b"KILL", 2) => super::keys::forward_request(cluster, request),
        (b"HELP", 2) => Action::Ready(Reply::Array(
            [
                "SCRIPT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "EXISTS <sha1> [<sha1> ...]",
                "    Return information about the existence of the scripts in the proxy's cache.",
                "FLUSH [ASYNC|SYNC]",
                "    Flush the Lua scripts cache on the proxy and on every master.",
                "KILL",
                "    Kill the currently executing Lua script on every master.",
                "LOAD <script>",
                "    Load a script on every master and into the proxy's cache.",
                "HELP",
                "    Print this help.",
            ]
            .iter()
            .map(|l| Reply::simple(l))
            .collect(),
        )),
        (b"LOAD" | b"EXISTS" | b"FLUSH" | b"KILL" | b"HELP", _) => {
            Action::Ready(Reply::error(format!(
                "ERR wrong number of arguments for 'script|{}' command",
                String::from_utf8_lossy(&sub).to_ascii_lowercase()
            )))
        }
        _ => Action::Ready(super::unknown_subcommand(&request.args[1], "SCRIPT")),
    }
}
