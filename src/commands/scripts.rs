//! `EVAL`, `EVALSHA` (and their `_RO` forms) and `SCRIPT LOAD|EXISTS|FLUSH|KILL`.
//!
//! A script runs on every master behind the key checks of [`crate::script_keys`]: its
//! `redis.call`s may touch only its declared `KEYS`, none of the proxy's own keys, and only
//! keys the client's user may access; a script that could get around those checks is refused.
//! The proxy remembers every body it sees under its real SHA1 (of the exact bytes, at most
//! [`crate::script_cache::MAX_SCRIPTS`]), and sends an `EVALSHA` of a known script to the
//! masters as the `EVAL` of its checked body, so a master that never saw the script or lost
//! its cache runs it like the others, in the same position of the connection's FIFO as the
//! client's request. Redis' error texts name the SHA1 of the body a master ran: the proxy puts
//! the client's SHA1 back. An `EVALSHA` of a SHA1 the proxy does not know is
//! answered with Redis' own `NOSCRIPT No matching script. Please use EVAL.` without reaching
//! the masters: forwarding it would run a script (perhaps a lease script loaded through another
//! proxy or before a restart) whose meaning the proxy never checked; every client library
//! then sends the body with `EVAL`.
//!
//! Replies merge by the quorum rule; only the recognised compare-and-delete may use the
//! integer rule, any other script needs Q identical replies ([`MergeRule`]).
//!
//! Lease scripts, by effect: the prelude ([`crate::script_keys`]) pads every lease a script
//! that may write sets on its keys, however it spells the TTL, and reports the shortest one
//! it took on each master. When a majority took one, a success is only reported while
//! `TTL − elapsed − drift > 0`; past that every reply becomes an error, which no convention
//! reads as success (reply codes differ per library: python-redis-lock's extend answers `0`
//! for extended and `1` for "not the owner", redis-py's reacquire the reverse, so no integer is
//! safe for every script). A TTL argument the text recogniser ([`crate::lease_script`]) finds
//! is refused above `max_lock_ttl_ms` before anything runs.
//!
//! Every script that may write is followed, on each master, by [`GUARD_SCRIPT`] in the same
//! pipeline: it gives every key of the script a TTL within the lease bound, and a master that
//! turns out unarmed or quarantined does not vote. A script that set a longer TTL, or left a key
//! without expiry, is answered with an error (its key was capped, so the caller must not believe
//! the longer lease, nor a key that lasts).

mod hash_lock;

use super::{forward_request, Action, Ctx, Session};
use crate::auth::KeyPatterns;
use crate::cluster::keys::token_prefix_on;
use crate::error::ProxyError;
use crate::lease::{Granted, Lease, Outcome};
use crate::lease_script::KnownLock;
use crate::lock::guard::{
    guard_command, script_votes, Guarded, Tally, CAPPED_NO_EXPIRY, CAPPED_TTL,
};
use crate::lock::Acquirer;
use crate::lock::Attempt;
use crate::masters::{slot_of, Ask, Forms, LateVotes, Masters, Voter};
use crate::on_master::script_sha;
use crate::protocol::{encode_command, Reply, Request};
use crate::redlock::{merge, validity_window, MergeRule, Policy, Vote};
use crate::script_cache::Script;
use crate::script_keys::{access_args, TokenOffer, COUNTERS_AT, DEADLINE_AT};
use bytes::Bytes;
use futures::future::BoxFuture;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;
use tokio::time::Instant;

/// Checks `numkeys` as Redis' `evalGetKeys` does; returns it.
fn check_numkeys(args: &[Bytes]) -> Result<usize, ProxyError> {
    let numkeys = super::parse_int(&args[2])?;
    if numkeys < 0 {
        return Err(ProxyError::NegativeNumkeys);
    }
    if numkeys as u64 > (args.len() - 3) as u64 {
        return Err(ProxyError::TooManyNumkeys);
    }
    Ok(numkeys as usize)
}

/// `EVAL body numkeys key… arg…`
pub fn eval(ctx: &Ctx<'_>, session: &mut Session, request: Request) -> Action {
    match check_numkeys(&request.args) {
        Err(err) => Action::error(err),
        Ok(numkeys) => {
            let script = ctx.shared.scripts.remember(request.args[1].clone());
            run(ctx, session, request, script, numkeys)
        }
    }
}

