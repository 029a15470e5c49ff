//! Mutual-exclusion checker over a lock history recorded by clients of the proxy, and its
//! generalisation to semaphores: at most L holders of one key at once ([`crowds`]).
//!
//! Every time is nanoseconds on one process-wide monotonic clock ([`crate::workload::now_ns`]).
//! A client that received `OK` may act on the resource from the moment the reply arrived until it
//! sends its release, and never later than its send time + TTL (a Redlock client counts the TTL
//! from when it *sent* the acquire; the proxy's contract covers exactly that). A successful
//! extend (`:1` to a compare-then-`PEXPIRE` lease script) moves that end to the extend's send
//! time + TTL; a refused or failed extend moves nothing. Two such hold windows on one key must
//! never overlap.
//!
//! An `OK` read after its lease already ended (send time + TTL) is a *late OK*: a correct
//! client does not act on it, so it has no window, but it is counted ([`Report::late_oks`]): the
//! proxy promises an `OK` only while `received_at + TTL − drift` is in the future, and it read
//! the request after the client sent it, so an `OK` read after send + TTL means the proxy's
//! validity re-check let a useless grant through (or the reader was stalled for at least the
//! drift). `OK`s read between send + TTL − drift and send + TTL can be legitimate (the proxy
//! measures from its own, later, read of the request) and are reported apart, for
//! information ([`Report::oks_past_validity`]).
//!
//! Why this cannot report a false violation against a correct proxy: a second `OK` needs a
//! majority of masters without the first value. The first value leaves a master only by the
//! first client's release (sent after `t_release_sent` was taken), by expiry (the masters were
//! asked for `PX = TTL + drift`, set no earlier than `t_send`), or by a fault the proxy must
//! account for (restart, data loss).

use std::collections::BTreeMap;
use std::fmt;

/// The drift allowance the proxy applies to a lease of `ttl_ms` (its default drift factor).
pub fn drift_ns(ttl_ms: u64) -> u64 {
    redlock_proxy::drift_ms(ttl_ms, 0.01) * 1_000_000
}

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
    /// Just before the last *successful* extend (same TTL) was written; `None` if the holder
    /// never extended, or every extend it sent was refused or failed.
    pub t_extend_sent: Option<u64>,
    /// The fencing token, for a grant taken with `LOCK.ACQUIRE`.
    pub fence: Option<u64>,
}

impl Hold {
    /// Where the lease ends: `max(t_send, t_extend_sent) + TTL`.
    pub fn lease_end(&self) -> u64 {
        self.t_send.max(self.t_extend_sent.unwrap_or(0)) + self.ttl_ms * 1_000_000
    }

    /// The window in which the client may act: `[t_ok, min(t_release_sent, lease end))`.
    pub fn window(&self) -> (u64, u64) {
        let lease_end = self.lease_end();
        let end = self.t_release_sent.map_or(lease_end, |r| r.min(lease_end));
        (self.t_ok, end)
    }

    /// An `OK` that arrived after the lease already ended gives no window (a correct client
    /// does not act on it).
    pub fn usable(&self) -> bool {
        let (start, end) = self.window();
        start < end
    }

    /// The `OK` was read after send + TTL: late (see the module documentation).
    pub fn late(&self) -> bool {
        self.t_ok > self.t_send + self.ttl_ms * 1_000_000
    }

