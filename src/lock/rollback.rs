//! The clean-up of a refused (or ungiven) acquire on every master that may hold its write
//! ([`RollbackPlan`]), and the scripts it runs there: a `SET NX` acquire's lock, or the count a
//! hash-lock acquire (Redisson's script, run as a lock operation) gave its field
//! ([`HashGrant`]).

use super::acquire::Record;
use super::LockStats;
use crate::cluster::keys::token_key_on;
use crate::cluster::slots::key_slot;
use crate::lease::Rollback;
use crate::masters::{Ask, Forms, LateVotes, Masters};
use crate::on_master::{COMPARE_AND_DELETE, UNDO_HASH_SCRIPT, UNDO_SCRIPT};
use crate::protocol::encode_command;
use crate::protocol::Reply;
use crate::redlock::Vote;
use bytes::Bytes;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

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
    /// sent, when the acquire goes out as the marker script) and whether the vote `took` the
    /// lock or may have (its answer unknown).
    fn for_vote(
        vote: &Vote,
        deadline: u64,
        sent_as_script: bool,
        took: fn(&Vote) -> bool,
    ) -> UndoStep {
        match vote {
            _ if !took(vote) => UndoStep::Skip,
            Vote::Replied(_) => UndoStep::Now,
            _ if sent_as_script && deadline == 0 => UndoStep::Skip,
            _ => UndoStep::AfterDeadline(deadline),
        }
    }
}

/// What one attempt wrote, to undo it.
pub(super) enum Undo {
    /// A `SET NX` acquire's lock: `value` at `key`.
    Lock {
        key: Bytes,
        value: Bytes,
        /// The attempt's record in the key's token counter; `None` when quarantine is off
        /// (the acquire is a bare `SET`).
        record: Option<Record>,
    },
    /// One count of `field` in the hash `key`, where the key's counter still names the run's
    /// `record` (its token offer) ([`UNDO_HASH_SCRIPT`]); then, if no majority holds the key,
    /// Redisson's unlock message on `channel` ([`wake_waiters_if_free`]).
    Hash {
        key: Bytes,
        field: Bytes,
        record: Bytes,
        channel: Bytes,
    },
}

impl Undo {
    /// The slot of the key it undoes (on a cluster master, the node that holds the write).
    fn slot(&self) -> u16 {
        match self {
            Undo::Lock { key, .. } | Undo::Hash { key, .. } => key_slot(key),
        }
    }

    /// The clean-up: deletes the lock only if this attempt wrote it ([`UNDO_SCRIPT`]), or takes
    /// back the count it gave a hash's field ([`UNDO_HASH_SCRIPT`]). Encoded only when a
    /// clean-up is sent (most acquires need none). On a cluster master (`cluster`) the token
    /// counter is the one in the key's slot.
    fn payload(&self, cluster: bool) -> Bytes {
        let eval = b"EVAL".as_ref();
        let token_key = |key: &[u8]| token_key_on(cluster, key);
        match self {
            Undo::Lock {
                key,
                value,
                record: Some(record),
            } => {
                let script = UNDO_SCRIPT.text().as_bytes();
                let counter = token_key(key);
                encode_command(&[eval, script, b"2", key, &counter, value, record.as_bytes()])
            }
            Undo::Lock {
                key,
                value,
                record: None,
            } => encode_command(&[eval, COMPARE_AND_DELETE.text().as_bytes(), b"1", key, value]),
            Undo::Hash {
                key, field, record, ..
            } => {
                let script = UNDO_HASH_SCRIPT.text().as_bytes();
                encode_command(&[eval, script, b"2", key, &token_key(key), field, record])
            }
        }
    }
}

/// A hash-lock acquire run by a client's script on every master (docs/SAFETY.md, "Hash locks
/// (Redisson)"), to roll back where it may have taken the lock ([`crate::lock::Acquirer::hash_rollback`]).
pub struct HashGrant {
    pub key: Bytes,
    /// The holder's field (`<uuid>:<threadId>`).
    pub field: Bytes,
    /// The run's token offer record (the prelude wrote it into the key's counter where the
    /// run created the hash).
    pub record: Bytes,
    /// Where Redisson's waiters for the lock wait for its unlock message.
    pub channel: Bytes,
    /// The `PX` the masters set: how long a write it undoes can live.
    pub lives: Duration,
    /// The votes at the decision, those still to come, and each master's deadline as sent
    /// (0: not asked).
    pub votes: Vec<Vote>,
    pub late: LateVotes,
    pub deadlines: Vec<u64>,
    /// Whether a master's vote took the lock, or may have (its answer unknown).
    pub took: fn(&Vote) -> bool,
}