/// `EVALSHA sha numkeys key… arg…`
pub fn evalsha(ctx: &Ctx<'_>, session: &mut Session, request: Request) -> Action {
    match check_numkeys(&request.args) {
        Err(err) => Action::error(err),
        Ok(numkeys) => match ctx.shared.scripts.by_sha(&request.args[1]) {
            Some(script) => run(ctx, session, request, script, numkeys),
            None => Action::error(ProxyError::NoScript),
        },
    }
}

/// A lease script's TTL argument, in ms, where the recogniser found one.
fn lease_ttl(script: &Script, args: &[Bytes], numkeys: usize) -> Option<u64> {
    let shape = script.lease?;
    let ttl = super::parse_int(args.get(3 + numkeys + shape.argv - 1)?).ok()?;
    let ttl_ms = u64::try_from(ttl).ok()?.checked_mul(shape.unit_ms)?;
    (ttl_ms > 0).then_some(ttl_ms)
}

/// The script's `KEYS` were checked by [`super::dispatch`] (reserved keys, the user's key
/// patterns); the keys its body names are checked on the masters ([`crate::script_keys`]).
fn run(
    ctx: &Ctx<'_>,
    session: &Session,
    request: Request,
    script: Script,
    numkeys: usize,
) -> Action {
    if script.reaches_globals {
        return Action::error(ProxyError::ScriptReachesGlobals);
    }
    let read_only =
        request.args[0].len() > 4 && request.args[0].to_ascii_uppercase().ends_with(b"_RO");
    if let Some(action) = known_lock(ctx, session, &script, &request.args, numkeys, read_only) {
        return action;
    }
    let policy = ctx.shared.policy;
    // A TTL argument the recogniser understood is refused above the cap before anything runs
    // (the guard would cap it afterwards, and answer an error then).
    if let Some(Err(err)) =
        lease_ttl(&script, &request.args, numkeys).map(|ms| policy.check_ttl(ms))
    {
        return Action::error(err);
    }
    let acquirer = ctx.shard.acquirer.clone();
    // An EVAL reaches the handler only authenticated: no user would be a bug, and gets no key.
    let no_keys = KeyPatterns::Some(Vec::new());
    let patterns = session.user.as_ref().map_or(&no_keys, |user| &user.keys);
    let call = MasterCall::new(
        &script,
        request.args,
        numkeys,
        patterns,
        &acquirer,
        &policy,
        read_only,
    );
    let (masters, stats, received_at) = (ctx.masters(), ctx.shared.stats.clone(), ctx.received_at);
    Action::Defer(Box::pin(async move {
        let rule = script.merge;
        let (reply, lease_ms) = match call.guarded {
            true => call.run_guarded(&masters, &acquirer, rule, policy).await,
            false => call.run_plain(&masters, rule).await,
        };
        stats.count_if_release(rule, &reply);
        // A lease a majority of masters took is promised only within its validity, as an
        // acquire's: `TTL − elapsed − drift > 0` when the reply is written.
        let deadline = lease_ms.map(|ms| {
            received_at + validity_window(ms, policy.drift_factor).unwrap_or(Duration::ZERO)
        });
        settle(clients_sha(reply, &call.checked, &script.body), deadline)
    }))
}

/// What the masters get for one run of a client script: the checked body's call, with the
/// prelude's arguments after the client's, and the guard after it where it may write.
struct MasterCall {
    /// The script may write and the call is not `_RO`: a deadline per master, the guard after
    /// it, leases padded and reported, a token offered.
    guarded: bool,
    args: Vec<Bytes>,
    /// Where the write deadline sits in `args` (set per master).
    due_at: usize,
    /// Where the token counters' prefix sits in `args`, and its forms (a cluster master's
    /// names the slot).
    counters_at: usize,
    counters: Forms,
    /// [`guard_command`] over the script's keys, or nothing (a read-only run).
    guard: Forms,
    /// The slot of its keys (on a cluster master, the node that runs it).
    slot: u16,
    /// `EVALSHA` and `EVAL` (or their `_RO` forms).
    by_sha: &'static [u8],
    by_body: &'static [u8],
    /// Send the body whole to every master (the script's first call).
    whole_first: bool,
    checked: Bytes,
    checked_sha: Bytes,
    /// The token the run may take ([`crate::script_keys`]); its record names the run.
    offer: Option<TokenOffer>,
}

