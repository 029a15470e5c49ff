//! Master health: each master is watched with `INFO` and the shared markers on a short
//! interval, and on every new connection before it may vote.
//!
//! Every key any proxy writes to a master lives at most `B = max_lock_ttl_ms + drift`
//! ([`crate::cluster::Cluster::lease_bound`]): every TTL the proxy forwards is capped, and
//! scripts that may set expiries are followed by a guard that caps what they set. So a master
//! that lost its data at time L held no lease that outlives L + B.
//!
//! - **Shared markers on every master** (the same keys for every proxy, so a restarted or newly
//!   started proxy knows what its predecessors knew):
//!   - `redlock-proxy:armed` (no expiry): "this master has been part of a lock deployment". A
//!     master that lacks it lost its data (restart without persistence, `FLUSHALL`) or is
//!     brand new. Every acquire checks it **in the same script** that sets the lock
//!     ([`crate::cluster::ACQUIRE_SCRIPT`]), and scripts are followed by a guard that checks it
//!     ([`crate::cluster::GUARD_SCRIPT`]): a master wiped since its last poll answers `-1`
//!     instead of voting.
//!   - `redlock-proxy:quarantine` (`PX` = B, only ever lengthened): set, *in the same script
//!     that re-arms the master*, by whichever proxy first sees the loss. While it exists the
//!     master votes for no proxy (the acquire script and the guard check it too).
//!
//!   Safety argument: a lock granted before a loss is held by a majority M including the lost
//!   master X. From the loss until the quarantine key is written, X lacks `armed` and votes
//!   for nobody; from then until the key expires (≥ L + B), X votes for nobody; afterwards
//!   every lease X held has expired. Meanwhile a grant needs Q votes among the other N − 1,
//!   which intersect M in a master that still holds the old lock.
//! - **A brand-new deployment** (no master has ever been armed) needs no quarantine: a master
//!   seen without `armed` is only armed without quarantine once *every* master has been seen
//!   without it by this proxy. With at most ⌊(N−1)/2⌋ masters faulty, a live lease would leave
//!   `armed` on at least one healthy master of its majority. As soon as any master is seen
//!   armed, the deployment is live and every master without the marker is quarantined.
//!   (Assumed: no proxy grants a lock and loses a master in the few milliseconds in which a
//!   second proxy's first round over a never-used set of masters is in progress.)
//! - A master that **restarted** (new `run_id`, or uptime going backwards) or **lost data**
//!   (`FLUSHALL`/`FLUSHDB`/`SWAPDB`/`DEBUG` calls, keys evicted) while watched is quarantined
//!   the same way, shared key included. A master first seen armed that **loaded its data from
//!   disk** (AOF on, or keys loaded from an RDB) less than B ago may have lost its last writes:
//!   quarantined for the rest of B.
//! - A master in an **unsafe configuration** (role other than master, `maxmemory-policy` other
//!   than `noeviction`, still loading) is refused for as long as that lasts, with the reason
//!   logged and shown in `INFO`.
//! - A master is not trusted on a fresh connection until one poll on it has been judged: a
//!   restart always breaks the TCP connection, so no vote from a restarted master is counted
//!   before its new state is seen.
//!
//! Parsing and judging are pure functions, table-tested; the task only does the polling.

use crate::backend::Master;
use crate::cluster::{command, Cluster};
use crate::protocol::Reply;
use crate::redlock::Vote;
use bytes::Bytes;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// The marker every proxy keeps on every master it has armed (no expiry).
pub const ARMED_KEY: &str = "redlock-proxy:armed";
/// The shared quarantine marker (`PX` = the lease bound, only ever lengthened).
pub const QUARANTINE_KEY: &str = "redlock-proxy:quarantine";

