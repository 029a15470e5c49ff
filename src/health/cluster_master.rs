//! One Redlock master that is a Redis Cluster ([`ClusterMaster`]): its slot map, a link and a
//! health record per primary ([`ClusterNode`]), and what the proxy knows of each slot's markers
//! (whether the slot's owner may vote for it now). The keeper task that reads the map and the
//! markers is in [`super::cluster`]; this module only holds the state and answers the
//! routing questions of a fan-out.
//!
//! Invariants:
//! - A slot votes only through the node the current map names its owner, and only once the
//!   keeper found that slot armed *by that very node* (its marker stamped with the node's id),
//!   unquarantined, on a node whose health record says it may vote on its current connection.
//!   A new owner (failover, migration) starts unready: the keeper looks at the slot again.
//! - The scripts check the same on the node itself at every call ([`crate::on_master`]'s cluster
//!   forms), so a node that changed since the keeper's look answers `-1` instead of voting.
//! - Nodes are never dropped: a cluster has a bounded set of them, and a primary that became a
//!   replica may come back.

use super::judge::Observation;
use super::loss::{kept_every_confirmed_write, Loss};
use super::MasterHealth;
use crate::backend::Backend;
use crate::cluster::map::{Redirect, SlotMap};
use crate::cluster::slots::SLOTS;
use crate::dial::Dial;
use crate::live::LiveDuration;
use crate::on_master::{script_sha, CLUSTER_LOCK_SCRIPT};
use crate::protocol::Reply;
use crate::secret::Secret;
use crate::transport::{Driver, Floor, Link, SharedScript};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_rustls::TlsConnector;

/// The most nodes a cluster master routes to (Redis Cluster's recommended bound is 1000).
const MAX_NODES: usize = 4096;

/// A primary of the cluster (or a node that was one).
#[derive(Debug)]
pub struct ClusterNode {
    /// Its node id (`CLUSTER MYID`): the stamp of the slots it armed.
    pub id: String,
    /// Never 0; names the node in [`ClusterMaster`]'s per-slot readiness.
    serial: u32,
    pub link: Arc<Link>,
    pub health: Arc<MasterHealth>,
    /// Losses its health monitor saw ([`ClusterMaster::node_lost`]): a slot found ready while
    /// one came is not ready.
    losses: AtomicU64,
}

impl ClusterNode {
    /// Losses seen so far (see [`ClusterMaster::set_slot`]).
    pub fn losses(&self) -> u64 {
        self.losses.load(Ordering::SeqCst)
    }

    /// Whether its health record lets it vote on its current connection.
    pub fn eligible(&self) -> bool {
        self.link.is_connected() && self.health.eligible(self.link.connect_count())
    }
}

/// What the proxy knows of one slot, a quarter of a cache line: the request path reads it whole
/// (three arrays of 16384 were three cache misses per request and cluster, 6 % of the proxy's
/// CPU over three clusters of three shards).
#[derive(Default)]
#[repr(C, align(16))]
struct SlotCell {
    /// The serial of its owner in the current map (0: none).
    owner: AtomicU32,
    /// The serial of the node found armed and ready for it (0: none).
    ready: AtomicU32,
    /// Until when (ms after `epoch`) it votes for nobody (a quarantine or another proxy's
    /// founding claim); 0: not fenced.
    fenced_until: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<SlotCell>() == 16);

/// How a cluster's nodes are dialled: the configured master's credentials and TLS, at each
/// node's address.
struct DialTemplate {
    backend: Backend,
    tls: Option<Result<TlsConnector, String>>,
    env_password: Option<Secret>,
}