/// A guarded run's votes at its decision (each master's `[script reply, guard reply]`), those
/// still to come, and each master's write deadline as sent (0: not asked).
struct Ballot {
    votes: Vec<Vote>,
    late: LateVotes,
    deadlines: Vec<u64>,
}

impl MasterCall {
    fn new(
        script: &Script,
        mut args: Vec<Bytes>,
        numkeys: usize,
        patterns: &KeyPatterns,
        acquirer: &Acquirer,
        policy: &Policy,
        read_only: bool,
    ) -> MasterCall {
        let guarded = script.may_write && !read_only;
        // The prelude pads the leases a script sets, and reports them, only where it may write.
        let pad = if guarded { policy.drift_factor } else { 0.0 };
        // A run that makes a new holder of a key takes a fencing token, as an acquire does.
        let offer = guarded.then(|| acquirer.offer_script_token()).flatten();
        let (due_at, counters_at) = (args.len() + DEADLINE_AT, args.len() + COUNTERS_AT);
        args.extend(access_args(patterns, pad, 0, offer.as_ref()));
        let keys = &args[3..3 + numkeys];
        let guard = Forms::new(acquirer.masters(), |cluster| match guarded {
            true => guard_command(keys, policy, cluster),
            false => Bytes::new(),
        });
        let slot = slot_of(keys);
        let counters = Forms::new(acquirer.masters(), |cluster| token_prefix_on(cluster, slot));
        let (by_sha, by_body): (&'static [u8], &'static [u8]) = match read_only {
            true => (b"EVALSHA_RO", b"EVAL_RO"),
            false => (b"EVALSHA", b"EVAL"),
        };
        // The masters get the checked body whole (`EVAL`) on its first call, then by its SHA1
        // (`EVALSHA`), and whole again where one answers `NOSCRIPT`: the prelude makes every
        // body some 5 KB, which would cost each master more to read and hash on every call
        // than the script costs to run.
        let whole_first = !script.sent_whole.swap(true, Ordering::Relaxed);
        MasterCall {
            guarded,
            args,
            due_at,
            counters_at,
            counters,
            guard,
            slot,
            by_sha,
            by_body,
            whole_first,
            checked: script.checked.clone(),
            checked_sha: script.checked_sha.clone(),
            offer,
        }
    }

