//! Redisson's lock acquires, run as hash-lock acquires (docs/SAFETY.md, "Hash locks
//! (Redisson)"): the client's script (or, for `RFencedLock`, Redisson's `RLock` acquire of the
//! same key) runs on every master as any guarded script, but its null ("acquired") is answered
//! only when a majority gave it within the lease's validity, its refusals answer what a
//! majority holds, and a grant that is not given to the client is rolled back where it may
//! have been taken ([`crate::lock::Acquirer::hash_rollback`]). `RFencedLock`'s token is the
//! proxy's fencing token of the grant.

use super::{clients_sha, lease_ttl, Ballot, MasterCall};
use crate::auth::KeyPatterns;
use crate::commands::{Action, Ctx, Session};
use crate::error::ProxyError;
use crate::lease::{Granted, Lease, Outcome, Rollback};
use crate::lease_script::{unlock_channel, KnownLock, REDISSON_ACQUIRES};
use crate::lock::guard::{script_vote, script_votes, Tally, CAPPED_NO_EXPIRY, CAPPED_TTL};
use crate::lock::{Acquirer, HashGrant};
use crate::masters::{slot_of, Masters};
use crate::protocol::Reply;
use crate::redlock::{
    backend_ttl_ms, grant_decision, held_pttl, merge, no_quorum, quorum, validity_window,
    AcquireDecision, MergeRule, Policy, Vote,
};
use crate::script_cache::Script;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How the client reads the acquire's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// `RLock`'s: null acquired, the PTTL held.
    Plain,
    /// `RFencedLock`'s token acquire: `{-1, token}` acquired, `{pttl, -1}` held.
    Fenced,
}

/// A masters' answer that took the lock: the acquire's null.
fn took(reply: &Reply) -> bool {
    *reply == Reply::Null
}

/// Whether a master's `[script reply, guard reply]` vote took the lock, or may have (its answer
/// unknown, or its guard found it unarmed): the roll-back's targets.
fn may_have_taken(vote: &Vote) -> bool {
    match vote {
        Vote::Replied(_) => match script_vote(vote).0 {
            Vote::Replied(reply) => took(&reply),
            _ => true,
        },
        _ => true,
    }
}

/// Redisson's acquire `known` as a hash-lock acquire, if the call has its layout (`KEYS[1]` the
/// lock, `KEYS[2]` `RFencedLock`'s counter, `ARGV[1]` the lease, `ARGV[2]` the field); `None`
/// leaves it to the general path.
pub(super) fn acquire(
    ctx: &Ctx<'_>,
    session: &Session,
    script: &Script,
    args: &[Bytes],
    numkeys: usize,
    known: KnownLock,
) -> Option<Action> {
    let (shape, keys) = match known {
        KnownLock::RedissonAcquire => (Shape::Plain, 1),
        KnownLock::RedissonFencedAcquire => (Shape::Fenced, 2),
        KnownLock::RedissonFencedLockAcquire => (Shape::Plain, 2),
        _ => return None,
    };
    if numkeys != keys || args.len() != 3 + keys + 2 {
        return None;
    }
    let client_body = script.body.clone();
    let script = match known {
        KnownLock::RedissonAcquire => script.clone(),
        // The counter's `INCR` gives no order through N masters (SAFETY.md): `RLock`'s acquire
        // of the same key runs instead, and a grant answers the proxy's token.
        _ => ctx
            .shared
            .scripts
            .remember(Bytes::from_static(REDISSON_ACQUIRES[0].as_bytes())),
    };
    let call_args = call_args(args, keys);
    let policy = ctx.shared.policy;
    let ttl_ms = lease_ttl(&script, &call_args, 1);
    if let Some(Err(err)) = ttl_ms.map(|ms| policy.check_ttl(ms)) {
        return Some(Action::error(err));
    }
    let acquirer = ctx.shard.acquirer.clone();
    let no_keys = KeyPatterns::Some(Vec::new());
    let patterns = session.user.as_ref().map_or(&no_keys, |user| &user.keys);
    let call = MasterCall::new(&script, call_args, 1, patterns, &acquirer, &policy, false);
    let run = Run {
        masters: ctx.masters(),
        acquirer,
        policy,
        key: args[3].clone(),
        field: args[4 + keys].clone(),
        // A lease the recogniser did not read (not a whole number) lives at most the bound.
        lives: ttl_ms.map_or(policy.lease_bound(), |ms| {
            Duration::from_millis(backend_ttl_ms(ms, policy.drift_factor))
        }),
        received_at: ctx.received_at,
        shape,
        checked: script.checked.clone(),
        client_body,
    };
    Some(Action::Defer(Box::pin(run.run(call))))
}

