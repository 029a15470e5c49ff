//! `LOCK.EXTEND` on every master ([`Acquirer::extend`]): a compare-and-extend with the
//! acquire's padding, validity rule and write deadline, counted only on armed, unquarantined
//! masters, and undone where it took effect if the client is not told "extended". The same
//! operation hands a lock over (`SET key new IFEQ holder PX ms`, [`Acquirer::hand_over`]): the
//! new value on a majority within the validity, or undone where it was written; an extend
//! spelled `SET key holder IFEQ holder PX ms` is the hand-over of a lock to its own holder.
//!
//! Why the deadline and the undo (issue 22, item 2): an extend held up in a paused master's
//! socket buffer runs when the master resumes, even after the proxy gave up on it; and the
//! masters that did extend when the extend as a whole was refused would keep the key for the
//! new TTL. A holder told "not extended" stops at its old lease's end, so a key that lives on
//! only blocks every other client for nothing. With the deadline a late extend writes nothing;
//! the undo sets each extended master's TTL back to what it was when the extend ran (never
//! shorter than the old lease: the holder keeps what it had).

use super::Acquirer;
use crate::cluster::slots::key_slot;
use crate::lease::Granted as Answer;
use crate::lease::{Lease, Outcome, Rollback};
use crate::lock::UNARMED;
use crate::masters::{Ask, LateVotes, Masters};
use crate::on_master::{
    CLUSTER_COMPARE_AND_SET_SCRIPT, CLUSTER_EXTEND_SCRIPT, COMPARE_AND_SET_SCRIPT, EXTEND_SCRIPT,
    RESTORE_SCRIPT, UNEXTEND_SCRIPT,
};
use crate::protocol::{encode_command, Reply};
use crate::redlock::{backend_ttl_ms, quorum, validity_window, Vote};
use bytes::Bytes;
use futures::future::BoxFuture;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::time::Instant;

/// The key's TTL before the extend, if `vote` says this master extended it.
fn extended_from(vote: &Vote) -> Option<i64> {
    match vote {
        Vote::Replied(Reply::Array(items)) => match items.as_slice() {
            [Reply::Integer(1), Reply::Integer(before)] => Some(*before),
            _ => None,
        },
        _ => None,
    }
}

/// How many masters extended.
fn extended(votes: &[Vote]) -> usize {
    votes.iter().filter_map(extended_from).count()
}

/// How many masters answered without extending.
fn refused(votes: &[Vote]) -> usize {
    votes
        .iter()
        .filter(|v| **v != Vote::Pending && extended_from(v).is_none())
        .count()
}

/// What a compare-and-write changes on each master where `from` holds the key.
#[derive(Clone, Copy)]
pub(super) enum Change<'a> {
    /// `LOCK.EXTEND`: the TTL of `from`'s lock ([`EXTEND_SCRIPT`]).
    Extend { from: &'a Bytes },
    /// `SET key to IFEQ from`: the value `to`, with the TTL given or kept
    /// ([`COMPARE_AND_SET_SCRIPT`]; `to` = `from` is an extend).
    HandOver { from: &'a Bytes, to: &'a Bytes },
}

