//! The Redlock decision, pure: quorum size, drift and validity arithmetic, when an acquire is
//! decided, where a refused acquire must be rolled back, and the quorum reply rule that merges
//! the replies of N masters into the one reply a single Redis would give.
//!
//! Nothing here does I/O or reads a clock; callers pass the votes and elapsed times in. That
//! keeps every rule table-testable and the safety arguments next to the arithmetic:
//!
//! - **Quorum** `Q = N/2 + 1`: two sets of Q masters out of N always intersect, so two
//!   acquires of one key cannot both collect Q `OK`s while the keys they set are alive.
//! - **Validity** `TTL − elapsed − drift`, elapsed measured from when the request was read off
//!   the client's socket (earlier than any master saw it, so it over-estimates the time
//!   consumed): the client's lease never outlives the keys on the masters (redis.io "Distributed
//!   Locks with Redis", step 3).
//! - **Padding**: masters are asked for `PX = TTL + drift`, so that a client counting TTL from
//!   the moment it *sent* the command is covered even if a master's clock runs fast by up to the
//!   drift factor.

use crate::error::ProxyError;
use crate::protocol::Reply;
use std::time::Duration;

/// The lock settings the decisions depend on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// The clock drift factor `F` (redis.io "Distributed Locks with Redis": drift is
    /// `TTL × F + 2 ms`).
    pub drift_factor: f64,
    /// The longest lock TTL the proxy forwards (`max_lock_ttl_ms`).
    pub max_lock_ttl_ms: u64,
}

impl Policy {
    /// `B`: the longest any key the proxy sets or extends can live on a master, the TTL cap
    /// plus drift. Every TTL the proxy forwards is checked against the cap
    /// ([`Policy::check_ttl`]), and scripts that may set expiries are capped at `B` after they
    /// run; so a master that lost its data at time L held no lease that outlives L + B, which
    /// is how long it is quarantined ([`crate::health`]).
    pub fn lease_bound(&self) -> Duration {
        Duration::from_millis(backend_ttl_ms(self.max_lock_ttl_ms, self.drift_factor))
    }

    /// Refuses a TTL above the cap: a longer lease could outlive a quarantine.
    pub fn check_ttl(&self, ttl_ms: u64) -> Result<(), ProxyError> {
        if ttl_ms > self.max_lock_ttl_ms {
            return Err(ProxyError::TtlAboveCap {
                ttl_ms,
                cap_ms: self.max_lock_ttl_ms,
            });
        }
        Ok(())
    }
}

/// Majority of `n` masters.
pub fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// Clock drift allowance for a lease of `ttl_ms` (redis.io "Distributed Locks with Redis": `TTL × F + 2 ms`), rounded up.
pub fn drift_ms(ttl_ms: u64, drift_factor: f64) -> u64 {
    ((ttl_ms as f64) * drift_factor).ceil() as u64 + 2
}

/// The `PX` each master is asked for: `TTL + drift` (docs/SAFETY.md, "Why it holds").
pub fn backend_ttl_ms(ttl_ms: u64, drift_factor: f64) -> u64 {
    ttl_ms.saturating_add(drift_ms(ttl_ms, drift_factor))
}

/// How long after the request was read the client may still be told `OK`:
/// `TTL − drift`. `None` if the drift alone eats the whole lease (no grant is ever valid).
pub fn validity_window(ttl_ms: u64, drift_factor: f64) -> Option<Duration> {
    let drift = drift_ms(ttl_ms, drift_factor);
    (ttl_ms > drift).then(|| Duration::from_millis(ttl_ms - drift))
}

/// What one master said about one fanned-out request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vote {
    /// Sent, no answer yet.
    Pending,
    /// No answer (the reason says why): counts as "no".
    Missing(MissingReason),
    /// Not asked: quarantined after a data loss. Counts as "no"; its state is unknown, but it
    /// votes for nobody until its quarantine ends (see [`MergeRule::Release`]).
    Fenced,
    /// The master's reply.
    Replied(Reply),
}

/// Fencing tokens (docs/SAFETY.md, "Fencing tokens"). Every grant carries a token `t` (µs),
/// the same on every master: the proxy proposes it, and each master's acquire script accepts
/// the write only if `t` is above the key's counter on that master and the master's clock (ms)
/// is within `window` of `t` ([`TokenRules::accepted_clocks_ms`]), then records `t` as the key's
/// counter for `counter_life`.
///
/// Why tokens of conflicting grants are ordered like their tenures (G1 before G2, granted by
/// majorities that share a master x): on x, G2's write came after G1's key was gone. If x still
/// had G1's counter then, G2 was accepted only with `t2 > t1`. If the counter had expired
/// (after `counter_life` on x's clock) or x lost it in a data loss (then x was quarantined for
/// the lease bound before voting again), x's clock advanced by at least `counter_life` since it
/// accepted `t1` (at most `window` + 1 ms behind its clock then, the ms rounding included), and
/// it accepted `t2` at least `window` + 1 ms ahead of its clock: so
/// `t2 − t1 ≥ counter_life − 2 × (window + 1 ms) > 0`. Nothing here depends on the proxies'
/// clocks or on the lease timing: a paused holder that acts late is fenced by the token even
/// when mutual exclusion itself was lost. Assumed: no master's clock steps back by more than
/// `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenRules {
    /// How far a master's clock may be from a proposal, either way (ms).
    pub window_ms: u64,
    /// How long a master keeps a key's counter after a grant (ms).
    pub counter_life_ms: u64,
}

