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
//!     ([`crate::on_master::LOCK_SCRIPT`]), and scripts are followed by a guard that checks it
//!     ([`crate::on_master::GUARD_SCRIPT`]): a master wiped since its last poll answers `-1`
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
//! - **Founding a brand-new deployment** (no master armed yet) needs no quarantine, and is
//!   decided on the masters, not from a proxy's memory of them: a proxy whose masters are
//!   undecided *claims* every unarmed master with one script that arms it and writes the
//!   proxy's tag (`founding:…`) into the quarantine key (`PX` = B): a claimed master votes
//!   for nobody. Once a quorum carries its claim and a second, read-only look at every master
//!   (after every counted claim was made) still shows a quorum of its claims and no master
//!   armed outside a claim, the proxy has founded the deployment and lifts its own claims
//!   (only while they are still its own). Any master armed outside a claim makes the
//!   deployment live at once; a decided proxy quarantines every unarmed master it meets (it
//!   joins a running deployment), and a claim nobody lifts ends as a quarantine of B.
//!   Argument: a lease live when the claims are lifted was granted, before the claims, on a
//!   majority M all armed then; a master of M that carries a claim was unarmed when claimed,
//!   so it lost its data (and has voted for nobody since); the others of M that did not lose
//!   theirs are armed, and the second look would have seen them. So every master of M lost
//!   data or could not be seen: at least Q > ⌊(N−1)/2⌋ faulty masters. A master that was
//!   down at founding joins later through a quarantine. Claims of a proxy with a larger tag
//!   are adopted (the tag replaced, the expiry kept), so proxies starting together converge
//!   on one founder instead of splitting the masters between them.
//! - A master that **restarted** (new `run_id`, or uptime going backwards) or **lost data**
//!   (`FLUSHALL`/`DEBUG` calls, keys evicted) while watched is quarantined the same way,
//!   shared key included; a restart is not a loss when the master ran with `appendonly yes`
//!   and `appendfsync always` before and after it (every write fsynced before its reply), and
//!   a `FLUSHDB`/`SWAPDB` is one only if it took database 0's marker with it. A master first seen armed that **loaded its data from
//!   disk** (AOF on, or keys loaded from an RDB) less than B ago may have lost its last writes:
//!   quarantined for the rest of B.
//! - A master in an **unsafe configuration** (role other than master, `maxmemory-policy` other
//!   than `noeviction`, still loading, fewer replicas online than `wait_replicas`) is refused
//!   for as long as that lasts, with the reason logged and shown in `INFO`.
//! - With `wait_replicas`, a **failover to a replica that had every confirmed write** (it
//!   continues the old primary's replication history past this proxy's last look at it, and
//!   that look showed no more replicas than confirm each vote) is no loss: re-stamped, not
//!   quarantined (docs/SAFETY.md "Confirmed writes").
//! - A master is not trusted on a fresh connection until one poll on it has been judged: a
//!   restart always breaks the TCP connection, so no vote from a restarted master is counted
//!   before its new state is seen.
//!
//! Parsing and judging are pure functions, table-tested; the task only does the polling.

pub(crate) mod cluster;
mod cluster_master;
pub(crate) mod judge;
pub(crate) mod loss;
mod state;

pub use cluster_master::{ClusterMaster, ClusterNode};
pub use judge::Deployment;
use judge::{
    check_stamp, founding_round, marker_step, parse_info, parse_time, Founding, MarkerStep,
    Markers, StampCheck,
};
pub use loss::LABELS as QUARANTINE_CAUSES;
use loss::{first_sight_wait, ClockReading, Loss};
pub use state::MasterHealth;