/// Where and how to undo a refused acquire.
pub(super) struct RollbackPlan {
    pub(super) masters: Arc<Masters>,
    pub(super) drift_factor: f64,
    pub(super) undo: Undo,
    /// The `PX` the acquire sent: how long a write it undoes can live.
    pub(super) lives: Duration,
    /// The votes at the decision, and those that were still pending then.
    pub(super) votes: Vec<Vote>,
    pub(super) late: LateVotes,
    /// Each master's deadline, as sent.
    pub(super) deadlines: Vec<u64>,
    /// Whether a vote took the lock or may have ([`crate::redlock::may_hold_our_value`] for
    /// `SET NX`).
    pub(super) took: fn(&Vote) -> bool,
    /// Counts rollbacks and late clean-ups.
    pub(super) stats: Arc<LockStats>,
}

impl RollbackPlan {
    /// Queues the clean-up on every master that may hold the value and waits (briefly) for the
    /// confirmation of those that said `OK`. Safety: the clean-up deletes only what this
    /// attempt wrote (its counter record), so however late it runs it never deletes a later grant,
    /// even one with the same value. Liveness (no phantom holder): votes still pending are
    /// awaited first (each within its node timeout); where the answer never came, the clean-up
    /// is sent again once the master's clock is past the write's deadline, after which the
    /// write can no longer take effect. Each is kept across reconnects until a master confirms
    /// it ([`crate::transport::Link::send_cleanup`]).
    pub(super) async fn run(mut self: Box<Self>) {
        while let Some((i, vote)) = self.late.next().await {
            self.votes[i] = vote;
        }
        let script = self.masters.quarantine();
        let steps: Vec<UndoStep> = self
            .votes
            .iter()
            .zip(&self.deadlines)
            .map(|(vote, deadline)| UndoStep::for_vote(vote, *deadline, script, self.took))
            .collect();
        // Counted only if some master may hold the value (a plain refusal has nothing to undo).
        if steps.iter().all(|step| *step == UndoStep::Skip) {
            return;
        }
        self.stats.rollbacks.inc();
        let payload = Forms::new(&self.masters, |cluster| self.undo.payload(cluster));
        let node_timeout = self.masters.node_timeout();
        self.send_after_deadlines(&steps, &payload, node_timeout);
        // The null waits for the confirmations (so a read right after it sees the value gone),
        // but at most half a node timeout: a master that stalls right after its `OK` must not
        // delay the refusal by another node timeout. Its clean-up stays queued regardless, and
        // is kept until confirmed.
        let confirm_for = node_timeout / 2;
        let slot = self.undo.slot();
        let waits: Vec<_> = self
            .masters
            .voters()
            .iter()
            .zip(&steps)
            .filter(|(_, step)| **step != UndoStep::Skip)
            .filter_map(|(voter, step)| {
                let server = voter.server(slot)?;
                let sent = server
                    .link
                    .send_cleanup(payload.for_voter(voter), self.lives);
                let wait = *step == UndoStep::Now;
                Some(async move {
                    if wait {
                        let _ = sent.wait_at_most(confirm_for).await;
                    }
                })
            })
            .collect();
        futures::future::join_all(waits).await;
        if let Undo::Hash { key, channel, .. } = self.undo {
            tokio::spawn(wake_waiters_if_free(self.masters, slot, key, channel));
        }
    }

    /// Where the answer never came, the write may still run until its deadline: the clean-up
    /// goes out now (it deletes only this attempt's write, so it is harmless if it runs
    /// first) and once more when the master's clock is surely past the deadline, when it is
    /// final. The second one runs on its own, bounded by the deadline: the refusal does not
    /// wait for it. This schedules those second ones (at most two node timeouts from now).
    fn send_after_deadlines(&self, steps: &[UndoStep], payload: &Forms, node_timeout: Duration) {
        let slot = self.undo.slot();
        for (voter, step) in self.masters.voters().iter().zip(steps) {
            let UndoStep::AfterDeadline(deadline) = *step else {
                continue;
            };
            let Some(server) = voter.server(slot) else {
                continue;
            };
            let Some(at) = server.health.surely_past(deadline, self.drift_factor) else {
                continue;
            };
            let at = at.min(Instant::now() + 2 * node_timeout);
            let (link, payload, lives) = (server.link, payload.for_voter(voter), self.lives);
            let late_cleanups = self.stats.late_cleanups.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                late_cleanups.inc();
                drop(link.send_cleanup(payload, lives));
            });
        }
    }
}

