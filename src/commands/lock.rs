//! `SET` (the acquire) and `SETNX`.
//!
//! `SET key value NX PX ms` / `NX EX s` (options in any order and case) is a Redlock acquire:
//! sent to every master as `SET key value NX PX (ms + drift)`, granted only with a quorum of
//! `OK`s and positive validity, otherwise rolled back and answered with null. Any other `SET`
//! is a plain write under the quorum reply rule. A lock without expiry (`SET … NX` without
//! PX/EX, `SETNX`) is refused: it cannot be made safe, since a crashed holder would hold it
//! forever and a restarted master would forget it.

use super::keys::forward_request;
use super::{not_an_integer, syntax_error, Action, Ctx, Lease, Outcome, Session};
use crate::backend::wait_reply;
use crate::cluster::{
    attempt_key, command, rollback_command, Cluster, LateVotes, ACQUIRE_SCRIPT, UNARMED,
    UNDO_SCRIPT,
};
use crate::health::{ARMED_KEY, QUARANTINE_KEY};
use crate::protocol::{Reply, Request};
use crate::redlock::{
    acquire_decision, backend_ttl_ms, held_by_majority, majority_unreachable, may_hold_our_value,
    validity_window, AcquireDecision, Vote,
};
use bytes::Bytes;
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use futures::StreamExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

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
}

/// Parses `SET` options like Redis' `parseExtendedStringArgumentsOrReply` (`t_string.c`).
fn parse_set_options(args: &[Bytes]) -> Result<SetOptions, Reply> {
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
            b"NX" if !opts.xx => opts.nx = true,
            b"XX" if !opts.nx => opts.xx = true,
            b"GET" => opts.get = true,
            b"KEEPTTL" if !expire_seen => {
                opts.keep_ttl = true;
                expire_seen = true;
            }
            b"EX" | b"PX" | b"EXAT" | b"PXAT"
                if !expire_seen && !opts.keep_ttl && next.is_some() =>
            {
                expire_seen = true;
                let value = super::parse_int(next.map(|b| b.as_ref()).unwrap_or_default())
                    .ok_or_else(not_an_integer)?;
                let scale: i64 = if arg.starts_with(b"EX") { 1000 } else { 1 };
                // Redis also refuses an expiry whose absolute time overflows (`t_string.c`).
                let ms = value
                    .checked_mul(scale)
                    .filter(|ms| *ms > 0 && ms.checked_add(unix_now_ms()).is_some())
                    .ok_or_else(|| Reply::error("ERR invalid expire time in 'set' command"))?;
                if arg.ends_with(b"AT") {
                    opts.expire_at_ms = Some(ms);
                } else {
                    opts.ttl_ms = Some(ms as u64);
                }
                i += 1;
            }
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    Ok(opts)
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
        Err(reply) => return Action::Ready(reply),
    };
    let cluster = ctx.cluster();
    // Every TTL forwarded is capped (see `Cluster::lease_bound`): `SET … XX PX` extends a lock.
    // `EXAT`/`PXAT` are measured from this proxy's clock.
    let relative = opts.ttl_ms.or_else(|| {
        opts.expire_at_ms
            .map(|at| at.saturating_sub(unix_now_ms()).max(0) as u64)
    });
    if let Some(Err(reply)) = relative.map(|ms| cluster.check_ttl(ms)) {
        return Action::Ready(reply);
    }
    if !opts.nx {
        return forward_request(cluster, request);
    }
    if ctx.shared.config.allow_locks_without_expiry && relative.is_none() {
        return forward_request(cluster, request);
    }
    let refuse = |text: &str| Action::Ready(Reply::error(text));
    let ttl_ms = match (opts.get, opts.expire_at_ms.is_some(), opts.ttl_ms) {
        (true, _, _) => {
            return refuse("ERR SET NX GET is not supported by redlock-proxy: an acquire answers OK or null")
        }
        (_, true, _) => {
            return refuse("ERR SET NX with EXAT/PXAT is refused by redlock-proxy: use PX <milliseconds> so the lock's validity can be checked")
        }
        (_, _, None) => {
            return refuse("ERR SET NX without PX/EX is refused by redlock-proxy: a lock without expiry cannot be made safe; add PX <milliseconds>")
        }
        (_, _, Some(ttl_ms)) => ttl_ms,
    };
    let attempt = Attempt {
        key: request.args[1].clone(),
        value: request.args[2].clone(),
        ttl_ms,
        received_at: ctx.received_at,
    };
    ctx.shared.acquires.start(cluster, attempt)
}