use crate::live::LiveDuration;
use crate::on_master::{
    CLAIM_PREFIX, CLAIM_SCRIPT, CLUSTER_CLAIM_SCRIPT, LIFT_SCRIPT, QUARANTINE_SCRIPT,
    RESTAMP_SCRIPT, STATUS_SCRIPT,
};
use crate::protocol::{encode_command, Reply};
use crate::transport::Link;
use bytes::{Bytes, BytesMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

pub use crate::on_master::{ARMED_KEY, QUARANTINE_KEY, WITNESS_KEY};

/// The `INFO` sections the monitor needs (Redis 7 accepts several sections at once), then the
/// fsync policy, which `INFO` does not show.
fn info_command() -> Bytes {
    let mut both = BytesMut::from(
        &encode_command(&[
            "INFO",
            "server",
            "persistence",
            "stats",
            "replication",
            "memory",
            "commandstats",
        ])[..],
    );
    both.extend_from_slice(&encode_command(&[
        "CONFIG",
        "GET",
        "appendfsync",
        "enable-debug-command",
    ]));
    both.freeze()
}

/// A parameter's value in a `CONFIG GET` reply (name, value pairs in any order; `None` if
/// absent, or the reply is an error: `CONFIG` renamed away).
fn config_value<'r>(reply: &'r Reply, name: &str) -> Option<&'r [u8]> {
    let Reply::Array(items) = reply else {
        return None;
    };
    items.chunks(2).find_map(|pair| match pair {
        [Reply::Bulk(n), Reply::Bulk(v)] if n.eq_ignore_ascii_case(name.as_bytes()) => {
            Some(v.as_ref())
        }
        _ => None,
    })
}

/// This proxy's view of the deployment, shared by the monitors of all masters and the
/// founding task.
struct DeploymentView {
    /// This proxy's founding tag (`founding:<pid>.<start ns>.<n>`, unique across proxies).
    tag: String,
    /// Becomes `Some` once decided, and never changes after.
    verdict: watch::Sender<Option<Deployment>>,
    /// Woken after every poll judged once the verdict is in, and after every founding round
    /// (whether the proxy started may hang on masters found unreachable: [`Startup`]).
    judged: Notify,
    /// Each master's last `run_id`: two addresses of one redis-server must not both vote.
    run_ids: std::sync::Mutex<Vec<String>>,
}

impl DeploymentView {
    fn verdict(&self) -> Option<Deployment> {
        *self.verdict.borrow()
    }

    /// Records master `index`'s `run_id`; the other master with the same one, if any (the
    /// same redis-server reached through two addresses).
    fn same_server_as(&self, index: usize, run_id: &str) -> Option<usize> {
        let mut ids = self.run_ids.lock().ok()?;
        ids[index] = run_id.to_string();
        (!run_id.is_empty())
            .then(|| {
                ids.iter()
                    .enumerate()
                    .position(|(i, id)| i != index && id == run_id)
            })
            .flatten()
    }

    /// Records the verdict if none was reached before (monitors waiting for it look again).
    fn decide(&self, verdict: Deployment, how: &str) {
        let decided = self.verdict.send_if_modified(|v| {
            let first = v.is_none();
            if first {
                *v = Some(verdict);
            }
            first
        });
        if decided {
            tracing::info!(?verdict, "deployment decided: {how}");
        }
    }
}

/// Whether the proxy has judged its masters since it started (see [`Startup::started`]).
#[derive(Clone)]
pub struct Startup {
    view: Arc<DeploymentView>,
    started: Arc<std::sync::atomic::AtomicBool>,
}

impl Startup {
    /// The deployment verdict, once decided.
    pub fn verdict(&self) -> Option<Deployment> {
        self.view.verdict()
    }

    /// True from the first moment `judged(verdict)` holds (see [`crate::masters::Masters`]);
    /// never false again. Before, an acquire's refusal would mean only "not looked at yet".
    pub fn started(&self, judged: impl FnOnce(Option<Deployment>) -> bool) -> bool {
        use std::sync::atomic::Ordering;
        if self.started.load(Ordering::Relaxed) {
            return true;
        }
        let now = judged(self.view.verdict());
        if now {
            self.started.store(true, Ordering::Relaxed);
        }
        now
    }

    /// Waits until [`Startup::started`] (re-evaluating `judged` after every poll), at most
    /// `limit`; whether it started.
    pub async fn wait_started(
        &self,
        limit: Duration,
        judged: impl Fn(Option<Deployment>) -> bool,
    ) -> bool {
        let waiting = async {
            loop {
                let polled = self.view.judged.notified();
                if self.started(&judged) {
                    return;
                }
                polled.await;
            }
        };
        tokio::time::timeout(limit, waiting).await.is_ok()
    }
}

/// What the monitors need of the proxy's configuration.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
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
    /// How many replicas confirm every vote (`WAIT`; 0: off): a primary with fewer online may
    /// not vote, and a failover to a replica that had every confirmed write is no loss.
    pub wait_replicas: u32,
    /// The drift factor F: a master's clock may run at most 1 + F times the proxy's
    /// ([`loss::clock`]).
    pub drift_factor: f64,
    /// Masters whose `enable-debug-command` is not `no` may vote (the operator accepts that
    /// `DEBUG RELOAD` can replace their data in place).
    pub allow_debug_command: bool,
    /// Judge a master's clock on every merged lock call ([`MasterHealth::judge_call_clock`]),
    /// not only at each poll (off only in the negative control of the tests).
    pub clock_per_call: bool,
}