    /// The request for `voter`, with its write deadline (`0`: none).
    fn ask(&self, due: u64, voter: &Voter) -> Ask {
        let mut call = self.args.clone();
        call[self.due_at] = Bytes::from(due.to_string());
        call[self.counters_at] = self.counters.for_voter(voter);
        let guard = self.guard.for_voter(voter);
        let mut encoded = |command: &'static [u8], script: &Bytes| {
            call[0] = Bytes::from_static(command);
            call[1] = script.clone();
            let mut payload = bytes::BytesMut::from(encode_command(&call).as_ref());
            payload.extend_from_slice(&guard);
            payload.freeze()
        };
        let whole = encoded(self.by_body, &self.checked);
        match self.whole_first {
            true => Ask::Commands(whole),
            false => Ask::BySha {
                by_sha: encoded(self.by_sha, &self.checked_sha),
                by_body: whole,
            },
        }
    }

    /// A run that may write: each master's call carries a deadline in that master's clock, as
    /// an acquire does (the latest its clock can show when the node timeout runs out, from its
    /// last reading; a master that may not vote is not asked), and is followed by the guard.
    /// Votes are collected until `done` says the reply is decided.
    async fn fan_out(
        &self,
        masters: &Masters,
        drift: f64,
        done: impl Fn(&[Vote]) -> bool,
    ) -> Ballot {
        let sent = OnceLock::new();
        let node_timeout = masters.node_timeout();
        let deadlines: Vec<AtomicU64> =
            masters.voters().iter().map(|_| AtomicU64::new(0)).collect();
        let ask = |i: usize| {
            let sent = *sent.get_or_init(Instant::now);
            let voter = &masters.voters()[i];
            let due = voter.write_deadline(self.slot, sent, node_timeout, drift)?;
            deadlines[i].store(due, Ordering::Relaxed);
            Some(self.ask(due, voter))
        };
        let (votes, late) = masters.fan_out_each(self.slot, ask, 2, done).await;
        Ballot {
            votes,
            late,
            deadlines: deadlines.into_iter().map(AtomicU64::into_inner).collect(),
        }
    }

    /// A run that may write ([`MasterCall::fan_out`]), answered by `rule` over the masters
    /// whose guard vouched for them.
    async fn run_guarded(
        &self,
        masters: &Masters,
        acquirer: &Acquirer,
        rule: MergeRule,
        policy: Policy,
    ) -> (Reply, Option<u64>) {
        let decided = |v: &[Vote]| merge(&script_votes(v), rule).is_some();
        let ballot = self.fan_out(masters, policy.drift_factor, decided).await;
        let guarded = Tally::of(masters, self.slot, &ballot.votes).guarded(rule);
        guarded_reply(acquirer, guarded, policy.max_lock_ttl_ms)
    }

    /// A read-only run: the same call on every master, no deadline, no guard.
    async fn run_plain(&self, masters: &Masters, rule: MergeRule) -> (Reply, Option<u64>) {
        let ask = |i: usize| Some(self.ask(0, &masters.voters()[i]));
        let reply = masters.quorum_reply_each(self.slot, ask, rule).await;
        (reply, None)
    }
}

/// Redis names the script in its error texts (`… script: <sha1>, on @user_script:1.`): the
/// SHA1 of the checked body the masters ran becomes the client's.
fn clients_sha(reply: Reply, checked: &[u8], body: &[u8]) -> Reply {
    let Reply::Error(text) = &reply else {
        return reply;
    };
    let ran = script_sha(checked);
    match text.windows(ran.len()).position(|w| w == ran.as_bytes()) {
        Some(at) => {
            let mut own = text.to_vec();
            own[at..at + ran.len()].copy_from_slice(script_sha(body).as_bytes());
            Reply::Error(Bytes::from(own))
        }
        None => reply,
    }
}

/// A client library's whole acquire or release script, run as the proxy's own (`EVAL_RO`
/// keeps Redis' refusal of the writes):
/// - the recognised compare-and-delete reads only `KEYS[1]` and `ARGV[1]` and answers as the
///   proxy's merged release does;
/// - with one key ([`KnownLock`]), node-redlock's acquire is the Redlock acquire (`SET key
///   ARGV[1] NX PX ARGV[2]`, `1` for `OK` and `0` for null, the lease checked at write time
///   like any grant), and its release the merged release.
///
/// Any other shape takes the general path.
fn known_lock(
    ctx: &Ctx<'_>,
    session: &Session,
    script: &Script,
    args: &[Bytes],
    numkeys: usize,
    read_only: bool,
) -> Option<Action> {
    if read_only || numkeys == 0 {
        return None;
    }
    let (key, value) = (args.get(3)?.clone(), args.get(3 + numkeys)?.clone());
    if script.merge == MergeRule::Release {
        return Some(super::release(ctx, key, value));
    }
    let known = script.lock?;
    if let Some(action) = hash_lock::acquire(ctx, session, script, args, numkeys, known) {
        return Some(action);
    }
    if numkeys != 1 {
        return None;
    }
    match known {
        KnownLock::RedissonAcquire
        | KnownLock::RedissonFencedAcquire
        | KnownLock::RedissonFencedLockAcquire => None,
        KnownLock::NodeRedlockRelease => Some(super::release(ctx, key, value)),
        KnownLock::NodeRedlockAcquire => {
            let ttl_ms = super::parse_int(args.get(5)?).ok()?;
            let ttl_ms = u64::try_from(ttl_ms).ok().filter(|ms| *ms > 0)?;
            if let Err(err) = ctx.shared.policy.check_ttl(ttl_ms) {
                return Some(Action::error(err));
            }
            let attempt = Attempt::new(key, value, ttl_ms, ctx.received_at, false);
            Some(counted(super::acquire(ctx, attempt)))
        }
    }
}

