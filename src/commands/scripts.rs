//! `EVAL`, `EVALSHA` (and their `_RO` forms) and `SCRIPT LOAD|EXISTS|FLUSH|KILL`.
//!
//! A script runs unchanged on every master. The proxy remembers every body it sees under its
//! real SHA1 (of the exact bytes, at most [`crate::cluster::MAX_SCRIPTS`]), and sends an
//! `EVALSHA` of a known script to the masters as the `EVAL` of its body, so a master that never
//! saw the script or lost its cache runs it like the others, in the same position of the
//! connection's FIFO as the client's request. An `EVALSHA` of a SHA1 the proxy does not know is
//! answered with Redis' own `NOSCRIPT No matching script. Please use EVAL.` without reaching
//! the masters: forwarding it would run a script (perhaps a lease script loaded through another
//! proxy or before a restart) whose meaning the proxy never checked; every client library
//! then sends the body with `EVAL`.
//!
//! Replies merge by the quorum rule; only the recognised compare-and-delete may use the
//! integer rule, any other script needs Q identical replies ([`MergeRule`]).
//!
//! Lease scripts ([`crate::lease_script`]: compare-then-`PEXPIRE`, `SET … PX ARGV[n]`) get the
//! acquire's treatment: the TTL argument must not exceed `max_lock_ttl_ms`, is padded by drift
//! on the masters, and a success is written only while `TTL − elapsed − drift > 0`. Past that,
//! a positive integer success becomes `0` (every recognised library reads 0 as "not
//! extended/not acquired") and any other reply becomes an error, which no convention reads as
//! success.
//!
//! Every script that may set expiries is followed, on each master, by
//! [`crate::cluster::GUARD_SCRIPT`] in the same pipeline: it caps what the script set at the
//! lease bound, and a master that turns out unarmed or quarantined does not vote. A script that
//! tried to set a longer TTL is answered with an error (its key was capped, so the caller must
//! not believe the longer lease).

use super::{not_an_integer, Action, Ctx, Lease, Outcome, Session};
use crate::cluster::{command, quorum_reply, Cluster, Script, GUARD_SCRIPT};
use crate::health::{ARMED_KEY, QUARANTINE_KEY};
use crate::protocol::{Reply, Request};
use crate::redlock::{backend_ttl_ms, merge, no_quorum, validity_window, MergeRule, Vote};
use bytes::Bytes;
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
            run(ctx, request, script, numkeys)
        }
    }
}

/// `EVALSHA sha numkeys key… arg…`
pub fn evalsha(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    match check_numkeys(&request.args) {
        Err(reply) => Action::Ready(reply),
        Ok(numkeys) => match ctx.shared.cluster.script_by_sha(&request.args[1]) {
            Some(script) => run(ctx, request, script, numkeys),
            None => Action::Ready(Reply::error(
                "NOSCRIPT No matching script. Please use EVAL.",
            )),
        },
    }
}

/// A lease script's TTL argument: its position in the request and its value in ms.
fn lease_ttl(script: &Script, args: &[Bytes], numkeys: usize) -> Option<(usize, u64, u64)> {
    let shape = script.lease?;
    let at = 3 + numkeys + shape.argv - 1;
    let ttl = super::parse_int(args.get(at)?)?;
    let ttl_ms = u64::try_from(ttl).ok()?.checked_mul(shape.unit_ms)?;
    (ttl_ms > 0).then_some((at, ttl_ms, shape.unit_ms))
}