/// `SETNX key value` has no expiry: refused unless the configuration allows it as a plain write.
pub fn setnx(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    if ctx.shared.config.allow_locks_without_expiry {
        return forward_request(ctx.cluster(), request);
    }
    Action::Ready(Reply::error(
        "ERR SETNX is refused by redlock-proxy: a lock without expiry cannot be made safe; use SET key value NX PX <milliseconds>",
    ))
}

/// One client's acquire request.
struct Attempt {
    key: Bytes,
    value: Bytes,
    ttl_ms: u64,
    received_at: Instant,
}

/// A queued acquire and where its outcome goes.
struct Waiter {
    attempt: Attempt,
    reply: oneshot::Sender<Outcome>,
}

/// Per-key single flight of acquires on this proxy: while one acquire of a key is out on the
/// masters, further acquires of that key queue; when it completes they go out as **one**
/// fan-out (the first one's value), and the others get null, which is what one Redis answers
/// to every `SET NX` but one. This bounds master work under hot-key polling (the seed's PHP
/// `Lock` polls every 5 ms) to one fan-out per round trip, however many pollers.
///
/// Linearizability: a batch is sent only after all its members arrived, and each member is
/// answered after the batch's votes are in, so each answer reflects master state from within
/// that member's own request interval. Followers are answered null only when the batch leader
/// was granted, when a majority of masters reported the key held (null votes), or when no
/// majority answered in time; a leader refused for any other reason (validity, errors)
/// leaves its followers to try themselves.
#[derive(Default)]
pub struct Flights {
    keys: DashMap<Bytes, Vec<Waiter>>,
}

impl Flights {
    /// Starts an acquire of `attempt.key`: at once if none is in flight (the caller leads),
    /// or queued behind the one in flight (the returned future waits for the batch).
    fn start(self: &Arc<Self>, cluster: Arc<Cluster>, attempt: Attempt) -> Action {
        // The map's shard lock is held only inside this block, never across an await.
        let queued = match self.keys.entry(attempt.key.clone()) {
            Entry::Vacant(slot) => {
                slot.insert(Vec::new());
                Err(attempt)
            }
            Entry::Occupied(mut queue) => {
                let (reply, receiver) = oneshot::channel();
                queue.get_mut().push(Waiter { attempt, reply });
                Ok(receiver)
            }
        };
        let receiver = match queued {
            Ok(receiver) => receiver,
            Err(attempt) => return self.lead(cluster, attempt),
        };
        // Nothing later from this client may reach the masters before this acquire has
        // (a pipelined `DEL` must not overtake its `SET`): a barrier.
        Action::Barrier(Box::pin(async move {
            receiver.await.unwrap_or(Outcome::Reply(Reply::error(
                "ERR acquire abandoned (redlock-proxy shutting down)",
            )))
        }))
    }

    /// Runs an acquire as the leader of its key's flight.
    fn lead(self: &Arc<Self>, cluster: Arc<Cluster>, attempt: Attempt) -> Action {
        let guard = FlightGuard {
            flights: self.clone(),
            cluster: cluster.clone(),
            key: attempt.key.clone(),
        };
        // Polled by the client's connection, whose loop never blocks on the client's socket
        // (see `connection`), so the key's flight progresses whatever the client does. (A
        // task of its own would reach the masters out of the client's request order.)
        Action::Defer(Box::pin(async move {
            let decided = decide(cluster, attempt).await;
            // The queued acquires of the key go on as soon as this one is decided; its own
            // clean-up does not hold them up.
            drop(guard);
            decided.finish().await
        }))
    }