    /// The `OK` was read after send + TTL − drift but not late: possibly legitimate.
    pub fn past_validity(&self) -> bool {
        !self.late()
            && self.t_ok
                > (self.t_send + self.ttl_ms * 1_000_000).saturating_sub(drift_ns(self.ttl_ms))
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

/// Every pair of holds of the same key whose windows overlap (touching ends do not overlap):
/// [`crowds`] with a limit of 1, the lock's mutual exclusion.
pub fn overlaps(holds: &[Hold]) -> Vec<Overlap> {
    crowds(holds, 1)
}

/// Where more than `limit` holds of one key were open at once (a semaphore of `limit` permits;
/// touching ends do not overlap): each window that starts while `limit` or more windows of its
/// key are open is reported with each of them (`first` the open one, `second` the new one).
pub fn crowds(holds: &[Hold], limit: usize) -> Vec<Overlap> {
    let mut out = Vec::new();
    sweep(holds, |open, i, (start, end)| {
        if open.len() >= limit {
            for &(j, e) in open {
                out.push(Overlap {
                    first: j,
                    second: i,
                    overlap_ns: e.min(end) - start,
                });
            }
        }
    });
    out
}

/// The most holds of one key that were open at once (0 without a usable hold).
pub fn max_holders(holds: &[Hold]) -> usize {
    let mut most = 0;
    sweep(holds, |open, _, _| most = most.max(open.len() + 1));
    most
}

/// Visits every usable window, key by key in start order, with the windows of its key still
/// open when it starts (index, end), before it joins them.
fn sweep(holds: &[Hold], mut visit: impl FnMut(&[(usize, u64)], usize, (u64, u64))) {
    let mut by_key: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, h) in holds.iter().enumerate() {
        if h.usable() {
            by_key.entry(h.key.as_str()).or_default().push(i);
        }
    }
    for (_, mut idx) in by_key {
        idx.sort_by_key(|&i| holds[i].window());
        // Windows still open at the start of the current one.
        let mut open: Vec<(usize, u64)> = Vec::new();
        for i in idx {
            let (start, end) = holds[i].window();
            open.retain(|&(_, e)| e > start);
            visit(&open, i, (start, end));
            open.push((i, end));
        }
    }
}

/// Grants of one key with the same token whose leases (`[t_send, lease end)`) overlap: the
/// compare-and-delete release (or an extend) of one could then act on the other, and the
/// checker could not tell them apart.
///
/// Why overlapping leases only, not every repeated token: clients like redis-py retry a refused
/// acquire with the *same* token (the workload's `same_token_retry_chance` does too), so one
/// token may be sent many times, and a token granted, released and granted again later is
/// harmless. What must never happen is two live grants carrying one token. (Recording tokens
/// unique per attempt instead would make this check vacuous.)
/// Fencing tokens that went backwards: pairs of grants of one key where the first `OK` was read
/// before the second acquire was sent (real-time order), yet the second token is not above the
/// first. The proxy promises tokens ordered like the grants, whatever the faults (docs/SAFETY.md,
/// "Fencing tokens"). Only grants with a token take part.
pub fn token_regressions(holds: &[Hold]) -> Vec<(Hold, Hold)> {
    let mut by_key: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
    for h in holds.iter().filter(|h| h.fence.is_some()) {
        by_key.entry(h.key.as_str()).or_default().push(h);
    }
    let mut regressions = Vec::new();
    for grants in by_key.into_values() {
        let mut by_ok = grants.clone();
        by_ok.sort_by_key(|h| h.t_ok);
        let mut by_send = grants;
        by_send.sort_by_key(|h| h.t_send);
        // The grant with the highest token among those read before each acquire was sent.
        let mut highest: Option<&Hold> = None;
        let mut next = 0;
        for later in by_send {
            while next < by_ok.len() && by_ok[next].t_ok < later.t_send {
                if highest.is_none_or(|h| by_ok[next].fence > h.fence) {
                    highest = Some(by_ok[next]);
                }
                next += 1;
            }
            if let Some(earlier) = highest {
                if later.fence <= earlier.fence {
                    regressions.push((earlier.clone(), later.clone()));
                }
            }
        }
    }
    regressions
}

pub fn duplicate_tokens(holds: &[Hold]) -> usize {
    let mut by_token: BTreeMap<(&str, &str), Vec<(u64, u64)>> = BTreeMap::new();
    for h in holds {
        by_token
            .entry((h.key.as_str(), h.token.as_str()))
            .or_default()
            .push((h.t_send, h.lease_end()));
    }
    let mut count = 0;
    for mut leases in by_token.into_values() {
        leases.sort_unstable();
        let mut end = 0;
        for (i, (start, e)) in leases.into_iter().enumerate() {
            if i > 0 && start < end {
                count += 1;
            }
            end = end.max(e);
        }
    }
    count
}

/// The verdict on one history.
#[derive(Debug, Default)]
pub struct Report {
    pub grants: usize,
    /// Grants whose `OK` was read after send + TTL: no window (not checked for overlap), but
    /// each one is a useless grant the proxy's validity re-check should have refused.
    pub late_oks: usize,
    /// Grants whose `OK` was read between send + TTL − drift and send + TTL: for information
    /// (the proxy counts its validity from its own, later, read of the request).
    pub oks_past_validity: usize,
    /// Grants extended at least once (a successful extend recorded).
    pub extended: usize,
    pub refusals: u64,
    /// Error replies to acquires, by text.
    pub errors: BTreeMap<String, u64>,
    /// Acquires with no reply within the client's limit.
    pub timeouts: u64,
    pub duplicate_tokens: usize,
    /// Grants taken with a fencing token, and the pairs whose tokens went backwards.
    pub fenced: usize,
    pub token_regressions: Vec<(Hold, Hold)>,
    /// How many holds of one key may be open at once: 1 for a lock, L for a semaphore of L
    /// permits ([`Report::for_limit`]).
    pub limit: usize,
    /// The most holds of one key open at once.
    pub max_holders: usize,
    /// Holds open beyond the limit ([`crowds`]); for a lock, every overlapping pair.
    pub violations: Vec<Overlap>,
    /// The holds involved, for the report.
    pub holds: Vec<Hold>,
    /// Longest acquire reply time (ms), and the longest one that was an `OK`.
    pub max_reply_ms: f64,
    pub max_grant_ms: f64,
}

impl Report {
    /// Asserts what every failover scenario must show: no two holders at once, no token given
    /// twice or going backwards, no OK after its lease, and at least `min_grants` grants (so
    /// it cannot pass vacuously).
    pub fn assert_safe(&self, min_grants: usize) {
        assert!(
            self.violations.is_empty(),
            "MUTUAL EXCLUSION VIOLATED: {self}"
        );
        assert_eq!(self.duplicate_tokens, 0, "{self}");
        assert!(self.token_regressions.is_empty(), "{self}");
        assert_eq!(self.late_oks, 0, "{self}");
        assert!(
            self.grants >= min_grants,
            "only {} grants: {self}",
            self.grants
        );
    }

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
            late_oks: holds.iter().filter(|h| h.late()).count(),
            oks_past_validity: holds.iter().filter(|h| h.past_validity()).count(),
            extended: holds.iter().filter(|h| h.t_extend_sent.is_some()).count(),
            refusals,
            errors,
            timeouts,
            duplicate_tokens: duplicate_tokens(&holds),
            fenced: holds.iter().filter(|h| h.fence.is_some()).count(),
            token_regressions: token_regressions(&holds),
            limit: 1,
            max_holders: max_holders(&holds),
            violations,
            holds,
            max_reply_ms,
            max_grant_ms,
        }
    }

    /// The verdict for a semaphore of `limit` permits: violations are the moments more than
    /// `limit` holds of one key were open.
    pub fn for_limit(self, limit: usize) -> Report {
        Report {
            violations: crowds(&self.holds, limit),
            limit,
            ..self
        }
    }

    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