/// `{exists(armed), pttl(quarantine)}`.
const STATUS_SCRIPT: &str = "return {redis.call('exists', KEYS[1]), redis.call('pttl', KEYS[2])}";
/// Quarantines for `ARGV[1]` ms (keeping a later end) and re-arms, in one step: no acquire can
/// pass the marker check in between. Returns the quarantine's remaining ms.
const QUARANTINE_SCRIPT: &str = "redis.call('set', KEYS[2], '1', 'NX', 'PX', ARGV[1]) redis.call('pexpire', KEYS[2], ARGV[1], 'GT') redis.call('set', KEYS[1], '1') return redis.call('pttl', KEYS[2])";

/// What one `INFO` said that matters for safety.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observation {
    pub run_id: String,
    pub uptime_secs: u64,
    pub role: String,
    pub maxmemory_policy: String,
    pub loading: bool,
    pub evicted_keys: u64,
    /// Calls of commands that drop data wholesale (`flushall`, `flushdb`, `swapdb`, `debug`).
    pub data_wipes: u64,
    /// The dataset was loaded from disk at startup (AOF on, or keys loaded from an RDB).
    pub loaded_from_disk: bool,
}

/// Reads an `INFO` reply (`field:value` lines).
pub fn parse_info(text: &str) -> Observation {
    let mut obs = Observation::default();
    for line in text.lines() {
        let Some((field, value)) = line.trim_end().split_once(':') else {
            continue;
        };
        let number = || value.parse::<u64>().unwrap_or(0);
        match field {
            "run_id" => obs.run_id = value.to_string(),
            "uptime_in_seconds" => obs.uptime_secs = number(),
            "role" => obs.role = value.to_string(),
            "maxmemory_policy" => obs.maxmemory_policy = value.to_string(),
            "loading" => obs.loading = value == "1",
            "evicted_keys" => obs.evicted_keys = number(),
            "aof_enabled" | "rdb_last_load_keys_loaded" => obs.loaded_from_disk |= number() > 0,
            "cmdstat_flushall" | "cmdstat_flushdb" | "cmdstat_swapdb" | "cmdstat_debug" => {
                obs.data_wipes += value
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("calls="))
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
            }
            _ => {}
        }
    }
    obs
}

/// The judgement on one observation, given the previous one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Judgement {
    /// The master may have forgotten keys since `prev`: quarantine it.
    pub lost: Option<String>,
    /// The master must not vote while this holds.
    pub unsafe_config: Option<String>,
}

/// Compares two observations of one master.
pub fn judge(prev: Option<&Observation>, now: &Observation) -> Judgement {
    let lost = prev.and_then(|p| {
        if p.run_id != now.run_id {
            Some(format!(
                "restarted (run_id {} -> {})",
                short(&p.run_id),
                short(&now.run_id)
            ))
        } else if now.uptime_secs < p.uptime_secs {
            Some("restarted (uptime went backwards)".to_string())
        } else if now.data_wipes > p.data_wipes {
            Some("data wiped (FLUSHALL/FLUSHDB/SWAPDB/DEBUG)".to_string())
        } else if now.evicted_keys > p.evicted_keys {
            Some(format!(
                "{} keys evicted",
                now.evicted_keys - p.evicted_keys
            ))
        } else {
            None
        }
    });
    let unsafe_config = if now.role != "master" {
        Some(format!("role is {}, not master", now.role))
    } else if now.maxmemory_policy != "noeviction" {
        Some(format!(
            "maxmemory-policy is {}, only noeviction keeps lock keys",
            now.maxmemory_policy
        ))
    } else if now.loading {
        Some("loading its dataset".to_string())
    } else {
        None
    };
    Judgement {
        lost,
        unsafe_config,
    }
}

fn short(run_id: &str) -> &str {
    run_id.get(..8).unwrap_or(run_id)
}

/// The `INFO` sections the monitor needs (Redis 7 accepts several sections at once).
fn info_command() -> Bytes {
    command(&[
        "INFO",
        "server",
        "persistence",
        "stats",
        "replication",
        "memory",
        "commandstats",
    ])
}

