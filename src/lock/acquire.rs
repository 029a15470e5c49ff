//! The Redlock acquire of one attempt, up to its decision ([`decide`]), and the script every
//! master runs for it ([`LOCK_SCRIPT`]).

use super::rollback::{RollbackPlan, Undo};
use super::stats::votes_summary;
use super::{AcquireResult, Acquirer};
use crate::admission::{admission_wait, Admitted};
use crate::cluster::keys::{marker_pieces, token_key_pieces};
use crate::cluster::slots::key_slot;
use crate::config::NoQuorumReply;
use crate::error::ProxyError;
use crate::health::instance_name;
use crate::lease::{Granted, Lease, Outcome};
use crate::masters::{Ask, LateVotes, Masters};
use crate::on_master::{script_sha, LOCK_SCRIPT};
use crate::protocol::{encode_command, CallBounds, Reply, ScriptCall};
use crate::redlock::{
    acquire_decision, backend_ttl_ms, held_by_majority, majority_unreachable, may_hold_our_value,
    propose_token, quorum_clock, token_floor, validity_window, AcquireDecision, TokenRules, Vote,
};
use crate::transport::{Floor, SharedScript};
use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::time::Instant;

/// How the links call [`LOCK_SCRIPT`] (`src/on_master/lock.lua`: every merged acquire and
/// release, checked as docs/SAFETY.md argues): by SHA1 (the health monitors load it on every
/// master), each operation passing its lock key alone (the script names the proxy's own keys
/// itself), and `floor` leading the arguments ([`Floor::Witness`]; [`Floor::Off`] only in the
/// negative control of the tests), then the merged acquires' [`CallBounds`].
pub fn lock_script(floor: Floor) -> Arc<SharedScript> {
    Arc::new(SharedScript {
        sha: script_sha(LOCK_SCRIPT.text().as_bytes()),
        body: LOCK_SCRIPT.text(),
        names_in_argv: false,
        floor,
        answers_clock: true,
    })
}

/// The vote of a master that was unarmed or quarantined at acquire time.
pub const UNARMED: Reply = Reply::Integer(-1);

/// This proxy's token proposals.
pub(super) struct Tokens {
    pub(super) rules: TokenRules,
    /// Propose from the masters' clocks (off only in the negative control of the tests:
    /// tokens are then a bare counter, which a master that lost its data lets go backwards).
    pub(super) clock: bool,
    /// The highest token this proxy proposed or saw refused.
    last: AtomicU64,
    /// Names these proposals among all proxies, past and present (see [`Tokens::record`]).
    instance: String,
}

impl Tokens {
    pub(super) fn new(rules: TokenRules, clock: bool) -> Tokens {
        Tokens {
            rules,
            clock,
            last: AtomicU64::new(0),
            instance: instance_name(),
        }
    }

    /// A proposal above `floor` and everything proposed before, at least the masters' clocks.
    pub(super) fn propose(&self, masters: &Masters, floor: u64) -> u64 {
        // Read once, not on every compare-and-swap retry: each estimate locks that master's
        // health record.
        let clock = if self.clock {
            let now = Instant::now();
            let mut clocks: Vec<u64> = (masters.voters().iter())
                .filter_map(|v| v.clock_estimate_us(now))
                .collect();
            quorum_clock(&mut clocks, masters.voters().len())
        } else {
            None
        };
        let mut token = 0;
        let _ = self
            .last
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
                token = propose_token(clock, last.max(floor));
                Some(token)
            });
        token
    }

    /// Later proposals go above `seen` (a token a master refused at that counter or clock).
    pub(super) fn raise_floor(&self, seen: u64) {
        self.last.fetch_max(seen, Ordering::Relaxed);
    }

    /// The counter record of an attempt with `token`: `<token, 16 digits>:<instance>`. It
    /// names the attempt: this proxy proposes every token once ([`Tokens::propose`] only goes
    /// up), and no other proxy has the same instance.
    pub(super) fn record(&self, token: u64) -> Record {
        let mut record = Record {
            bytes: [b'0'; RECORD_MAX],
            len: 0,
        };
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(token).as_bytes();
        // Zero-padded to 16 digits, as `{token:016}` (a token is µs since the epoch: 16 digits
        // until the year 2286).
        let start = 16usize.saturating_sub(digits.len());
        let end = start + digits.len();
        record.bytes[start..end].copy_from_slice(digits);
        record.bytes[end] = b':';
        record.bytes[end + 1..end + 1 + self.instance.len()]
            .copy_from_slice(self.instance.as_bytes());
        record.len = end + 1 + self.instance.len();
        record
    }

    /// The master clocks (ms) at which a master may accept `token` (any, with the clock off).
    pub(super) fn accepted_clocks_ms(&self, token: u64) -> (u64, u64) {
        if self.clock {
            self.rules.accepted_clocks_ms(token)
        } else {
            (0, u64::MAX)
        }
    }
}