/// A Redis Cluster voting as one master.
pub struct ClusterMaster {
    /// As configured (`cluster://h:p,h:p`), for `INFO`, logs and metrics.
    pub name: String,
    template: DialTemplate,
    node_timeout: LiveDuration,
    stop: watch::Receiver<bool>,
    /// The seed nodes' links, for the map until primaries are known.
    pub seeds: Vec<Arc<Link>>,
    /// The current map (each slot's owner is also in its [`SlotCell`]).
    map: RwLock<Option<Arc<SlotMap>>>,
    /// Every node met, by id.
    nodes: Mutex<HashMap<String, Arc<ClusterNode>>>,
    next_serial: AtomicU32,
    /// Every node by its serial (index 0 unused): what the request path reads without a lock.
    by_serial: Box<[OnceLock<Arc<ClusterNode>>]>,
    /// What the proxy knows of each slot: the request path's routing, lock-free
    /// ([`ClusterMaster::with_owner`]).
    slots: Box<[SlotCell]>,
    epoch: Instant,
    /// The merged lock script of every node: a link merges the calls of any slots its node
    /// serves, each operation naming its own slot's markers.
    lock_script: Arc<SharedScript>,
    /// Wakes the keeper: a redirection (the map changed) or a slot answered unarmed.
    pub wake: Notify,
    /// Whether some slot may not be found ready: set by whatever can make one so (a new map, a
    /// loss, a recheck) and by a keeper round that left one. A round finding it unset scans no
    /// slot: the scan of all 16384 every 100 ms was 4 % of the proxy's CPU under load over
    /// three clusters, and most of what it burnt idle.
    rescan: AtomicBool,
    /// Nodes whose health monitor found they lost data, with the reason: every slot they own
    /// is quarantined at the keeper's next round.
    lost: Mutex<HashMap<String, Loss>>,
    /// Whether the keeper has judged every slot once since the deployment verdict.
    judged: std::sync::atomic::AtomicBool,
    /// Quarantines begun (one per primary and cause at a time, whatever the slots), by cause
    /// (for the metrics).
    quarantines: Mutex<std::collections::BTreeMap<&'static str, u64>>,
}

impl ClusterMaster {
    /// The cluster of `backend` (its seeds), dialled with its credentials and TLS; links to
    /// the seeds are made (their drivers run until `stop`).
    pub fn new(
        backend: &Backend,
        tls: Option<Result<TlsConnector, String>>,
        env_password: Option<Secret>,
        node_timeout: LiveDuration,
        stop: watch::Receiver<bool>,
    ) -> Arc<ClusterMaster> {
        let template = DialTemplate {
            backend: backend.clone(),
            tls,
            env_password,
        };
        let seeds = (backend.cluster.iter().flatten())
            .map(|(host, port)| {
                let (link, driver) = template.link(host, *port, node_timeout.clone());
                tokio::spawn(driver.run(stop.clone()));
                link
            })
            .collect();
        Arc::new(ClusterMaster {
            name: backend.to_string(),
            template,
            node_timeout,
            stop,
            seeds,
            map: RwLock::default(),
            nodes: Mutex::default(),
            next_serial: AtomicU32::new(1),
            by_serial: (0..=MAX_NODES).map(|_| OnceLock::new()).collect(),
            slots: (0..SLOTS).map(|_| SlotCell::default()).collect(),
            epoch: Instant::now(),
            lock_script: Arc::new(SharedScript {
                sha: script_sha(CLUSTER_LOCK_SCRIPT.text().as_bytes()),
                body: CLUSTER_LOCK_SCRIPT.text(),
                names_in_argv: true,
                // Cluster nodes keep no witness (docs/SAFETY.md, "Acknowledged writes").
                floor: Floor::None,
                // Nor answer their clock: their acquires are judged at the next poll's `TIME`
                // (docs/SAFETY.md, "Master clocks: steps and rates between two looks").
                answers_clock: false,
            }),
            wake: Notify::new(),
            rescan: AtomicBool::new(true),
            lost: Mutex::default(),
            judged: Default::default(),
            quarantines: Mutex::default(),
        })
    }

    /// The current slot map, once one was read.
    pub fn map(&self) -> Option<Arc<SlotMap>> {
        self.map.read().ok()?.clone()
    }

