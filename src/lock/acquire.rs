//! The Redlock acquire of one attempt, up to its decision ([`decide`]), and the script every
//! master runs for it ([`ACQUIRE_SCRIPT`]).

use super::rollback::{RollbackPlan, COMPARE_AND_DELETE, UNDO_SCRIPT};
use super::Acquirer;
use crate::health::{ARMED_KEY, QUARANTINE_KEY};
use crate::lease::{Lease, Outcome};
use crate::protocol::{encode_command, Reply};
use crate::redlock::{
    acquire_decision, backend_ttl_ms, held_by_majority, majority_unreachable, validity_window,
    AcquireDecision, Vote,
};
use bytes::{Bytes, BytesMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// The acquire on one master. `KEYS` = the lock key, [`ARMED_KEY`], [`QUARANTINE_KEY`], the
/// attempt key ([`attempt_key`]); `ARGV` = the value, `PX`, this attempt's id, the deadline
/// (ms since the epoch, in the master's clock).
/// - Nothing is written after the deadline (`-2`): a write held up in a paused master's socket
///   buffer cannot take effect once the proxy has given up on it, so the clean-up sent after
///   the deadline is final (no phantom holder).
/// - Nothing is written unless the master is armed and not quarantined (`-1`): it lost its
///   data since it was last checked, or a proxy quarantined it. Checked in the same script, so
///   no wipe can fall between the check and the write.
/// - A successful write records the attempt's id beside the lock, with the same `PX`, so the
///   clean-up of a refused attempt deletes only what *that* attempt wrote, never the grant of a
///   later attempt with the same value (redis-py retries with the same token).
pub const ACQUIRE_SCRIPT: &str = "local t = redis.call('time') if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[4]) then return -2 end if redis.call('exists', KEYS[2]) == 0 or redis.call('exists', KEYS[3]) == 1 then return -1 end local ok = redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) if ok then redis.call('set', KEYS[4], ARGV[3], 'PX', ARGV[2]) end return ok";

/// The vote of a master that was unarmed or quarantined at acquire time.
pub const UNARMED: Reply = Reply::Integer(-1);

/// Where an acquire records its attempt id beside `key`.
pub fn attempt_key(key: &[u8]) -> Bytes {
    let mut name = BytesMut::with_capacity(key.len() + 22);
    name.extend_from_slice(b"redlock-proxy:attempt:");
    name.extend_from_slice(key);
    name.freeze()
}

/// Attempt ids, unique across proxies and restarts: `<pid>.<start ns>.<n>`.
pub(super) struct AttemptIds {
    instance: String,
    next: AtomicU64,
}

impl AttemptIds {
    pub(super) fn new() -> AttemptIds {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        AttemptIds {
            instance: format!("{}.{started}", std::process::id()),
            next: AtomicU64::new(0),
        }
    }

    fn next(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{}.{n}", self.instance)
    }
}

/// One client's acquire request: `SET key value NX PX ttl_ms`, read at `received_at`.
pub struct Attempt {
    pub key: Bytes,
    pub value: Bytes,
    pub ttl_ms: u64,
    pub received_at: Instant,
}

/// An acquire whose votes are in.
pub(super) struct Decided {
    /// What the client is told once `undo` (if any) has run.
    outcome: Outcome,
    /// Whether this settles the question for concurrent acquires of the key (granted, held
    /// by a majority, or no majority reachable).
    pub(super) settled: bool,
    /// The rollback a refusal needs before its null may be written.
    undo: Option<RollbackPlan>,
}

impl Decided {
    fn refused(settled: bool, undo: Option<RollbackPlan>) -> Decided {
        Decided {
            outcome: Outcome::Reply(Reply::Null),
            settled,
            undo,
        }
    }

    pub(super) async fn finish(self) -> Outcome {
        if let Some(undo) = self.undo {
            undo.run().await;
        }
        self.outcome
    }
}

/// The Redlock acquire, up to its decision (see [`Decided`]). Safety arguments:
/// - The grant deadline is `received_at + TTL − drift`; `received_at` is when the request was
///   read off the client's socket, which is after the client sent it, so a client counting its
///   TTL from its send time is covered by the masters' `PX = TTL + drift` (docs/SAFETY.md,
///   "Why it holds").
/// - `OK` is returned only with Q `OK` votes; the connection writes it only if the deadline has
///   not passed at write time ([`Lease`]).
/// - On refusal, every master that may hold our value (said `OK`, or its answer is unknown) gets
///   a clean-up of this attempt's write before null is returned ([`RollbackPlan`]).
pub(super) async fn decide(acquirer: &Acquirer, attempt: Attempt) -> Decided {
    let Attempt {
        key,
        value,
        ttl_ms,
        received_at,
    } = attempt;
    let masters = &acquirer.masters;
    let drift_factor = acquirer.policy.drift_factor;
    let Some(window) = validity_window(ttl_ms, drift_factor) else {
        // The drift allowance alone exceeds the TTL: no grant could ever be valid.
        return Decided::refused(false, None);
    };
    let deadline = received_at + window;
    let px_ms = backend_ttl_ms(ttl_ms, drift_factor);
    let px = px_ms.to_string();
    // With quarantine on, the write is the acquire script (markers, deadline, attempt id: see
    // `ACQUIRE_SCRIPT`), called by SHA1 (the health monitor loads it on every master); a master
    // that lost its script cache answers NOSCRIPT and gets the body at once. Each master's
    // deadline is the latest its clock can show when the node timeout runs out, computed as the
    // request leaves (after the fan-out permit).
    let quarantine = masters.quarantine();
    let attempt_id = acquirer.ids.next();
    let attempt_key = attempt_key(&key);
    let deadlines: Vec<AtomicU64> = masters.voters().iter().map(|_| AtomicU64::new(0)).collect();
    let node_timeout = masters.node_timeout();
    let ask = |i: usize| {
        if !quarantine {
            let set = encode_command(&[b"SET".as_ref(), &key, &value, b"NX", b"PX", px.as_bytes()]);
            return Some((set, None));
        }
        let voter = &masters.voters()[i];
        // A master whose vote cannot count is not asked: nothing to clean up there.
        if !voter.eligible() {
            return None;
        }
        let deadline = voter
            .health
            .master_clock_bound(Instant::now() + node_timeout, drift_factor)
            .unwrap_or(0);
        deadlines[i].store(deadline, Ordering::Relaxed);
        let deadline = deadline.to_string();
        let call = |how: &[u8], script: &[u8]| {
            encode_command(&[
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
            call(b"EVALSHA", acquirer.acquire_sha.as_bytes()),
            Some(call(b"EVAL", ACQUIRE_SCRIPT.as_bytes())),
        ))
    };
    let (votes, late) = masters
        .fan_out_each(ask, 1, |v| {
            acquire_decision(v) != AcquireDecision::Undecided
        })
        .await;
    for (voter, vote) in masters.voters().iter().zip(&votes) {
        if *vote == Vote::Replied(UNARMED) {
            voter.health.recheck();
        }
    }
    // Followers queued behind this acquire get the same null when it tells them nothing
    // different would happen now: the key is held, or no majority answered in time (they
    // would wait out the same node timeout, on connections the watchdog is about to abort).
    let settled = held_by_majority(&votes) || majority_unreachable(&votes);
    let undo_payload = if quarantine {
        encode_command(&[
            b"EVAL".as_ref(),
            UNDO_SCRIPT.as_bytes(),
            b"2",
            &key,
            &attempt_key,
            &value,
            attempt_id.as_bytes(),
        ])
    } else {
        encode_command(&[
            b"EVAL".as_ref(),
            COMPARE_AND_DELETE.as_bytes(),
            b"1",
            &key,
            &value,
        ])
    };
    let undo = RollbackPlan {
        masters: masters.clone(),
        drift_factor,
        payload: undo_payload,
        lives: Duration::from_millis(px_ms),
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
    Decided::refused(settled, Some(undo))
}
