//! The acquire service every connection shares ([`Acquirer`]), and its whole API in one
//! `impl`: acquire (single flight, [`super::flights`]; the Redlock round, [`super::acquire`]),
//! release ([`Acquirer::release`]), extend ([`super::extend`]), and the tokens of client
//! scripts. Each method is an entry point: the work is done by the free functions of the
//! module of its concern.
//!
//! Invariants:
//! - One acquirer per shard, over that shard's links to the masters; the token proposals
//!   ([`Tokens`]) and the statistics may be common to several.
//! - Every lock operation on the masters is a call of [`LOCK_SCRIPT`] through the same
//!   [`SharedScript`] (`script`), so the links merge the calls of acquires and releases.

use super::acquire::{Attempt, Tokens};
use super::extend::{self, Change};
use super::flights::{self, Flights, Started};
use super::rollback::{HashGrant, RollbackPlan, Undo};
use super::{lock_script, LockStats};
use crate::cluster::keys::token_key_on;
use crate::cluster::slots::key_slot;
use crate::config::NoQuorumReply;
use crate::lease::{Granted, Outcome, Rollback};
use crate::masters::{Ask, Forms, Masters};
use crate::on_master::{LOCK_SCRIPT, TOKEN_SCRIPT};
use crate::protocol::{encode_command, Reply, ScriptCall};
use crate::redlock::{MergeRule, Policy, TokenRules};
use crate::script_keys::TokenOffer;
use crate::transport::{Floor, SharedScript};
use bytes::Bytes;
use std::sync::Arc;
use tokio::time::Instant;

/// How acquires answer, from the configuration.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Off only in the negative control of the tests (see [`TokenRules`]).
    pub token_clock: bool,
    /// Whether the lock script checks the write witness floor ([`Floor`]); off only in the
    /// negative control of the tests.
    pub witness_floor: bool,
    pub no_quorum_reply: NoQuorumReply,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            token_clock: true,
            witness_floor: true,
            no_quorum_reply: NoQuorumReply::Null,
        }
    }
}

/// The acquire service shared by every connection.
pub struct Acquirer {
    pub(super) masters: Arc<Masters>,
    pub(super) policy: Policy,
    pub(super) tokens: Tokens,
    /// [`LOCK_SCRIPT`], as the links merge its calls.
    pub(super) script: Arc<SharedScript>,
    pub(super) flights: Flights,
    pub(super) no_quorum_reply: NoQuorumReply,
    /// Acquires by result, their duration, rollbacks (exported by [`crate::ops`]).
    pub stats: Arc<LockStats>,
}

impl Acquirer {
    /// `stats` may be common to several acquirers (one per shard: [`crate::shared::Shard`]).
    pub fn new(
        masters: Arc<Masters>,
        policy: Policy,
        options: Options,
        stats: Arc<LockStats>,
    ) -> Arc<Acquirer> {
        let rules = TokenRules::for_lease_bound(policy.lease_bound());
        Arc::new(Acquirer {
            masters,
            policy,
            tokens: Tokens::new(rules, options.token_clock),
            script: lock_script(match options.witness_floor {
                true => Floor::Witness,
                false => Floor::Off,
            }),
            flights: Flights::default(),
            no_quorum_reply: options.no_quorum_reply,
            stats,
        })
    }

    /// Scripts the health monitors keep loaded on every master (acquires call them by SHA1).
    /// The masters it asks.
    pub fn masters(&self) -> &Masters {
        &self.masters
    }

