//! What the acquire service counts ([`LockStats`]): acquires by result, their duration from
//! the read of the request to the decision, rollbacks and late clean-ups. Plain atomic
//! counters and one histogram, resolved at start-up; exported by [`crate::ops`].

use crate::masters::latency_buckets;
use crate::protocol::Reply;
use crate::redlock::{quorum, MissingReason, Vote};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// How an acquire ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireResult {
    /// A quorum set the key within the validity window.
    Granted,
    /// A majority said the key is held.
    Contended,
    /// Too few masters answered.
    NoQuorum,
    /// The validity window ran out (or could never open: drift alone exceeds the TTL).
    Expired,
    /// Refused by a rule before reaching the masters (TTL cap, a lock without expiry, …), or
    /// refused for another reason (split votes, error replies).
    Refused,
    /// Not admitted in time (the proxy is over its admission limit): no master was asked, and
    /// the client is told to retry (`TRYAGAIN`), never null.
    Overloaded,
}

impl AcquireResult {
    pub const ALL: [AcquireResult; 6] = [
        AcquireResult::Granted,
        AcquireResult::Contended,
        AcquireResult::NoQuorum,
        AcquireResult::Expired,
        AcquireResult::Refused,
        AcquireResult::Overloaded,
    ];

    pub fn label(self) -> &'static str {
        match self {
            AcquireResult::Granted => "granted",
            AcquireResult::Contended => "contended",
            AcquireResult::NoQuorum => "no_quorum",
            AcquireResult::Expired => "expired",
            AcquireResult::Refused => "refused",
            AcquireResult::Overloaded => "overloaded",
        }
    }
}

/// The acquire service's counters.
#[derive(Debug)]
pub struct LockStats {
    acquires: [Counter; 6],
    /// Read of the request to its decision, in seconds.
    pub acquire_duration: Histogram,
    /// Clean-ups of refused or ungiven acquires.
    pub rollbacks: Counter,
    /// Clean-ups sent again once a master that never answered is surely past the deadline.
    pub late_cleanups: Counter,
    /// The last acquire decided at the masters found too few of them answering.
    lacking_quorum: AtomicBool,
    /// What the quorum log lines said last (see [`QuorumLog`]).
    quorum_log: Mutex<QuorumLog>,
}

/// The shortest time between two "refused for lack of a quorum" lines: an overloaded proxy
/// whose masters time out now and then flaps between refusing and granting many times a
/// second (a benchmark over 5 masters on 2 CPUs logged 151 warnings in 13 s).
const QUORUM_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// What a refused acquire's votes were, for the quorum log line: how many masters took the key
/// against the quorum, then each other kind of vote counted, so that the line says why (a
/// master that timed out is slow or cut off; one not eligible is judged unsafe or quarantined)
/// rather than how many masters are usable, which can be all of them.
pub fn votes_summary(votes: &[Vote]) -> String {
    const KINDS: [&str; 10] = [
        "took the key",
        "held by another",
        "refused by the master's script",
        "no reply within the node timeout",
        "connection closed before the reply",
        "no connection",
        "not eligible to vote",
        "unconfirmed by WAIT",
        "quarantined",
        "still pending",
    ];
    let mut counts = [0usize; KINDS.len()];
    for vote in votes {
        let kind = match vote {
            Vote::Replied(Reply::Simple(ok)) if ok.as_ref() == b"OK" => 0,
            Vote::Replied(Reply::Null) => 1,
            Vote::Replied(_) => 2,
            Vote::Missing(MissingReason::Timeout) => 3,
            Vote::Missing(MissingReason::Closed) => 4,
            Vote::Missing(MissingReason::NoLink) => 5,
            Vote::Missing(MissingReason::NotEligible) => 6,
            Vote::Missing(MissingReason::Unconfirmed) => 7,
            Vote::Fenced => 8,
            Vote::Pending => 9,
        };
        counts[kind] += 1;
    }
    let others: Vec<String> = (1..KINDS.len())
        .filter(|&k| counts[k] > 0)
        .map(|k| format!("{} {}", counts[k], KINDS[k]))
        .collect();
    format!(
        "{} of {} masters {}, quorum {}; {}",
        counts[0],
        votes.len(),
        KINDS[0],
        quorum(votes.len()),
        others.join(", ")
    )
}

/// The quorum log lines: a warning when acquires start being refused for lack of a quorum, and
/// a line when they resume, at most one warning per [`QUORUM_LOG_INTERVAL`]; the episodes in
/// between are counted and told with the next warning, and their resumptions not logged.
#[derive(Debug, Default)]
struct QuorumLog {
    last_warning: Option<Instant>,
    /// Episodes not logged since the last warning.
    untold: u64,
    /// Whether the current episode was told (so its end is told too).
    told: bool,
}