impl TokenRules {
    /// The rules for a lease bound `B`: a window of `B / 4 − 1 ms` and counters kept for `B`,
    /// so `counter_life − 2 × (window + 1 ms) = B / 2 > 0`, and a master that lost its counters
    /// (then was quarantined for `B`) can never accept a token below one it had accepted.
    pub fn for_lease_bound(bound: Duration) -> TokenRules {
        let bound_ms = bound.as_millis() as u64;
        TokenRules {
            window_ms: (bound_ms / 4).saturating_sub(1),
            counter_life_ms: bound_ms.max(1),
        }
    }

    /// The master clocks (ms) at which a master accepts `token`: `token` ± the window. The
    /// upper end also bounds the write's deadline, so the script checks it with the deadline.
    pub fn accepted_clocks_ms(&self, token: u64) -> (u64, u64) {
        let token_ms = token / 1000;
        (
            token_ms.saturating_sub(self.window_ms),
            token_ms.saturating_add(self.window_ms),
        )
    }
}

/// The clock a proposal must reach, from the masters' estimated clocks (µs) out of `masters`:
/// the Q-th highest (a quorum's clocks are then at or below it, within their windows if they
/// agree), not the highest, so that up to N − Q masters whose clocks run ahead by more than the
/// window (a step not yet corrected, quarantined for it) do not push every proposal out of the
/// others' windows; with fewer estimates than Q, the highest. Reorders `clocks`.
pub fn quorum_clock(clocks: &mut [u64], masters: usize) -> Option<u64> {
    let q = quorum(masters);
    let at = if clocks.len() < q { 0 } else { q - 1 };
    if at >= clocks.len() {
        return None;
    }
    let (_, nth, _) = clocks.select_nth_unstable_by(at, |a, b| b.cmp(a));
    Some(*nth)
}

/// The token to propose: at least `clock` ([`quorum_clock`]), and above `last`, the highest
/// this proxy proposed or saw refused. Which token is proposed decides only which masters
/// accept it: each master checks its own window and counter (docs/SAFETY.md).
pub fn propose_token(clock: Option<u64>, last: u64) -> u64 {
    clock.unwrap_or(0).max(last.saturating_add(1))
}

/// A master's answer to the acquire that refused a token: `[-3, clock_us]` (the token is too
/// far ahead of its clock) or `[-4, counter]` (not above the key's counter).
pub fn refused_token(vote: &Vote) -> Option<u64> {
    match vote {
        Vote::Replied(reply) => token_refusal(reply),
        _ => None,
    }
}

/// What a master reported when it refused a token (the acquire's answer, or a script
/// prelude's verdict): the clock or counter to propose above.
pub fn token_refusal(reply: &Reply) -> Option<u64> {
    match reply {
        Reply::Array(items) => match items.as_slice() {
            [Reply::Integer(-3 | -4), Reply::Integer(seen)] => u64::try_from(*seen).ok(),
            _ => None,
        },
        _ => None,
    }
}

/// After a refused acquire: the floor a retry must propose above, if some master refused the
/// token (the highest counter or clock it reported).
pub fn token_floor(votes: &[Vote]) -> Option<u64> {
    votes.iter().filter_map(refused_token).max()
}

/// Why a master's vote is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingReason {
    /// The master may not vote now (not yet judged on this connection, unsafe, quarantined):
    /// it was not asked, or its answer does not count.
    NotEligible,
    /// There was no connection to it.
    NoLink,
    /// No answer within the node timeout.
    Timeout,
    /// Its connection ended before the answer came.
    Closed,
    /// It answered, but `WAIT` did not confirm that `wait_replicas` replicas have the write
    /// (docs/SAFETY.md, "Confirmed writes").
    Unconfirmed,
}

/// State of an acquire (`SET key value NX PX ttl` on every master).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireDecision {
    /// Neither outcome is certain yet.
    Undecided,
    /// At least Q masters set the key (the validity check is the caller's, at reply time).
    Quorum,
    /// Q `OK`s can no longer be reached.
    Refused,
}