/// The longest record: a 20-digit token, `:`, and an instance name (at most 42 bytes).
const RECORD_MAX: usize = 64;

/// A counter record ([`Tokens::record`]), kept inline: built for every acquire, it costs no
/// allocation.
#[derive(Clone, Copy)]
pub(super) struct Record {
    bytes: [u8; RECORD_MAX],
    len: usize,
}

impl Record {
    pub(super) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// One client's acquire request: `SET key value NX PX ttl_ms` (or `LOCK.ACQUIRE`), read at
/// `received_at`.
pub struct Attempt {
    pub key: Bytes,
    pub value: Bytes,
    pub ttl_ms: u64,
    pub received_at: Instant,
    /// Answer `[token, validity_ms]` instead of `OK`.
    pub with_token: bool,
}

impl Attempt {
    /// The acquire of `key` for `value` with `ttl_ms`, its validity counted from
    /// `received_at`; answering `[token, validity_ms]` if `with_token`.
    pub fn new(
        key: Bytes,
        value: Bytes,
        ttl_ms: u64,
        received_at: Instant,
        with_token: bool,
    ) -> Self {
        Attempt {
            key,
            value,
            ttl_ms,
            received_at,
            with_token,
        }
    }
}

/// An acquire whose votes are in.
pub(super) struct Decided {
    /// What the client is told once `undo` (if any) has run.
    outcome: Outcome,
    /// Whether this settles the question for concurrent acquires of the key (granted, held
    /// by a majority, or no majority reachable).
    pub(super) settled: bool,
    /// How it ended, for the metrics.
    pub(super) result: AcquireResult,
    /// The rollback a refusal needs before its null may be written.
    /// Boxed: it is most of an acquire's result, which moves several times on its way out.
    undo: Option<Box<RollbackPlan>>,
}

impl Decided {
    fn outcome_is_refusal(&self) -> bool {
        matches!(self.outcome, Outcome::Reply(Reply::Null))
    }

