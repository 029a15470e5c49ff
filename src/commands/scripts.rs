//! `EVAL`, `EVALSHA` (and their `_RO` forms) and `SCRIPT LOAD|EXISTS|FLUSH|KILL`.
//!
//! A script runs unchanged on every master and its replies are merged by the quorum rule. The
//! proxy remembers every body it sees under its real SHA1 (of the exact bytes), so `EVALSHA`
//! works on masters that never saw the script or lost their cache (restart, `SCRIPT FLUSH`):
//! such a master answers `NOSCRIPT` and is sent the `EVAL` instead, invisibly to the client.
//! An `EVALSHA` of a SHA1 the proxy does not know is still sent on (another proxy may have
//! loaded it); if a majority of masters do not know it either, the client gets Redis' own
//! `NOSCRIPT No matching script. Please use EVAL.`

use super::{not_an_integer, Action, Ctx, Outcome, Session};
use crate::cluster::{command, quorum_reply, script_sha};
use crate::protocol::{Reply, Request};
use bytes::Bytes;

/// Checks `numkeys` as Redis' `evalGetKeys` does.
fn check_numkeys(args: &[Bytes]) -> Result<(), Reply> {
    let numkeys = super::parse_int(&args[2]).ok_or_else(not_an_integer)?;
    if numkeys < 0 {
        return Err(Reply::error("ERR Number of keys can't be negative"));
    }
    if numkeys as u64 > (args.len() - 3) as u64 {
        return Err(Reply::error(
            "ERR Number of keys can't be greater than number of args",
        ));
    }
    Ok(())
}

/// `EVAL body numkeys key… arg…`
pub fn eval(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    if let Err(reply) = check_numkeys(&request.args) {
        return Action::Ready(reply);
    }
    let body = request.args[1].clone();
    ctx.shared
        .cluster
        .scripts
        .entry(script_sha(&body))
        .or_insert(body);
    super::keys::forward_request(ctx.cluster(), request)
}

/// `EVALSHA sha numkeys key… arg…`
pub fn evalsha(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    if let Err(reply) = check_numkeys(&request.args) {
        return Action::Ready(reply);
    }
    let cluster = ctx.cluster();
    let sha = String::from_utf8_lossy(&request.args[1]).to_ascii_lowercase();
    let fallback = cluster.scripts.get(&sha).map(|body| {
        let mut args = request.args.clone();
        args[0] = if args[0].len() > 7 {
            Bytes::from_static(b"EVAL_RO")
        } else {
            Bytes::from_static(b"EVAL")
        };
        args[1] = body.clone();
        command(&args)
    });
    let payload = request.raw.unwrap_or_else(|| command(&request.args));
    Action::Defer(Box::pin(async move {
        Outcome::Reply(quorum_reply(&cluster, &payload, fallback.as_ref()).await)
    }))
}

/// `SCRIPT LOAD|EXISTS|FLUSH|KILL|HELP`
pub fn script(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let sub = request.args[1].to_ascii_uppercase();
    let cluster = ctx.cluster();
    match (sub.as_slice(), request.args.len()) {
        (b"LOAD", 3) => {
            let body = request.args[2].clone();
            cluster.scripts.insert(script_sha(&body), body);
            super::keys::forward_request(cluster, request)
        }
        (b"EXISTS", n) if n >= 3 => {
            let known = request.args[2..]
                .iter()
                .map(|sha| {
                    let sha = String::from_utf8_lossy(sha).to_ascii_lowercase();
                    Reply::Integer(i64::from(cluster.scripts.contains_key(&sha)))
                })
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