/// Where a master is, as its voter routes to it and the monitors watch it: one server, or a
/// Redis Cluster whose slots are served by its primaries.
#[derive(Debug, Clone)]
pub enum Place {
    /// One redis-server (or a Sentinel group's primary): its link and the health record its
    /// monitor keeps.
    Single {
        link: Arc<Link>,
        health: Arc<MasterHealth>,
    },
    /// A Redis Cluster: its keeper watches the map, every primary and every slot.
    Cluster(Arc<ClusterMaster>),
}

/// Watches every master until `stop` becomes true, and founds the deployment if it is new.
pub fn spawn_monitors(
    masters: &[Place],
    policy: MonitorConfig,
    stop: watch::Receiver<bool>,
) -> Startup {
    let view = Arc::new(DeploymentView {
        tag: format!("{CLAIM_PREFIX}{}", instance_name()),
        verdict: watch::Sender::new(None),
        judged: Notify::new(),
        run_ids: std::sync::Mutex::new(vec![String::new(); masters.len()]),
    });
    // A single master's status also reads its write witness.
    let status = encode_command(&[
        "EVAL",
        STATUS_SCRIPT.text(),
        "3",
        ARMED_KEY,
        QUARANTINE_KEY,
        WITNESS_KEY,
    ]);
    let preload: Vec<Bytes> = policy
        .preload
        .iter()
        .map(|script| encode_command(&["SCRIPT", "LOAD", script]))
        .collect();
    let policy = Arc::new(policy);
    tokio::spawn(found(
        masters.to_vec(),
        view.clone(),
        policy.clone(),
        stop.clone(),
    ));
    for (index, place) in masters.iter().enumerate() {
        match place {
            Place::Single { link, health } => {
                let monitor = Monitor {
                    role: Role::Master {
                        index,
                        status: status.clone(),
                    },
                    link: link.clone(),
                    health: health.clone(),
                    view: view.clone(),
                    policy: policy.clone(),
                    info: info_command(),
                    preload: preload.clone(),
                };
                tokio::spawn(monitor.run(stop.clone()));
            }
            Place::Cluster(cluster) => {
                let keeper = cluster::Keeper {
                    cluster: cluster.clone(),
                    view: view.clone(),
                    policy: policy.clone(),
                    preload: preload.clone(),
                };
                tokio::spawn(keeper.run(stop.clone()));
            }
        }
    }
    Startup {
        view,
        started: Arc::default(),
    }
}

/// A name no other proxy (token proposer, founder) has, across proxies and restarts: `<pid>.<start ns>.<n>` in
/// hex, `n` counting the proposers of this process. Short (about 25 bytes, so a record
/// stays within the 44 bytes Redis keeps in one allocation), since every acquire sends it and
/// every master stores it.
pub(crate) fn instance_name() -> String {
    static PROPOSERS: AtomicU64 = AtomicU64::new(0);
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = PROPOSERS.fetch_add(1, Ordering::Relaxed);
    format!("{:x}.{started:x}.{n:x}", std::process::id())
}

/// Claim rounds a founding proxy waits, once a quorum carries its claim, for masters that did
/// not answer yet (one health interval, plus up to a node timeout for the answers, each); and
/// when each of them refused the proxy's credentials.
const FOUNDING_PATIENCE: u32 = 10;
const FOUNDING_PATIENCE_IF_REFUSED: u32 = 1;

/// `EVAL script 2 <armed> <quarantine> args…`.
fn markers_command(script: &str, args: &[&str]) -> Bytes {
    let mut parts = vec!["EVAL", script, "2", ARMED_KEY, QUARANTINE_KEY];
    parts.extend_from_slice(args);
    encode_command(&parts)
}

/// A markers script to run on every master: on a single master its form and the command, on
/// a cluster its cluster form and arguments (run on every slot).
struct MarkersScript {
    single: Bytes,
    cluster: &'static str,
    args: Vec<String>,
}