/// [`Acquirer::extend`] and [`Acquirer::hand_over`]: writes `change` on every master that may
/// vote where its holder holds `key`, with `PX = ttl_ms + drift` (`None`: the TTL is kept, and
/// the validity is that of the shortest TTL the masters that wrote had). Granted (`answer`,
/// written only within the validity, undone otherwise) if a majority wrote; else null, or the
/// error a majority gave a hand-over (Redis' `WRONGTYPE`), undone where it took effect.
pub(super) async fn write(
    acquirer: &Acquirer,
    key: &Bytes,
    change: Change<'_>,
    ttl_ms: Option<u64>,
    received_at: Instant,
    answer: Answer,
) -> Outcome {
    let drift_factor = acquirer.policy.drift_factor;
    let px_ms = ttl_ms.map_or(0, |ttl| backend_ttl_ms(ttl, drift_factor));
    if ttl_ms.is_some_and(|ttl| validity_window(ttl, drift_factor).is_none()) {
        return Outcome::Reply(Reply::Null);
    }
    let masters = &acquirer.masters;
    let (votes, answered, late) = fan_out(masters, key, change, px_ms, drift_factor).await;
    for (vote, voter) in votes.iter().zip(masters.voters()) {
        if *vote == Vote::Replied(UNARMED) {
            voter.recheck(key_slot(key));
        }
        if extended_from(vote).is_some() {
            voter.uncovered_write();
        }
    }
    let granted = extended(&votes) >= quorum(votes.len());
    // A kept TTL is as long as the shortest a writing master had (a key without one: the bound).
    let kept = votes
        .iter()
        .filter_map(extended_from)
        .map(|before| u64::try_from(before).unwrap_or(acquirer.policy.max_lock_ttl_ms));
    let lease_ms = ttl_ms.or_else(|| kept.min());
    let window = lease_ms.and_then(|ms| validity_window(ms, drift_factor));
    // An error a majority gave (Redis' `WRONGTYPE`), never a blend of answers.
    let agreed = |error: &&Vote| votes.iter().filter(|v| v == error).count() >= quorum(votes.len());
    let refusal = match (change, votes.iter().find(agreed)) {
        (Change::HandOver { .. }, Some(Vote::Replied(error @ Reply::Error(_)))) => error.clone(),
        _ => Reply::Null,
    };
    let now = Instant::now();
    let undo = Box::new(Unextend {
        masters: masters.clone(),
        key: key.clone(),
        undo: match change {
            Change::Extend { from } => Undo::Extend {
                value: from.clone(),
            },
            Change::HandOver { from, to } => Undo::HandOver {
                from: from.clone(),
                to: to.clone(),
            },
        },
        votes: votes
            .into_iter()
            .zip(answered)
            .map(|(vote, at)| (vote, at.get().copied().unwrap_or(now)))
            .collect(),
        late,
        lives: Duration::from_millis(px_ms.max(lease_ms.unwrap_or(0))),
    });
    let (true, Some(window)) = (granted, window) else {
        // Not written on a majority (or no validity left): the caller must not count on it,
        // and the masters that took it give it back.
        Box::new(*undo).run().await;
        return Outcome::Reply(refusal);
    };
    Outcome::Lease(Lease {
        deadline: received_at + window,
        granted: answer,
        expired: Reply::Null,
        rollback: Some(undo),
    })
}

/// Asks every master that may vote to write `change` (with `PX` `px_ms`, 0 to keep the TTL,
/// and its own write deadline)
/// and collects the votes until a majority extended, or can no longer; also when each answer
/// came (seen here as it comes), for the undo, and the votes still to come.
async fn fan_out(
    masters: &Masters,
    key: &Bytes,
    change: Change<'_>,
    px_ms: u64,
    drift_factor: f64,
) -> (Vec<Vote>, Vec<OnceLock<Instant>>, LateVotes) {
    let px = px_ms.to_string();
    let node_timeout = masters.node_timeout();
    let slot = key_slot(key);
    let sent = Instant::now();
    // Each master's write deadline: the latest its clock can show when the node timeout
    // runs out ([`crate::lock`]'s acquire does the same); a master that may not vote is
    // not asked. A cluster master runs the script's cluster form on the key's slot.
    let ask = |i: usize| {
        let voter = &masters.voters()[i];
        let write_by = voter
            .write_deadline(slot, sent, node_timeout, drift_factor)?
            .to_string();
        let cluster = voter.cluster().is_some();
        let (script, values): (&str, &[&[u8]]) = match (change, cluster) {
            (Change::Extend { from }, false) => (EXTEND_SCRIPT.text(), &[from]),
            (Change::Extend { from }, true) => (CLUSTER_EXTEND_SCRIPT.text(), &[from]),
            (Change::HandOver { from, to }, false) => (COMPARE_AND_SET_SCRIPT.text(), &[from, to]),
            (Change::HandOver { from, to }, true) => {
                (CLUSTER_COMPARE_AND_SET_SCRIPT.text(), &[from, to])
            }
        };
        let [armed, quarantine] = voter.markers(slot);
        let token_key = voter.token_key(key);
        let mut call: Vec<&[u8]> = vec![b"EVAL", script.as_bytes(), b"4", key, &token_key];
        call.extend([armed.as_ref(), quarantine.as_ref()]);
        call.extend(values);
        call.extend([px.as_bytes(), write_by.as_bytes()]);
        Some(Ask::Commands(encode_command(&call)))
    };
    let n = masters.voters().len();
    let q = quorum(n);
    // When each answer came (seen here as it comes), for the undo.
    let answered: Vec<OnceLock<Instant>> = (0..n).map(|_| OnceLock::new()).collect();
    // Decided as soon as a majority extended, or can no longer.
    let decided = |votes: &[Vote]| {
        for (vote, at) in votes.iter().zip(&answered) {
            if *vote != Vote::Pending {
                at.get_or_init(Instant::now);
            }
        }
        extended(votes) >= q || refused(votes) > n - q
    };
    let (votes, late) = masters.fan_out_each(slot, ask, 1, decided).await;
    (votes, answered, late)
}

