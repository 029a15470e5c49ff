//! Master health: each master is watched with `INFO` and the shared markers on a short
//! interval, and on every new connection before it may vote.
//!
//! Every key any proxy writes to a master lives at most `B = max_lock_ttl_ms + drift`
//! ([`crate::redlock::Policy::lease_bound`]): every TTL the proxy forwards is capped, and
//! scripts that may set expiries are followed by a guard that caps what they set. So a master
//! that lost its data at time L held no lease that outlives L + B.
//!
//! - **Shared markers on every master** (the same keys for every proxy, so a restarted or newly
//!   started proxy knows what its predecessors knew):
//!   - `redlock-proxy:armed` (no expiry): "this master has been part of a lock deployment". A
//!     master that lacks it lost its data (restart without persistence, `FLUSHALL`) or is
//!     brand new. Every acquire checks it **in the same script** that sets the lock
//!     ([`crate::lock::LOCK_SCRIPT`]), and scripts are followed by a guard that checks it
//!     ([`crate::commands::scripts::GUARD_SCRIPT`]): a master wiped since its last poll answers `-1`
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

pub(crate) mod judge;
mod state;

use judge::{
    decide_deployment, first_sight_wait, marker_step, parse_info, parse_time, Deployment,
    MarkerStep,
};
pub use state::{MasterHealth, QUARANTINE_CAUSES};

use crate::live::LiveDuration;
use crate::protocol::{encode_command, Reply};
use crate::transport::Link;
use bytes::Bytes;
use state::ClockReading;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The marker every proxy keeps on every master it has armed (no expiry).
pub const ARMED_KEY: &str = "redlock-proxy:armed";
/// The shared quarantine marker (`PX` = the lease bound, only ever lengthened).
pub const QUARANTINE_KEY: &str = "redlock-proxy:quarantine";

/// `{exists(armed), pttl(quarantine)}`.
pub(crate) const STATUS_SCRIPT: &str =
    "return {redis.call('exists', KEYS[1]), redis.call('pttl', KEYS[2])}";
/// Quarantines for `ARGV[1]` ms (keeping a later end) and re-arms, in one step: no acquire can
/// pass the marker check in between. Returns the quarantine's remaining ms.
pub(crate) const QUARANTINE_SCRIPT: &str = "redis.call('set', KEYS[2], '1', 'NX', 'PX', ARGV[1]) redis.call('pexpire', KEYS[2], ARGV[1], 'GT') redis.call('set', KEYS[1], '1') return redis.call('pttl', KEYS[2])";