/// What this proxy concluded about the whole set of masters from its first look at each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deployment {
    /// No master was armed when this proxy first saw them all: nothing to protect yet.
    Fresh,
    /// Some master was armed: masters without the marker lost their data.
    Live,
}

/// Decides the deployment from whether each master was armed at first sight (`None`: not
/// seen yet). `None` while undecided: any armed master makes it live at once; fresh needs
/// every master seen unarmed (see the module header for why all of them).
pub fn decide_deployment(first_sight: &[Option<bool>]) -> Option<Deployment> {
    if first_sight.contains(&Some(true)) {
        Some(Deployment::Live)
    } else if first_sight.iter().all(|s| *s == Some(false)) {
        Some(Deployment::Fresh)
    } else {
        None
    }
}

/// What to do about the markers of one master after a poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkerStep {
    /// Armed and nothing lost: ready.
    Ready,
    /// Brand-new deployment: arm it, no quarantine.
    Arm,
    /// It lost data (the reason): quarantine on the master and re-arm, in one script.
    Quarantine(String),
    /// Unarmed and the deployment is undecided: wait for the other masters.
    Wait,
}

/// The step for a master whose marker is `armed`, given whether this proxy saw it armed
/// before, the deployment verdict and a loss the `INFO` judgement found.
pub fn marker_step(
    armed: bool,
    seen_armed_before: bool,
    deployment: Option<Deployment>,
    lost: Option<String>,
) -> MarkerStep {
    match (armed, lost) {
        (_, Some(reason)) => MarkerStep::Quarantine(reason),
        (true, None) => MarkerStep::Ready,
        (false, None) if seen_armed_before => {
            MarkerStep::Quarantine("lock marker gone (data wiped or restarted empty)".into())
        }
        (false, None) => match deployment {
            Some(Deployment::Live) => MarkerStep::Quarantine(
                "lock marker missing while other masters have it (lost its data)".into(),
            ),
            Some(Deployment::Fresh) => MarkerStep::Arm,
            None => MarkerStep::Wait,
        },
    }
}

/// A master first seen armed that loaded its dataset from disk less than `bound` ago may have
/// lost its last writes (AOF fsync policy, RDB snapshot age): how much of `bound` is left.
pub fn first_sight_wait(obs: &Observation, bound: Duration) -> Option<Duration> {
    let up = Duration::from_secs(obs.uptime_secs);
    (obs.loaded_from_disk && up < bound).then(|| bound - up)
}

/// This proxy's view of the deployment, shared by the monitors of all masters.
struct DeploymentView {
    first_sight: Mutex<Vec<Option<bool>>>,
    /// Becomes `Some` once decided; monitors waiting for the verdict watch it.
    decided: watch::Sender<Option<Deployment>>,
}

impl DeploymentView {
    fn note(&self, index: usize, armed: bool) -> Option<Deployment> {
        let Ok(mut seen) = self.first_sight.lock() else {
            return None;
        };
        if seen[index].is_some() {
            return decide_deployment(&seen);
        }
        seen[index] = Some(armed);
        let verdict = decide_deployment(&seen);
        // Monitors of masters that were waiting for the verdict look again at once.
        self.decided.send_if_modified(|d| {
            let changed = d.is_none() && verdict.is_some();
            if changed {
                *d = verdict;
            }
            changed
        });
        verdict
    }
}

/// What the health monitor last concluded about a master. Read by [`Master::eligible`].
#[derive(Debug, Default)]
pub struct MasterHealth {
    state: Mutex<HealthState>,
    /// Wakes the master's monitor for an immediate poll (an acquire saw it unarmed).
    check_now: Notify,
}

/// A reading of a master's clock (`TIME`), to give its acquires a deadline in its own time.
#[derive(Debug, Clone, Copy)]
struct ClockReading {
    /// Local instant halfway through the `TIME` round trip.
    at: Instant,
    /// The master's clock then, in ms since the epoch.
    master_ms: u64,
    /// Half the round trip: how far off `at` may be.
    error: Duration,
}

