//! The nemesis of the fault suite: process faults on the masters (SIGKILL, restart empty,
//! SIGSTOP/SIGCONT, `FLUSHALL`) and link faults on the relays in front of them (delay,
//! blackhole, reset, heal), each logged with its time on the workload clock; run on a blocking
//! thread (killing and restarting a redis-server blocks). Then the fault steps the scenarios
//! loop over: each keeps at most ⌊(N−1)/2⌋ masters crashed, partitioned or freshly restarted at
//! a time (a restarted or flushed master counts until a full lease has passed), and sleeps
//! between faults.

use crate::masters::signal;
use crate::relay::{Mode, Relay};
use crate::resp::blocking_cmd;
use crate::workload::{now_ns, Rng};
use redlock_proxy::LocalCluster;
use std::sync::Arc;
use std::time::Duration;

/// The node timeout of the fault scenarios (unless a scenario says otherwise).
pub const NODE_TIMEOUT_MS: u64 = 50;

/// The lease of the workloads the fault steps run against.
pub const TTL_MS: u64 = 500;

/// The fault injector over a set of masters (and the relays in front of them, if any).
pub struct Nemesis {
    pub masters: LocalCluster,
    /// `relays[i]` sits in front of master `i` (empty when the rig has no relays).
    pub relays: Arc<Vec<Relay>>,
    node_timeout: Duration,
    pub rng: Rng,
    /// What was done, when (ns on the workload clock).
    pub log: Vec<(u64, String)>,
    /// Masters currently SIGSTOPped, links currently faulty.
    stopped: Vec<bool>,
    faulty_link: Vec<bool>,
}

impl Nemesis {
    /// A nemesis over `masters` and their `relays` (none, or one per master); `node_timeout`
    /// is the proxies' (a healed link is held reset for three of them); `seed` drives every
    /// random choice.
    pub fn new(
        masters: LocalCluster,
        relays: Vec<Relay>,
        node_timeout: Duration,
        seed: u64,
    ) -> Nemesis {
        Nemesis {
            stopped: vec![false; masters.masters.len()],
            faulty_link: vec![false; relays.len()],
            masters,
            relays: Arc::new(relays),
            node_timeout,
            rng: Rng::new(seed),
            log: Vec::new(),
        }
    }

    /// An empty nemesis, to hold the place of one moved to a blocking thread.
    pub fn placeholder() -> Nemesis {
        Nemesis {
            masters: LocalCluster {
                masters: Vec::new(),
            },
            relays: Arc::new(Vec::new()),
            node_timeout: Duration::ZERO,
            rng: Rng::new(0),
            log: Vec::new(),
            stopped: Vec::new(),
            faulty_link: Vec::new(),
        }
    }

    pub fn n(&self) -> usize {
        self.masters.masters.len()
    }

    pub fn note(&mut self, what: String) {
        self.log.push((now_ns(), what));
    }

    pub fn sleep(&mut self, lo_ms: u64, hi_ms: u64) {
        std::thread::sleep(Duration::from_millis(self.rng.range(lo_ms, hi_ms)));
    }

    /// SIGKILL (the master forgets everything).
    pub fn kill(&mut self, i: usize) {
        self.masters.masters[i].kill();
        self.stopped[i] = false;
        self.note(format!("kill m{i}"));
    }

    /// Start a killed master again, empty, on its port (a new `run_id`).
    pub fn restart(&mut self, i: usize) {
        self.masters.masters[i]
            .restart(&[])
            .expect("restart redis-server");
        self.note(format!("restart m{i} empty"));
    }

    fn send_signal(&mut self, i: usize, sig: &str) {
        if let Some(pid) = self.masters.masters[i].pid() {
            signal(pid, sig);
            self.note(format!("SIG{sig} m{i}"));
        }
    }

    /// SIGSTOP: the master stops answering; its sockets stay open and fill up.
    pub fn pause(&mut self, i: usize) {
        self.send_signal(i, "STOP");
        self.stopped[i] = true;
    }