    pub fn preload() -> Vec<&'static str> {
        vec![LOCK_SCRIPT.text()]
    }

    /// Starts an acquire of `attempt.key`: at once if none is in flight (the caller leads),
    /// or queued behind the one in flight (the returned future waits for its turn).
    pub fn acquire(self: &Arc<Self>, attempt: Attempt) -> Started {
        flights::start(self, attempt)
    }

    /// Releases `key` if it holds `value`, on every master (those that cannot vote too), and
    /// answers by the release rule ([`MergeRule::Release`]).
    ///
    /// The release of a lock: the compare-and-delete every client library sends (recognised
    /// by [`crate::lease_script::is_compare_and_delete`]) and `LOCK.RELEASE`, as release
    /// operations of the proxy's own [`LOCK_SCRIPT`], which the links merge with the acquires.
    pub async fn release(&self, key: &[u8], value: &[u8]) -> Reply {
        let call = ScriptCall::new(&[&[key]], &[b"r", value]);
        let rule = MergeRule::Release;
        let slot = key_slot(key);
        let voters = self.masters.voters();
        let ask = |i: usize| {
            let script = voters[i].lock_script(&self.script);
            Some(Ask::Script(script, call.clone()))
        };
        self.masters.quorum_reply_each(slot, ask, rule).await
    }

    /// The fencing token of `key`'s grant to `value` (a string lock's value, or a field of a
    /// hash lock): only if a majority answers that one token ([`MergeRule::Identical`]; each
    /// master runs [`TOKEN_SCRIPT`], whose counter is named in the key's slot on a cluster
    /// master), else null. `LOCK.TOKEN`, and the token of a Redisson re-entry.
    pub async fn token(&self, key: &[u8], value: &[u8]) -> Reply {
        let read = Forms::new(&self.masters, |cluster| {
            let token_key = token_key_on(cluster, key);
            let script = TOKEN_SCRIPT.text().as_bytes();
            encode_command(&[b"EVAL", script, b"2", key, &token_key, value])
        });
        (self.masters)
            .quorum_reply_forms(key_slot(key), &read, MergeRule::Identical)
            .await
    }

    /// Extends `key` to `ttl_ms` if `value` holds it on a majority of armed, unquarantined
    /// masters: a lease of the new validity (written only while it lasts, undone otherwise),
    /// or null (undone where it took effect). See [`super::extend`].
    pub async fn extend(
        &self,
        key: &Bytes,
        value: &Bytes,
        ttl_ms: u64,
        received_at: Instant,
    ) -> Outcome {
        let change = Change::Extend { from: value };
        extend::write(
            self,
            key,
            change,
            Some(ttl_ms),
            received_at,
            Granted::Validity,
        )
        .await
    }

    /// Hands `key` over from `from` to `to` (`to` = `from`: extends it) if `from` holds it on a
    /// majority of armed, unquarantined masters, with `ttl_ms` (`None`: the TTL is kept): a
    /// lease answering `answer` (written only within the validity, undone otherwise), or null
    /// (or the error a majority gave), undone where it took effect. `SET key to IFEQ from` with
    /// an expiry; see [`super::extend`].
    pub async fn hand_over(
        &self,
        key: &Bytes,
        (from, to): (&Bytes, &Bytes),
        ttl_ms: Option<u64>,
        received_at: Instant,
        answer: Reply,
    ) -> Outcome {
        let change = Change::HandOver { from, to };
        extend::write(
            self,
            key,
            change,
            ttl_ms,
            received_at,
            Granted::Reply(answer),
        )
        .await
    }

    /// The token a client script's run may take where it makes a new holder of a key
    /// (docs/SAFETY.md, "Tokens for locks taken by scripts"): proposed as an acquire's, once
    /// per run. None with quarantine off (tests only), where acquires take no token either.
    pub fn offer_script_token(&self) -> Option<TokenOffer> {
        if !self.masters.quarantine() {
            return None;
        }
        let token = self.tokens.propose(&self.masters, 0);
        let (earliest_ms, latest_ms) = self.tokens.accepted_clocks_ms(token);
        Some(TokenOffer {
            record: Bytes::copy_from_slice(self.tokens.record(token).as_bytes()),
            earliest_ms,
            latest_ms,
            life_ms: self.tokens.rules.counter_life_ms,
        })
    }

    /// A master refused a script's token at `seen` (its counter, or its clock): later
    /// proposals go above it (a script is not retried: it ran).
    pub fn script_token_refused(&self, seen: u64) {
        self.tokens.raise_floor(seen);
    }

    /// The roll-back of a hash-lock acquire that is not given to its client (refused, or its
    /// validity ran out): one count of the field taken back on every master that may have
    /// given it, where the run's record still names it (docs/SAFETY.md, "Hash locks
    /// (Redisson)"); kept across reconnects, and sent again past the deadline where an answer
    /// never came, as a refused `SET NX`'s clean-up is ([`super::rollback`]).
    pub fn hash_rollback(&self, grant: HashGrant) -> Box<dyn Rollback> {
        let HashGrant {
            key,
            field,
            record,
            channel,
            lives,
            votes,
            late,
            deadlines,
            took,
        } = grant;
        Box::new(RollbackPlan {
            masters: self.masters.clone(),
            drift_factor: self.policy.drift_factor,
            undo: Undo::Hash {
                key,
                field,
                record,
                channel,
            },
            lives,
            votes,
            late,
            deadlines,
            took,
            stats: self.stats.clone(),
        })
    }
}
