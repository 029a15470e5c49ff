//! The keeper of a master that is a Redis Cluster ([`Keeper`]): it reads the slot map, starts
//! a health monitor for every primary (clock and `INFO`, as for a single master), and looks at
//! the markers of every slot its owner has not been found ready for: a slot votes once its
//! marker carries its owner's node id and no quarantine or claim is on it.
//!
//! The rules are the single master's, per slot ([`super::judge::marker_step`],
//! docs/SAFETY.md "Cluster masters"): a slot armed by another node (its data came by a
//! failover or a migration), a slot unarmed in a running deployment, and every slot of a
//! primary that lost data (restart, wipe, data loaded from disk) is quarantined for the
//! lease bound and re-stamped in one script; founding claims are made and lifted per slot,
//! the founding itself deciding over the masters with every slot's markers taken together
//! ([`Markers::combine`]). A slot's readiness is cleared the moment its owner changes (a new
//! node) or its owner's monitor sees a loss, before anything else may vote for it.

use super::judge::{marker_step, MarkerStep, Markers};
use super::loss::{Cause, Loss};
use super::{ask, info_command, DeploymentView, Monitor, MonitorConfig, Role};
use super::{ClusterMaster, ClusterNode};
use crate::cluster::keys::markers;
use crate::cluster::map::SlotMap;
use crate::cluster::slots::SLOTS;
use crate::on_master::{
    script_sha, CLUSTER_LOCK_SCRIPT, CLUSTER_QUARANTINE_SCRIPT, CLUSTER_RESTAMP_SCRIPT,
    LIFT_SCRIPT, STATUS_SCRIPT,
};
use crate::protocol::{encode_command, Reply};
use crate::transport::Link;
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Slots per pipelined batch of marker scripts: a batch must come back within one node
/// timeout, or the link's connection is aborted (with the votes in flight on it). A script on
/// a slot costs a node some microseconds, so 128 take about a millisecond, far below the
/// default 50 ms even on a loaded node (512 once took longer at a cluster's founding beside
/// lockbench, and the founding then warned that no quorum carried its claims for a round).
const BATCH: usize = 128;

/// Watches one cluster master (module header).
pub(crate) struct Keeper {
    pub(super) cluster: Arc<ClusterMaster>,
    pub(super) view: Arc<DeploymentView>,
    pub(super) policy: Arc<MonitorConfig>,
    pub(super) preload: Vec<Bytes>,
}

