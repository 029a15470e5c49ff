//! Loss detection in one place: every rule that decides "this master may have lost locks",
//! each a named [`Cause`] with its own rule, test and metric label. A loss quarantines the
//! master for the lease bound (docs/SAFETY.md, "Masters that lose data"); the next cause is one
//! variant here and one rule. Pure: no I/O, no clock of its own (readings are given).
//!
//! The rules, by what they look at:
//! - two `INFO` observations of one master ([`between_looks`]): a restart that may have lost
//!   writes, a promotion, `FLUSHALL`/`DEBUG` calls, evicted keys;
//! - the shared markers ([`super::judge::marker_step`], [`super::judge::check_stamp`]): the
//!   armed marker gone, missing in a running deployment, stamped by another process, a
//!   quarantine another proxy wrote;
//! - the first look at a master that loaded its data from disk ([`first_sight_wait`]);
//! - the master's clock against this proxy's monotonic clock ([`clock`]): a forward step, or
//!   a rate above 1 + drift factor, expires its keys early, as a loss of them.

use super::judge::Observation;
use std::fmt;
use std::time::Duration;
use tokio::time::Instant;

/// Why a master may have lost locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cause {
    /// A new `run_id`, or uptime going backwards, not both durable before and after.
    Restarted,
    /// A replica promoted in place, or data armed by another process or node (a failover,
    /// a restart no proxy watched, a slot migration).
    Failover,
    /// `FLUSHALL` or `DEBUG` (`RELOAD`, `LOADAOF`…) calls since the last look.
    DataWiped,
    /// Keys evicted since the last look.
    Evicted,
    /// The armed marker this proxy saw is gone.
    MarkerGone,
    /// Unarmed in a running deployment, or still carrying this proxy's founding claim once
    /// the deployment turned out live: it lost its data, or it is new.
    Joined,
    /// A quarantine another proxy wrote (this proxy saw no cause of its own).
    SharedMarker,
    /// First seen less than the lease bound after it loaded its data from disk.
    LoadedFromDisk,
    /// Its clock jumped forward between two readings.
    ClockStep,
    /// Its clock ran faster than 1 + drift factor over some window.
    ClockRate,
    /// It lacks lock writes it acknowledged: its write witness is behind the highest one its
    /// replies carried (data replaced in place, or a restart judged durable that was not).
    WitnessBehind,
}

impl Cause {
    /// The metric label (few and fixed: a label never carries free text).
    pub fn label(self) -> &'static str {
        match self {
            Cause::Restarted => "restarted",
            Cause::Failover => "failover",
            Cause::DataWiped => "data_wiped",
            Cause::Evicted => "evicted",
            Cause::MarkerGone => "marker_gone",
            Cause::Joined => "joined",
            Cause::SharedMarker => "shared_marker",
            Cause::LoadedFromDisk => "loaded_from_disk",
            Cause::ClockStep | Cause::ClockRate => "clock",
            Cause::WitnessBehind => "witness_behind",
        }
    }
}

/// Every metric label of a [`Cause`], once each.
pub const LABELS: [&str; 10] = [
    "restarted",
    "failover",
    "data_wiped",
    "evicted",
    "marker_gone",
    "joined",
    "shared_marker",
    "loaded_from_disk",
    "clock",
    "witness_behind",
];

/// A loss: its cause, and what was seen (for the log and `INFO`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loss {
    pub cause: Cause,
    pub detail: String,
}

impl Loss {
    pub fn new(cause: Cause, detail: impl Into<String>) -> Loss {
        Loss {
            cause,
            detail: detail.into(),
        }
    }

    pub fn marker_gone() -> Loss {
        Loss::new(
            Cause::MarkerGone,
            "lock marker gone (data wiped or restarted empty)",
        )
    }

    pub fn unarmed_in_live_deployment() -> Loss {
        Loss::new(
            Cause::Joined,
            "lock marker missing in a running deployment (lost its data, or new)",
        )
    }

    pub fn claimed_while_live() -> Loss {
        Loss::new(
            Cause::Joined,
            "claimed at start-up while the deployment was live (lost its data, or new)",
        )
    }