    /// The node of id `id` at `host:port`, made (its link connecting, its driver running until
    /// the proxy stops) if it is new; `true` with it if it is new.
    pub fn node(&self, id: &str, host: &str, port: u16) -> (Arc<ClusterNode>, bool) {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(node) = nodes.get(id) {
            return (node.clone(), false);
        }
        let (link, driver) = self.template.link(host, port, self.node_timeout.clone());
        tokio::spawn(driver.run(self.stop.clone()));
        let node = Arc::new(ClusterNode {
            id: id.to_string(),
            serial: self.next_serial.fetch_add(1, Ordering::Relaxed),
            link,
            health: Arc::default(),
            losses: AtomicU64::new(0),
        });
        match self.by_serial.get(node.serial as usize) {
            Some(place) => drop(place.set(node.clone())),
            None => {
                tracing::error!(master = %self.name, "more than {MAX_NODES} nodes met: the new ones are not routed to")
            }
        }
        nodes.insert(id.to_string(), node.clone());
        (node, true)
    }

    /// Every node met so far that is routed to, read without a lock (on every acquire's path:
    /// [`ClusterMaster::nodes`] takes a lock and copies).
    pub fn each_node(&self) -> impl Iterator<Item = &Arc<ClusterNode>> {
        let met = (self.next_serial.load(Ordering::Acquire) as usize).min(self.by_serial.len());
        self.by_serial[1..met].iter().filter_map(OnceLock::get)
    }

    /// Every node met so far.
    pub fn nodes(&self) -> Vec<Arc<ClusterNode>> {
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        nodes.values().cloned().collect()
    }

    /// The node whose replication history `now` (node `id`'s `INFO` as a primary) continues,
    /// with this proxy's last look at it while it was a primary: the primary `id` was promoted
    /// in place of (docs/SAFETY.md, "Cluster masters"). `None` if `id` was never promoted, or
    /// its old primary was not watched as one.
    pub fn predecessor(&self, id: &str, now: &Observation) -> Option<(String, Observation)> {
        if !now.promoted() {
            return None;
        }
        self.each_node().find_map(|node| {
            let primary = node.health.last_primary()?;
            (node.id != id && primary.master_replid == now.master_replid2)
                .then(|| (node.id.clone(), primary))
        })
    }

    /// The node `id` was promoted in place of ([`ClusterMaster::predecessor`]), if `now` holds
    /// every write whose vote counted there (`wait_replicas`, docs/SAFETY.md "Confirmed
    /// writes"): its id.
    pub fn kept_writes_of(
        &self,
        id: &str,
        now: &Observation,
        wait_replicas: u32,
    ) -> Option<String> {
        let (from, primary) = self.predecessor(id, now)?;
        kept_every_confirmed_write(&primary, now, wait_replicas).then_some(from)
    }

    /// Installs `map` (its primaries already made nodes with [`ClusterMaster::node`]).
    pub fn set_map(&self, map: SlotMap) {
        {
            let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
            for (slot, cell) in (0..SLOTS as u16).zip(self.slots.iter()) {
                let owner = map.owner(slot).and_then(|n| nodes.get(&n.id));
                cell.owner
                    .store(owner.map_or(0, |n| n.serial), Ordering::Release);
            }
        }
        if let Ok(mut current) = self.map.write() {
            *current = Some(Arc::new(map));
        }
        self.rescan_later();
    }

    /// Whether the keeper must scan the slots for one not found ready (cleared by asking).
    pub fn take_rescan(&self) -> bool {
        self.rescan.swap(false, Ordering::SeqCst)
    }

    /// Has the keeper scan the slots at its next round.
    pub fn rescan_later(&self) {
        self.rescan.store(true, Ordering::SeqCst);
    }

    /// The node that serves `slot` now, if the map names one: read without a lock (on every
    /// request's path, a read-write lock's shared counter bounced between the cores: 7 % of
    /// the proxy's CPU under load).
    pub fn owner_ref(&self, slot: u16) -> Option<&Arc<ClusterNode>> {
        let serial = self
            .slots
            .get(usize::from(slot))?
            .owner
            .load(Ordering::Acquire);
        self.by_serial.get(serial as usize)?.get()
    }