    pub fn resume(&mut self, i: usize) {
        self.send_signal(i, "CONT");
        self.stopped[i] = false;
    }

    /// `FLUSHALL` directly on the master (data loss without a restart).
    pub fn flush(&mut self, i: usize) {
        let port = self.masters.masters[i].port;
        let reply = blocking_cmd(port, &[b"FLUSHALL"], Duration::from_secs(2))
            .ok()
            .map(|r| r.to_string());
        self.note(format!("FLUSHALL m{i}: {reply:?}"));
    }

    /// Blackhole the link to master `i`: nothing passes either way.
    pub fn partition(&mut self, i: usize) {
        self.relays[i].set_mode(Mode::Blackhole);
        self.faulty_link[i] = true;
        self.note(format!("partition m{i}"));
    }

    /// Ends a partition. The relay's blackhole *discards* bytes, which a real partition does not
    /// (TCP retransmits); forwarding again on a connection that lost bytes mid-stream would
    /// desynchronise RESP and fabricate replies. So a partition ends like a real long one: the
    /// connections are reset (held long enough for every link with lost bytes to time out and be
    /// retired by the proxy), and only new connections pass.
    pub fn heal(&mut self, i: usize) {
        self.relays[i].set_mode(Mode::Reset);
        std::thread::sleep(self.node_timeout * 3 + Duration::from_millis(20));
        self.relays[i].set_delay(Duration::ZERO);
        self.relays[i].set_mode(Mode::Pass);
        self.faulty_link[i] = false;
        self.note(format!("heal m{i}"));
    }

    pub fn delay(&mut self, i: usize, ms: u64) {
        self.relays[i].set_delay(Duration::from_millis(ms));
        self.faulty_link[i] |= ms > 0;
        self.note(format!("delay m{i} {ms} ms"));
    }

    pub fn reset(&mut self, i: usize) {
        self.relays[i].set_mode(Mode::Reset);
        self.faulty_link[i] = true;
        self.note(format!("reset m{i}"));
    }

    /// Everything back to normal: stopped masters continued, killed ones restarted, links
    /// passing.
    pub fn heal_all(&mut self) {
        for i in 0..self.n() {
            if self.stopped[i] {
                self.resume(i);
            }
            if self.masters.masters[i].pid().is_none() {
                self.restart(i);
            }
        }
        for i in 0..self.relays.len() {
            if self.faulty_link[i] {
                self.heal(i);
            }
        }
        self.note("all healed".into());
    }
}

/// How long a master that lost data must stay out for `ttl_ms` leases (TTL + drift), with a
/// margin for detection.
pub fn quarantine_ms(ttl_ms: u64) -> u64 {
    redlock_proxy::backend_ttl_ms(ttl_ms, 0.01) + 150
}

// Fault steps (see the module documentation); `TTL_MS` is the lease of the workloads they run
// against.

/// Kleppmann's crash-restart: a minority is partitioned while locks are granted (so those
/// locks sit on exactly a majority), the partition heals, then one master of that majority
/// restarts empty. Without quarantine the healed minority plus the amnesiac master form a new
/// majority for a lock that is still held.
pub fn step_partition_then_restart(nem: &mut Nemesis) {
    partition_then_lose(nem, |nem, victim| {
        nem.kill(victim);
        nem.sleep(0, 60);
        nem.restart(victim);
    });
}

/// A minority partitioned for 150–400 ms while locks are granted, healed; then `lose` makes
/// one master of the majority that held those locks lose its data; then a quarantine passes.
fn partition_then_lose(nem: &mut Nemesis, lose: fn(&mut Nemesis, usize)) {
    let n = nem.n();
    let f = (n - 1) / 2;
    let pick = nem.rng.pick(n, f + 1);
    for &i in &pick[..f] {
        nem.partition(i);
    }
    nem.sleep(150, 400);
    for &i in &pick[..f] {
        nem.heal(i);
    }
    nem.sleep(0, 40);
    lose(nem, pick[f]);
    sleep_past_quarantine(nem);
}