    pub fn shared_marker() -> Loss {
        Loss::new(
            Cause::SharedMarker,
            "quarantined by a proxy (shared marker)",
        )
    }

    pub fn loaded_from_disk() -> Loss {
        Loss::new(
            Cause::LoadedFromDisk,
            "loaded its data from disk recently (may have lost its last writes)",
        )
    }
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

fn short(run_id: &str) -> &str {
    run_id.get(..8).unwrap_or(run_id)
}

/// The loss two `INFO` looks at one master show, if any. `last_primary`: its last look while a
/// primary (a planned failover demotes the old primary before the proxy follows the switch);
/// `wait_replicas`: how many replicas confirm every vote (`WAIT`, 0: off).
pub fn between_looks(
    prev: &Observation,
    now: &Observation,
    last_primary: Option<&Observation>,
    wait_replicas: u32,
) -> Option<Loss> {
    // A restart loses nothing when every write was on disk before its reply, before the
    // restart and after it, and the master holds every write it acknowledged (persistence
    // may have been off for a moment between two looks); a failover nothing when the new
    // primary had every write whose vote counted.
    let kept = now
        .witness
        .is_none_or(|w| w.kept_every_acknowledged_write());
    let restart_loses = !(prev.durable() && now.durable() && kept);
    let failover_loses = !last_primary
        .is_some_and(|primary| kept_every_confirmed_write(primary, now, wait_replicas));
    let restarted = prev.run_id != now.run_id || now.uptime_secs < prev.uptime_secs;
    if restarted && restart_loses && failover_loses && prev.durable() && now.durable() {
        // Durable before and after, but not every acknowledged write is there.
        Some(Loss::new(
            Cause::WitnessBehind,
            format!(
                "restarted (run_id {} -> {}) without every lock write it acknowledged, though durable before and after ({})",
                short(&prev.run_id),
                short(&now.run_id),
                witness_text(now.witness)
            ),
        ))
    } else if prev.run_id != now.run_id && restart_loses && failover_loses {
        Some(Loss::new(
            Cause::Restarted,
            format!(
                "restarted (run_id {} -> {})",
                short(&prev.run_id),
                short(&now.run_id)
            ),
        ))
    } else if now.uptime_secs < prev.uptime_secs && restart_loses && failover_loses {
        Some(Loss::new(
            Cause::Restarted,
            "restarted (uptime went backwards)",
        ))
    } else if prev.role != "master" && now.role == "master" && failover_loses {
        // A replica promoted in place (same run_id): replication is asynchronous, so it may
        // lack the last locks its old primary granted (a failover is amnesia).
        Some(Loss::new(
            Cause::Failover,
            format!("promoted from {} to master", prev.role),
        ))
    } else if now.data_wipes > prev.data_wipes {
        Some(Loss::new(Cause::DataWiped, "data wiped (FLUSHALL)"))
    } else if let Some(w) = now.witness.filter(|w| w.holds < w.acknowledged) {
        // The same process, with fewer of its writes than it acknowledged: its data was
        // replaced in place (DEBUG RELOAD with allow_debug_command, SWAPDB, a restore).
        Some(Loss::new(
            Cause::WitnessBehind,
            format!(
                "lacks lock writes it acknowledged ({})",
                witness_text(Some(w))
            ),
        ))
    } else if now.debug_calls > prev.debug_calls {
        // A `DEBUG RELOAD` that kept every acknowledged write, as far as the witness shows
        // (writes it does not cover may be gone).
        Some(Loss::new(
            Cause::DataWiped,
            "data wiped or replaced in place (DEBUG)",
        ))
    } else if now.evicted_keys > prev.evicted_keys {
        Some(Loss::new(
            Cause::Evicted,
            format!("{} keys evicted", now.evicted_keys - prev.evicted_keys),
        ))
    } else {
        None
    }
}

/// What a witness check saw, for the log.
fn witness_text(witness: Option<super::judge::WitnessCheck>) -> String {
    match witness {
        Some(w) if w.uncovered && w.holds >= w.acknowledged => format!(
            "witness {}; an extend or lease script acknowledged after witness {} is not covered",
            w.holds, w.acknowledged
        ),
        Some(w) => format!("witness {}, acknowledged {}", w.holds, w.acknowledged),
        None => "no witness".into(),
    }
}

/// Whether `now`, a new primary, holds every write whose vote counted on the primary seen in
/// `prev`, when every counted vote waited for `wait_replicas` replicas (docs/SAFETY.md,
/// "Confirmed writes"): `now` continues `prev`'s replication history (a replica of it, promoted),
/// with all of it up to `prev` (so every write before that look), and `prev` had no more
/// replicas online than confirm each vote (so a vote after that look was confirmed by every
/// replica, `now` included, unless the replicas changed since: the assumption).
pub fn kept_every_confirmed_write(
    prev: &Observation,
    now: &Observation,
    wait_replicas: u32,
) -> bool {
    wait_replicas > 0
        && prev.role == "master"
        && prev.online_replicas <= wait_replicas
        && !prev.master_replid.is_empty()
        && now.master_replid2 == prev.master_replid
        && now
            .second_repl_offset
            .is_some_and(|first_new| first_new > prev.master_repl_offset)
}

/// A master first seen armed that loaded its dataset from disk less than `bound` ago may have
/// lost its last writes (AOF fsync policy, RDB snapshot age): how much of `bound` is left.
pub fn first_sight_wait(obs: &Observation, bound: Duration) -> Option<Duration> {
    let up = Duration::from_secs(obs.uptime_secs);
    (obs.loaded_from_disk && up < bound).then(|| bound - up)
}

/// A reading of a master's clock (`TIME`) against this proxy's monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockReading {
    /// Local instant halfway through the `TIME` round trip.
    pub at: Instant,
    /// The master's clock then, in ms since the epoch.
    pub master_ms: u64,
    /// How far off `at` may be: half the round trip, plus `TIME`'s ms rounding.
    pub error: Duration,
}

