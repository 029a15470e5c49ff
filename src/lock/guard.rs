//! The guard after every command that may write (docs/PROTOCOL.md §5), and how a guarded
//! fan-out's votes are read: each master's `[command reply, guard reply]` pair counts only
//! where the guard vouched for the master (armed, not quarantined), what the guards capped,
//! and what a client script's prelude reported beside its reply (its lease, its token).
//!
//! Used by every command that may create a key (the scripts, `HSET`, `ZADD`, the pushes) and by
//! Redisson's hash-lock acquire; knows nothing of the command table.
//!
//! Invariant: a master whose guard answered `-1` (unarmed or quarantined) never counts, and is
//! re-checked by its health monitor at once.

use crate::cluster::keys::markers_on;
use crate::masters::{slot_of, Ask, Masters};
use crate::on_master::{CLUSTER_GUARD_SCRIPT, GUARD_SCRIPT};
use crate::protocol::{encode_command, Reply};
use crate::redlock::{
    merge, merged, quorum, token_refusal, MergeRule, MissingReason, Policy, Vote,
};
use bytes::Bytes;

/// The guard's flags (`src/on_master/guard.lua`): a key had a TTL above the bound.
pub const CAPPED_TTL: i64 = 1;
/// The guard's flag: a key had no expiry.
pub const CAPPED_NO_EXPIRY: i64 = 2;

/// What a master's prelude reported beside a script's reply ([`crate::script_keys`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// The shortest lease the script set there (the client's TTL in ms, 0: none).
    pub lease_ms: u64,
    /// The counter or clock (µs) at which the master refused the run's token, if it did
    /// (`{-3|-4, seen}`; a token refused as too late, `{-2, clock}`, says nothing of later
    /// proposals).
    pub token_refused_at: Option<u64>,
    /// The master took the run's token for a new holder (verdict `1`).
    pub token_taken: bool,
}

/// The script's vote of one master from its `[script reply, guard reply]` pair, and what the
/// prelude reported there. The script reply is the prelude's `{noted, token verdict, reply}`
/// when the script returned ([`crate::script_keys`]; an error it raised comes alone). Counted
/// only if the guard vouched for the master (`-1`: unarmed or quarantined, no vote).
pub fn script_vote(vote: &Vote) -> (Vote, Report) {
    let not_eligible = || (Vote::Missing(MissingReason::NotEligible), Report::default());
    let Vote::Replied(answer) = vote else {
        return (vote.clone(), Report::default());
    };
    let Reply::Array(pair) = answer else {
        return not_eligible();
    };
    match pair.as_slice() {
        [Reply::Array(reported), Reply::Integer(n)] if *n >= 0 => match reported.as_slice() {
            // A script's nil reply ends the Lua table: `{noted, verdict}` alone.
            [Reply::Integer(noted), verdict, reply @ ..] if reply.len() <= 1 => {
                let reply = reply.first().cloned().unwrap_or(Reply::Null);
                let report = Report {
                    lease_ms: u64::try_from(*noted).unwrap_or(0),
                    token_refused_at: token_refusal(verdict),
                    token_taken: *verdict == Reply::Integer(1),
                };
                (Vote::Replied(reply), report)
            }
            _ => (Vote::Replied(pair[0].clone()), Report::default()),
        },
        [reply, Reply::Integer(n)] if *n >= 0 => (Vote::Replied(reply.clone()), Report::default()),
        _ => not_eligible(),
    }
}

/// The guard over `keys` (`EVAL <guard> (2 + keys) <armed> <quarantine> <keys…> <bound>`), to
/// send on each master right after a command that may have written them; on a cluster
/// (`cluster`) its cluster form with the markers of the keys' slot.
pub fn guard_command(keys: &[Bytes], policy: &Policy, cluster: bool) -> Bytes {
    let count = (keys.len() + 2).to_string();
    let bound = policy.lease_bound().as_millis().to_string();
    let script = match cluster {
        false => GUARD_SCRIPT.text(),
        true => CLUSTER_GUARD_SCRIPT.text(),
    };
    let [armed, quarantine] = markers_on(cluster, slot_of(keys));
    let mut parts: Vec<&[u8]> = vec![
        b"EVAL",
        script.as_bytes(),
        count.as_bytes(),
        &armed,
        &quarantine,
    ];
    parts.extend(keys.iter().map(|k| k.as_ref()));
    parts.push(bound.as_bytes());
    encode_command(&parts)
}