/// Decides an acquire as soon as the outcome is known: Q `OK`s, or more than `N − Q` votes that
/// are not `OK` (an answered null, an error, a missing answer).
pub fn acquire_decision(votes: &[Vote]) -> AcquireDecision {
    grant_decision(
        votes,
        |reply| matches!(reply, Reply::Simple(s) if s.as_ref() == b"OK"),
    )
}

/// [`acquire_decision`] for an acquire whose masters answer `granted` where they took the lock
/// (Redisson's hash-lock acquire answers null there, its holder's PTTL elsewhere).
pub fn grant_decision(votes: &[Vote], granted: impl Fn(&Reply) -> bool) -> AcquireDecision {
    let n = votes.len();
    let q = quorum(n);
    let took = |v: &Vote| matches!(v, Vote::Replied(reply) if granted(reply));
    let granted = votes.iter().filter(|v| took(v)).count();
    let denied = votes
        .iter()
        .filter(|v| !matches!(v, Vote::Pending) && !took(v))
        .count();
    if granted >= q {
        AcquireDecision::Quorum
    } else if denied > n - q {
        AcquireDecision::Refused
    } else {
        AcquireDecision::Undecided
    }
}

/// What a refused hash-lock acquire answers when at least Q masters answered the holder's PTTL:
/// the Q-th largest (a majority holds the lock at least that long), less the drift padding as
/// `PTTL` answers ([`conservative_ttl`]). `None` with fewer than Q integers.
pub fn held_pttl(votes: &[Vote], drift_factor: f64) -> Option<Reply> {
    let q = quorum(votes.len());
    let mut pttls: Vec<i64> = votes
        .iter()
        .filter_map(|v| match v {
            Vote::Replied(Reply::Integer(pttl)) => Some(*pttl),
            _ => None,
        })
        .collect();
    pttls.sort_unstable_by(|a, b| b.cmp(a));
    let pttl = *pttls.get(q - 1)?;
    Some(conservative_ttl(Reply::Integer(pttl), 1, drift_factor))
}

fn is_ok(vote: &Vote) -> bool {
    matches!(vote, Vote::Replied(Reply::Simple(s)) if s.as_ref() == b"OK")
}

/// True if at least Q masters answered null to an acquire: the key is held there by someone
/// else, which is exactly what one Redis would have reported to any concurrent `SET NX`.
pub fn held_by_majority(votes: &[Vote]) -> bool {
    votes
        .iter()
        .filter(|v| matches!(v, Vote::Replied(Reply::Null)))
        .count()
        >= quorum(votes.len())
}

/// True if more than `N − Q` masters gave no answer in time: no majority was reachable for
/// this acquire, so a concurrent acquire of the same key sent at the same moment would be
/// refused the same way.
pub fn majority_unreachable(votes: &[Vote]) -> bool {
    let n = votes.len();
    votes
        .iter()
        .filter(|v| matches!(v, Vote::Missing(_) | Vote::Fenced))
        .count()
        > n - quorum(n)
}

/// True where a refused acquire must be rolled back: the master said `OK` (or took the key in
/// a call whose clock reading ran ahead: [`CLOCK_AHEAD`]), or its answer is unknown (still pending, timed out, connection lost: the write may have been applied).
/// A master that answered null did *not* take our value; deleting "our" value there could
/// delete another holder's lock that happens to use the same token (the PHP lock class of
/// `tests/clients/php-phpredis.php` draws tokens from only 9001 values), so those masters are
/// left alone.
pub fn may_hold_our_value(vote: &Vote) -> bool {
    match vote {
        Vote::Pending | Vote::Missing(_) | Vote::Fenced => true,
        Vote::Replied(reply) => is_ok(vote) || *reply == CLOCK_AHEAD,
    }
}

/// An acquire a master took (`OK`) in a merged call whose reading of the master's clock ran
/// ahead of the clock rule (docs/SAFETY.md, "Master clocks: steps and rates between two
/// looks"): its key may expire early there, so it is no vote; the key is there, so it is
/// undone as an `OK` is; and the master is judged again at once, as after `-1`.
pub const CLOCK_AHEAD: Reply = Reply::Integer(-5);

