//! What the health monitor last concluded about one master ([`MasterHealth`]): whether its
//! votes count on its current connection, its quarantine, and the reading of its clock that
//! gives each acquire a deadline in the master's own time.

use super::judge::{judge, Observation};
use super::loss::{ClockHistory, ClockReading, Loss};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// What the health monitor last concluded about a master. Read by [`crate::masters::Voter::eligible`].
#[derive(Debug, Default)]
pub struct MasterHealth {
    state: Mutex<HealthState>,
    /// Wakes the master's monitor for an immediate poll (an acquire saw it unarmed).
    pub(super) check_now: Notify,
}

impl ClockReading {
    /// The latest time (ms since the epoch) the master's clock can show at local instant
    /// `when`: the reading's error and the drift factor since are allowed for.
    fn bound_at(&self, when: Instant, drift_factor: f64) -> u64 {
        let since = when.saturating_duration_since(self.at);
        let late = since + self.error + since.mul_f64(drift_factor);
        self.master_ms + late.as_millis() as u64 + 1
    }
}

#[derive(Debug, Default)]
struct HealthState {
    clock: Option<ClockReading>,
    /// The readings its clock is judged against, and the `run_id` of the process they were
    /// read from (another process may run on another machine, with a clock of its own).
    clock_history: ClockHistory,
    clock_run_id: String,
    last: Option<Observation>,
    /// The last observation of this master while a primary (a planned failover demotes the
    /// old primary before the proxy follows the switch: its last look may show a replica),
    /// with the most replicas online any look of the same process as a primary showed.
    last_primary: Option<Observation>,
    /// Connection number (see [`crate::transport::Link::connect_count`]) on which the last
    /// poll found the master ready; 0 = not ready.
    ready_connect: u64,
    seen_armed: bool,
    quarantined_until: Option<Instant>,
    quarantine_reason: Option<String>,
    /// The running quarantine's cause, as the metric labels it ([`super::loss::Cause::label`]).
    quarantine_cause: Option<&'static str>,
    unsafe_reason: Option<String>,
    /// Why the master waits without a quarantine of its own (founding undecided, or another
    /// proxy's founding claim on it); cleared when it becomes ready.
    waiting: Option<&'static str>,
    /// A founding claim is on it: it votes for nobody, as a quarantined master.
    claimed: bool,
    /// A poll was judged after the deployment verdict (see [`super::Startup`]).
    judged: bool,
    /// Quarantines begun, by their cause's label (for the metrics).
    quarantines: std::collections::BTreeMap<&'static str, u64>,
}

impl HealthState {
    fn eligible(&self, connect: u64) -> bool {
        self.ready_connect == connect
            && self.unsafe_reason.is_none()
            && self.quarantined_until.is_none_or(|t| Instant::now() >= t)
    }
}

/// How far apart the clock samples a rate is judged over are kept (so at most about
/// `bound / spacing` of them per master).
const CLOCK_SAMPLE_SPACING: Duration = Duration::from_secs(1);

impl MasterHealth {
    /// Whether votes on connection number `connect` count now.
    pub fn eligible(&self, connect: u64) -> bool {
        self.state.lock().is_ok_and(|h| h.eligible(connect))
    }

    /// With one look at the record (an acquire asks this of every master): `None` if votes on
    /// connection number `connect` do not count now, else the latest time (ms since the epoch)
    /// the master's clock can show at local instant `when`, from its last reading, allowing the
    /// reading's error and the drift factor since (`None` before the first reading).
    pub fn clock_bound_if_eligible(
        &self,
        connect: u64,
        when: Instant,
        drift_factor: f64,
    ) -> Option<Option<u64>> {
        let h = self.state.lock().ok()?;
        h.eligible(connect)
            .then(|| h.clock.map(|reading| reading.bound_at(when, drift_factor)))
    }

    /// The master's clock at local instant `when`, estimated from its last reading (µs since
    /// the epoch; no allowance for error or drift: for proposing fencing tokens, which the
    /// master itself checks against its clock). `None` before the first reading.
    pub fn master_clock_estimate_us(&self, when: Instant) -> Option<u64> {
        let reading = self.state.lock().ok()?.clock?;
        let since = when.saturating_duration_since(reading.at);
        Some(reading.master_ms * 1000 + since.as_micros() as u64)
    }

    /// The local instant from which the master's clock surely shows more than `master_ms`.
    pub fn surely_past(&self, master_ms: u64, drift_factor: f64) -> Option<Instant> {
        let reading = self.state.lock().ok()?.clock?;
        let ahead = Duration::from_millis(master_ms.saturating_sub(reading.master_ms) + 1);
        let slowest = (1.0 - drift_factor).max(0.5);
        Some(reading.at + (ahead + reading.error).div_f64(slowest))
    }