/// A master as the founding sees it: one server's markers, or a cluster's (every slot's,
/// taken together: [`Markers::combine`]).
impl Place {
    /// The master's markers after `script` (`None`: no usable answer).
    async fn look(&self, script: &MarkersScript) -> Option<Markers> {
        match self {
            Place::Single { link, .. } => {
                let answer = ask(link, script.single.clone(), 1).await?;
                Markers::parse(&answer)
            }
            Place::Cluster(c) => cluster::look_at_every_slot(c, script.cluster, &script.args).await,
        }
    }

    /// The links whose new connections wake the founding (a cluster: its seeds).
    fn links(&self) -> Vec<Arc<Link>> {
        match self {
            Place::Single { link, .. } => vec![link.clone()],
            Place::Cluster(cluster) => cluster.seeds.clone(),
        }
    }

    /// Until its first connection attempts are over (a cluster: its seeds', then, if one
    /// answered, its map's primaries'), so that the first claims find it.
    async fn wait_attempted(&self) {
        futures::future::join_all(self.links().iter().map(|l| l.wait_attempted())).await;
        if let Place::Cluster(cluster) = self {
            cluster.wait_primaries_attempted().await;
        }
    }

    /// Why the master refused the proxy's credentials, if it did.
    fn auth_refused(&self) -> Option<String> {
        self.links().iter().find_map(|l| l.auth_refused())
    }
}

/// `replies` requests to a server at once, whatever its health (the monitors and keepers are
/// what judge it): their replies (as an array when more than one), or `None` without them.
async fn ask(link: &Link, payload: Bytes, replies: usize) -> Option<Reply> {
    link.send(payload, replies).wait().await.ok()
}

/// Asks every master at once; each answer read as markers (`None`: no usable answer).
async fn look_at_all(places: &[Place], script: &MarkersScript) -> Vec<Option<Markers>> {
    futures::future::join_all(places.iter().map(|place| place.look(script))).await
}