fn run(ctx: &Ctx<'_>, request: Request, script: Script, numkeys: usize) -> Action {
    if request.args[3..3 + numkeys]
        .iter()
        .any(super::is_reserved_key)
    {
        return Action::Ready(super::reserved_key());
    }
    let cluster = ctx.cluster();
    let lease = lease_ttl(&script, &request.args, numkeys);
    let mut args = request.args;
    let mut deadline = None;
    if let Some((at, ttl_ms, unit_ms)) = lease {
        if let Err(reply) = cluster.check_ttl(ttl_ms) {
            return Action::Ready(reply);
        }
        // Pad the masters' TTL by drift (rounded up to the script's unit).
        let padded = backend_ttl_ms(ttl_ms, cluster.drift_factor).div_ceil(unit_ms);
        args[at] = Bytes::from(padded.to_string());
        let window = validity_window(ttl_ms, cluster.drift_factor).unwrap_or(Duration::ZERO);
        deadline = Some(ctx.received_at + window);
    }
    // The masters always get the body (`EVAL`), never a SHA1 they may not know.
    let read_only = args[0].len() > 4 && args[0].to_ascii_uppercase().ends_with(b"_RO");
    args[0] = Bytes::from_static(if read_only { b"EVAL_RO" } else { b"EVAL" });
    args[1] = script.body;
    let mut payload = bytes::BytesMut::from(command(&args).as_ref());
    let guarded = script.sets_expiry && !read_only;
    if guarded {
        // EVAL <guard> (2 + numkeys) <armed> <quarantine> <the script's keys…> <bound>
        let count = (numkeys + 2).to_string();
        let bound = cluster.lease_bound().as_millis().to_string();
        let mut guard: Vec<&[u8]> = vec![
            b"EVAL",
            GUARD_SCRIPT.as_bytes(),
            count.as_bytes(),
            ARMED_KEY.as_bytes(),
            QUARANTINE_KEY.as_bytes(),
        ];
        guard.extend(args[3..3 + numkeys].iter().map(|k| k.as_ref()));
        guard.push(bound.as_bytes());
        payload.extend_from_slice(&command(&guard));
    }
    let payload = payload.freeze();
    let rule = script.merge;
    Action::Defer(Box::pin(async move {
        let reply = if guarded {
            guarded_reply(&cluster, &payload, rule).await
        } else {
            quorum_reply(&cluster, &payload, rule).await
        };
        settle(reply, deadline)
    }))
}

/// The script's vote of one master from its `[script reply, guard reply]` pair: counted only if
/// the guard vouched for the master (`-1`: unarmed or quarantined, no vote).
fn script_vote(vote: &Vote) -> Vote {
    match vote {
        Vote::Replied(Reply::Array(pair)) => match pair.as_slice() {
            [reply, Reply::Integer(n)] if *n >= 0 => Vote::Replied(reply.clone()),
            _ => Vote::Missing,
        },
        Vote::Replied(_) => Vote::Missing,
        other => other.clone(),
    }
}

/// Runs a script followed by its guard on every master (two replies each) and merges the
/// script's replies, counting a master only if its guard vouched for it. A master whose guard
/// found it unarmed or quarantined is re-checked by its health monitor at once; a guard that
/// had to cap a TTL makes the reply an error.
async fn guarded_reply(cluster: &Cluster, payload: &Bytes, rule: MergeRule) -> Reply {
    let script_votes = |votes: &[Vote]| votes.iter().map(script_vote).collect::<Vec<_>>();
    let votes = cluster
        .fan_out(payload, 2, |v| merge(&script_votes(v), rule).is_some())
        .await;
    let mut capped = false;
    for (vote, master) in votes.iter().zip(&cluster.masters) {
        if let Vote::Replied(Reply::Array(pair)) = vote {
            match pair.get(1) {
                Some(Reply::Integer(-1)) => master.health.recheck(),
                Some(Reply::Integer(n)) if *n > 0 => capped = true,
                _ => {}
            }
        }
    }
    if capped {
        return Reply::error(format!(
            "ERR script set a TTL above max_lock_ttl_ms ({} ms) of redlock-proxy; the key's TTL was capped, do not rely on the longer lease",
            cluster.max_lock_ttl_ms
        ));
    }
    let votes = script_votes(&votes);
    merge(&votes, rule).unwrap_or_else(|| no_quorum(votes.len()))
}

/// The outcome of a script: a lease reply (checked against its deadline at write time) for a
/// lease script, the plain reply otherwise.
fn settle(reply: Reply, deadline: Option<Instant>) -> Outcome {
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