    /// After a flight of `key`: sends the queued acquires as the next batch, or marks the
    /// key idle.
    fn next_batch(self: Arc<Self>, cluster: Arc<Cluster>, key: Bytes) {
        let batch = match self.keys.entry(key) {
            Entry::Occupied(mut queue) if !queue.get().is_empty() => {
                std::mem::take(queue.get_mut())
            }
            Entry::Occupied(queue) => {
                queue.remove();
                return;
            }
            Entry::Vacant(_) => return,
        };
        tokio::spawn(async move {
            let key = batch[0].attempt.key.clone();
            let mut batch = batch.into_iter();
            let Some(leader) = batch.next() else { return };
            let decided = decide(cluster.clone(), leader.attempt).await;
            let mut decisions = Vec::new();
            if decided.settled {
                for follower in batch {
                    let _ = follower.reply.send(Outcome::Reply(Reply::Null));
                }
            } else {
                // The leader's refusal says nothing about the key (timeouts, validity): every
                // follower tries for itself, all at once, so waiting does not grow with the
                // queue. Still one of them at most can be granted.
                let tries = batch.map(|follower| {
                    let cluster = cluster.clone();
                    async move { (follower.reply, decide(cluster, follower.attempt).await) }
                });
                decisions = futures::future::join_all(tries).await;
            }
            decisions.push((leader.reply, decided));
            // The next batch goes out once this one is decided, not after its clean-ups.
            self.next_batch(cluster, key);
            let finishes = decisions.into_iter().map(|(reply, decided)| async move {
                let _ = reply.send(decided.finish().await);
            });
            futures::future::join_all(finishes).await;
        });
    }
}

/// Ends a flight however its leader ends (completed, or dropped with its client): the queued
/// acquires of the key then go out, so a key is never left waiting on a vanished leader.
struct FlightGuard {
    flights: Arc<Flights>,
    cluster: Arc<Cluster>,
    key: Bytes,
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_ok() {
            let key = std::mem::take(&mut self.key);
            self.flights.clone().next_batch(self.cluster.clone(), key);
        }
    }
}

