//! What the acquire service counts ([`LockStats`]): acquires by result, their duration from
//! the read of the request to the decision, rollbacks and late clean-ups. Plain atomic
//! counters and one histogram, resolved at start-up; exported by [`crate::ops`].

use crate::masters::latency_buckets;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use std::sync::atomic::{AtomicBool, Ordering};
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
}

impl AcquireResult {
    pub const ALL: [AcquireResult; 5] = [
        AcquireResult::Granted,
        AcquireResult::Contended,
        AcquireResult::NoQuorum,
        AcquireResult::Expired,
        AcquireResult::Refused,
    ];

    pub fn label(self) -> &'static str {
        match self {
            AcquireResult::Granted => "granted",
            AcquireResult::Contended => "contended",
            AcquireResult::NoQuorum => "no_quorum",
            AcquireResult::Expired => "expired",
            AcquireResult::Refused => "refused",
        }
    }
}

/// The acquire service's counters.
#[derive(Debug)]
pub struct LockStats {
    acquires: [Counter; 5],
    /// Read of the request to its decision, in seconds.
    pub acquire_duration: Histogram,
    /// Clean-ups of refused or ungiven acquires.
    pub rollbacks: Counter,
    /// Clean-ups sent again once a master that never answered is surely past the deadline.
    pub late_cleanups: Counter,
    /// The last acquire decided at the masters found too few of them answering.
    lacking_quorum: AtomicBool,
}

impl Default for LockStats {
    fn default() -> Self {
        LockStats {
            acquires: Default::default(),
            acquire_duration: Histogram::new(latency_buckets()),
            rollbacks: Counter::default(),
            late_cleanups: Counter::default(),
            lacking_quorum: AtomicBool::new(false),
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

    /// Logs once when acquires start being refused for lack of a quorum, and once when a
    /// majority answers them again (`summary`: the masters usable now).
    pub fn note_quorum(&self, result: AcquireResult, summary: impl FnOnce() -> String) {
        let lacking = result == AcquireResult::NoQuorum;
        // Read first: every acquire comes here, and a write each time would bounce the line
        // between shards' threads.
        if self.lacking_quorum.load(Ordering::Relaxed) == lacking
            || self.lacking_quorum.swap(lacking, Ordering::Relaxed) == lacking
        {
            return;
        }
        match lacking {
            true => tracing::warn!(
                "acquires are refused for lack of a quorum: {}; see INFO masters",
                summary()
            ),
            false => tracing::info!(
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