#[derive(Debug, Default)]
struct HealthState {
    clock: Option<ClockReading>,
    last: Option<Observation>,
    /// Connection number (see [`crate::backend::MasterStats::connects`]) on which the last
    /// poll found the master ready; 0 = not ready.
    ready_connect: u64,
    seen_armed: bool,
    quarantined_until: Option<Instant>,
    quarantine_reason: Option<String>,
    unsafe_reason: Option<String>,
}

impl MasterHealth {
    /// Whether votes on connection number `connect` count now.
    pub fn eligible(&self, connect: u64) -> bool {
        let Ok(h) = self.state.lock() else {
            return false;
        };
        h.ready_connect == connect
            && h.unsafe_reason.is_none()
            && h.quarantined_until.is_none_or(|t| Instant::now() >= t)
    }

    /// The latest time (ms since the epoch) the master's clock can show at local instant
    /// `when`, from its last reading, allowing the reading's error and the drift factor since.
    /// `None` before the first reading.
    pub fn master_clock_bound(&self, when: Instant, drift_factor: f64) -> Option<u64> {
        let reading = self.state.lock().ok()?.clock?;
        let since = when.saturating_duration_since(reading.at);
        let late = since + reading.error + since.mul_f64(drift_factor);
        Some(reading.master_ms + late.as_millis() as u64 + 1)
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

    fn record_clock(&self, reading: ClockReading) {
        if let Ok(mut h) = self.state.lock() {
            h.clock = Some(reading);
        }
    }

    /// Whether the master is in quarantine now (it votes for no proxy: see the module header).
    pub fn quarantined(&self) -> bool {
        self.state
            .lock()
            .is_ok_and(|h| h.quarantined_until.is_some_and(|t| Instant::now() < t))
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
            return "connecting".into();
        }
        "up".into()
    }

    /// The master answered an acquire or guard with "unarmed or quarantined": no vote until
    /// the next poll has looked at its markers (which happens at once).
    pub fn recheck(&self) {
        if let Ok(mut h) = self.state.lock() {
            h.ready_connect = 0;
        }
        self.check_now.notify_one();
    }