    /// [`ClusterMaster::owner_ref`], counted.
    pub fn owner(&self, slot: u16) -> Option<Arc<ClusterNode>> {
        self.owner_ref(slot).cloned()
    }

    /// `f` on the node that serves `slot` now, if the map names one (no reference count
    /// taken: this is on every request's path).
    pub fn with_owner<R>(&self, slot: u16, f: impl FnOnce(&ClusterNode) -> R) -> Option<R> {
        self.owner_ref(slot).map(|node| f(node))
    }

    /// Whether `slot` may vote through `node` now: found armed by it, not fenced.
    pub fn slot_ready(&self, slot: u16, node: &ClusterNode) -> bool {
        let cell = &self.slots[usize::from(slot)];
        cell.ready.load(Ordering::SeqCst) == node.serial && !self.fenced(cell)
    }

    /// Whether `slot` is quarantined or claimed now (its vote is then [`crate::redlock::Vote::Fenced`]).
    pub fn slot_fenced(&self, slot: u16) -> bool {
        self.fenced(&self.slots[usize::from(slot)])
    }

    fn fenced(&self, cell: &SlotCell) -> bool {
        let until = cell.fenced_until.load(Ordering::Relaxed);
        until != 0 && self.epoch.elapsed().as_millis() < u128::from(until)
    }

    /// Records the keeper's finding on `slot` served by `node`, from a look begun when the
    /// node had seen `losses` losses: ready (fenced until `fenced`, if some) or not. A loss
    /// seen since makes it not ready ([`ClusterMaster::node_lost`] clears after counting, this
    /// checks after storing: one of the two clears it).
    pub fn set_slot(
        &self,
        slot: u16,
        node: &ClusterNode,
        losses: u64,
        ready: bool,
        fenced: Option<Instant>,
    ) {
        let cell = &self.slots[usize::from(slot)];
        let until = fenced.map_or(0, |t| {
            (t.saturating_duration_since(self.epoch).as_millis() as u64).max(1)
        });
        cell.fenced_until.store(until, Ordering::Relaxed);
        let serial = if ready { node.serial } else { 0 };
        cell.ready.store(serial, Ordering::SeqCst);
        if ready && node.losses() != losses {
            cell.ready.store(0, Ordering::SeqCst);
        }
    }

    /// Whether the keeper must look at `slot` on `node` (not found ready for it yet).
    pub fn slot_unknown(&self, slot: u16, node: &ClusterNode) -> bool {
        self.slots[usize::from(slot)].ready.load(Ordering::Relaxed) != node.serial
    }

    /// `slot` answered unarmed or quarantined: the keeper looks at it again at once.
    pub fn recheck(&self, slot: u16) {
        self.slots[usize::from(slot)]
            .ready
            .store(0, Ordering::Relaxed);
        self.rescan_later();
        self.wake.notify_one();
    }

    /// A reply that is a redirection means the map is stale: the keeper reloads it at once.
    pub fn note_reply(&self, reply: &Reply) {
        if let Some(Redirect::Moved { .. } | Redirect::Ask { .. } | Redirect::ClusterDown) =
            Redirect::parse(reply)
        {
            self.wake.notify_one();
        }
    }

    /// The health monitor of node `id` found it lost data (`reason`): none of the slots it
    /// serves votes from now on, until the keeper has quarantined them.
    pub fn node_lost(&self, id: &str, reason: Loss) {
        let node = self
            .nodes
            .lock()
            .ok()
            .and_then(|nodes| nodes.get(id).cloned());
        if let Some(node) = node {
            node.losses.fetch_add(1, Ordering::SeqCst);
            for cell in self.slots.iter() {
                let (was, now) = (node.serial, 0);
                let _ = (cell.ready).compare_exchange(was, now, Ordering::SeqCst, Ordering::SeqCst);
            }
        }
        if let Ok(mut lost) = self.lost.lock() {
            lost.insert(id.to_string(), reason);
        }
        self.rescan_later();
        self.wake.notify_one();
    }