/// The clock rule. A key lives on a master until the master's clock has advanced its `PX`,
/// `TTL + drift = TTL·(1 + F) + 2 ms`, so a lock is safe on a master whose clock advances at
/// most `1 + F` times this proxy's over the lease (the proxy measures `elapsed` and validity on
/// its own monotonic clock). The master's clock is judged between the new reading `now` and
/// each `earlier` one (the last reading, and samples over the last lease bound): it may have
/// advanced at most `(1 + F)·(local time between them + both readings' errors)`. More is a
/// loss: every key on it may expire before its holder's validity ends. A forward jump shows
/// against the last reading (a step: more than twice the local time between them); a rate
/// shows against whichever sample gives it the most room to accumulate. A backward step or a
/// slow clock only lengthens what the master holds, and is no loss.
pub fn clock(earlier: &[ClockReading], now: &ClockReading, drift_factor: f64) -> Option<Loss> {
    let last = earlier.last()?;
    let mut worst: Option<(i64, &ClockReading)> = None;
    for then in earlier {
        let local = now.at.saturating_duration_since(then.at);
        let room = (local + then.error + now.error).mul_f64(1.0 + drift_factor);
        let advanced = now.master_ms as i64 - then.master_ms as i64;
        let excess = advanced - room.as_millis() as i64;
        if excess > 0 && worst.is_none_or(|(e, _)| excess > e) {
            worst = Some((excess, then));
        }
    }
    let (excess, then) = worst?;
    let local = now.at.saturating_duration_since(then.at);
    let advanced = now.master_ms.saturating_sub(then.master_ms);
    let local_ms = local.as_millis().max(1) as u64;
    if std::ptr::eq(then, last) && advanced > 2 * local_ms {
        return Some(Loss::new(
            Cause::ClockStep,
            format!(
                "clock stepped forward: {advanced} ms in {local_ms} ms of the proxy's clock ({excess} ms beyond the drift allowance)"
            ),
        ));
    }
    Some(Loss::new(
        Cause::ClockRate,
        format!(
            "clock ran fast: {advanced} ms in {local_ms} ms of the proxy's clock ({:.3}x; the drift factor allows {:.3}x, {excess} ms beyond it)",
            advanced as f64 / local_ms as f64,
            1.0 + drift_factor
        ),
    ))
}