/// Which replies the quorum rule may pick when no Q masters agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeRule {
    /// For scripts whose meaning the proxy does not know: a "smaller" reply can be a success
    /// (Redisson's acquire answers null when it takes the lock and the holder's PTTL
    /// otherwise), so a minority's reply is never the answer. Only a reply Q masters gave, or
    /// an integer `v` that Q masters answered `≥ v` *and* Q answered `≤ v` (with N masters
    /// that is the median of N integer answers, N odd): whichever way the script's codes run,
    /// a majority did at least what `v` says. A PTTL a few milliseconds apart per master
    /// (pottery's `locked()`, redlock-universal's extend) is then an answer, not `NOQUORUM`.
    Strict,
    /// Rules 2 and 3 too, for replies whose meaning is known: counts and flags where a higher
    /// integer claims more (`DEL`, `EXISTS`, `PEXPIRE`, `PTTL`), and values where null means
    /// "not held" (`GET`).
    Known,
    /// The compare-and-delete release (`1` deleted our value, `0` it was not there): as
    /// [`MergeRule::Known`], and `1` as soon as the masters that answered `1` plus the
    /// [fenced](Vote::Fenced) ones reach Q. Safety argument (docs/SAFETY.md, "Releases and
    /// extends while masters restart"): another grant during the caller's tenure would need a
    /// master of the caller's majority to say `OK`; such a master either still held the
    /// caller's value (it answers `1`), or lost it in a data loss and has voted for nobody
    /// since (unarmed, then quarantined for longer than any lease: it is fenced now). So when the masters answering `1` and the fenced ones make a
    /// majority, the proxy can vouch that the caller held the lock until its release, even
    /// while masters of its grant restart one after the other.
    Release,
    /// Rule 1 alone: what one act wrote on a majority (a grant's fencing token), else null
    /// once Q masters answered without error (they do not agree on one: no majority holds
    /// it), else `NOQUORUM`. Never a blend: the Q-th largest of tokens written by different
    /// runs (a script's new token on some masters, an earlier run's on one that kept the
    /// value) would vouch for a token no grant took.
    Identical,
}

/// The quorum reply rule (docs/PROTOCOL.md), applied as votes arrive. `None` = wait for more.
///
/// 1. At least Q masters gave the same reply: that reply (decidable before the rest answer).
/// 2. ([`MergeRule::Known`]) At least Q integers: the largest `v` such that at least Q masters
///    replied `≥ v` (the Q-th largest), so a count or a "deleted" flag is only claimed if a
///    majority did it.
/// 3. ([`MergeRule::Known`]) At least Q replies, a mix of one value and null: null (the
///    majority does not hold it).
/// 4. Otherwise `NOQUORUM`.
pub fn merge(votes: &[Vote], rule: MergeRule) -> Option<Reply> {
    let n = votes.len();
    let q = quorum(n);
    let replies: Vec<&Reply> = votes
        .iter()
        .filter_map(|v| match v {
            Vote::Replied(r) => Some(r),
            _ => None,
        })
        .collect();
    if let Some(agreed) = identical(&replies, q) {
        return Some(agreed);
    }
    if votes.iter().any(|v| matches!(v, Vote::Pending)) {
        return None;
    }
    if rule == MergeRule::Strict {
        let reply = either_way(&replies, q)
            .or_else(|| merge_arrays(&replies, q))
            .unwrap_or_else(|| no_quorum(n));
        return Some(reply);
    }
    if rule == MergeRule::Identical {
        let answered = replies.iter().filter(|r| !r.is_error()).count();
        return Some(match answered >= q {
            true => Reply::Null,
            false => no_quorum(n),
        });
    }
    if rule == MergeRule::Release {
        let deleted = replies.iter().filter(|r| **r == &Reply::Integer(1)).count();
        let fenced = votes.iter().filter(|v| matches!(v, Vote::Fenced)).count();
        if deleted > 0 && deleted + fenced >= q {
            return Some(Reply::Integer(1));
        }
    }
    let mut integers: Vec<i64> = integers(&replies).collect();
    if integers.len() >= q {
        integers.sort_unstable_by(|a, b| b.cmp(a));
        return Some(Reply::Integer(integers[q - 1]));
    }
    if replies.len() >= q {
        let values: Vec<&Reply> = replies
            .iter()
            .copied()
            .filter(|r| **r != Reply::Null)
            .collect();
        if let Some(first) = values.first() {
            if !first.is_error() && values.iter().all(|r| r == first) {
                return Some(Reply::Null);
            }
        }
    }
    Some(no_quorum(n))
}

/// Rule 1: a reply at least `q` of `replies` gave.
fn identical(replies: &[&Reply], q: usize) -> Option<Reply> {
    replies.iter().enumerate().find_map(|(i, candidate)| {
        let same = replies[i..].iter().filter(|r| *r == candidate).count();
        (same >= q).then(|| (*candidate).clone())
    })
}

/// The integers among `replies`.
fn integers<'a>(replies: &'a [&Reply]) -> impl Iterator<Item = i64> + 'a {
    replies.iter().filter_map(|r| match r {
        Reply::Integer(i) => Some(*i),
        _ => None,
    })
}

/// Rule 2s: an integer `v` that at least `q` replies are ≥ and at least `q` are ≤.
fn either_way(replies: &[&Reply], q: usize) -> Option<Reply> {
    integers(replies)
        .find(|v| {
            integers(replies).filter(|i| i >= v).count() >= q
                && integers(replies).filter(|i| i <= v).count() >= q
        })
        .map(Reply::Integer)
}

