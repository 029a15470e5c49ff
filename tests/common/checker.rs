//! Mutual-exclusion checker over a lock history recorded by clients of the proxy.
//!
//! Every time is nanoseconds on one process-wide monotonic clock ([`super::workload::now_ns`]).
//! A client that received `OK` may act on the resource from the moment the reply arrived until it
//! sends its release, and never later than its send time + TTL (a Redlock client counts the TTL
//! from when it *sent* the acquire; the proxy's contract covers exactly that). Two such hold
//! windows on one key must never overlap.
//!
//! Why this cannot report a false violation against a correct proxy: a second `OK` needs a
//! majority of masters without the first value. The first value leaves a master only by the
//! first client's release (sent after `t_release_sent` was taken), by expiry (the masters were
//! asked for `PX = TTL + drift`, set no earlier than `t_send`), or by a fault the proxy must
//! account for (restart, data loss).

use std::collections::BTreeMap;
use std::fmt;

/// One `OK` as seen by the client that received it.
#[derive(Clone, Debug)]
pub struct Hold {
    pub key: String,
    pub token: String,
    pub worker: usize,
    /// Which proxy instance granted it (index into the workload's ports).
    pub proxy: usize,
    pub ttl_ms: u64,
    /// Just before the `SET … NX PX` was written.
    pub t_send: u64,
    /// When the `OK` was read.
    pub t_ok: u64,
    /// Just before the release was written; `None` if the client let the lock expire.
    pub t_release_sent: Option<u64>,
}

impl Hold {
    /// The window in which the client may act: `[t_ok, min(t_release_sent, t_send + TTL))`.
    pub fn window(&self) -> (u64, u64) {
        let lease_end = self.t_send + self.ttl_ms * 1_000_000;
        let end = self.t_release_sent.map_or(lease_end, |r| r.min(lease_end));
        (self.t_ok, end)
    }

    /// An `OK` that arrived after the lease already ended gives no window (a correct client
    /// does not act on it).
    pub fn usable(&self) -> bool {
        let (start, end) = self.window();
        start < end
    }
}

/// Two holds of one key whose windows overlap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// Indexes into the checked slice; `first` started earlier.
    pub first: usize,
    pub second: usize,
    pub overlap_ns: u64,
}

/// Every pair of holds of the same key whose windows overlap (touching ends do not overlap).
pub fn overlaps(holds: &[Hold]) -> Vec<Overlap> {
    let mut by_key: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, h) in holds.iter().enumerate() {
        if h.usable() {
            by_key.entry(h.key.as_str()).or_default().push(i);
        }
    }
    let mut out = Vec::new();
    for (_, mut idx) in by_key {
        idx.sort_by_key(|&i| holds[i].window());
        // Windows still open at the start of the current one.
        let mut open: Vec<(usize, u64)> = Vec::new();
        for i in idx {
            let (start, end) = holds[i].window();
            open.retain(|&(_, e)| e > start);
            for &(j, e) in &open {
                out.push(Overlap {
                    first: j,
                    second: i,
                    overlap_ns: e.min(end) - start,
                });
            }
            open.push((i, end));
        }
    }
    out
}

/// Tokens must be unique per key, or the compare-and-delete release proves nothing.
pub fn duplicate_tokens(holds: &[Hold]) -> usize {
    let mut seen = std::collections::HashSet::new();
    holds
        .iter()
        .filter(|h| !seen.insert((h.key.as_str(), h.token.as_str())))
        .count()
}

/// The verdict on one history.
#[derive(Debug, Default)]
pub struct Report {
    pub grants: usize,
    /// Grants whose `OK` arrived after send + TTL (not usable, not checked for overlap).
    pub unusable: usize,
    pub refusals: u64,
    /// Error replies to acquires, by text.
    pub errors: BTreeMap<String, u64>,
    /// Acquires with no reply within the client's limit.
    pub timeouts: u64,
    pub duplicate_tokens: usize,
    pub violations: Vec<Overlap>,
    /// The holds involved, for the report.
    pub holds: Vec<Hold>,
    /// Longest acquire reply time (ms), and the longest one that was an `OK`.
    pub max_reply_ms: f64,
    pub max_grant_ms: f64,
}

impl Report {
    pub fn new(
        holds: Vec<Hold>,
        refusals: u64,
        errors: BTreeMap<String, u64>,
        timeouts: u64,
        max_reply_ms: f64,
    ) -> Report {
        let violations = overlaps(&holds);
        let max_grant_ms = holds
            .iter()
            .map(|h| (h.t_ok - h.t_send) as f64 / 1e6)
            .fold(0.0, f64::max);
        Report {
            grants: holds.len(),
            unusable: holds.iter().filter(|h| !h.usable()).count(),
            refusals,
            errors,
            timeouts,
            duplicate_tokens: duplicate_tokens(&holds),
            violations,
            holds,
            max_reply_ms,
            max_grant_ms,
        }
    }

    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "grants={} (unusable {}) refusals={} errors={} timeouts={} violations={} \
             duplicate_tokens={} max_reply={:.1}ms max_grant={:.1}ms",
            self.grants,
            self.unusable,
            self.refusals,
            self.error_count(),
            self.timeouts,
            self.violations.len(),
            self.duplicate_tokens,
            self.max_reply_ms,
            self.max_grant_ms,
        )?;
        for (text, n) in &self.errors {
            write!(f, "\n  error {n}× {text}")?;
        }
        for v in self.violations.iter().take(10) {
            let (a, b) = (&self.holds[v.first], &self.holds[v.second]);
            let show = |h: &Hold| {
                let (s, e) = h.window();
                format!(
                    "{} w{} p{} send={:.3} ok={:.3} end={:.3} released={}",
                    h.token,
                    h.worker,
                    h.proxy,
                    ms(h.t_send),
                    ms(s),
                    ms(e),
                    h.t_release_sent.is_some()
                )
            };
            write!(
                f,
                "\n  OVERLAP {:.3} ms on {}:\n    {}\n    {}",
                ms(v.overlap_ns),
                a.key,
                show(a),
                show(b)
            )?;
        }
        if self.violations.len() > 10 {
            write!(f, "\n  … {} more", self.violations.len() - 10)?;
        }
        Ok(())
    }
}