/// The clock readings a master's clock is judged against ([`clock`]): the last one, and one
/// sample per `spacing` over the last lease bound, so that a rate is seen over the longest
/// window a lease can span.
#[derive(Debug, Clone, Default)]
pub struct ClockHistory {
    /// Oldest first; the last is the latest reading.
    readings: std::collections::VecDeque<ClockReading>,
}

impl ClockHistory {
    /// Judges `now` against the history (see [`clock`]), then keeps it: after a loss, as the
    /// only reading (the master is judged afresh from there).
    pub fn judge(
        &mut self,
        now: ClockReading,
        drift_factor: f64,
        bound: Duration,
        spacing: Duration,
    ) -> Option<Loss> {
        let loss = clock(self.readings.make_contiguous(), &now, drift_factor);
        if loss.is_some() {
            self.readings.clear();
        }
        // The latest reading replaces the one before it unless that one is a sample: at least
        // `spacing` after the sample before it.
        let n = self.readings.len();
        if n >= 2 && self.readings[n - 1].at < self.readings[n - 2].at + spacing {
            self.readings.pop_back();
        }
        self.readings.push_back(now);
        while self
            .readings
            .front()
            .is_some_and(|r| now.at.saturating_duration_since(r.at) > bound)
        {
            self.readings.pop_front();
        }
        loss
    }

    /// Judges `now` against the latest reading only (see [`clock`]) without keeping it: a
    /// reading a merged lock call took, between two polls, where the hole is a step or rate
    /// since the last poll (rates over longer windows are the polls' to find, against the
    /// samples). Before the first reading, no loss.
    pub fn check(&self, now: &ClockReading, drift_factor: f64) -> Option<Loss> {
        let last = self.readings.back()?;
        clock(std::slice::from_ref(last), now, drift_factor)
    }