/// The Redlock acquire, up to its decision (see [`Decided`]). Safety arguments:
/// - The grant deadline is `received_at + TTL − drift`; `received_at` is when the request was
///   read off the client's socket, which is after the client sent it, so a client counting its
///   TTL from its send time is covered by the masters' `PX = TTL + drift` (docs/SAFETY.md, validity).
/// - `OK` is returned only with Q `OK` votes; the connection writes it only if the deadline has
///   not passed at write time ([`Lease`]).
/// - On refusal, every master that may hold our value (said `OK`, or its answer is unknown) gets
///   a clean-up of this attempt's write before null is returned ([`RollbackPlan`]).
async fn decide(cluster: Arc<Cluster>, attempt: Attempt) -> Decided {
    let Attempt {
        key,
        value,
        ttl_ms,
        received_at,
    } = attempt;
    let Some(window) = validity_window(ttl_ms, cluster.drift_factor) else {
        // The drift allowance alone exceeds the TTL: no grant could ever be valid.
        return Decided {
            outcome: Outcome::Reply(Reply::Null),
            settled: false,
            undo: None,
        };
    };
    let deadline = received_at + window;
    let px_ms = backend_ttl_ms(ttl_ms, cluster.drift_factor);
    let px = px_ms.to_string();
    // With quarantine on, the write is the acquire script (markers, deadline, attempt id: see
    // `ACQUIRE_SCRIPT`), called by SHA1 (the health check loads it on every master); a master
    // that lost its script cache answers NOSCRIPT and gets the body at once. Each master's
    // deadline is the latest its clock can show when the node timeout runs out, computed as the
    // request leaves (after the fan-out permit).
    let attempt_id = cluster.next_attempt_id();
    let attempt_key = attempt_key(&key);
    let deadlines: Vec<AtomicU64> = cluster.masters.iter().map(|_| AtomicU64::new(0)).collect();
    let node_timeout = cluster.node_timeout;
    let payload = |i: usize| {
        if !cluster.quarantine {
            let set = command(&[b"SET".as_ref(), &key, &value, b"NX", b"PX", px.as_bytes()]);
            return Some((set, None));
        }
        // A master whose vote cannot count is not asked: nothing to clean up there.
        if !cluster.masters[i].eligible() {
            return None;
        }
        let health = &cluster.masters[i].health;
        let deadline = health
            .master_clock_bound(Instant::now() + node_timeout, cluster.drift_factor)
            .unwrap_or(0);
        deadlines[i].store(deadline, Ordering::Relaxed);
        let deadline = deadline.to_string();
        let call = |how: &[u8], script: &[u8]| {
            command(&[
                how,
                script,
                b"4",
                &key,
                ARMED_KEY.as_bytes(),
                QUARANTINE_KEY.as_bytes(),
                &attempt_key,
                &value,
                px.as_bytes(),
                attempt_id.as_bytes(),
                deadline.as_bytes(),
            ])
        };
        Some((
            call(b"EVALSHA", cluster.acquire_sha.as_bytes()),
            Some(call(b"EVAL", ACQUIRE_SCRIPT.as_bytes())),
        ))
    };
    let (votes, late) = cluster
        .fan_out_each(payload, 1, |v| {
            acquire_decision(v) != AcquireDecision::Undecided
        })
        .await;
    for (master, vote) in cluster.masters.iter().zip(&votes) {
        if *vote == Vote::Replied(UNARMED) {
            master.health.recheck();
        }
    }
    // Followers queued behind this acquire get the same null when it tells them nothing
    // different would happen now: the key is held, or no majority answered in time (they
    // would wait out the same node timeout, on connections the watchdog is about to abort).
    let held = held_by_majority(&votes) || majority_unreachable(&votes);
    let undo_payload = if cluster.quarantine {
        command(&[
            b"EVAL".as_ref(),
            UNDO_SCRIPT.as_bytes(),
            b"2",
            &key,
            &attempt_key,
            &value,
            attempt_id.as_bytes(),
        ])
    } else {
        rollback_command(&key, &value)
    };
    let undo = RollbackPlan {
        cluster: cluster.clone(),
        payload: undo_payload,
        ttl: Duration::from_millis(px_ms),
        votes: votes.clone(),
        late,
        deadlines: deadlines
            .iter()
            .map(|d| d.load(Ordering::Relaxed))
            .collect(),
    };
    if acquire_decision(&votes) == AcquireDecision::Quorum && Instant::now() < deadline {
        tracing::trace!(key = ?key, "granted");
        let lease = Lease {
            deadline,
            granted: Reply::ok(),
            expired: Reply::Null,
            rollback: Some(Box::pin(undo.run())),
        };
        return Decided {
            outcome: Outcome::Lease(lease),
            settled: true,
            undo: None,
        };
    }
    Decided {
        outcome: Outcome::Reply(Reply::Null),
        settled: held,
        undo: Some(undo),
    }
}

/// An acquire whose votes are in.
struct Decided {
    /// What the client is told once `undo` (if any) has run.
    outcome: Outcome,
    /// Whether this settles the question for concurrent acquires of the key (granted, held
    /// by a majority, or no majority reachable).
    settled: bool,
    /// The rollback a refusal needs before its null may be written.
    undo: Option<RollbackPlan>,
}

impl Decided {
    async fn finish(self) -> Outcome {
        if let Some(undo) = self.undo {
            undo.run().await;
        }
        self.outcome
    }
}

/// What a refused acquire's clean-up does on one master.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UndoStep {
    /// The master answered without taking the value, or was not asked: nothing to undo.
    Skip,
    /// It said `OK`: the write ran, undo it now (and wait for the confirmation).
    Now,
    /// Its answer never came: the write may still run, up to this deadline in the master's
    /// clock (ms since the epoch); undo it once the master's clock is surely past it, so the
    /// clean-up cannot run before the write.
    AfterDeadline(u64),
}

impl UndoStep {
    /// The step for a master's final vote, given the deadline its request carried (0: not
    /// sent, when the acquire goes out as the marker script).
    fn for_vote(vote: &Vote, deadline: u64, sent_as_script: bool) -> UndoStep {
        match vote {
            _ if !may_hold_our_value(vote) => UndoStep::Skip,
            Vote::Replied(_) => UndoStep::Now,
            _ if sent_as_script && deadline == 0 => UndoStep::Skip,
            _ => UndoStep::AfterDeadline(deadline),
        }
    }
}