impl Keeper {
    pub(super) async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut verdict = self.view.verdict.subscribe();
        // Losses seen by the primaries' monitors, kept until their slots are quarantined.
        let mut losses = HashMap::new();
        loop {
            let seeds = &self.cluster.seeds;
            let seen: Vec<u64> = seeds.iter().map(|l| l.connect_count()).collect();
            self.round(&mut losses, &stop).await;
            // Until a map is loaded, a seed's connection is worth a round at once: the
            // founding waits for the map.
            let unmapped = self.cluster.map().is_none();
            let seed_connected = futures::future::select_all(
                seeds
                    .iter()
                    .zip(seen)
                    .map(|(l, s)| Box::pin(l.wait_new_connection(s))),
            );
            tokio::select! {
                _ = tokio::time::sleep(self.policy.interval.get()) => {}
                _ = self.cluster.wake.notified() => {}
                _ = verdict.changed() => {}
                _ = seed_connected, if unmapped => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// One round: the map, then every slot whose owner was not found ready for it.
    async fn round(&self, losses: &mut HashMap<String, Loss>, stop: &watch::Receiver<bool>) {
        let verdict = self.view.verdict();
        if let Some(map) = self.read_map().await {
            self.install(map, stop);
        }
        losses.extend(self.cluster.take_losses());
        if self.cluster.map().is_none() {
            return;
        }
        let mut work: HashMap<String, (Arc<ClusterNode>, Vec<u16>)> = HashMap::new();
        // No slot can have become unready since a round found every slot ready: no scan.
        let scan = self.cluster.take_rescan() || !losses.is_empty();
        let slots = if scan { 0..SLOTS as u16 } else { 0..0 };
        for slot in slots {
            let Some(node) = self.cluster.owner_ref(slot) else {
                continue;
            };
            if losses.contains_key(&node.id) || self.cluster.slot_unknown(slot, node) {
                let entry = work
                    .entry(node.id.clone())
                    .or_insert_with(|| (node.clone(), vec![]));
                entry.1.push(slot);
            }
        }
        if !work.is_empty() {
            // Some slot was not ready: look again next round (until a round finds none).
            self.cluster.rescan_later();
        }
        // Every primary at once (each has its own link); one is looked at once its own monitor
        // judged it on this connection.
        let looks = work.into_values().map(|(node, slots)| {
            let loss = losses.get(&node.id).cloned();
            async move {
                let done = node.eligible() && self.examine(&node, &slots, verdict, loss).await;
                (node.id.clone(), done)
            }
        });
        let mut complete = true;
        for (id, done) in futures::future::join_all(looks).await {
            match done {
                true => drop(losses.remove(&id)),
                false => complete = false,
            }
        }
        if verdict.is_some() && complete {
            self.cluster.set_judged();
            self.view.judged.notify_waiters();
        }
    }

    /// The current slot map, read from a primary met so far or a seed (`CLUSTER SHARDS`,
    /// else `CLUSTER SLOTS` before Redis 7).
    async fn read_map(&self) -> Option<SlotMap> {
        let links = (self.cluster.nodes().into_iter().map(|n| n.link.clone()))
            .chain(self.cluster.seeds.iter().cloned())
            .filter(|l| l.is_connected());
        let tls = self.cluster.tls();
        for link in links {
            // A node the cluster knows no address of is where the answer came from.
            let asked = link.addr.rsplit_once(':').map_or("", |(host, _)| host);
            let asked = asked.trim_start_matches('[').trim_end_matches(']');
            let shards = ask(&link, encode_command(&["CLUSTER", "SHARDS"]), 1).await;
            let map = match shards {
                Some(Reply::Error(_)) => {
                    let slots = ask(&link, encode_command(&["CLUSTER", "SLOTS"]), 1).await;
                    slots.and_then(|r| SlotMap::from_cluster_slots(&r, asked).ok())
                }
                Some(reply) => SlotMap::from_cluster_shards(&reply, tls, asked).ok(),
                None => None,
            };
            if map.is_some() {
                return map;
            }
        }
        None
    }

    /// Makes a node (and its health monitor) for every new primary of `map`, and routes by it.
    fn install(&self, map: SlotMap, stop: &watch::Receiver<bool>) {
        if self.cluster.map().as_deref() == Some(&map) {
            return;
        }
        for primary in &map.primaries {
            let (node, new) = self.cluster.node(&primary.id, &primary.host, primary.port);
            if new {
                let mut preload = self.preload.clone();
                preload.push(encode_command(&[
                    "SCRIPT",
                    "LOAD",
                    CLUSTER_LOCK_SCRIPT.text(),
                ]));
                let monitor = Monitor {
                    role: Role::Node {
                        cluster: self.cluster.clone(),
                        id: node.id.clone(),
                    },
                    link: node.link.clone(),
                    health: node.health.clone(),
                    view: self.view.clone(),
                    policy: self.policy.clone(),
                    info: info_command(),
                    preload,
                };
                tokio::spawn(monitor.run(stop.clone()));
            }
        }
        tracing::info!(master = %self.cluster.name, primaries = map.primaries.len(), uncovered = map.uncovered(), "cluster slot map loaded");
        self.cluster.set_map(map);
    }

    /// Reads the markers of `slots` on `node` and acts on them; whether every slot got an
    /// answer (and every quarantine it needed was written).
    async fn examine(
        &self,
        node: &ClusterNode,
        slots: &[u16],
        verdict: Option<super::Deployment>,
        loss: Option<Loss>,
    ) -> bool {
        let mut complete = true;
        // A loss the node's monitor sees from now on undoes what this look finds ready.
        let losses = node.losses();
        // The node it was promoted in place of, if it holds every write whose vote counted
        // there (`wait_replicas`): that node's slots need re-stamping, no quarantine.
        let replicas = self.policy.wait_replicas;
        let kept = (node.health.last())
            .and_then(|now| self.cluster.kept_writes_of(&node.id, &now, replicas));
        for batch in slots.chunks(BATCH) {
            let Some(looks) = run_on_slots(&node.link, STATUS_SCRIPT.text(), batch, &[]).await
            else {
                complete = false;
                continue;
            };
            let now = Instant::now();
            let (mut lift, mut quarantine, mut restamp) = (Vec::new(), Vec::new(), Vec::new());
            for (&slot, look) in batch.iter().zip(&looks) {
                let Some(markers) = look.as_ref().and_then(Markers::parse) else {
                    complete = false;
                    continue;
                };
                if matches!(markers, Markers::Armed { .. }) {
                    self.view
                        .decide(super::Deployment::Live, "a master is armed");
                }
                let (tag, lost) = (&self.view.tag, loss.clone());
                let step = match slot_step(&markers, &node.id, kept.as_deref(), verdict, tag, lost)
                {
                    SlotStep::Restamp => {
                        restamp.push(slot);
                        continue;
                    }
                    SlotStep::Marker(step) => step,
                };
                match step {
                    MarkerStep::Ready => {
                        let left = match markers {
                            Markers::Armed {
                                quarantine_left_ms, ..
                            } => quarantine_left_ms,
                            _ => 0,
                        };
                        let fenced = (left > 0).then(|| now + ms(left));
                        self.cluster.set_slot(slot, node, losses, true, fenced);
                    }
                    MarkerStep::Wait(_) => self.cluster.set_slot(slot, node, losses, false, None),
                    MarkerStep::Claimed => {
                        let left = match markers {
                            Markers::Claimed { left_ms, .. } => left_ms,
                            _ => 0,
                        };
                        self.cluster
                            .set_slot(slot, node, losses, false, Some(now + ms(left)));
                    }
                    MarkerStep::Lift => lift.push(slot),
                    MarkerStep::Quarantine(reason) => quarantine.push((slot, reason)),
                }
            }
            self.lift(node, &lift, losses).await;
            if let Some(from) = &kept {
                complete &= self.restamp(node, &restamp, from, losses).await;
            }
            complete &= self.quarantine(node, &quarantine, now, losses).await;
        }
        complete
    }

    /// Lifts this proxy's founding claims on `slots` (only where they are still its own).
    async fn lift(&self, node: &ClusterNode, slots: &[u16], losses: u64) {
        if slots.is_empty() {
            return;
        }
        let args = [self.view.tag.as_str()];
        let Some(answers) = run_on_slots(&node.link, LIFT_SCRIPT.text(), slots, &args).await else {
            return;
        };
        for (&slot, answer) in slots.iter().zip(answers) {
            if answer == Some(Reply::Integer(1)) {
                self.cluster.set_slot(slot, node, losses, true, None);
            }
        }
    }

    /// Re-stamps `slots`, armed by node `from`, with `node`'s id (where they still carry
    /// `from`'s stamp and `node` still serves them); whether every one was written. They are
    /// then ready; a slot whose stamp changed meanwhile is looked at again next round.
    async fn restamp(&self, node: &ClusterNode, slots: &[u16], from: &str, losses: u64) -> bool {
        if slots.is_empty() {
            return true;
        }
        let script = CLUSTER_RESTAMP_SCRIPT.text();
        let args = [from, node.id.as_str()];
        let Some(answers) = run_on_slots(&node.link, script, slots, &args).await else {
            return false;
        };
        let mut written = 0;
        for (&slot, answer) in slots.iter().zip(answers) {
            if answer == Some(Reply::Integer(1)) {
                self.cluster.set_slot(slot, node, losses, true, None);
                written += 1;
            }
        }
        tracing::info!(master = %self.cluster.name, node = %node.link.addr, slots = written, from, "cluster slots re-stamped, no quarantine: the node took over from a primary whose every confirmed write it holds");
        written == slots.len()
    }

    /// Quarantines and re-stamps `slots` (each with the reason it lost data) for the lease
    /// bound; whether every one was written. Quarantine off (the negative controls only): the
    /// slots are re-stamped with no wait.
    async fn quarantine(
        &self,
        node: &ClusterNode,
        slots: &[(u16, Loss)],
        now: Instant,
        losses: u64,
    ) -> bool {
        let Some((_, reason)) = slots.first() else {
            return true;
        };
        let only: Vec<u16> = slots.iter().map(|(slot, _)| *slot).collect();
        if !self.policy.quarantine {
            tracing::warn!(master = %self.cluster.name, node = %node.link.addr, slots = only.len(), %reason, "slots lost data (quarantine is off)");
            let stamp =
                "local id = redis.call('cluster', 'myid') redis.call('set', KEYS[1], id) return id";
            let Some(answers) = run_on_slots(&node.link, stamp, &only, &[]).await else {
                return false;
            };
            for (&slot, answer) in only.iter().zip(answers) {
                if matches!(answer, Some(Reply::Bulk(_))) {
                    self.cluster.set_slot(slot, node, losses, true, None);
                }
            }
            return true;
        }
        let bound = self.policy.lease_bound.as_millis().to_string();
        let script = CLUSTER_QUARANTINE_SCRIPT.text();
        let Some(answers) = run_on_slots(&node.link, script, &only, &[&bound]).await else {
            return false;
        };
        let mut written = 0;
        for (&slot, answer) in only.iter().zip(answers) {
            if let Some(Reply::Integer(left)) = answer {
                self.cluster
                    .set_slot(slot, node, losses, true, Some(now + ms(left)));
                written += 1;
            }
        }
        self.cluster.count_quarantine(reason.cause.label());
        tracing::warn!(master = %self.cluster.name, node = %node.link.addr, slots = written, %reason, "cluster slots quarantined");
        written == only.len()
    }
}

/// What to do about a slot's markers on the node that serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum SlotStep {
    /// The single master's step ([`marker_step`]).
    Marker(MarkerStep),
    /// Armed by the node this one was promoted in place of, whose every confirmed write it
    /// holds (`wait_replicas`): re-stamp with this node's id, no quarantine.
    Restamp,
}

/// What to do about a slot's markers on node `node_id`: the single master's rule
/// ([`marker_step`]), where a marker stamped by another node is a loss (its data came by a
/// failover or a migration: docs/SAFETY.md "Cluster masters"), unless that node is
/// `kept_from`, the primary this one was promoted in place of, holding every write whose vote
/// counted there, and no loss was seen since.
pub(super) fn slot_step(
    markers: &Markers,
    node_id: &str,
    kept_from: Option<&str>,
    verdict: Option<super::Deployment>,
    tag: &str,
    lost: Option<Loss>,
) -> SlotStep {
    let foreign = match markers {
        Markers::Armed { stamp, .. } if stamp.as_deref() != Some(node_id) => {
            if lost.is_none() && stamp.is_some() && stamp.as_deref() == kept_from {
                return SlotStep::Restamp;
            }
            Some(Loss::new(
                Cause::Failover,
                format!(
                    "armed by another node ({}): its data came by a failover or a slot migration",
                    stamp.as_deref().unwrap_or("unstamped")
                ),
            ))
        }
        _ => None,
    };
    SlotStep::Marker(marker_step(markers, false, verdict, tag, lost.or(foreign)))
}

fn ms(left: i64) -> Duration {
    Duration::from_millis(left.max(0) as u64)
}

/// Runs `script` (with `args`) on each of `slots`, its markers as its two keys, pipelined
/// after one `SCRIPT LOAD`: each slot's answer (`None`: an error answer), or `None` if the
/// batch got no answer.
async fn run_on_slots(
    link: &Link,
    script: &str,
    slots: &[u16],
    args: &[&str],
) -> Option<Vec<Option<Reply>>> {
    let sha = script_sha(script.as_bytes());
    let mut payload = BytesMut::from(encode_command(&["SCRIPT", "LOAD", script]).as_ref());
    for &slot in slots {
        let [armed, quarantine] = markers(slot);
        let mut parts: Vec<&[u8]> = vec![b"EVALSHA", sha.as_bytes(), b"2", &armed, &quarantine];
        parts.extend(args.iter().map(|a| a.as_bytes()));
        payload.extend_from_slice(&encode_command(&parts));
    }
    let Reply::Array(mut answers) = ask(link, payload.freeze(), slots.len() + 1).await? else {
        return None;
    };
    if answers.len() != slots.len() + 1 {
        return None;
    }
    answers.remove(0);
    Some(
        answers
            .into_iter()
            .map(|a| (!matches!(a, Reply::Error(_))).then_some(a))
            .collect(),
    )
}

/// Runs a markers script on every slot of `cluster`, each on its owner, and takes the answers
/// together ([`Markers::combine`]); `None` without a map or an answer for every slot.
pub(super) async fn look_at_every_slot(
    cluster: &ClusterMaster,
    script: &str,
    args: &[String],
) -> Option<Markers> {
    cluster.map()?;
    let mut by_node: HashMap<String, (Arc<ClusterNode>, Vec<u16>)> = HashMap::new();
    for slot in 0..SLOTS as u16 {
        let node = cluster.owner_ref(slot)?;
        let entry = by_node
            .entry(node.id.clone())
            .or_insert_with(|| (node.clone(), vec![]));
        entry.1.push(slot);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut looks = Vec::with_capacity(SLOTS);
    for (node, slots) in by_node.values() {
        for batch in slots.chunks(BATCH) {
            let answers = run_on_slots(&node.link, script, batch, &args).await?;
            looks.extend(answers.iter().map(|a| a.as_ref().and_then(Markers::parse)));
        }
    }
    Markers::combine(looks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::Deployment;

    /// A slot's markers on the node that serves it: the single master's steps, where a stamp
    /// of another node (or none) is a loss, unless that node is the one this node took every
    /// confirmed write over from.
    #[test]
    fn a_slot_armed_by_another_node_is_quarantined_unless_its_writes_were_kept() {
        let armed_by = |stamp: Option<&str>, left| Markers::Armed {
            quarantine_left_ms: left,
            stamp: stamp.map(str::to_string),
        };
        let live = Some(Deployment::Live);
        // On node "me" of a live deployment, this proxy's tag "t", taken over from "old".
        let kept_step = |markers: &Markers, kept: Option<&str>, lost: Option<&str>| match slot_step(
            markers,
            "me",
            kept,
            live,
            "t",
            lost.map(|detail| Loss::new(Cause::Restarted, detail)),
        ) {
            SlotStep::Marker(step) => Some(step),
            SlotStep::Restamp => None,
        };
        let step = |markers: &Markers, lost: Option<&str>| kept_step(markers, None, lost);
        let quarantined =
            |step: Option<MarkerStep>| matches!(step, Some(MarkerStep::Quarantine(_)));
        assert_eq!(
            step(&armed_by(Some("me"), 0), None),
            Some(MarkerStep::Ready)
        );
        // A quarantine under way on its own stamp: ready, the fence from the marker's time.
        assert_eq!(
            step(&armed_by(Some("me"), 900), None),
            Some(MarkerStep::Ready)
        );
        assert!(quarantined(step(&armed_by(Some("other"), 0), None)));
        assert!(quarantined(step(&armed_by(None, 0), None)));
        // Its primary lost data: quarantined whatever the stamp.
        assert!(quarantined(step(
            &armed_by(Some("me"), 0),
            Some("restarted")
        )));
        // Taken over from "old" with every confirmed write: its slots are re-stamped; slots
        // of any other node, unstamped ones, and any slot after a loss are still quarantined.
        let old = Some("old");
        assert_eq!(kept_step(&armed_by(Some("old"), 0), old, None), None);
        assert!(quarantined(kept_step(
            &armed_by(Some("other"), 0),
            old,
            None
        )));
        assert!(quarantined(kept_step(&armed_by(None, 0), old, None)));
        let lost = Some("restarted");
        assert!(quarantined(kept_step(&armed_by(Some("old"), 0), old, lost)));
        assert_eq!(
            kept_step(&armed_by(Some("me"), 0), old, None),
            Some(MarkerStep::Ready)
        );
        assert!(quarantined(kept_step(&Markers::Unarmed, old, None)));
        // Founding: unarmed waits while undecided, joins through a quarantine once decided.
        assert!(matches!(
            slot_step(&Markers::Unarmed, "me", None, None, "t", None),
            SlotStep::Marker(MarkerStep::Wait(_))
        ));
        assert!(quarantined(step(&Markers::Unarmed, None)));
        let mine = Markers::Claimed {
            tag: "t".into(),
            left_ms: 5,
        };
        let fresh = Some(Deployment::Fresh);
        let founding = |tag| slot_step(&mine, "me", old, fresh, tag, None);
        assert_eq!(founding("t"), SlotStep::Marker(MarkerStep::Lift));
        assert_eq!(founding("u"), SlotStep::Marker(MarkerStep::Claimed));
    }
}