/// Founds the deployment if it is new (module header): rounds of claims on every master until
/// a quorum carries this proxy's claim (then a read-only look confirms it), or some master
/// is seen armed outside a claim (live). Ends once the verdict is in, by whichever path.
async fn found(
    links: Vec<Place>,
    view: Arc<DeploymentView>,
    policy: Arc<MonitorConfig>,
    mut stop: watch::Receiver<bool>,
) {
    let quorum = links.len() / 2 + 1;
    let bound = policy.lease_bound.as_millis().to_string();
    let claim = MarkersScript {
        single: markers_command(CLAIM_SCRIPT.text(), &[&view.tag, &bound]),
        cluster: CLUSTER_CLAIM_SCRIPT.text(),
        args: vec![view.tag.clone(), bound.clone()],
    };
    let status = MarkersScript {
        single: markers_command(STATUS_SCRIPT.text(), &[]),
        cluster: STATUS_SCRIPT.text(),
        args: Vec::new(),
    };
    // Every master gets one connection attempt first: one that is merely slower to connect
    // than the others is claimed with them instead of joining later through a quarantine.
    let tried = futures::future::join_all(links.iter().map(|l| l.wait_attempted()));
    tokio::select! {
        _ = tried => {}
        _ = stop.wait_for(|s| *s) => return,
    }
    view.judged.notify_waiters();
    let mut reported = None;
    // Rounds a quorum of claims waits for masters that did not answer, so that those merely
    // slow (a loaded machine: a connection attempt may even have timed out) are founded with
    // the others instead of joining later through a quarantine: a few, or one when every one of
    // them refused the proxy's credentials (that is no passing state).
    let (mut patience, mut patience_if_refused) = (FOUNDING_PATIENCE, FOUNDING_PATIENCE_IF_REFUSED);
    loop {
        if view.verdict().is_some() {
            return;
        }
        let seen: Vec<(Arc<Link>, u64)> = (links.iter().flat_map(Place::links))
            .map(|l| {
                let count = l.connect_count();
                (l, count)
            })
            .collect();
        let looks = look_at_all(&links, &claim).await;
        let slow = looks
            .iter()
            .zip(&links)
            .any(|(look, link)| look.is_none() && link.auth_refused().is_none());
        let waits = match slow {
            true => &mut patience,
            false => &mut patience_if_refused,
        };
        let round = match founding_round(&looks, &view.tag, quorum) {
            Founding::Quorum { silent } if silent > 0 && *waits > 0 => {
                *waits -= 1;
                Founding::Short {
                    mine: quorum,
                    others: 0,
                    silent,
                }
            }
            // Counted claims were all made before this look began (module header).
            Founding::Quorum { .. } => {
                founding_round(&look_at_all(&links, &status).await, &view.tag, quorum)
            }
            round => round,
        };
        match round {
            Founding::Live => view.decide(Deployment::Live, "a master is armed"),
            Founding::Quorum { .. } => view.decide(
                Deployment::Fresh,
                "no master was armed: this proxy founded the deployment on a quorum of them",
            ),
            Founding::Short {
                mine,
                others,
                silent,
            } => {
                if reported != Some((mine, others, silent)) {
                    let why = match mine >= quorum {
                        true => "no master is armed yet: a quorum carries this proxy's founding claim; waiting a little for the masters that did not answer",
                        false => "no master is armed yet: the deployment is new, but fewer than a quorum of masters carry this proxy's founding claim; serving nothing until they do",
                    };
                    tracing::warn!(
                        claimed = mine,
                        claimed_by_other_proxies = others,
                        not_answering = silent,
                        quorum,
                        "{why}"
                    );
                    reported = Some((mine, others, silent));
                }
            }
        }
        view.judged.notify_waiters();
        let new_connection = futures::future::select_all(
            seen.iter()
                .map(|(l, s)| Box::pin(l.wait_new_connection(*s))),
        );
        tokio::select! {
            _ = tokio::time::sleep(policy.interval.get()) => {}
            _ = new_connection => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// What a monitored server is.
enum Role {
    /// A master: its place in the configuration and the command that reads its markers.
    Master { index: usize, status: Bytes },
    /// A primary of a cluster master: its markers are per slot (the cluster's keeper reads
    /// them); a loss its monitor sees is every slot it serves.
    Node {
        cluster: Arc<ClusterMaster>,
        id: String,
    },
}

/// The monitor of one master, or of one primary of a cluster.
struct Monitor {
    role: Role,
    link: Arc<Link>,
    health: Arc<MasterHealth>,
    view: Arc<DeploymentView>,
    policy: Arc<MonitorConfig>,
    info: Bytes,
    preload: Vec<Bytes>,
}

impl Monitor {
    async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut verdict = self.view.verdict.subscribe();
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
        self.ask_n(payload, 1).await
    }

    /// `replies` requests at once: their replies as an array.
    async fn ask_n(&self, payload: Bytes, replies: usize) -> Option<Reply> {
        ask(&self.link, payload, replies).await
    }

    /// Reads the server's clock into its health record, for the deadline of every acquire
    /// (`crate::lock`); `None` if it cannot be read (the server is then not ready).
    async fn read_clock(&self) -> Option<()> {
        let asked = Instant::now();
        let Some(Reply::Array(time)) = self.ask(encode_command(&["TIME"])).await else {
            return None;
        };
        let answered = Instant::now();
        let master_ms = parse_time(&time)?;
        let error = (answered - asked) / 2;
        self.health.record_clock(ClockReading {
            at: asked + error,
            master_ms,
            // TIME is read somewhere within the round trip, and has a resolution of 1 µs; the
            // ms rounding of the deadline is covered by the extra millisecond.
            error: error + Duration::from_millis(1),
        });
        Some(())
    }

    /// Judges the clock reading this poll took, on the process `run_id` ([`loss::clock`]).
    fn judge_clock(&self, run_id: &str) -> Option<Loss> {
        let policy = &self.policy;
        (self.health).judge_clock(run_id, policy.drift_factor, policy.lease_bound)
    }

    /// The server's `INFO` and fsync policy, read.
    async fn read_info(&self) -> Option<judge::Observation> {
        let Some(Reply::Array(answers)) = self.ask_n(self.info.clone(), 2).await else {
            return None;
        };
        let [Reply::Bulk(text), config] = answers.as_slice() else {
            return None;
        };
        let mut obs = parse_info(&String::from_utf8_lossy(text));
        obs.fsync_always =
            config_value(config, "appendfsync").is_some_and(|p| p.eq_ignore_ascii_case(b"always"));
        obs.debug_command = config_value(config, "enable-debug-command")
            .map(|v| String::from_utf8_lossy(v).to_ascii_lowercase())
            .unwrap_or_default();
        Some(obs)
    }

    /// One look at the server: its clock, then what its role needs.
    async fn poll(&self, connect: u64) {
        if self.read_clock().await.is_none() {
            return;
        }
        match &self.role {
            Role::Master { index, status } => self.poll_master(connect, *index, status).await,
            Role::Node { cluster, id } => self.poll_node(connect, cluster, id).await,
        }
    }

    /// A primary of a cluster: judged on its `INFO` as a master is (a node promoted in place
    /// of another, against that one's last look as a primary: with `wait_replicas`, a failback
    /// that kept every confirmed write is no loss); a loss (a restart, wiped data, data loaded
    /// from disk recently) takes every slot it serves out of the vote at once and has the
    /// keeper quarantine them. It is then ready on connection `connect`: its
    /// slots vote as the keeper finds them.
    async fn poll_node(&self, connect: u64, cluster: &ClusterMaster, id: &str) {
        let Some(obs) = self.read_info().await else {
            return;
        };
        let (health, addr, replicas) = (&self.health, &self.link.addr, self.policy.wait_replicas);
        let took_over = cluster.predecessor(id, &obs).map(|(_, primary)| primary);
        // Promoted with every confirmed write of the primary it replaced, it holds what counted
        // there, however its dataset was loaded (a replica's full sync reads like a load from
        // disk): no wait at first sight.
        let kept = cluster.kept_writes_of(id, &obs, replicas).is_some();
        let first = health.first_sight() && !kept;
        let waited = first_sight_wait(&obs, self.policy.lease_bound).filter(|_| first);
        let clock = self.judge_clock(&obs.run_id);
        let allow_debug = self.policy.allow_debug_command;
        let lost = health.observe(addr, obs, None, replicas, took_over.as_ref(), allow_debug);
        let lost = lost
            .or(clock)
            .or_else(|| waited.map(|_| Loss::loaded_from_disk()));
        if let Some(loss) = lost {
            cluster.node_lost(id, loss);
        }
        health.set_ready(connect);
    }

    /// One look at a master: its markers, then `INFO`; arms or quarantines it as needed and
    /// marks it ready on connection `connect` when it may vote.
    async fn poll_master(&self, connect: u64, index: usize, status: &Bytes) {
        let (link, health, policy) = (&self.link, &self.health, &self.policy);
        // The verdict as it stood before the markers were read: a founding decided while this
        // poll is under way (its claim written after the read) must not meet these markers, or
        // a master claimed for the founding would be taken for one unarmed in a running
        // deployment. A verdict that changes wakes the monitor for another poll.
        let verdict = self.view.verdict();
        // What the link saw acknowledged before the status request leaves: every write of it
        // ran on the master before the status script does (one connection, in order).
        let (acknowledged, uncovered) = link.witness.acknowledged();
        let Some(reply) = self.ask(status.clone()).await else {
            return;
        };
        let Some(markers) = Markers::parse(&reply) else {
            return;
        };
        let Some(mut obs) = self.read_info().await else {
            return;
        };
        let holds = judge::witness_of(&reply);
        obs.witness = Some(judge::WitnessCheck {
            holds,
            acknowledged,
            uncovered,
        });
        let now = Instant::now();
        let first = health.first_sight();
        let watched = health.last_run_id();
        // The armed marker's stamp when armed outside a claim (`Some(None)`: unstamped).
        let stamp = match &markers {
            Markers::Armed { stamp, .. } => Some(stamp.clone()),
            _ => None,
        };
        let armed = stamp.is_some();
        let waited = first_sight_wait(&obs, policy.lease_bound).filter(|_| first && armed);
        let twin = self.view.same_server_as(index, &obs.run_id).map(|other| {
            format!(
                "the same redis-server as master{other} (run_id {}): it would vote twice",
                &obs.run_id[..obs.run_id.len().min(8)]
            )
        });
        let judged = obs.clone();
        let clock = self.judge_clock(&obs.run_id);
        let (replicas, allow_debug) = (policy.wait_replicas, policy.allow_debug_command);
        let mut lost = health.observe(&link.addr, obs, twin, replicas, None, allow_debug);
        lost = lost.or(clock);
        if armed {
            self.view.decide(Deployment::Live, "a master is armed");
        }
        if let Some(stamp) = stamp {
            let (stamp, watched) = (stamp.as_deref(), watched.as_deref());
            match check_stamp(stamp, &judged, watched, lost.is_some(), policy.lease_bound) {
                StampCheck::Own => {}
                StampCheck::Restamp => self.restamp(stamp, &judged.run_id).await,
                StampCheck::Foreign(loss) => {
                    lost.get_or_insert(loss);
                }
            }
        }
        if policy.quarantine {
            if lost.is_none() && waited.is_some() {
                lost = Some(Loss::loaded_from_disk());
            }
            health.end_quarantine(&link.addr);
            if let Markers::Armed {
                quarantine_left_ms: left @ 1..,
                ..
            } = markers
            {
                // The cause this proxy saw, if it saw one (another proxy may have written the
                // marker first: the log and INFO then still name the restart).
                let loss = lost.clone().unwrap_or_else(Loss::shared_marker);
                let until = now + Duration::from_millis(left as u64);
                health.quarantine(&link.addr, until, &loss);
            }
        }
        let step = marker_step(&markers, health.seen_armed(), verdict, &self.view.tag, lost);
        let quarantining = matches!(step, MarkerStep::Quarantine(_));
        let ready = self.take(step, now).await;
        if quarantining {
            // The loss is quarantined: the writes it lacks are covered, judging starts again
            // from what it holds.
            link.witness.reset(holds);
        }
        if ready {
            health.set_ready(connect);
        }
        if verdict.is_some() {
            health.set_judged();
            self.view.judged.notify_waiters();
        }
    }

    /// Stamps the armed marker with `run_id`, the process judged, if it still holds `stamp`
    /// (`None`: `1`, unstamped) and the master is still that process ([`RESTAMP_SCRIPT`]).
    async fn restamp(&self, stamp: Option<&str>, run_id: &str) {
        let stamp = stamp.unwrap_or("1");
        let script =
            encode_command(&["EVAL", RESTAMP_SCRIPT.text(), "1", ARMED_KEY, stamp, run_id]);
        if self.ask(script).await == Some(Reply::Integer(1)) {
            tracing::debug!(master = %self.link.addr, "armed marker stamped with the serving process");
        }
    }

    /// Carries out `step` on the master; whether it may vote afterwards.
    async fn take(&self, step: MarkerStep, now: Instant) -> bool {
        let (link, health, policy) = (&self.link, &self.health, &self.policy);
        match step {
            MarkerStep::Ready => true,
            MarkerStep::Wait(why) => {
                health.set_waiting(why, false);
                false
            }
            MarkerStep::Claimed => {
                health.set_waiting(
                    "claimed by a proxy deciding whether the deployment is new",
                    true,
                );
                false
            }
            MarkerStep::Lift => {
                let lift = markers_command(LIFT_SCRIPT.text(), &[&self.view.tag]);
                self.ask(lift).await == Some(Reply::Integer(1))
            }
            // Quarantine off (the safety suite's negative control only): re-arm, no wait.
            MarkerStep::Quarantine(loss) if !policy.quarantine => {
                tracing::warn!(master = %link.addr, reason = %loss, "master lost data (quarantine is off)");
                let arm = encode_command(&["SET", ARMED_KEY, "1"]);
                self.ask(arm).await == Some(Reply::ok())
            }
            MarkerStep::Quarantine(loss) => {
                let ms = policy.lease_bound.as_millis().to_string();
                let script = markers_command(QUARANTINE_SCRIPT.text(), &[&ms]);
                let Some(Reply::Integer(left)) = self.ask(script).await else {
                    return false;
                };
                let until = now + Duration::from_millis(left.max(0) as u64);
                health.quarantine(&link.addr, until, &loss);
                true
            }
        }
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
        until(LIMIT, || first.voters().iter().all(|v| v.usable())).await;
        // A brand-new deployment is armed without a quarantine.
        assert!(fakes.iter().all(|f| f.get(super::ARMED_KEY).is_some()));
        fakes[0].wipe();
        let wiped = &first.voters()[0];
        until(LIMIT, || !wiped.usable()).await;
        assert!(
            wiped.state().starts_with("quarantined (lock marker gone"),
            "{}",
            wiped.state()
        );
        // A proxy started now learns the quarantine from the master itself.
        let second = masters(&fakes, NODE_TIMEOUT);
        until(LIMIT, || second.voters()[1..].iter().all(|v| v.usable())).await;
        assert!(!second.voters()[0].usable());
        assert!(second.voters()[0].state().starts_with("quarantined ("));
        // Both let it vote again only once every lease it may have held has expired.
        tokio::time::sleep(LEASE_BOUND - Duration::from_secs(1)).await;
        assert!(!wiped.usable() && !second.voters()[0].usable());
        until(Duration::from_secs(2), || {
            wiped.usable() && second.voters()[0].usable()
        })
        .await;
    }
}