/// Whether a majority holds a key, from the masters' `EXISTS` so far: `Some` once known (a
/// master that cannot answer counts as not holding it: only a majority's `1` stops the wake).
fn held_by_a_majority(votes: &[Vote], quorum: usize) -> Option<bool> {
    let held = |v: &&Vote| matches!(v, Vote::Replied(Reply::Integer(1)));
    let pending = |v: &&Vote| matches!(v, Vote::Pending);
    let (held, pending) = (
        votes.iter().filter(held).count(),
        votes.iter().filter(pending).count(),
    );
    if held >= quorum {
        Some(true)
    } else if held + pending < quorum {
        Some(false)
    } else {
        None
    }
}

/// After a hash-lock attempt was rolled back: if no majority of the masters holds `key` (of
/// `slot`), the roll-back may have freed a lock that waiters were refused by (two acquires
/// that split the masters are both refused, each with a PTTL read from the other's write), and
/// on one Redis nobody would publish for it: Redisson's unlock message (`0`) goes out on the
/// lock's `channel` through every master, as an unlock's does (as Redisson's own
/// `RedissonRedLock` publishes when it unlocks a partial grant). While a majority holds it (a
/// holder whose lock a minority lacks, where a waiter's attempt is granted and rolled back),
/// nothing: its waiters wait for its unlock instead of polling at each other's roll-backs. Of
/// two split attempts, each rolled back before it looks, the one that looks last sees no
/// majority: its undos were confirmed or went first on each connection, and the other's were
/// confirmed before that one looked (docs/SAFETY.md, "Hash locks (Redisson)").
async fn wake_waiters_if_free(masters: Arc<Masters>, slot: u16, key: Bytes, channel: Bytes) {
    let quorum = masters.quorum();
    let exists = encode_command(&[b"EXISTS".as_slice(), &key]);
    let ask = |_| Some(Ask::Commands(exists.clone()));
    let decided = |votes: &[Vote]| held_by_a_majority(votes, quorum).is_some();
    let (votes, _) = masters.fan_out_each(slot, ask, 1, decided).await;
    if held_by_a_majority(&votes, quorum) != Some(false) {
        return;
    }
    let publish = encode_command(&[b"PUBLISH".as_slice(), &channel, b"0"]);
    let ask = |_| Some(Ask::Commands(publish.clone()));
    masters.fan_out_each(slot, ask, 1, |_| false).await;
}

impl Rollback for RollbackPlan {
    fn run(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(RollbackPlan::run(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redlock::may_hold_our_value;
    use crate::redlock::MissingReason;

    #[test]
    fn the_waiters_are_woken_unless_a_majority_holds_the_key() {
        let (one, zero) = (
            Vote::Replied(Reply::Integer(1)),
            Vote::Replied(Reply::Integer(0)),
        );
        let (pending, missing) = (Vote::Pending, Vote::Missing(MissingReason::Timeout));
        let cases = [
            (vec![&one, &one, &one, &zero, &zero], Some(true)),
            (vec![&one, &one, &zero, &zero, &zero], Some(false)),
            (vec![&one, &one, &pending, &zero, &zero], None),
            (vec![&one, &one, &missing, &zero, &pending], None),
            (vec![&one, &one, &missing, &zero, &zero], Some(false)),
            (vec![&one, &pending, &pending, &zero, &zero], None),
            (vec![&zero, &zero, &zero, &pending, &pending], Some(false)),
            (vec![&one, &Vote::Fenced, &zero], Some(false)),
            (vec![&one, &one, &pending], Some(true)),
        ];
        for (votes, held) in cases {
            let votes: Vec<Vote> = votes.into_iter().cloned().collect();
            let quorum = votes.len() / 2 + 1;
            assert_eq!(held_by_a_majority(&votes, quorum), held, "{votes:?}");
        }
    }

    #[test]
    fn undo_steps_per_vote() {
        let missing = Vote::Missing(MissingReason::Timeout);
        let cases = [
            (Vote::Replied(Reply::ok()), 7, true, UndoStep::Now),
            (Vote::Replied(Reply::Null), 7, true, UndoStep::Skip),
            (Vote::Replied(Reply::Integer(-1)), 7, true, UndoStep::Skip),
            (missing.clone(), 7, true, UndoStep::AfterDeadline(7)),
            // Not sent (ineligible): nothing can have been written.
            (missing.clone(), 0, true, UndoStep::Skip),
            // A plain SET carries no deadline: undone after the node timeout bound.
            (missing, 0, false, UndoStep::AfterDeadline(0)),
            (Vote::Pending, 9, true, UndoStep::AfterDeadline(9)),
        ];
        for (vote, deadline, script, step) in cases {
            assert_eq!(
                UndoStep::for_vote(&vote, deadline, script, may_hold_our_value),
                step,
                "{vote:?}"
            );
        }
    }
}