    /// How old the last clock reading is and how far off it may be (for `INFO`).
    pub fn clock_reading(&self) -> Option<(Duration, Duration)> {
        let reading = self.state.lock().ok()?.clock?;
        Some((reading.at.elapsed(), reading.error))
    }

    pub(super) fn record_clock(&self, reading: ClockReading) {
        if let Ok(mut h) = self.state.lock() {
            h.clock = Some(reading);
        }
    }

    /// Judges the last clock reading, taken from the process `run_id`, against the earlier
    /// ones of that process ([`super::loss::clock`]): the loss it shows, if any.
    pub(super) fn judge_clock(
        &self,
        run_id: &str,
        drift_factor: f64,
        bound: Duration,
    ) -> Option<Loss> {
        let mut h = self.state.lock().ok()?;
        let reading = h.clock?;
        if h.clock_run_id != run_id {
            h.clock_history.clear();
            h.clock_run_id = run_id.to_string();
        }
        h.clock_history
            .judge(reading, drift_factor, bound, CLOCK_SAMPLE_SPACING)
    }

    /// Judges the master's clock as a merged lock call read it (`master_us`, µs since the
    /// epoch), the call handed over (no later than written) at `written` and its reply read at `read`, against the last
    /// poll's reading ([`ClockHistory::check`], the rule of [`super::loss::clock`]); the reading
    /// is not kept. A loss has the master judged at once ([`MasterHealth::recheck`]): its poll
    /// reads `TIME` and quarantines it (docs/SAFETY.md, "Master clocks: steps and rates
    /// between two looks"). Returns whether the clock ran ahead.
    pub fn judge_call_clock(
        &self,
        addr: &str,
        master_us: u64,
        written: Instant,
        read: Instant,
        drift_factor: f64,
    ) -> bool {
        // TIME was read somewhere between the call's writing and its reply's reading, with a
        // resolution of 1 µs; the ms it is judged in are covered by the extra millisecond.
        let half = read.saturating_duration_since(written) / 2;
        let reading = ClockReading {
            at: written + half,
            master_ms: master_us / 1000,
            error: half + Duration::from_millis(1),
        };
        let loss = match self.state.lock() {
            Ok(h) => h.clock_history.check(&reading, drift_factor),
            Err(_) => return false,
        };
        let Some(loss) = loss else { return false };
        tracing::warn!(master = %addr, reason = %loss, "a lock call read the master's clock ahead of the clock rule: its acquires in that call are no votes, and it is judged at once");
        self.recheck();
        true
    }

    /// Whether the master is in quarantine now (it votes for no proxy: see the module header).
    pub fn quarantined(&self) -> bool {
        self.state
            .lock()
            .is_ok_and(|h| h.quarantined_until.is_some_and(|t| Instant::now() < t))
    }

    /// Whether the master votes for no proxy now: quarantined, or under a founding claim.
    pub fn fenced(&self) -> bool {
        self.quarantined() || self.state.lock().is_ok_and(|h| h.claimed)
    }

    /// The state shown by `INFO` for a connected master.
    pub fn state(&self, connect: u64) -> String {
        let Ok(h) = self.state.lock() else {
            return "unknown".into();
        };
        let now = Instant::now();
        if let Some(reason) = &h.unsafe_reason {
            return format!("unsafe ({reason})");
        }
        if let (Some(until), Some(reason)) = (h.quarantined_until, &h.quarantine_reason) {
            if now < until {
                return format!(
                    "quarantined ({reason}; {} ms left)",
                    (until - now).as_millis()
                );
            }
        }
        if h.ready_connect != connect {
            return match h.waiting {
                Some(why) => format!("connecting ({why})"),
                None => "connecting".into(),
            };
        }
        "up".into()
    }