    fn refused(settled: bool, result: AcquireResult, undo: Option<Box<RollbackPlan>>) -> Decided {
        Decided {
            outcome: Outcome::Reply(Reply::Null),
            settled,
            result,
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
    // Right after start, a refusal would only say "not looked at yet", which a client reads
    // as "held by someone": the acquire waits for the first judgement (at most a node
    // timeout), else it is told why with an error.
    let masters = &acquirer.masters;
    if !masters.started() && !masters.wait_started(masters.node_timeout()).await {
        acquirer
            .stats
            .record(AcquireResult::NoQuorum, attempt.received_at);
        return Decided {
            outcome: Outcome::Reply(ProxyError::Starting.into()),
            settled: false,
            result: AcquireResult::NoQuorum,
            undo: None,
        };
    }
    // Admission (issue 38): an acquire waits its turn among the fan-outs in progress, but not
    // so long that its lease would be mostly spent (or expired: a null the client would read as
    // "held") by the time it is asked: past its bound it asks no master and is told to retry.
    let by = attempt.received_at + admission_wait(Duration::from_millis(attempt.ttl_ms));
    let Some(admitted) = masters.admission.admit_by(by).await else {
        acquirer
            .stats
            .record(AcquireResult::Overloaded, attempt.received_at);
        return Decided {
            outcome: Outcome::Reply(ProxyError::Overloaded(masters.admission.limit()).into()),
            settled: false,
            result: AcquireResult::Overloaded,
            undo: None,
        };
    };
    let token = acquirer.tokens.propose(&acquirer.masters, 0);
    let (decided, floor) = decide_once(acquirer, &attempt, token, &admitted).await;
    let mut decided = retry_above_floor(acquirer, &attempt, decided, floor, &admitted).await;
    drop(admitted);
    acquirer.stats.record(decided.result, attempt.received_at);
    // A refusal is told by its own votes: why they were missing, not how many masters are
    // usable (all of them can be, when they are merely slow).
    acquirer
        .stats
        .note_quorum(decided.result, || match &decided.undo {
            Some(plan) => votes_summary(&plan.votes),
            None => masters.usable_summary(),
        });
    if decided.result == AcquireResult::NoQuorum && acquirer.no_quorum_reply == NoQuorumReply::Error
    {
        let refusal = ProxyError::AcquireNoQuorum(masters.usable_summary());
        decided.outcome = Outcome::Reply(refusal.into());
    }
    decided
}

/// The retry of an acquire whose token a master refused, if it needs one.
async fn retry_above_floor(
    acquirer: &Acquirer,
    attempt: &Attempt,
    decided: Decided,
    floor: Option<u64>,
    admitted: &Admitted<'_>,
) -> Decided {
    // A master refused the token (another proxy granted the key with a higher one a moment
    // ago, or this proxy's reading of a master's clock is off): once more above what it
    // reported, after the clean-up of this attempt (its writes would block the retry).
    match floor {
        Some(floor) if !decided.settled && decided.outcome_is_refusal() => {
            if let Some(undo) = decided.undo {
                undo.run().await;
            }
            let token = acquirer.tokens.propose(&acquirer.masters, floor);
            // Boxed: a retry is rare, and inline its state would double the size of every
            // acquire's future (copied as it moves).
            Box::pin(decide_once(acquirer, attempt, token, admitted))
                .await
                .0
        }
        _ => decided,
    }
}

/// One round of the acquire with `token`: encode the request, fan it out, tally the votes.
/// Also the floor a retry must propose above, if some master refused the token.
async fn decide_once(
    acquirer: &Acquirer,
    attempt: &Attempt,
    token: u64,
    admitted: &Admitted<'_>,
) -> (Decided, Option<u64>) {
    let Some(request) = Request::encode(acquirer, attempt, token) else {
        // The drift allowance alone exceeds the TTL: no grant could ever be valid.
        return (Decided::refused(false, AcquireResult::Expired, None), None);
    };
    let ballot = fan_out(acquirer, &request, admitted).await;
    tally(acquirer, attempt, request, ballot)
}

/// What one round asks every master, encoded once: only each master's write deadline
/// differs, and it is set as the request leaves ([`fan_out`]).
struct Request {
    token: u64,
    /// The grant deadline: `received_at + TTL − drift`.
    deadline: Instant,
    /// The `PX` every master's write gets (TTL + drift).
    px_ms: u64,
    /// The operation itself: the acquire operation of [`LOCK_SCRIPT`], or a bare `SET`.
    operation: Operation,
    /// The key's slot (on a cluster master, the node that votes).
    slot: u16,
    /// This attempt's record in the key's token counter.
    record: Record,
    /// The latest master clock (ms) at which a master may take the token.
    latest: u64,
}

/// How the acquire writes on a master.
enum Operation {
    /// With quarantine on: an acquire operation of [`LOCK_SCRIPT`] (markers, deadline,
    /// token), whose number is the master's write deadline, where some master is a single
    /// server; and its form for cluster masters (its slot's markers, the token counter in the
    /// key's slot), where some master is one.
    Script {
        single: Option<ScriptCall>,
        cluster: Option<ScriptCall>,
    },
    /// With quarantine off (tests only): `SET key value NX PX`, which carries no token.
    Set(Bytes),
}

impl Request {
    /// The request of `attempt` with `token`; `None` if no grant could be valid (the drift
    /// allowance alone exceeds the TTL).
    fn encode(acquirer: &Acquirer, attempt: &Attempt, token: u64) -> Option<Request> {
        let Attempt { key, value, .. } = attempt;
        let drift_factor = acquirer.policy.drift_factor;
        let window = validity_window(attempt.ttl_ms, drift_factor)?;
        let px_ms = backend_ttl_ms(attempt.ttl_ms, drift_factor);
        let mut px = itoa::Buffer::new();
        let px = px.format(px_ms).as_bytes();
        // With quarantine on, the write is an acquire operation of `LOCK_SCRIPT` (markers,
        // deadline, token), merged by the link with the operations queued beside it and called
        // by SHA1 (the health monitor loads it on every master); a master that lost its script
        // cache answers NOSCRIPT and the link sends the body at once.
        // The record starts with the token (16 digits), which the script compares.
        let record = acquirer.tokens.record(token);
        let (earliest, latest) = acquirer.tokens.accepted_clocks_ms(token);
        let bounds = CallBounds {
            deadline: 0,
            earliest,
            counter_life: acquirer.tokens.rules.counter_life_ms.max(px_ms),
        };
        let slot = key_slot(key);
        // Encoded once per kind of master: only the deadline differs from master to master.
        let call = |keys: &[&[&[u8]]]| {
            ScriptCall::with_bounds(keys, &[record.as_bytes(), value, px], bounds)
        };
        let masters = &acquirer.masters;
        let operation = match masters.quarantine() {
            true => Operation::Script {
                single: masters.any_single().then(|| call(&[&[key]])),
                // Each operation names its slot's markers (as `cluster::keys` names them, from
                // their pieces): a node merges calls of all its slots.
                cluster: masters.any_cluster().then(|| {
                    let [armed, quarantine] = marker_pieces(slot);
                    call(&[&armed, &quarantine, &[key], &token_key_pieces(slot, key)])
                }),
            },
            false => Operation::Set(encode_command(&[
                b"SET".as_ref(),
                key,
                value,
                b"NX",
                b"PX",
                px,
            ])),
        };
        Some(Request {
            token,
            deadline: attempt.received_at + window,
            px_ms,
            operation,
            slot,
            record,
            latest,
        })
    }
}

/// A round's votes at the decision, those still to come, and each master's write deadline as
/// sent (0: not sent).
struct Ballot {
    votes: Vec<Vote>,
    late: LateVotes,
    deadlines: Vec<u64>,
}

/// Sends every master its request, and collects the votes until the acquire is decided.
async fn fan_out(acquirer: &Acquirer, request: &Request, admitted: &Admitted<'_>) -> Ballot {
    let masters = &acquirer.masters;
    let drift_factor = acquirer.policy.drift_factor;
    let deadlines: Vec<AtomicU64> = masters.voters().iter().map(|_| AtomicU64::new(0)).collect();
    let node_timeout = masters.node_timeout();
    let sent_at = OnceLock::new();
    let ask = |i: usize| {
        let voter = &masters.voters()[i];
        let (single, cluster) = match &request.operation {
            Operation::Set(set) => return Some(Ask::Commands(set.clone())),
            Operation::Script { single, cluster } => (single, cluster),
        };
        // Each master's deadline is the latest its clock can show when the node timeout runs
        // out, computed as the request leaves (after the fan-out permit). One clock read for
        // the whole fan-out, at its first request: the requests leave microseconds apart, and
        // a deadline a little earlier than its own request's is only stricter on the master.
        let sent = *sent_at.get_or_init(Instant::now);
        // A master whose vote cannot count is not asked: nothing to clean up there. The
        // write's deadline is also the latest clock at which the master may take the token:
        // one comparison in the script checks both.
        let deadline = voter
            .write_deadline(request.slot, sent, node_timeout, drift_factor)?
            .min(request.latest);
        deadlines[i].store(deadline, Ordering::Relaxed);
        let (script, call) = match voter.cluster() {
            None => (acquirer.script.clone(), single.as_ref()?),
            Some(c) => (c.lock_script(), cluster.as_ref()?),
        };
        Some(Ask::Script(script, call.with_deadline(deadline)))
    };
    let (votes, late) = masters
        .fan_out_admitted(admitted, request.slot, ask, 1, |v| {
            acquire_decision(v) != AcquireDecision::Undecided
        })
        .await;
    Ballot {
        votes,
        late,
        // Collected in place: the same allocation.
        deadlines: deadlines.into_iter().map(AtomicU64::into_inner).collect(),
    }
}

/// The decision on a round's votes: a lease if a quorum took the key before the grant
/// deadline, else a refusal with the clean-up of what it may have written; also the floor a
/// retry must propose above, if some master refused the token.
fn tally(
    acquirer: &Acquirer,
    attempt: &Attempt,
    request: Request,
    ballot: Ballot,
) -> (Decided, Option<u64>) {
    let masters = &acquirer.masters;
    let Ballot {
        votes,
        mut late,
        deadlines,
    } = ballot;
    for (voter, vote) in masters.voters().iter().zip(&votes) {
        if *vote == Vote::Replied(UNARMED) {
            voter.recheck(request.slot);
        }
        voter.stats.count_acquire_vote(vote, false);
    }
    late.count_acquire_votes(request.slot);
    let held = held_by_majority(&votes);
    let unreachable = majority_unreachable(&votes);
    let floor = token_floor(&votes);
    let quorum = acquire_decision(&votes) == AcquireDecision::Quorum;
    let quarantine = matches!(request.operation, Operation::Script { .. });
    let undo = Box::new(RollbackPlan {
        masters: masters.clone(),
        drift_factor: acquirer.policy.drift_factor,
        undo: Undo::Lock {
            key: attempt.key.clone(),
            value: attempt.value.clone(),
            record: quarantine.then_some(request.record),
        },
        lives: Duration::from_millis(request.px_ms),
        stats: acquirer.stats.clone(),
        votes,
        late,
        deadlines,
        took: may_hold_our_value,
    });
    if quorum && Instant::now() < request.deadline {
        tracing::trace!(key = ?attempt.key, token = request.token, "granted");
        // Without quarantine (tests only) the acquire is a bare `SET`, which carries no token.
        let token = if quarantine { request.token } else { 0 };
        return (
            granted(request.deadline, token, attempt.with_token, undo),
            None,
        );
    }
    let result = refusal(held, unreachable, quorum);
    // Followers queued behind this acquire get the same null when it tells them nothing
    // different would happen now: the key is held, or no majority answered in time (they
    // would wait out the same node timeout on the same connections).
    let settled = held || unreachable;
    (Decided::refused(settled, result, Some(undo)), floor)
}

/// How a round that granted nothing ended, for the metrics: the key held by a majority, no
/// majority reachable, a quorum too late, or refused otherwise.
fn refusal(held: bool, unreachable: bool, quorum: bool) -> AcquireResult {
    if held {
        AcquireResult::Contended
    } else if unreachable {
        AcquireResult::NoQuorum
    } else if quorum {
        AcquireResult::Expired
    } else {
        AcquireResult::Refused
    }
}

/// A grant: a lease until `deadline` of `OK`, or of `[token, validity]` (`with_token`), whose
/// rollback is `undo` if the client is not told in time.
fn granted(deadline: Instant, token: u64, with_token: bool, undo: Box<RollbackPlan>) -> Decided {
    let lease = Lease {
        deadline,
        granted: if with_token {
            Granted::TokenAndValidity(token)
        } else {
            Granted::Reply(Reply::ok())
        },
        expired: Reply::Null,
        rollback: Some(undo),
    };
    Decided {
        outcome: Outcome::Lease(lease),
        settled: true,
        result: AcquireResult::Granted,
        undo: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_the_token_in_16_digits_then_the_instance() {
        let tokens = Tokens::new(TokenRules::for_lease_bound(Duration::from_secs(60)), true);
        let longest = "ffffffff.ffffffffffffffff.ffffffffffffffff";
        for instance in [tokens.instance.clone(), longest.to_string()] {
            let tokens = Tokens {
                instance: instance.clone(),
                ..Tokens::new(tokens.rules, true)
            };
            for token in [0, 7, 1_795_459_899_610_560, 9_999_999_999_999_999, u64::MAX] {
                assert_eq!(
                    tokens.record(token).as_bytes(),
                    format!("{token:016}:{instance}").as_bytes(),
                    "{token}"
                );
            }
        }
    }
}