/// 1..=f distinct masters (f = ⌊(N−1)/2⌋), at random.
fn minority_victims(nem: &mut Nemesis) -> Vec<usize> {
    let n = nem.n();
    let k = 1 + nem.rng.below((n - 1) / 2);
    nem.rng.pick(n, k)
}

/// Sleeps until a master that just lost data is out of quarantine (plus 100–500 ms).
fn sleep_past_quarantine(nem: &mut Nemesis) {
    let q = quarantine_ms(TTL_MS);
    nem.sleep(q + 100, q + 500);
}

/// Crash churn: 1..=f masters killed, restarted empty after 0–200 ms.
pub fn step_crash_restart(nem: &mut Nemesis) {
    let victims = minority_victims(nem);
    for &i in &victims {
        nem.kill(i);
    }
    nem.sleep(0, 200);
    for &i in &victims {
        nem.restart(i);
    }
    sleep_past_quarantine(nem);
}

/// Amnesia churn: Kleppmann's step (60 %) or crash churn.
pub fn step_amnesia(nem: &mut Nemesis) {
    if nem.rng.chance(0.6) {
        step_partition_then_restart(nem)
    } else {
        step_crash_restart(nem)
    }
}

/// Like Kleppmann's scenario, with `FLUSHALL` as the data loss (no restart, same `run_id`).
pub fn step_partition_then_flush(nem: &mut Nemesis) {
    partition_then_lose(nem, Nemesis::flush);
}

/// SIGSTOP of 1..=f masters for 1.2–2 × TTL, then SIGCONT.
pub fn step_pause(nem: &mut Nemesis) {
    let victims = minority_victims(nem);
    for &i in &victims {
        nem.pause(i);
    }
    nem.sleep(TTL_MS * 6 / 5, TTL_MS * 2);
    for &i in &victims {
        nem.resume(i);
    }
    nem.sleep(100, 600);
}

/// Link faults on 1..=f links, changing over time: a delay under the node timeout, a delay
/// over it, a blackhole, or resets; sometimes every link also gets a small delay.
pub fn step_links(nem: &mut Nemesis) {
    let n = nem.n();
    let victims = minority_victims(nem);
    let everyone_slow = nem.rng.chance(0.3);
    if everyone_slow {
        for i in 0..n {
            let d = nem.rng.range(1, NODE_TIMEOUT_MS / 5);
            nem.delay(i, d);
        }
    }
    let mut kinds = Vec::new();
    for &i in &victims {
        let kind = nem.rng.below(4);
        match kind {
            0 => {
                let d = nem.rng.range(5, NODE_TIMEOUT_MS * 4 / 5);
                nem.delay(i, d)
            }
            1 => {
                let d = nem.rng.range(NODE_TIMEOUT_MS + 10, TTL_MS);
                nem.delay(i, d)
            }
            2 => nem.partition(i),
            _ => nem.reset(i),
        }
        kinds.push((i, kind));
    }
    nem.sleep(200, 900);
    for (i, kind) in kinds {
        if kind >= 2 {
            nem.heal(i);
        } else {
            nem.delay(i, 0);
        }
    }
    if everyone_slow {
        for i in 0..n {
            nem.delay(i, 0);
        }
    }
    nem.sleep(50, 300);
}

/// Every kind of fault.
pub fn step_mixed(nem: &mut Nemesis) {
    match nem.rng.below(6) {
        0 | 1 => step_partition_then_restart(nem),
        2 => step_crash_restart(nem),
        3 => step_pause(nem),
        4 => step_links(nem),
        _ => step_partition_then_flush(nem),
    }
}

/// Every kind of fault but `FLUSHALL` (which has its own scenario).
pub fn step_mixed_no_flush(nem: &mut Nemesis) {
    match nem.rng.below(5) {
        0 | 1 => step_partition_then_restart(nem),
        2 => step_crash_restart(nem),
        3 => step_pause(nem),
        _ => step_links(nem),
    }
}