/// What [`guarded`] found: the merged reply, what the guards capped ([`CAPPED_TTL`] and
/// [`CAPPED_NO_EXPIRY`] or-ed over the masters that answered), and the lease a script set if a
/// majority of the masters counted took one: the shortest client TTL they noted (ms).
pub struct Guarded {
    pub reply: Reply,
    pub capped: i64,
    pub lease: Option<u64>,
    /// The highest counter or clock (µs) at which a master refused a script's token.
    pub token_refused_at: Option<u64>,
}

/// The script votes of a fan-out's `[script reply, guard reply]` pairs (see [`script_vote`]).
pub fn script_votes(votes: &[Vote]) -> Vec<Vote> {
    votes.iter().map(|v| script_vote(v).0).collect()
}

/// A guarded fan-out's votes, read: each master's script vote (counted only where its guard
/// vouched for it) and what its prelude reported, and what the guards capped.
pub struct Tally {
    pub votes: Vec<Vote>,
    pub reports: Vec<Report>,
    /// [`CAPPED_TTL`] and [`CAPPED_NO_EXPIRY`] or-ed over the masters that answered.
    pub capped: i64,
}

impl Tally {
    /// Reads the `[script reply, guard reply]` votes; a master whose guard found it unarmed or
    /// quarantined is re-checked by its health monitor at once.
    pub fn of(masters: &Masters, slot: u16, raw: &[Vote]) -> Tally {
        let mut capped = 0;
        for (vote, voter) in raw.iter().zip(masters.voters()) {
            if let Vote::Replied(Reply::Array(pair)) = vote {
                match pair.get(1) {
                    Some(Reply::Integer(-1)) => voter.recheck(slot),
                    Some(Reply::Integer(flags)) if *flags > 0 => capped |= flags,
                    _ => {}
                }
                // The guard ran after the write: it was acknowledged.
                if matches!(pair.get(1), Some(Reply::Integer(0..))) {
                    voter.uncovered_write();
                }
            }
        }
        let (votes, reports) = raw.iter().map(script_vote).unzip();
        Tally {
            votes,
            reports,
            capped,
        }
    }

    /// The lease the run set if a majority of the masters counted took one: the shortest
    /// client TTL they noted (ms).
    pub fn lease(&self) -> Option<u64> {
        let leases: Vec<u64> = (self.votes.iter().zip(&self.reports))
            .filter(|(vote, report)| matches!(vote, Vote::Replied(_)) && report.lease_ms > 0)
            .map(|(_, report)| report.lease_ms)
            .collect();
        (leases.len() >= quorum(self.votes.len()))
            .then(|| leases.iter().min().copied())
            .flatten()
    }

    /// The highest counter or clock (µs) at which a master refused the run's token.
    pub fn token_refused_at(&self) -> Option<u64> {
        self.reports.iter().filter_map(|r| r.token_refused_at).max()
    }

    /// The masters merged by `rule`, with what [`Guarded`] keeps.
    pub fn guarded(&self, rule: MergeRule) -> Guarded {
        let reply = merged(&self.votes, rule);
        Guarded {
            reply,
            capped: self.capped,
            lease: self.lease(),
            token_refused_at: self.token_refused_at(),
        }
    }
}

/// Runs a command followed by its guard ([`guard_command`]) on every master (two replies each)
/// and merges the command's replies, counting a master only if its guard vouched for it
/// ([`Tally`]).
pub async fn guarded(
    masters: &Masters,
    slot: u16,
    ask: impl Fn(usize) -> Option<Ask>,
    rule: MergeRule,
) -> Guarded {
    let decided = |v: &[Vote]| merge(&script_votes(v), rule).is_some();
    let (votes, _late) = masters.fan_out_each(slot, ask, 2, decided).await;
    Tally::of(masters, slot, &votes).guarded(rule)
}