    /// Forgets every reading (another process, perhaps on another machine, serves it now).
    pub fn clear(&mut self) {
        self.readings.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::judge::test_primary as obs;

    #[test]
    fn every_label_names_a_cause() {
        // `label` is an exhaustive match: a new cause needs a label; LABELS must list it.
        let labels = LABELS.to_vec();
        let mut seen = labels.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), labels.len(), "a label listed twice");
        let some = [
            Cause::Restarted,
            Cause::ClockStep,
            Cause::ClockRate,
            Cause::WitnessBehind,
        ];
        for cause in some {
            assert!(LABELS.contains(&cause.label()), "{cause:?}");
        }
    }

    /// Each rule between two looks, with the cause it names.
    #[test]
    fn rules_between_two_looks() {
        let base = obs("aaaaaaaaaa", 100);
        let cause = |now: &Observation| between_looks(&base, now, None, 0).map(|l| l.cause);
        assert_eq!(cause(&obs("aaaaaaaaaa", 101)), None);
        assert_eq!(cause(&obs("bbbbbbbbbb", 1)), Some(Cause::Restarted));
        assert_eq!(cause(&obs("aaaaaaaaaa", 5)), Some(Cause::Restarted));
        let wiped = Observation {
            data_wipes: 1,
            ..base.clone()
        };
        assert_eq!(cause(&wiped), Some(Cause::DataWiped));
        // A `DEBUG` call is a loss; one whose data lacks acknowledged writes (the witness
        // behind the highest answered: `DEBUG RELOAD` of an older snapshot) names that cause.
        let debugged = Observation {
            debug_calls: 1,
            ..base.clone()
        };
        assert_eq!(cause(&debugged), Some(Cause::DataWiped));
        let witness = |holds| {
            Some(crate::health::judge::WitnessCheck {
                holds,
                acknowledged: 7,
                uncovered: false,
            })
        };
        let reloaded = Observation {
            witness: witness(5),
            ..debugged.clone()
        };
        assert_eq!(cause(&reloaded), Some(Cause::WitnessBehind));
        let kept = Observation {
            witness: witness(7),
            ..debugged.clone()
        };
        assert_eq!(cause(&kept), Some(Cause::DataWiped));
        let evicted = Observation {
            evicted_keys: 2,
            ..base.clone()
        };
        assert_eq!(
            between_looks(&base, &evicted, None, 0),
            Some(Loss::new(Cause::Evicted, "2 keys evicted"))
        );
        let replica = Observation {
            role: "slave".into(),
            ..base.clone()
        };
        assert_eq!(
            between_looks(&replica, &base, None, 0),
            Some(Loss::new(Cause::Failover, "promoted from slave to master"))
        );
    }

    fn reading(at: Instant, master_ms: u64, error_ms: u64) -> ClockReading {
        ClockReading {
            at,
            master_ms,
            error: Duration::from_millis(error_ms),
        }
    }

    /// The clock rule, table-driven: (ms after the last reading, master ms advanced, errors)
    /// and the cause it finds.
    #[test]
    fn a_clock_that_steps_forward_or_runs_fast_is_a_loss() {
        let t0 = Instant::now();
        let f = 0.01;
        let ms = Duration::from_millis;
        let cases: [(u64, u64, u64, Option<Cause>); 9] = [
            (100, 100, 1, None),
            // 1 % drift plus both readings' errors: within.
            (100, 103, 1, None),
            (1000, 1010 + 20, 10, None),
            // Backward, or slow: longer leases, no loss.
            (100, 0, 1, None),
            (1000, 500, 1, None),
            // Forward steps of 12 s and 40 s between two polls.
            (100, 12_100, 1, Some(Cause::ClockStep)),
            (100, 40_100, 1, Some(Cause::ClockStep)),
            // 1.6x over one poll interval.
            (100, 160, 1, Some(Cause::ClockRate)),
            // Just beyond what the errors allow.
            (100, 106, 1, Some(Cause::ClockRate)),
        ];
        for (local, advanced, error, expected) in cases {
            let then = reading(t0, 1_000_000, error);
            let now = reading(t0 + ms(local), 1_000_000 + advanced, error);
            assert_eq!(
                clock(&[then], &now, f).map(|l| l.cause),
                expected,
                "{local} ms local, {advanced} ms master"
            );
        }
        assert_eq!(clock(&[], &reading(t0, 1, 1), f), None);
    }

    /// A rate just above 1 + F hides in every poll's errors, and shows against the samples
    /// kept over the lease bound; after the loss, judging starts afresh.
    #[test]
    fn a_small_rate_shows_over_the_samples_of_the_lease_bound() {
        let t0 = Instant::now();
        let mut history = ClockHistory::default();
        let (bound, spacing) = (Duration::from_secs(60), Duration::from_secs(1));
        // 1.03x with F = 0.01: 2 ms beyond the drift per 100 ms poll, within 2 x 2 ms errors.
        let mut found = None;
        for poll in 0..300u64 {
            let at = t0 + Duration::from_millis(100 * poll);
            let master_ms = 1_000_000 + 103 * poll;
            if let Some(loss) = history.judge(reading(at, master_ms, 2), 0.01, bound, spacing) {
                found = Some((poll, loss));
                break;
            }
        }
        let (poll, loss) = found.expect("the rate is seen within 30 s");
        // Not against the last reading: one poll's room holds it.
        assert!(poll >= 2, "{poll}");
        let one_poll =
            |p: u64| reading(t0 + Duration::from_millis(100 * p), 1_000_000 + 103 * p, 2);
        assert_eq!(clock(&[one_poll(poll - 1)], &one_poll(poll), 0.01), None);
        assert_eq!(loss.cause, Cause::ClockRate, "{loss}");
        assert_eq!(history.readings.len(), 1);
        // Samples stay a spacing apart and within the bound.
        let mut steady = ClockHistory::default();
        for poll in 0..2000u64 {
            let at = t0 + Duration::from_millis(100 * poll);
            assert_eq!(
                steady.judge(reading(at, 5_000 + 100 * poll, 2), 0.01, bound, spacing),
                None
            );
        }
        assert!(steady.readings.len() <= 62, "{}", steady.readings.len());
    }
}