/// One quorum log line to write.
#[derive(Debug, PartialEq, Eq)]
enum QuorumLine {
    /// Refused; `earlier`: episodes since the last warning that were not logged.
    Refusing {
        earlier: u64,
    },
    Resumed,
}

impl QuorumLog {
    /// The line for a change to `lacking` at `now`, if one is due.
    fn change(&mut self, lacking: bool, now: Instant) -> Option<QuorumLine> {
        if !lacking {
            return std::mem::take(&mut self.told).then_some(QuorumLine::Resumed);
        }
        let due = self
            .last_warning
            .is_none_or(|last| now.duration_since(last) >= QUORUM_LOG_INTERVAL);
        if !due {
            self.untold += 1;
            return None;
        }
        self.last_warning = Some(now);
        self.told = true;
        Some(QuorumLine::Refusing {
            earlier: std::mem::take(&mut self.untold),
        })
    }
}

impl Default for LockStats {
    fn default() -> Self {
        LockStats {
            acquires: Default::default(),
            acquire_duration: Histogram::new(latency_buckets()),
            rollbacks: Counter::default(),
            late_cleanups: Counter::default(),
            lacking_quorum: AtomicBool::new(false),
            quorum_log: Mutex::default(),
        }
    }
}

impl LockStats {
    /// Counts an acquire read at `received_at` and decided now.
    pub fn record(&self, result: AcquireResult, received_at: Instant) {
        self.acquires[result as usize].inc();
        self.acquire_duration
            .observe(received_at.elapsed().as_secs_f64());
    }

    /// Logs when acquires start being refused for lack of a quorum, and when a majority
    /// answers them again (`summary`: the masters usable now), at most one warning a second
    /// ([`QuorumLog`]).
    pub fn note_quorum(&self, result: AcquireResult, summary: impl FnOnce() -> String) {
        let lacking = result == AcquireResult::NoQuorum;
        // Read first: every acquire comes here, and a write each time would bounce the line
        // between shards' threads.
        if self.lacking_quorum.load(Ordering::Relaxed) == lacking
            || self.lacking_quorum.swap(lacking, Ordering::Relaxed) == lacking
        {
            return;
        }
        let line = match self.quorum_log.lock() {
            Ok(mut log) => log.change(lacking, Instant::now()),
            Err(_) => return,
        };
        match line {
            None => {}
            Some(QuorumLine::Refusing { earlier: 0 }) => tracing::warn!(
                "acquires are refused for lack of a quorum: {}; see INFO masters",
                summary()
            ),
            Some(QuorumLine::Refusing { earlier }) => tracing::warn!(
                "acquires are refused for lack of a quorum: {}; see INFO masters ({earlier} more such episodes since the last report, each shorter than a second)",
                summary()
            ),
            Some(QuorumLine::Resumed) => tracing::info!(
                "acquires resume: a quorum of masters answers again ({})",
                summary()
            ),
        }
    }

    /// Counts an acquire refused by rule before it reached the masters.
    pub fn refused_by_rule(&self) {
        self.acquires[AcquireResult::Refused as usize].inc();
    }

    pub fn acquires(&self, result: AcquireResult) -> u64 {
        self.acquires[result as usize].get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_told_by_its_votes_not_by_the_masters_usable() {
        let ok = Vote::Replied(Reply::simple("OK"));
        let timeout = Vote::Missing(MissingReason::Timeout);
        let cases = [
            (
                vec![ok.clone(), timeout.clone(), timeout.clone(), Vote::Fenced, ok.clone()],
                "2 of 5 masters took the key, quorum 3; 2 no reply within the node timeout, 1 quarantined",
            ),
            (
                vec![Vote::Replied(Reply::Integer(-2)), Vote::Missing(MissingReason::Closed), Vote::Missing(MissingReason::NotEligible)],
                "0 of 3 masters took the key, quorum 2; 1 refused by the master's script, 1 connection closed before the reply, 1 not eligible to vote",
            ),
        ];
        for (votes, said) in cases {
            assert_eq!(votes_summary(&votes), said);
        }
    }

    #[test]
    fn quorum_warnings_are_at_most_one_a_second_and_count_the_episodes_between() {
        let mut log = QuorumLog::default();
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let refusing = |earlier| Some(QuorumLine::Refusing { earlier });
        // (ms, lacking): the line due.
        let steps = [
            (0, true, refusing(0)),
            (10, false, Some(QuorumLine::Resumed)),
            // Flapping within the second: counted, and neither start nor end logged.
            (20, true, None),
            (30, false, None),
            (500, true, None),
            (510, false, None),
            // A second after the last warning: told, with the two episodes in between.
            (1_000, true, refusing(2)),
            (1_200, false, Some(QuorumLine::Resumed)),
            (5_000, true, refusing(0)),
            (5_001, false, Some(QuorumLine::Resumed)),
        ];
        for (ms, lacking, expected) in steps {
            assert_eq!(log.change(lacking, at(ms)), expected, "at {ms} ms");
        }
    }
}