/// What an undo puts back.
enum Undo {
    /// The TTL of the extended lock ([`UNEXTEND_SCRIPT`]: only ever shortened).
    Extend { value: Bytes },
    /// The holder's value `from` where `to` was written, with the TTL it had
    /// ([`RESTORE_SCRIPT`]).
    HandOver { from: Bytes, to: Bytes },
}

/// The undo of an extend or hand-over: every master that wrote (those that answered after the
/// decision too) gets its TTL, and its holder, back.
struct Unextend {
    masters: Arc<Masters>,
    key: Bytes,
    undo: Undo,
    /// Each master's vote and a moment after its answer came (so after the extend ran there).
    votes: Vec<(Vote, Instant)>,
    late: LateVotes,
    /// The extend's `PX`: how long an undo can matter.
    lives: Duration,
}

impl Unextend {
    /// Waits for the votes still pending (each within its node timeout), then queues the undo
    /// on each master that extended; kept across reconnects until confirmed
    /// ([`crate::transport::Link::send_cleanup`]). The TTL given back is what the key had
    /// when the extend ran, less the time since its answer came: never shorter than the old
    /// lease (the answer came after the extend ran), longer by at most the answer's way back.
    /// A master whose answer never came wrote before its deadline or not at all; if it wrote,
    /// its TTL stays (the key lives longer than the old lease there: availability, not
    /// safety).
    async fn run(mut self: Box<Self>) {
        while let Some((i, vote)) = self.late.next().await {
            self.votes[i] = (vote, Instant::now());
        }
        for ((vote, answered), voter) in self.votes.iter().zip(self.masters.voters()) {
            let Some(before) = extended_from(vote) else {
                continue;
            };
            let since = answered.elapsed().as_millis() as i64;
            // A hand-over's key that had no TTL keeps the one it has now (`0`).
            let before = match (&self.undo, before) {
                (Undo::HandOver { .. }, ..=0) => "0".to_string(),
                (_, ms) => ms.saturating_sub(since).max(1).to_string(),
            };
            let (script, values): (&str, [&[u8]; 2]) = match &self.undo {
                Undo::Extend { value } => (UNEXTEND_SCRIPT.text(), [value, before.as_bytes()]),
                Undo::HandOver { from, to } => (RESTORE_SCRIPT.text(), [to, from]),
            };
            let mut call: Vec<&[u8]> = vec![b"EVAL", script.as_bytes(), b"1", &self.key];
            call.extend(values);
            if let Undo::HandOver { .. } = self.undo {
                call.push(before.as_bytes());
            }
            let payload = encode_command(&call);
            if let Some(server) = voter.server(key_slot(&self.key)) {
                drop(server.link.send_cleanup(payload, self.lives));
            }
        }
    }
}

impl Rollback for Unextend {
    fn run(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(Unextend::run(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redlock::MissingReason;

    #[test]
    fn only_an_extend_that_wrote_counts_and_is_undone() {
        let reply = |r: Reply| Vote::Replied(r);
        let cases = [
            (
                reply(Reply::Array(vec![Reply::Integer(1), Reply::Integer(2500)])),
                Some(2500),
            ),
            (reply(Reply::Integer(0)), None),
            (reply(Reply::Integer(-1)), None),
            (reply(Reply::Integer(-2)), None),
            (reply(Reply::Integer(1)), None),
            (reply(Reply::error("BUSY")), None),
            (Vote::Missing(MissingReason::Timeout), None),
            (Vote::Fenced, None),
            (Vote::Pending, None),
        ];
        for (vote, expected) in cases {
            assert_eq!(extended_from(&vote), expected, "{vote:?}");
        }
    }
}