/// [`MergeRule::Strict`] for arrays of one length that at least `q` replies are (`{1, pttl}`
/// from redlock-universal's extend): element by element over those arrays, each by rules 1 and
/// 2s (and arrays again), so a PTTL a few ms apart is their median; none if some element has
/// no answer.
fn merge_arrays(replies: &[&Reply], q: usize) -> Option<Reply> {
    let length = |r: &Reply| match r {
        Reply::Array(items) => Some(items.len()),
        _ => None,
    };
    let len = replies
        .iter()
        .filter_map(|r| length(r))
        .find(|len| replies.iter().filter(|r| length(r) == Some(*len)).count() >= q)?;
    let arrays: Vec<&[Reply]> = replies
        .iter()
        .filter_map(|r| match r {
            Reply::Array(items) if items.len() == len => Some(items.as_slice()),
            _ => None,
        })
        .collect();
    (0..len)
        .map(|i| {
            let elements: Vec<&Reply> = arrays.iter().map(|items| &items[i]).collect();
            identical(&elements, q)
                .or_else(|| either_way(&elements, q))
                .or_else(|| merge_arrays(&elements, q))
        })
        .collect::<Option<Vec<Reply>>>()
        .map(Reply::Array)
}

/// The reply `votes` merge to by `rule`, or the refusal when they merge to none (no majority
/// agreed among the votes in).
pub fn merged(votes: &[Vote], rule: MergeRule) -> Reply {
    merge(votes, rule).unwrap_or_else(|| no_quorum(votes.len()))
}

/// The refusal when no majority of `n` masters agreed.
pub fn no_quorum(n: usize) -> Reply {
    ProxyError::NoQuorum {
        quorum: quorum(n),
        masters: n,
    }
    .into()
}