    /// Keeps the master out until `until` (a later end already set is kept).
    fn quarantine(&self, addr: &str, until: Instant, reason: &str) {
        let Ok(mut h) = self.state.lock() else { return };
        if h.quarantined_until.is_some_and(|t| t >= until) {
            return;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left >= Duration::from_millis(500) && h.quarantine_reason.as_deref() != Some(reason) {
            tracing::warn!(master = %addr, %reason, wait_ms = left.as_millis() as u64, "master quarantined until every lease it may have held has expired");
        }
        // A quarantine still running keeps its reason (the first cause seen); only its end moves.
        if h.quarantined_until.is_none_or(|t| t <= Instant::now()) {
            h.quarantine_reason = Some(reason.to_string());
        }
        h.quarantined_until = Some(until);
    }

    /// Records an `INFO` observation; returns the loss it shows, if any.
    fn observe(&self, addr: &str, obs: Observation) -> Option<String> {
        let Ok(mut h) = self.state.lock() else {
            return None;
        };
        let verdict = judge(h.last.as_ref(), &obs);
        if verdict.unsafe_config != h.unsafe_reason {
            match &verdict.unsafe_config {
                Some(reason) => {
                    tracing::error!(master = %addr, %reason, "master refused: unsafe for locks")
                }
                None => tracing::info!(master = %addr, "master configuration safe again"),
            }
            h.unsafe_reason = verdict.unsafe_config;
        }
        h.last = Some(obs);
        verdict.lost
    }

    fn first_sight(&self) -> bool {
        self.state.lock().is_ok_and(|h| h.last.is_none())
    }

    fn seen_armed(&self) -> bool {
        self.state.lock().is_ok_and(|h| h.seen_armed)
    }

    fn set_ready(&self, connect: u64) {
        if let Ok(mut h) = self.state.lock() {
            h.seen_armed = true;
            h.ready_connect = connect;
        }
    }
}

/// `TIME`'s reply (`[seconds, microseconds]`) in ms since the epoch.
fn parse_time(items: &[Reply]) -> Option<u64> {
    let number = |r: &Reply| match r {
        Reply::Bulk(b) => std::str::from_utf8(b).ok()?.parse::<u64>().ok(),
        _ => None,
    };
    match items {
        [secs, micros] => Some(number(secs)? * 1000 + number(micros)? / 1000),
        _ => None,
    }
}

/// Watches every master of `cluster` until `stop` becomes true.
pub fn spawn_monitors(cluster: &Arc<Cluster>, interval: Duration, stop: watch::Receiver<bool>) {
    let view = Arc::new(DeploymentView {
        first_sight: Mutex::new(vec![None; cluster.masters.len()]),
        decided: watch::Sender::new(None),
    });
    for index in 0..cluster.masters.len() {
        tokio::spawn(monitor(
            Arc::downgrade(cluster),
            view.clone(),
            index,
            interval,
            stop.clone(),
        ));
    }
}

async fn monitor(
    cluster: Weak<Cluster>,
    view: Arc<DeploymentView>,
    index: usize,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut verdict = view.decided.subscribe();
    let info = info_command();
    let status = command(&["EVAL", STATUS_SCRIPT, "2", ARMED_KEY, QUARANTINE_KEY]);
    let load_acquire = command(&["SCRIPT", "LOAD", crate::cluster::ACQUIRE_SCRIPT]);
    loop {
        let Some(c) = cluster.upgrade() else { return };
        let master: Arc<Master> = c.masters[index].clone();
        let quarantine_on = c.quarantine;
        let bound = c.lease_bound();
        drop(c);
        let connect_seen = master.connect_count();
        if master.is_connected() {
            poll(
                &master,
                &view,
                index,
                quarantine_on,
                bound,
                connect_seen,
                &status,
                &info,
            )
            .await;
            // Acquires call their script by SHA1: keep it loaded (a master that lost it gets
            // the body from the acquire itself meanwhile).
            master.probe(load_acquire.clone()).await;
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = master.wait_new_connection(connect_seen) => {}
            _ = master.health.check_now.notified() => {}
            _ = verdict.changed() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// One look at one master: its markers, then `INFO`; arms or quarantines it as needed and
/// marks it ready on connection `connect` when it may vote.
#[allow(clippy::too_many_arguments)]
async fn poll(
    master: &Master,
    view: &DeploymentView,
    index: usize,
    quarantine_on: bool,
    bound: Duration,
    connect: u64,
    status: &Bytes,
    info: &Bytes,
) {
    // The master's clock, for the deadline of every acquire (see `ACQUIRE_SCRIPT`): a master
    // whose clock cannot be read is not ready.
    let asked = Instant::now();
    let Vote::Replied(Reply::Array(time)) = master.probe(command(&["TIME"])).await else {
        return;
    };
    let answered = Instant::now();
    let Some(master_ms) = parse_time(&time) else {
        return;
    };
    let error = (answered - asked) / 2;
    master.health.record_clock(ClockReading {
        at: asked + error,
        master_ms,
        // TIME is read somewhere within the round trip, and has a resolution of 1 µs; the
        // ms rounding of the deadline is covered by the extra millisecond.
        error: error + Duration::from_millis(1),
    });
    let (armed, quarantine_left) = match master.probe(status.clone()).await {
        Vote::Replied(Reply::Array(items)) => match items.as_slice() {
            [Reply::Integer(a), Reply::Integer(q)] => (*a == 1, *q),
            _ => return,
        },
        _ => return,
    };
    let Vote::Replied(Reply::Bulk(text)) = master.probe(info.clone()).await else {
        return;
    };
    let obs = parse_info(&String::from_utf8_lossy(&text));
    let now = Instant::now();
    let first = master.health.first_sight();
    let waited = first_sight_wait(&obs, bound).filter(|_| first && armed);
    let mut lost = master.health.observe(&master.addr, obs);
    if quarantine_on {
        if quarantine_left > 0 {
            let until = now + Duration::from_millis(quarantine_left as u64);
            master.health.quarantine(
                &master.addr,
                until,
                "quarantined by a proxy (shared marker)",
            );
        }
        if lost.is_none() && waited.is_some() {
            lost =
                Some("loaded its data from disk recently (may have lost its last writes)".into());
        }
    }
    let deployment = view.note(index, armed);
    let step = marker_step(armed, master.health.seen_armed(), deployment, lost);
    let step = match step {
        // Quarantine off (the safety suite's negative control only): re-arm, no wait.
        MarkerStep::Quarantine(reason) if !quarantine_on => {
            tracing::warn!(master = %master.addr, %reason, "master lost data (quarantine is off)");
            MarkerStep::Arm
        }
        step => step,
    };
    match step {
        MarkerStep::Ready => {}
        MarkerStep::Wait => return,
        MarkerStep::Arm => {
            let arm = command(&["SET", ARMED_KEY, "1"]);
            if master.probe(arm).await != Vote::Replied(Reply::ok()) {
                return;
            }
        }
        MarkerStep::Quarantine(reason) => {
            let ms = bound.as_millis().to_string();
            let script = command(&[
                "EVAL",
                QUARANTINE_SCRIPT,
                "2",
                ARMED_KEY,
                QUARANTINE_KEY,
                &ms,
            ]);
            let Vote::Replied(Reply::Integer(left)) = master.probe(script).await else {
                return;
            };
            let until = now + Duration::from_millis(left.max(0) as u64);
            master.health.quarantine(&master.addr, until, &reason);
        }
    }
    master.health.set_ready(connect);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(run_id: &str, uptime: u64) -> Observation {
        Observation {
            run_id: run_id.into(),
            uptime_secs: uptime,
            role: "master".into(),
            maxmemory_policy: "noeviction".into(),
            ..Default::default()
        }
    }

    #[test]
    fn parses_the_fields_that_matter() {
        let text = "# Server\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n# Persistence\r\nloading:0\r\n# Stats\r\nevicted_keys:3\r\n# Replication\r\nrole:master\r\n# Memory\r\nmaxmemory_policy:noeviction\r\n# Commandstats\r\ncmdstat_flushall:calls=2,usec=4,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\ncmdstat_flushdb:calls=1,usec=1\r\ncmdstat_get:calls=9,usec=1\r\n";
        let o = parse_info(text);
        assert_eq!(o.run_id, "abc123");
        assert_eq!(o.uptime_secs, 42);
        assert_eq!(o.evicted_keys, 3);
        assert_eq!(o.role, "master");
        assert_eq!(o.maxmemory_policy, "noeviction");
        assert!(!o.loading);
        assert_eq!(o.data_wipes, 3);
    }

    #[test]
    fn judgements() {
        let base = obs("aaaaaaaaaa", 100);
        let lost = |j: Judgement| j.lost.is_some();
        assert_eq!(judge(None, &base), Judgement::default());
        assert_eq!(
            judge(Some(&base), &obs("aaaaaaaaaa", 101)),
            Judgement::default()
        );
        assert!(lost(judge(Some(&base), &obs("bbbbbbbbbb", 1))));
        assert!(lost(judge(Some(&base), &obs("aaaaaaaaaa", 5))));
        let wiped = Observation {
            data_wipes: 1,
            ..base.clone()
        };
        assert!(lost(judge(Some(&base), &wiped)));
        let evicted = Observation {
            evicted_keys: 2,
            ..base.clone()
        };
        assert_eq!(
            judge(Some(&base), &evicted).lost.as_deref(),
            Some("2 keys evicted")
        );
        let replica = Observation {
            role: "slave".into(),
            ..base.clone()
        };
        assert!(judge(Some(&base), &replica).unsafe_config.is_some());
        let lru = Observation {
            maxmemory_policy: "allkeys-lru".into(),
            ..base.clone()
        };
        assert!(judge(None, &lru)
            .unsafe_config
            .unwrap()
            .contains("allkeys-lru"));
        let loading = Observation {
            loading: true,
            ..base.clone()
        };
        assert!(judge(None, &loading).unsafe_config.is_some());
    }

    #[test]
    fn deployment_is_fresh_only_when_every_master_was_seen_unarmed() {
        use Deployment::*;
        let cases: &[(&[Option<bool>], Option<Deployment>)] = &[
            (&[Some(false), Some(false), Some(false)], Some(Fresh)),
            (&[Some(false), None, Some(false)], None),
            (&[Some(false), None, Some(true)], Some(Live)),
            (&[Some(true), Some(true), Some(true)], Some(Live)),
            (&[None, None, None], None),
        ];
        for (seen, expected) in cases {
            assert_eq!(decide_deployment(seen), *expected, "{seen:?}");
        }
    }

    #[test]
    fn marker_steps() {
        use Deployment::*;
        let q = |s: MarkerStep| matches!(s, MarkerStep::Quarantine(_));
        assert_eq!(marker_step(true, false, None, None), MarkerStep::Ready);
        assert_eq!(marker_step(true, true, Some(Live), None), MarkerStep::Ready);
        // unarmed: wiped if this proxy saw it armed, or if the deployment is live
        assert!(q(marker_step(false, true, Some(Fresh), None)));
        assert!(q(marker_step(false, false, Some(Live), None)));
        assert!(q(marker_step(false, true, None, None)));
        // a brand-new deployment is armed without quarantine; undecided waits
        assert_eq!(
            marker_step(false, false, Some(Fresh), None),
            MarkerStep::Arm
        );
        assert_eq!(marker_step(false, false, None, None), MarkerStep::Wait);
        // a loss seen by INFO quarantines even an armed master (restart with persistence)
        assert!(q(marker_step(
            true,
            true,
            Some(Live),
            Some("restarted".into())
        )));
    }

    #[test]
    fn a_shorter_quarantine_never_overwrites_a_longer_one() {
        let health = MasterHealth::default();
        let now = Instant::now();
        let long = now + Duration::from_secs(60);
        health.quarantine("m", long, "restarted");
        health.quarantine("m", now + Duration::from_secs(1), "shared marker");
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
        // 100 ms later the master's clock shows at most 100 + 2 + 1 (drift) + 1 ms more.
        let bound = health
            .master_clock_bound(at + Duration::from_millis(100), drift)
            .unwrap();
        assert_eq!(bound, 1_000_104);
        // Its clock is surely past that bound only after more time than it took to get there.
        let past = health.surely_past(bound, drift).unwrap();
        assert!(past > at + Duration::from_millis(100));
        assert!(past < at + Duration::from_millis(120), "{:?}", past - at);
    }

    #[test]
    fn recently_loaded_from_disk_waits_out_the_rest_of_the_bound() {
        let bound = Duration::from_secs(60);
        let mut o = obs("a", 10);
        assert_eq!(first_sight_wait(&o, bound), None);
        o.loaded_from_disk = true;
        assert_eq!(first_sight_wait(&o, bound), Some(Duration::from_secs(50)));
        o.uptime_secs = 61;
        assert_eq!(first_sight_wait(&o, bound), None);
        let text = "aof_enabled:0\r\nrdb_last_load_keys_loaded:3\r\n";
        assert!(parse_info(text).loaded_from_disk);
        assert!(!parse_info("aof_enabled:0\r\nrdb_last_load_keys_loaded:0\r\n").loaded_from_disk);
    }
}