/// The `INFO` sections the monitor needs (Redis 7 accepts several sections at once).
fn info_command() -> Bytes {
    encode_command(&[
        "INFO",
        "server",
        "persistence",
        "stats",
        "replication",
        "memory",
        "commandstats",
    ])
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
/// What the monitors need of the proxy's configuration.
#[derive(Debug, Clone)]
pub struct Policy {
    /// How often each master is polled (besides on every new connection); a reload may change
    /// it ([`LiveDuration::set`]).
    pub interval: LiveDuration,
    /// Quarantine masters that lost data (off only in the safety suite's negative controls).
    pub quarantine: bool,
    /// `B`: the longest any key the proxy sets can live, and so the length of a quarantine.
    pub lease_bound: Duration,
    /// Scripts kept loaded on every master: acquires call them by SHA1 (a master that lost
    /// one gets the body from the acquire itself meanwhile).
    pub preload: Vec<&'static str>,
}

/// Watches every master (its link and the health record its voter reads) until `stop`
/// becomes true.
pub fn spawn_monitors(
    masters: &[(Arc<Link>, Arc<MasterHealth>)],
    policy: Policy,
    stop: watch::Receiver<bool>,
) {
    let view = Arc::new(DeploymentView {
        first_sight: Mutex::new(vec![None; masters.len()]),
        decided: watch::Sender::new(None),
    });
    let status = encode_command(&["EVAL", STATUS_SCRIPT, "2", ARMED_KEY, QUARANTINE_KEY]);
    let preload: Vec<Bytes> = policy
        .preload
        .iter()
        .map(|script| encode_command(&["SCRIPT", "LOAD", script]))
        .collect();
    let policy = Arc::new(policy);
    for (index, (link, health)) in masters.iter().enumerate() {
        let monitor = Monitor {
            link: link.clone(),
            health: health.clone(),
            index,
            view: view.clone(),
            policy: policy.clone(),
            info: info_command(),
            status: status.clone(),
            preload: preload.clone(),
        };
        tokio::spawn(monitor.run(stop.clone()));
    }
}

/// The monitor of one master.
struct Monitor {
    link: Arc<Link>,
    health: Arc<MasterHealth>,
    /// The master's place in the deployment view.
    index: usize,
    view: Arc<DeploymentView>,
    policy: Arc<Policy>,
    info: Bytes,
    status: Bytes,
    preload: Vec<Bytes>,
}

impl Monitor {
    async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut verdict = self.view.decided.subscribe();
        loop {
            let connect_seen = self.link.connect_count();
            if self.link.is_connected() {
                self.poll(connect_seen).await;
                for load in &self.preload {
                    let _ = self.ask(load.clone()).await;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.policy.interval.get()) => {}
                _ = self.link.wait_new_connection(connect_seen) => {}
                _ = self.health.check_now.notified() => {}
                _ = verdict.changed() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// One request to the master, whatever its health (the monitor is what judges it).
    async fn ask(&self, payload: Bytes) -> Option<Reply> {
        self.link.send(payload, 1).wait().await.ok()
    }

    /// One look at the master: its clock, its markers, then `INFO`; arms or quarantines it as
    /// needed and marks it ready on connection `connect` when it may vote.
    async fn poll(&self, connect: u64) {
        let (link, health, policy) = (&self.link, &self.health, &self.policy);
        // The master's clock, for the deadline of every acquire (`crate::lock`): a master
        // whose clock cannot be read is not ready.
        let asked = Instant::now();
        let Some(Reply::Array(time)) = self.ask(encode_command(&["TIME"])).await else {
            return;
        };
        let answered = Instant::now();
        let Some(master_ms) = parse_time(&time) else {
            return;
        };
        let error = (answered - asked) / 2;
        health.record_clock(ClockReading {
            at: asked + error,
            master_ms,
            // TIME is read somewhere within the round trip, and has a resolution of 1 µs; the
            // ms rounding of the deadline is covered by the extra millisecond.
            error: error + Duration::from_millis(1),
        });
        let (armed, quarantine_left) = match self.ask(self.status.clone()).await {
            Some(Reply::Array(items)) => match items.as_slice() {
                [Reply::Integer(a), Reply::Integer(q)] => (*a == 1, *q),
                _ => return,
            },
            _ => return,
        };
        let Some(Reply::Bulk(text)) = self.ask(self.info.clone()).await else {
            return;
        };
        let obs = parse_info(&String::from_utf8_lossy(&text));
        let now = Instant::now();
        let first = health.first_sight();
        let waited = first_sight_wait(&obs, policy.lease_bound).filter(|_| first && armed);
        let mut lost = health.observe(&link.addr, obs);
        if policy.quarantine {
            if quarantine_left > 0 {
                let until = now + Duration::from_millis(quarantine_left as u64);
                health.quarantine(&link.addr, until, "quarantined by a proxy (shared marker)");
            }
            if lost.is_none() && waited.is_some() {
                lost = Some(
                    "loaded its data from disk recently (may have lost its last writes)".into(),
                );
            }
        }
        let deployment = self.view.note(self.index, armed);
        let step = marker_step(armed, health.seen_armed(), deployment, lost);
        let step = match step {
            // Quarantine off (the safety suite's negative control only): re-arm, no wait.
            MarkerStep::Quarantine(reason) if !policy.quarantine => {
                tracing::warn!(master = %link.addr, %reason, "master lost data (quarantine is off)");
                MarkerStep::Arm
            }
            step => step,
        };
        match step {
            MarkerStep::Ready => {}
            MarkerStep::Wait => return,
            MarkerStep::Arm => {
                let arm = encode_command(&["SET", ARMED_KEY, "1"]);
                if self.ask(arm).await != Some(Reply::ok()) {
                    return;
                }
            }
            MarkerStep::Quarantine(reason) => {
                let ms = policy.lease_bound.as_millis().to_string();
                let script = encode_command(&[
                    "EVAL",
                    QUARANTINE_SCRIPT,
                    "2",
                    ARMED_KEY,
                    QUARANTINE_KEY,
                    &ms,
                ]);
                let Some(Reply::Integer(left)) = self.ask(script).await else {
                    return;
                };
                let until = now + Duration::from_millis(left.max(0) as u64);
                health.quarantine(&link.addr, until, &reason);
            }
        }
        health.set_ready(connect);
    }
}

#[cfg(test)]
mod tests {
    //! Deterministic: scripted in-process masters and tokio's paused clock.
    use crate::fake_master::{masters, until, FakeMaster, LEASE_BOUND};
    use std::time::Duration;

    const NODE_TIMEOUT: Duration = Duration::from_millis(500);
    const LIMIT: Duration = Duration::from_secs(10);

    #[tokio::test(start_paused = true)]
    async fn a_wiped_master_is_quarantined_for_the_lease_bound_for_every_proxy() {
        let fakes: Vec<_> = (0..3).map(|_| FakeMaster::new()).collect();
        let first = masters(&fakes, NODE_TIMEOUT);
        until(LIMIT, || first.voters().iter().all(|v| v.eligible())).await;
        // A brand-new deployment is armed without a quarantine.
        assert!(fakes.iter().all(|f| f.get(super::ARMED_KEY).is_some()));
        fakes[0].wipe();
        let wiped = &first.voters()[0];
        until(LIMIT, || !wiped.eligible()).await;
        assert!(
            wiped.state().starts_with("quarantined (lock marker gone"),
            "{}",
            wiped.state()
        );
        // A proxy started now learns the quarantine from the master itself.
        let second = masters(&fakes, NODE_TIMEOUT);
        until(LIMIT, || second.voters()[1..].iter().all(|v| v.eligible())).await;
        assert!(!second.voters()[0].eligible());
        assert!(second.voters()[0].state().starts_with("quarantined ("));
        // Both let it vote again only once every lease it may have held has expired.
        tokio::time::sleep(LEASE_BOUND - Duration::from_secs(1)).await;
        assert!(!wiped.eligible() && !second.voters()[0].eligible());
        until(Duration::from_secs(2), || {
            wiped.eligible() && second.voters()[0].eligible()
        })
        .await;
    }
}