/// `PTTL`/`TTL` never promise more than the lock holds: the drift padding added to the
/// master's `PX` at acquire time is taken off again. Negative answers (`-1` no expiry,
/// `-2` no key) are passed through. `unit_ms` is 1 for `PTTL`, 1000 for `TTL`.
pub fn conservative_ttl(reply: Reply, unit_ms: u64, drift_factor: f64) -> Reply {
    match reply {
        Reply::Integer(t) if t > 0 => {
            // A master's absurd TTL (fuzzing found `t × 1000` overflowing) saturates.
            let ms = (t as u64).saturating_mul(unit_ms);
            let drift = drift_ms(ms, drift_factor);
            let kept = ms.saturating_sub(drift) / unit_ms;
            Reply::Integer(kept as i64)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use AcquireDecision::*;

    fn ok() -> Vote {
        Vote::Replied(Reply::ok())
    }
    fn null() -> Vote {
        Vote::Replied(Reply::Null)
    }
    fn arr_reply(items: &[i64]) -> Reply {
        Reply::Array(items.iter().map(|i| Reply::Integer(*i)).collect())
    }
    fn arr(items: &[i64]) -> Vote {
        Vote::Replied(arr_reply(items))
    }
    fn int(i: i64) -> Vote {
        Vote::Replied(Reply::Integer(i))
    }
    fn bulk(s: &'static str) -> Vote {
        Vote::Replied(Reply::Bulk(Bytes::from_static(s.as_bytes())))
    }
    fn err(s: &str) -> Vote {
        Vote::Replied(Reply::error(s))
    }
    use Vote::Pending as P;
    const M: Vote = Vote::Missing(MissingReason::Timeout);

    #[test]
    fn token_rules_order_tokens_across_lost_counters() {
        let rules = TokenRules::for_lease_bound(Duration::from_millis(60_604));
        assert_eq!(rules.window_ms, 15_150);
        assert_eq!(rules.counter_life_ms, 60_604);
        assert_eq!(
            rules.accepted_clocks_ms(1_000_000_999),
            (1_000_000 - 15_150, 1_000_000 + 15_150)
        );
        // A counter lost (expired, or wiped then quarantined for the bound): the next token a
        // master accepts is at least `life − window − 1 ms` later than the clock it accepted
        // the last one at, which was at most `window + 1 ms` behind: strictly above it.
        for bound_ms in [3, 4, 5, 100, 1_515, 60_604] {
            let r = TokenRules::for_lease_bound(Duration::from_millis(bound_ms));
            assert!(
                r.counter_life_ms > 2 * (r.window_ms + 1),
                "{bound_ms}: {r:?}"
            );
        }
    }

    #[test]
    fn token_proposals_and_refusals() {
        // (clocks, masters, last, proposal)
        let cases: &[(&[u64], usize, u64, u64)] = &[
            (&[1_000, 1_500, 1_200], 3, 0, 1_200),
            // One master 40 s ahead (a forward step): the others' clocks decide.
            (&[1_000, 40_001_000, 1_100], 3, 0, 1_100),
            (&[1_000, 1_500, 1_200, 1_400, 1_300], 5, 0, 1_300),
            // Fewer readings than a quorum: the highest.
            (&[1_000, 1_500], 5, 0, 1_500),
            (&[1_000, 1_500], 3, 1_500, 1_501),
            (&[1_000], 3, 9_000, 9_001),
            (&[], 3, 0, 1),
        ];
        for (clocks, masters, last, expected) in cases {
            let mut clocks = clocks.to_vec();
            assert_eq!(
                propose_token(quorum_clock(&mut clocks, *masters), *last),
                *expected,
                "{clocks:?}"
            );
        }
        let stale = |code: i64, n: i64| {
            Vote::Replied(Reply::Array(vec![Reply::Integer(code), Reply::Integer(n)]))
        };
        let votes = vec![
            ok(),
            stale(-4, 700),
            stale(-3, 900),
            null(),
            M,
            stale(-5, 10_000),
        ];
        assert_eq!(refused_token(&votes[1]), Some(700));
        assert_eq!(refused_token(&votes[5]), None);
        assert_eq!(token_floor(&votes), Some(900));
        assert_eq!(token_floor(&[ok(), null(), M]), None);
        // A refused token is a "no" for the acquire decision.
        assert_eq!(
            acquire_decision(&[ok(), stale(-4, 1), stale(-4, 1)]),
            Refused
        );
    }

    #[test]
    fn quorum_sizes() {
        for (n, q) in [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (7, 4)] {
            assert_eq!(quorum(n), q, "n={n}");
        }
    }

    #[test]
    fn drift_and_padding() {
        assert_eq!(drift_ms(30_000, 0.01), 302);
        assert_eq!(backend_ttl_ms(30_000, 0.01), 30_302);
        assert_eq!(drift_ms(1, 0.01), 3);
        assert_eq!(
            validity_window(30_000, 0.01),
            Some(Duration::from_millis(29_698))
        );
        assert_eq!(validity_window(3, 0.01), None);
        assert_eq!(validity_window(2, 0.0), None);
    }

    #[test]
    fn acquire_decisions() {
        let cases: Vec<(Vec<Vote>, AcquireDecision)> = vec![
            (vec![ok(), ok(), ok(), P, P], Quorum),
            (vec![ok(), ok(), P, P, P], Undecided),
            (vec![null(), null(), null(), P, P], Refused),
            (vec![ok(), ok(), null(), null(), P], Undecided),
            (vec![ok(), ok(), null(), null(), M], Refused),
            (vec![M, M, M, P, P], Refused),
            (vec![ok(), err("OOM x"), M, ok(), ok()], Quorum),
            (vec![ok()], Quorum),
            (vec![M], Refused),
            (vec![ok(), null(), P], Undecided),
            (vec![ok(), ok(), P], Quorum),
        ];
        for (votes, expected) in cases {
            assert_eq!(acquire_decision(&votes), expected, "{votes:?}");
        }
    }

    #[test]
    fn a_null_grant_needs_q_nulls_and_answers_what_a_majority_holds() {
        let granted = |r: &Reply| *r == Reply::Null;
        let cases: Vec<(Vec<Vote>, AcquireDecision)> = vec![
            (vec![null(), null(), int(500)], Quorum),
            (vec![null(), null(), P], Quorum),
            (vec![null(), int(500), P], Undecided),
            (vec![null(), int(500), int(400)], Refused),
            (vec![null(), int(500), M], Refused),
            // A minority's null is no grant, nor an error or an unarmed master's reply.
            (vec![null(), null(), int(9), M, err("ERR x")], Refused),
            (vec![null(), null(), null(), M, M], Quorum),
            (vec![ok(), ok(), ok()], Refused),
        ];
        for (votes, expected) in cases {
            assert_eq!(grant_decision(&votes, granted), expected, "{votes:?}");
        }
        // The Q-th largest PTTL, less the padding (drift of 1 % + 2 ms) as PTTL answers it.
        let held = |votes: &[Vote]| held_pttl(votes, 0.01);
        assert_eq!(
            held(&[null(), int(10_102), int(9_000)]),
            Some(Reply::Integer(8_908))
        );
        assert_eq!(
            held(&[int(10_102), int(10_101), int(1)]),
            Some(Reply::Integer(9_997))
        );
        assert_eq!(held(&[null(), int(10_102), M]), None);
        assert_eq!(held(&[null(), null(), int(5), int(5), M]), None);
        assert_eq!(held(&[int(0), int(0), M]), Some(Reply::Integer(0)));
    }

    #[test]
    fn held_by_majority_needs_q_nulls() {
        assert!(held_by_majority(&[null(), null(), null(), P, P]));
        assert!(!held_by_majority(&[null(), null(), M, M, M]));
        assert!(!held_by_majority(&[null(), null(), ok(), ok(), ok()]));
        assert!(held_by_majority(&[null()]));
    }

    #[test]
    fn majority_unreachable_needs_more_than_n_minus_q_missing() {
        assert!(majority_unreachable(&[M, M, M, ok(), ok()]));
        assert!(!majority_unreachable(&[M, M, P, ok(), ok()]));
        assert!(!majority_unreachable(&[M, M, null(), null(), null()]));
        assert!(majority_unreachable(&[M]));
    }

    #[test]
    fn rollback_targets() {
        assert!(may_hold_our_value(&ok()));
        assert!(may_hold_our_value(&P));
        assert!(may_hold_our_value(&M));
        assert!(!may_hold_our_value(&null()));
        assert!(may_hold_our_value(&Vote::Replied(CLOCK_AHEAD)));
        assert!(!may_hold_our_value(&Vote::Replied(Reply::Integer(-1))));
        assert!(!may_hold_our_value(&err("ERR x")));
    }

    #[test]
    fn merge_rule() {
        let noq = Some(no_quorum(5));
        let cases: Vec<(Vec<Vote>, Option<Reply>)> = vec![
            // same reply from Q masters wins, even before the rest answered
            (
                vec![bulk("v"), bulk("v"), bulk("v"), P, P],
                Some(Reply::Bulk("v".into())),
            ),
            (vec![ok(), ok(), M, ok(), err("ERR x")], Some(Reply::ok())),
            // not yet decidable
            (vec![int(1), int(0), int(1), P, P], None),
            // integers: the Q-th largest
            (
                vec![int(1), int(1), int(0), int(0), int(1)],
                Some(Reply::Integer(1)),
            ),
            (
                vec![int(1), int(1), int(0), int(0), M],
                Some(Reply::Integer(0)),
            ),
            (
                vec![int(29_000), int(28_000), int(30_000), M, M],
                Some(Reply::Integer(28_000)),
            ),
            (
                vec![int(0), int(0), int(1), int(1), M],
                Some(Reply::Integer(0)),
            ),
            (
                vec![int(-2), int(5000), int(-2), int(5000), int(4000)],
                Some(Reply::Integer(4000)),
            ),
            // mix of one value and null: null
            (
                vec![bulk("v"), bulk("v"), null(), null(), M],
                Some(Reply::Null),
            ),
            (vec![bulk("v"), null(), M, M, M], noq.clone()),
            // two different values: no quorum
            (vec![bulk("v"), bulk("w"), null(), null(), M], noq.clone()),
            // errors never turn into null
            (
                vec![err("ERR a"), null(), null(), err("ERR a"), M],
                noq.clone(),
            ),
            (vec![M, M, M, M, M], noq),
            (
                vec![err("WRONGTYPE x"); 3],
                Some(Reply::error("WRONGTYPE x")),
            ),
            (vec![int(7)], Some(Reply::Integer(7))),
        ];
        for (votes, expected) in cases {
            assert_eq!(merge(&votes, MergeRule::Known), expected, "{votes:?}");
        }
    }

    #[test]
    fn identical_answers_what_a_majority_holds_and_never_a_blend() {
        let noq = Some(no_quorum(3));
        let cases: Vec<(Vec<Vote>, Option<Reply>)> = vec![
            (vec![int(7), int(7), M], Some(Reply::Integer(7))),
            (vec![int(7), int(7), int(5)], Some(Reply::Integer(7))),
            (vec![int(7), null(), null()], Some(Reply::Null)),
            // Tokens of different runs: null, not the Q-th largest (Known's 5) nor a median.
            (vec![int(7), int(5), int(9)], Some(Reply::Null)),
            (vec![int(7), int(5), M], Some(Reply::Null)),
            (vec![int(7), M, M], noq.clone()),
            (vec![int(7), err("ERR x"), M], noq),
            (vec![int(7), Vote::Pending, int(5)], None),
        ];
        for (votes, expected) in cases {
            assert_eq!(merge(&votes, MergeRule::Identical), expected, "{votes:?}");
        }
    }

    #[test]
    fn release_counts_fenced_masters_toward_the_majority() {
        use Vote::Fenced as F;
        let noq = Some(no_quorum(5));
        let cases: Vec<(Vec<Vote>, Option<Reply>)> = vec![
            // rolling restarts: the holder's value on 2, one master fenced, two unreachable
            (vec![int(1), int(1), F, M, M], Some(Reply::Integer(1))),
            (vec![int(1), F, F, M, M], Some(Reply::Integer(1))),
            // a majority says the value was not there
            (
                vec![int(0), int(0), int(0), F, int(1)],
                Some(Reply::Integer(0)),
            ),
            // nobody vouches for the value: fenced masters alone prove nothing
            (vec![F, F, F, int(0), M], noq.clone()),
            // unreachable is not fenced
            (vec![int(1), int(1), M, M, M], noq),
            (vec![int(1), int(1), int(0), F, M], Some(Reply::Integer(1))),
        ];
        for (votes, expected) in cases {
            assert_eq!(merge(&votes, MergeRule::Release), expected, "{votes:?}");
        }
    }

    #[test]
    fn strict_merge_never_answers_what_a_minority_said() {
        let noq = Some(no_quorum(3));
        let cases: Vec<(Vec<Vote>, Option<Reply>)> = vec![
            // Redisson's acquire: null = taken, PTTL = held by another. Held on B and C, C
            // silent: one null is not a grant.
            (vec![null(), int(29_000), M], noq.clone()),
            (vec![null(), null(), M], Some(Reply::Null)),
            (vec![int(1), int(0), M], noq.clone()),
            (vec![int(1), int(1), int(0)], Some(Reply::Integer(1))),
            (vec![int(1), int(0), P], None),
            (vec![bulk("v"), null(), null()], Some(Reply::Null)),
            (vec![M, M, M], noq.clone()),
            // PTTLs a few ms apart: the median, a majority at or above it and at or below it
            (
                vec![int(29_990), int(29_996), int(29_993)],
                Some(Reply::Integer(29_993)),
            ),
            (vec![int(29_990), int(29_996), M], noq.clone()),
            (vec![int(29_990), int(29_996), null()], noq.clone()),
            (vec![int(1), int(0), err("ERR x")], noq),
        ];
        for (votes, expected) in cases {
            assert_eq!(merge(&votes, MergeRule::Strict), expected, "{votes:?}");
        }
        let noq = Some(no_quorum(5));
        let cases: Vec<(Vec<Vote>, Option<Reply>)> = vec![
            (
                vec![int(5), int(3), int(4), int(1), int(2)],
                Some(Reply::Integer(3)),
            ),
            // the middle two of four agree: 3 masters ≥ 3 and 3 masters ≤ 3
            (
                vec![int(5), int(3), int(3), int(1), M],
                Some(Reply::Integer(3)),
            ),
            (vec![int(5), int(4), int(3), int(1), M], noq.clone()),
            // Redisson: one null (taken) among PTTLs (held) is no answer either way
            (vec![null(), int(9), int(8), int(7), M], noq.clone()),
            (vec![null(), null(), int(8), int(7), int(6)], noq.clone()),
            // `{1, pttl}` (redlock-universal's extend): element by element
            (
                vec![
                    arr(&[1, 29_990]),
                    arr(&[1, 29_996]),
                    arr(&[1, 29_993]),
                    arr(&[1, 29_991]),
                    arr(&[1, 29_995]),
                ],
                Some(arr_reply(&[1, 29_993])),
            ),
            (
                vec![
                    arr(&[1, 29_990]),
                    arr(&[0, 29_996]),
                    arr(&[1, 29_993]),
                    arr(&[1, 29_993]),
                    M,
                ],
                Some(arr_reply(&[1, 29_993])),
            ),
            // three of five PTTLs a few ms apart: no majority at or below the middle one
            (
                vec![
                    arr(&[1, 29_990]),
                    arr(&[1, 29_996]),
                    arr(&[1, 29_993]),
                    M,
                    M,
                ],
                noq.clone(),
            ),
            (
                vec![arr(&[1, 29_990]), arr(&[1, 29_996]), M, M, M],
                noq.clone(),
            ),
            (
                vec![arr(&[1, 5]), arr(&[1, 6]), arr(&[1]), null(), M],
                noq.clone(),
            ),
            (
                vec![arr(&[1, 5]), arr(&[2, 6]), arr(&[3, 7]), arr(&[4, 8]), M],
                noq,
            ),
        ];
        for (votes, expected) in cases {
            assert_eq!(merge(&votes, MergeRule::Strict), expected, "{votes:?}");
        }
    }

    #[test]
    fn ttl_answers_never_exceed_the_lease() {
        let cases = [
            (30_302, 1, 29_996),
            (-2, 1, -2),
            (-1, 1, -1),
            (0, 1, 0),
            (1, 1, 0),
            (30, 1000, 29),
            (1, 1000, 0),
            // Saturates instead of overflowing, and still never exceeds the master's answer.
            (i64::MAX, 1000, 18_262_276_632_972_456),
            (i64::MAX, 1, 9_131_138_316_486_228_045),
        ];
        for (raw, unit, expected) in cases {
            assert_eq!(
                conservative_ttl(Reply::Integer(raw), unit, 0.01),
                Reply::Integer(expected),
                "{raw} unit {unit}"
            );
        }
    }
}