/// Nanoseconds as milliseconds.
pub fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "grants={} (late OKs {}, OKs past validity {}, extended {}) refusals={} errors={} \
             timeouts={} max_holders={} (limit {}) violations={} duplicate_tokens={} fenced={} \
             token_regressions={} max_reply={:.1}ms max_grant={:.1}ms",
            self.grants,
            self.late_oks,
            self.oks_past_validity,
            self.extended,
            self.refusals,
            self.error_count(),
            self.timeouts,
            self.max_holders,
            self.limit,
            self.violations.len(),
            self.duplicate_tokens,
            self.fenced,
            self.token_regressions.len(),
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
                    "{} w{} p{} send={:.3} ok={:.3} extend={} end={:.3} released={}",
                    h.token,
                    h.worker,
                    h.proxy,
                    ms(h.t_send),
                    ms(s),
                    h.t_extend_sent
                        .map_or("-".to_string(), |t| format!("{:.3}", ms(t))),
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
        for (earlier, later) in self.token_regressions.iter().take(10) {
            write!(
                f,
                "\n  TOKEN REGRESSION on {}: {} (w{} p{} ok={:.3}) then {} (w{} p{} send={:.3})",
                earlier.key,
                earlier.fence.unwrap_or(0),
                earlier.worker,
                earlier.proxy,
                ms(earlier.t_ok),
                later.fence.unwrap_or(0),
                later.worker,
                later.proxy,
                ms(later.t_send)
            )?;
        }
        Ok(())
    }
}