/// An acquire answered as node-redlock's script answers: `1` keys set, or `0`.
fn counted(action: Action) -> Action {
    let count = |acquire: BoxFuture<'static, Outcome>| -> BoxFuture<'static, Outcome> {
        Box::pin(async move {
            match acquire.await {
                Outcome::Lease(lease) => Outcome::Lease(Lease {
                    granted: Granted::Reply(Reply::Integer(1)),
                    expired: Reply::Integer(0),
                    ..lease
                }),
                Outcome::Reply(Reply::Null) => Outcome::Reply(Reply::Integer(0)),
                other => other,
            }
        })
    };
    match action {
        Action::Defer(acquire) => Action::Defer(count(acquire)),
        Action::Barrier(acquire) => Action::Barrier(count(acquire)),
        other => other,
    }
}

/// A script's [`Guarded`] reply: a guard that had to cap a key makes it an error (a key left
/// without expiry first: the stronger surprise); with the lease the script set. A token a
/// master refused raises the floor of later proposals.
fn guarded_reply(acquirer: &Acquirer, guarded: Guarded, cap_ms: u64) -> (Reply, Option<u64>) {
    let Guarded {
        reply,
        capped,
        lease,
        token_refused_at,
    } = guarded;
    if let Some(seen) = token_refused_at {
        acquirer.script_token_refused(seen);
    }
    if capped & CAPPED_NO_EXPIRY != 0 {
        return (ProxyError::ScriptNoExpiry(cap_ms).into(), None);
    }
    if capped & CAPPED_TTL != 0 {
        return (ProxyError::ScriptTtlCapped(cap_ms).into(), None);
    }
    (reply, lease)
}

/// The outcome of a script: a lease reply (checked against its deadline at write time) for a
/// lease script, the plain reply otherwise.
fn settle(reply: Reply, deadline: Option<Instant>) -> Outcome {
    match deadline {
        Some(deadline) if !reply.is_error() => Outcome::Lease(Lease {
            deadline,
            granted: Granted::Reply(reply),
            expired: ProxyError::LeaseExpired.into(),
            rollback: None,
        }),
        _ => Outcome::Reply(reply),
    }
}

/// `SCRIPT LOAD|EXISTS|FLUSH|KILL|HELP`
pub fn script(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let sub = request.args[1].to_ascii_uppercase();
    let (masters, scripts) = (ctx.masters(), &ctx.shared.scripts);
    match (sub.as_slice(), request.args.len()) {
        (b"LOAD", 3) => {
            scripts.remember(request.args[2].clone());
            forward_request(masters, request)
        }
        (b"EXISTS", n) if n >= 3 => {
            let known = request.args[2..]
                .iter()
                .map(|sha| Reply::Integer(i64::from(scripts.by_sha(sha).is_some())))
                .collect();
            Action::Ready(Reply::Array(known))
        }
        (b"FLUSH", 2 | 3) => {
            scripts.clear();
            forward_request(masters, request)
        }
        (b"KILL", 2) => forward_request(masters, request),
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
            Action::error(ProxyError::subcommand_arity("script", &sub))
        }
        _ => Action::error(ProxyError::unknown_subcommand(&request.args[1], "SCRIPT")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_script_past_its_validity_answers_an_error_whatever_its_reply() {
        // python-redis-lock's extend: 0 extended, 1 not the owner; redis-py's reacquire: 1
        // extended, 0 not the owner. No integer reads as "not extended" for both.
        let deadline = Instant::now();
        for reply in [
            Reply::Integer(0),
            Reply::Integer(1),
            Reply::ok(),
            Reply::Null,
        ] {
            let Outcome::Lease(lease) = settle(reply.clone(), Some(deadline)) else {
                panic!("{reply:?} is not checked against the validity");
            };
            assert_eq!(lease.expired, ProxyError::LeaseExpired.into(), "{reply:?}");
        }
        let refused = Reply::error("ERR x");
        assert!(matches!(settle(refused, Some(deadline)), Outcome::Reply(_)));
    }
}