    /// The losses noted since the last call, by node id.
    pub fn take_losses(&self) -> HashMap<String, Loss> {
        self.lost
            .lock()
            .map(|mut l| std::mem::take(&mut *l))
            .unwrap_or_default()
    }

    /// The merged lock script ([`CLUSTER_LOCK_SCRIPT`]): an acquire's call names its slot's
    /// markers itself ([`crate::cluster::keys::markers`]).
    pub fn lock_script(&self) -> Arc<SharedScript> {
        self.lock_script.clone()
    }

    /// Counts a quarantine of some slots, under `cause` ([`crate::health::QUARANTINE_CAUSES`]).
    pub fn count_quarantine(&self, cause: &'static str) {
        if let Ok(mut counts) = self.quarantines.lock() {
            *counts.entry(cause).or_default() += 1;
        }
    }

    /// Quarantines begun, by cause.
    pub fn quarantines(&self) -> Vec<(&'static str, u64)> {
        let counts = self
            .quarantines
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default();
        counts.into_iter().collect()
    }

    /// Whether its nodes are reached over TLS (their `tls-port`).
    pub fn tls(&self) -> bool {
        self.template.backend.tls
    }

    pub fn set_judged(&self) {
        self.judged.store(true, Ordering::Relaxed);
    }

    pub fn judged(&self) -> bool {
        self.judged.load(Ordering::Relaxed)
    }

    /// Whether some link of the cluster is connected.
    pub fn reachable(&self) -> bool {
        self.seeds.iter().any(|l| l.is_connected())
            || self.nodes().iter().any(|n| n.link.is_connected())
    }

    /// Whether every seed had its first connection attempt.
    pub fn attempted(&self) -> bool {
        self.seeds.iter().all(|l| l.attempted())
    }

    /// Waits (at most a node timeout, and at least 1 s) until, if a seed is connected, the
    /// keeper has loaded a map and every primary's link had its first connection attempt: the
    /// founding's first claims then reach the whole cluster instead of finding it silent.
    pub async fn wait_primaries_attempted(&self) {
        let loaded = async {
            while self.seeds.iter().any(|l| l.is_connected())
                && (self.map().is_none() || !self.nodes().iter().all(|n| n.link.attempted()))
            {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        };
        let limit = self
            .node_timeout
            .get()
            .max(std::time::Duration::from_secs(1));
        let _ = tokio::time::timeout(limit, loaded).await;
    }

    /// Slots that may vote now, of [`SLOTS`].
    pub fn usable_slots(&self) -> usize {
        (0..SLOTS as u16)
            .filter(|&slot| {
                self.with_owner(slot, |n| n.eligible() && self.slot_ready(slot, n))
                    .unwrap_or(false)
            })
            .count()
    }

    /// `up (…)`, `partial (…)` or `down (…)`, for `INFO`: how many slots may vote, how many
    /// are fenced, and the primaries.
    pub fn state(&self) -> String {
        let usable = self.usable_slots();
        let fenced = (0..SLOTS as u16).filter(|&s| self.slot_fenced(s)).count();
        let primaries = self.map().map_or(0, |m| m.primaries.len());
        let word = match usable {
            SLOTS => "up",
            0 if fenced > 0 => "quarantined",
            0 => "down",
            _ => "partial",
        };
        format!("{word} (cluster: {primaries} primaries, {usable} of {SLOTS} slots usable, {fenced} fenced)")
    }
}

impl std::fmt::Debug for ClusterMaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterMaster")
            .field("name", &self.name)
            .finish()
    }
}

impl DialTemplate {
    fn link(&self, host: &str, port: u16, node_timeout: LiveDuration) -> (Arc<Link>, Driver) {
        let backend = Backend {
            host: host.to_string(),
            port,
            cluster: None,
            ..self.backend.clone()
        };
        let dial = Dial::new(&backend, self.tls.as_ref(), self.env_password.as_ref())
            .answering_within(node_timeout.clone());
        Link::new(format!("{host}:{port}"), Box::new(dial), node_timeout)
    }
}