/// The masters' call of a Redisson acquire whose `KEYS` are `keys` long: `<EVAL…> <body> 1 key
/// lease field` (the lock's key alone: `RFencedLock`'s counter is not written; [`MasterCall`]
/// sets the first two words).
fn call_args(args: &[Bytes], keys: usize) -> Vec<Bytes> {
    let (key, lease, field) = (&args[3], &args[3 + keys], &args[4 + keys]);
    [
        &args[0],
        &args[1],
        &Bytes::from_static(b"1"),
        key,
        lease,
        field,
    ]
    .map(Bytes::clone)
    .to_vec()
}

/// One hash-lock acquire on the masters, and what it needs to answer.
struct Run {
    masters: Arc<Masters>,
    acquirer: Arc<Acquirer>,
    policy: Policy,
    key: Bytes,
    field: Bytes,
    /// How long what it writes can live on a master (the padded lease).
    lives: Duration,
    received_at: Instant,
    shape: Shape,
    /// What the masters ran and what the client sent: Redis' error texts name the SHA1 of
    /// the first, the client gets its own ([`clients_sha`]).
    checked: Bytes,
    client_body: Bytes,
}

impl Run {
    async fn run(self, call: MasterCall) -> Outcome {
        let drift = self.policy.drift_factor;
        let decided = |raw: &[Vote]| decided(&script_votes(raw), drift);
        let ballot = call.fan_out(&self.masters, drift, decided).await;
        let tally = Tally::of(&self.masters, slot_of(&[&self.key]), &ballot.votes);
        if let Some(seen) = tally.token_refused_at() {
            self.acquirer.script_token_refused(seen);
        }
        let Some(record) = call.offer.as_ref().map(|offer| offer.record.clone()) else {
            // Quarantine off (tests only): no record names the run, so nothing can be undone.
            return self.answer(&tally, None, None).await;
        };
        let token: Option<u64> = std::str::from_utf8(&record[..16.min(record.len())])
            .ok()
            .and_then(|t| t.parse().ok());
        let rollback = self.rollback(ballot, record);
        self.answer(&tally, Some(rollback), token).await
    }

    fn rollback(&self, ballot: Ballot, record: Bytes) -> Box<dyn Rollback> {
        let Ballot {
            votes,
            late,
            deadlines,
        } = ballot;
        self.acquirer.hash_rollback(HashGrant {
            key: self.key.clone(),
            field: self.field.clone(),
            record,
            channel: unlock_channel(&self.key),
            lives: self.lives,
            votes,
            late,
            deadlines,
            took: may_have_taken,
        })
    }

    /// The grant (a lease: written only within its validity, else rolled back), or the
    /// refusal after the roll-back.
    async fn answer(
        &self,
        tally: &Tally,
        rollback: Option<Box<dyn Rollback>>,
        offered: Option<u64>,
    ) -> Outcome {
        let lease = tally.lease();
        let granted =
            grant_decision(&tally.votes, took) == AcquireDecision::Quorum && tally.capped == 0;
        let (true, Some(lease_ms)) = (granted, lease) else {
            if let Some(rollback) = rollback {
                rollback.run().await;
            }
            return Outcome::Reply(self.refusal(tally));
        };
        let reply = match self.shape {
            Shape::Plain => Reply::Null,
            Shape::Fenced => match self.token(tally, offered).await {
                Some(token) => Reply::Array(vec![Reply::Integer(-1), Reply::Integer(token)]),
                None => {
                    if let Some(rollback) = rollback {
                        rollback.run().await;
                    }
                    return Outcome::Reply(ProxyError::FencedTokenRefused.into());
                }
            },
        };
        let window = validity_window(lease_ms, self.policy.drift_factor).unwrap_or(Duration::ZERO);
        Outcome::Lease(Lease {
            deadline: self.received_at + window,
            granted: Granted::Reply(reply),
            expired: ProxyError::LeaseExpired.into(),
            rollback,
        })
    }