    /// The cause of the quarantine running now, as the metric labels it (`INFO masters`, the
    /// status view: one vocabulary with `redlock_proxy_master_quarantines_total`).
    pub fn quarantine_cause(&self) -> Option<&'static str> {
        let h = self.state.lock().ok()?;
        h.quarantined_until
            .is_some_and(|t| Instant::now() < t)
            .then_some(h.quarantine_cause)
            .flatten()
    }

    /// Quarantines begun so far, by their cause's label ([`super::loss::Cause::label`]).
    pub fn quarantines(&self) -> Vec<(&'static str, u64)> {
        self.state.lock().map_or_else(
            |_| Vec::new(),
            |h| h.quarantines.iter().map(|(c, n)| (*c, *n)).collect(),
        )
    }

    /// The master answered an acquire or guard with "unarmed or quarantined": no vote until
    /// the next poll has looked at its markers (which happens at once).
    pub fn recheck(&self) {
        if let Ok(mut h) = self.state.lock() {
            h.ready_connect = 0;
        }
        self.check_now.notify_one();
    }

    /// Keeps the master out until `until` (a later end already set is kept). One log line when
    /// a quarantine begins, with its cause and end; [`MasterHealth::end_quarantine`] logs its
    /// end. Polls that find a running quarantine (the shared marker) only move its end.
    pub(super) fn quarantine(&self, addr: &str, until: Instant, loss: &Loss) {
        let Ok(mut h) = self.state.lock() else { return };
        if h.quarantined_until.is_some_and(|t| t >= until) {
            return;
        }
        // A quarantine still running keeps its reason (the first cause seen); only its end moves.
        let now = Instant::now();
        if h.quarantined_until.is_none_or(|t| t <= now) {
            let left = until.saturating_duration_since(now);
            let end = humantime::format_rfc3339_seconds(std::time::SystemTime::now() + left);
            let cause = loss.cause.label();
            tracing::warn!(master = %addr, reason = %loss, cause, wait_ms = left.as_millis() as u64, "master quarantined until {end} ({loss}): every lease it may have held has expired by then");
            h.quarantine_reason = Some(loss.detail.clone());
            h.quarantine_cause = Some(cause);
            *h.quarantines.entry(cause).or_default() += 1;
        }
        h.quarantined_until = Some(until);
    }

    /// Ends a quarantine whose time is up, with a log line (every poll asks).
    pub(super) fn end_quarantine(&self, addr: &str) {
        let Ok(mut h) = self.state.lock() else { return };
        if h.quarantined_until.is_some_and(|t| t <= Instant::now()) {
            h.quarantined_until = None;
            h.quarantine_cause = None;
            let reason = h.quarantine_reason.take().unwrap_or_default();
            tracing::info!(master = %addr, %reason, "master out of quarantine ({reason}): it votes again");
        }
    }

    /// Records an `INFO` observation; returns the loss it shows, if any. `also_unsafe`: a
    /// reason beyond the observation not to let the master vote. `took_over`: the last look
    /// at the primary whose history this one continues, where another record holds it (a
    /// cluster node promoted in place of another: [`super::ClusterMaster::predecessor`]);
    /// otherwise this master's own last look while a primary.
    pub(super) fn observe(
        &self,
        addr: &str,
        obs: Observation,
        also_unsafe: Option<String>,
        wait_replicas: u32,
        took_over: Option<&Observation>,
        allow_debug_command: bool,
    ) -> Option<Loss> {
        let Ok(mut h) = self.state.lock() else {
            return None;
        };
        let last_primary = took_over.or(h.last_primary.as_ref());
        let mut verdict = judge(
            h.last.as_ref(),
            &obs,
            last_primary,
            wait_replicas,
            allow_debug_command,
        );
        verdict.unsafe_config = verdict.unsafe_config.or(also_unsafe);
        if verdict.unsafe_config != h.unsafe_reason {
            match &verdict.unsafe_config {
                Some(reason) => {
                    tracing::error!(master = %addr, %reason, "master refused: unsafe for locks")
                }
                None => tracing::info!(master = %addr, "master configuration safe again"),
            }
            h.unsafe_reason = verdict.unsafe_config;
        }
        if obs.role == "master" {
            // The most replicas this process had online in any look as a primary: the
            // replica that promotes itself leaves first, so the last look may miss it while
            // still listing the others, which could confirm a vote after that look the
            // promoted one never had (docs/SAFETY.md, "Confirmed writes").
            let mut primary = obs.clone();
            if let Some(earlier) = (h.last_primary.as_ref()).filter(|p| p.run_id == obs.run_id) {
                primary.online_replicas = primary.online_replicas.max(earlier.online_replicas);
            }
            h.last_primary = Some(primary);
        }
        h.last = Some(obs);
        verdict.lost
    }

    /// This master's last observation, if any.
    pub(super) fn last(&self) -> Option<Observation> {
        self.state.lock().ok()?.last.clone()
    }

    /// This master's last observation while it was a primary, if any.
    pub(super) fn last_primary(&self) -> Option<Observation> {
        self.state.lock().ok()?.last_primary.clone()
    }

    /// The `run_id` of this master's last observation, if any.
    pub(super) fn last_run_id(&self) -> Option<String> {
        let h = self.state.lock().ok()?;
        h.last.as_ref().map(|obs| obs.run_id.clone())
    }

    pub(super) fn first_sight(&self) -> bool {
        self.state.lock().is_ok_and(|h| h.last.is_none())
    }

    pub(super) fn seen_armed(&self) -> bool {
        self.state.lock().is_ok_and(|h| h.seen_armed)
    }

    pub(super) fn set_ready(&self, connect: u64) {
        if let Ok(mut h) = self.state.lock() {
            h.seen_armed = true;
            h.ready_connect = connect;
            h.waiting = None;
            h.claimed = false;
        }
    }

    /// Not ready for `why`; `claimed`: a founding claim fences it.
    pub(super) fn set_waiting(&self, why: &'static str, claimed: bool) {
        if let Ok(mut h) = self.state.lock() {
            h.waiting = Some(why);
            h.claimed = claimed;
        }
    }

    pub(super) fn set_judged(&self) {
        if let Ok(mut h) = self.state.lock() {
            h.judged = true;
        }
    }

    /// Whether a poll of this master was judged since the deployment verdict.
    pub fn judged(&self) -> bool {
        self.state.lock().is_ok_and(|h| h.judged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::loss::{kept_every_confirmed_write, Cause};

    /// A primary with two replicas online, then one (the other left to promote itself): a
    /// failover to the one that left keeps nothing by the one-replica rule, since the other
    /// could have confirmed a vote after the last look. A restarted process starts afresh.
    #[test]
    fn the_last_primary_look_keeps_the_most_replicas_seen_online() {
        let health = MasterHealth::default();
        let primary = |run_id: &str, online, offset| Observation {
            run_id: run_id.into(),
            role: "master".into(),
            maxmemory_policy: "noeviction".into(),
            master_replid: format!("{run_id}-history"),
            master_repl_offset: offset,
            online_replicas: online,
            ..Observation::default()
        };
        let promoted = Observation {
            master_replid2: "a-history".into(),
            second_repl_offset: Some(101),
            ..primary("b", 1, 101)
        };
        let kept = |health: &MasterHealth| {
            let last = health.last_primary().expect("a primary look");
            (
                last.online_replicas,
                kept_every_confirmed_write(&last, &promoted, 1),
            )
        };
        health.observe("m", primary("a", 2, 90), None, 1, None, false);
        health.observe("m", primary("a", 1, 100), None, 1, None, false);
        assert_eq!(kept(&health), (2, false));
        // Never more than one: the promoted replica keeps every confirmed write.
        let single = MasterHealth::default();
        single.observe("m", primary("a", 1, 90), None, 1, None, false);
        single.observe("m", primary("a", 0, 100), None, 1, None, false);
        assert_eq!(kept(&single), (1, true));
        // Another process: its own looks only.
        health.observe("m", primary("a2", 1, 5), None, 1, None, false);
        assert_eq!(health.last_primary().map(|p| p.online_replicas), Some(1));
    }

    #[test]
    fn a_shorter_quarantine_never_overwrites_a_longer_one() {
        let health = MasterHealth::default();
        let now = Instant::now();
        let long = now + Duration::from_secs(60);
        health.quarantine("m", long, &Loss::new(Cause::Restarted, "restarted"));
        health.quarantine("m", now + Duration::from_secs(1), &Loss::shared_marker());
        assert!(health.quarantined());
        let state = health.state.lock().unwrap();
        assert_eq!(state.quarantined_until, Some(long));
        assert_eq!(state.quarantine_reason.as_deref(), Some("restarted"));
    }

    #[test]
    fn clock_bounds_bracket_the_master_clock() {
        let health = MasterHealth::default();
        let at = Instant::now();
        health.record_clock(ClockReading {
            at,
            master_ms: 1_000_000,
            error: Duration::from_millis(2),
        });
        let drift = 0.01;
        let later = at + Duration::from_millis(100);
        // Only for a master whose votes count on that connection.
        assert_eq!(health.clock_bound_if_eligible(1, later, drift), None);
        health.set_ready(1);
        assert_eq!(health.clock_bound_if_eligible(2, later, drift), None);
        // 100 ms later the master's clock shows at most 100 + 2 + 1 (drift) + 1 ms more.
        let bound = health
            .clock_bound_if_eligible(1, later, drift)
            .unwrap()
            .unwrap();
        assert_eq!(bound, 1_000_104);
        // Its clock is surely past that bound only after more time than it took to get there.
        let past = health.surely_past(bound, drift).unwrap();
        assert!(past > at + Duration::from_millis(100));
        assert!(past < at + Duration::from_millis(120), "{:?}", past - at);
    }
}