/// Where and how to undo a refused acquire.
struct RollbackPlan {
    cluster: Arc<Cluster>,
    /// The clean-up: deletes the lock only if this attempt wrote it ([`UNDO_SCRIPT`]).
    payload: Bytes,
    /// The `PX` the acquire sent: how long a write it undoes can live.
    ttl: Duration,
    /// The votes at the decision, and those that were still pending then.
    votes: Vec<Vote>,
    late: LateVotes,
    /// Each master's deadline, as sent.
    deadlines: Vec<u64>,
}

impl RollbackPlan {
    /// Queues the clean-up on every master that may hold the value and waits (briefly) for the
    /// confirmation of those that said `OK`. Safety: the clean-up deletes only what this
    /// attempt wrote (its attempt id), so however late it runs it never deletes a later grant,
    /// even one with the same value. Liveness (no phantom holder): votes still pending are
    /// awaited first (each within its node timeout); where the answer never came, the clean-up
    /// is sent again once the master's clock is past the write's deadline, after which the
    /// write can no longer take effect. Each is kept across reconnects until a master confirms
    /// it ([`crate::backend::Master::undo`]).
    async fn run(mut self) {
        while let Some((i, vote)) = self.late.next().await {
            self.votes[i] = vote;
        }
        let script = self.cluster.quarantine;
        let steps: Vec<UndoStep> = self
            .votes
            .iter()
            .zip(&self.deadlines)
            .map(|(vote, deadline)| UndoStep::for_vote(vote, *deadline, script))
            .collect();
        // Where the answer never came, the write may still run until its deadline: the clean-up
        // goes out now (it deletes only this attempt's write, so it is harmless if it runs
        // first) and once more when the master's clock is surely past the deadline, when it is
        // final. The second one runs on its own, bounded by the deadline: the refusal does not
        // wait for it.
        let drift = self.cluster.drift_factor;
        for (master, step) in self.cluster.masters.iter().zip(&steps) {
            let UndoStep::AfterDeadline(deadline) = *step else {
                continue;
            };
            let Some(at) = master.health.surely_past(deadline, drift) else {
                continue;
            };
            let at = at.min(Instant::now() + 2 * self.cluster.node_timeout);
            let (master, payload, ttl) = (master.clone(), self.payload.clone(), self.ttl);
            tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                drop(master.undo(payload, ttl));
            });
        }
        // The null waits for the confirmations (so a read right after it sees the value gone),
        // but at most half a node timeout: a master that stalls right after its `OK` must not
        // delay the refusal by another node timeout. Its clean-up stays queued regardless, and
        // is kept until confirmed.
        let confirm_for = self.cluster.node_timeout / 2;
        let waits: Vec<_> = self
            .cluster
            .masters
            .iter()
            .zip(&steps)
            .filter(|(_, step)| **step != UndoStep::Skip)
            .filter_map(|(master, step)| {
                let rx = master.undo(self.payload.clone(), self.ttl)?;
                (*step == UndoStep::Now).then(|| wait_reply(rx, confirm_for))
            })
            .collect();
        futures::future::join_all(waits).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(list: &[&str]) -> Result<SetOptions, Reply> {
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
        assert_eq!(opts(&["NX", "XX"]), Err(syntax_error()));
        assert_eq!(opts(&["PX", "1", "EX", "1"]), Err(syntax_error()));
        assert_eq!(opts(&["PX"]), Err(syntax_error()));
        assert_eq!(opts(&["BOGUS"]), Err(syntax_error()));
        assert_eq!(opts(&["NX", "PX", "abc"]), Err(not_an_integer()));
        let invalid = Err(Reply::error("ERR invalid expire time in 'set' command"));
        assert_eq!(opts(&["NX", "PX", "0"]), invalid);
        assert_eq!(opts(&["NX", "PX", "-1"]), invalid);
        assert_eq!(opts(&["NX", "EX", "9223372036854775807"]), invalid);
        assert_eq!(opts(&["NX", "PX", "9223372036854775807"]), invalid);
    }
}