    /// The grant's fencing token: the offered one when a majority of the masters that granted
    /// took it (a new holder), else the one `LOCK.TOKEN` reads (a re-entry: its holder's).
    async fn token(&self, tally: &Tally, offered: Option<u64>) -> Option<i64> {
        let taken = (tally.votes.iter().zip(&tally.reports))
            .filter(|(vote, report)| {
                matches!(vote, Vote::Replied(r) if took(r)) && report.token_taken
            })
            .count();
        if let Some(token) = offered.filter(|_| taken >= quorum(tally.votes.len())) {
            return i64::try_from(token).ok();
        }
        match self.acquirer.token(&self.key, &self.field).await {
            Reply::Integer(token) => Some(token),
            _ => None,
        }
    }

    /// A refusal: the guard's error if it capped a key; the PTTL a majority holds the lock
    /// for; else what the masters answered alike, never a null (that would read as acquired).
    fn refusal(&self, tally: &Tally) -> Reply {
        let cap_ms = self.policy.max_lock_ttl_ms;
        if tally.capped & CAPPED_NO_EXPIRY != 0 {
            return ProxyError::ScriptNoExpiry(cap_ms).into();
        }
        if tally.capped & CAPPED_TTL != 0 {
            return ProxyError::ScriptTtlCapped(cap_ms).into();
        }
        let n = tally.votes.len();
        match held_pttl(&tally.votes, self.policy.drift_factor) {
            Some(pttl) if self.shape == Shape::Fenced => {
                Reply::Array(vec![pttl, Reply::Integer(-1)])
            }
            Some(pttl) => pttl,
            None => match merge(&tally.votes, MergeRule::Strict) {
                Some(reply) if !took(&reply) => {
                    clients_sha(reply, &self.checked, &self.client_body)
                }
                _ => no_quorum(n),
            },
        }
    }
}

/// Whether the acquire is decided on the votes so far: a majority took it, or it can no longer
/// be taken and either a majority's PTTL is known or every master answered.
fn decided(votes: &[Vote], drift: f64) -> bool {
    match grant_decision(votes, took) {
        AcquireDecision::Quorum => true,
        AcquireDecision::Undecided => false,
        AcquireDecision::Refused => {
            held_pttl(votes, drift).is_some() || !votes.contains(&Vote::Pending)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redlock::MissingReason;

    /// A master's `[script reply, guard reply]`: the prelude's `{noted, verdict, reply}` (a
    /// null reply ends the table) and the guard's flags.
    fn pair(reply: Option<Reply>, guard: i64) -> Vote {
        let mut reported = vec![Reply::Integer(1000), Reply::Integer(1)];
        reported.extend(reply);
        Vote::Replied(Reply::Array(vec![
            Reply::Array(reported),
            Reply::Integer(guard),
        ]))
    }

    #[test]
    fn the_roll_back_targets_masters_that_took_it_or_may_have() {
        assert!(may_have_taken(&pair(None, 0)), "null: taken");
        assert!(!may_have_taken(&pair(Some(Reply::Integer(500)), 0)), "held");
        assert!(
            may_have_taken(&pair(None, -1)),
            "unarmed: not counted, but it ran"
        );
        let raised = Vote::Replied(Reply::Array(vec![
            Reply::error("ERR late"),
            Reply::Integer(0),
        ]));
        assert!(!may_have_taken(&raised), "an error: nothing ran");
        assert!(may_have_taken(&Vote::Missing(MissingReason::Timeout)));
        assert!(may_have_taken(&Vote::Pending));
    }

    #[test]
    fn decided_on_a_majority_of_nulls_or_of_pttls_or_once_all_answered() {
        let null = || Vote::Replied(Reply::Null);
        let pttl = |ms| Vote::Replied(Reply::Integer(ms));
        let p = Vote::Pending;
        let cases = [
            (vec![null(), null(), p.clone()], true),
            (vec![null(), pttl(900), p.clone()], false),
            (vec![pttl(900), pttl(800), p.clone()], true),
            // Refused without a majority's PTTL: decided once every master answered.
            (
                vec![null(), pttl(900), Vote::Missing(MissingReason::Timeout)],
                true,
            ),
            (vec![null(), null(), pttl(9), p.clone(), p.clone()], false),
            // Refused, a majority's PTTL not known yet: the last master may give it.
            (
                vec![null(), pttl(9), pttl(9), Vote::Fenced, p.clone()],
                false,
            ),
            (vec![null(), pttl(9), pttl(9), Vote::Fenced, pttl(8)], true),
        ];
        for (votes, expected) in cases {
            assert_eq!(decided(&votes, 0.01), expected, "{votes:?}");
        }
    }
}
