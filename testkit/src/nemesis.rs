//! The nemesis of the fault suite: process faults on the masters (SIGKILL, restart empty,
//! SIGSTOP/SIGCONT, `FLUSHALL`) and link faults on the relays in front of them (delay,
//! blackhole, reset, heal), each logged with its time on the workload clock; run on a blocking
//! thread (killing and restarting a redis-server blocks). Then the fault steps the scenarios
//! loop over: each keeps at most ⌊(N−1)/2⌋ masters crashed, partitioned or freshly restarted at
//! a time (a restarted or flushed master counts until a full lease has passed), and sleeps
//! between faults.
//!
//! Every fault is checked to have taken effect, or the nemesis panics (and the scenario fails):
//! a killed master had a process, a restarted one answers with a new `run_id`, a paused one
//! shows as stopped in `/proc` (and a resumed one no longer does), `FLUSHALL` answered `+OK`,
//! and a blackholed or reset link cut traffic (before or while it healed).
//! [`Nemesis::faults`] counts the faults that took effect; the verdict demands a minimum
//! ([`crate::rig::Expect`]).

use crate::clock::FakeClock;
use crate::masters::signal;
use crate::relay::{Mode, Relay};
use crate::resp::{blocking_cmd, Reply};
use crate::workload::{now_ns, Rng};
use redlock_proxy::LocalCluster;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// Faults that took effect.
    faults: usize,
    /// Masters currently SIGSTOPped, links currently faulty.
    stopped: Vec<bool>,
    faulty_link: Vec<bool>,
    /// Each master's `run_id` (the one before its last kill, once killed).
    run_ids: Vec<String>,
    /// What each master is restarted with (its persistence, `enable-debug-command`: empty for
    /// neither).
    pub restart_args: Vec<Vec<String>>,
    /// Each relay's cut count and live connections when its blackhole or reset began.
    cut_before: Vec<Option<(u64, u64)>>,
    /// Each master's wall clock, where the masters run with the clock shim
    /// ([`crate::rig::Rig::start_with_clocks`]); empty otherwise.
    pub clocks: Vec<FakeClock>,
}

/// A master's `run_id` (`INFO server`); panics if it does not answer within 2 s.
fn run_id(port: u16) -> String {
    let reply = blocking_cmd(port, &[b"INFO", b"server"], Duration::from_secs(2))
        .unwrap_or_else(|err| panic!("INFO server on port {port}: {err}"));
    let Reply::Bulk(info) = reply else {
        panic!("INFO server on port {port}: {reply}");
    };
    String::from_utf8_lossy(&info)
        .lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .unwrap_or_else(|| panic!("no run_id from port {port}"))
        .trim()
        .to_string()
}

/// A master's clock (`TIME`), in ms; panics if it does not answer within 2 s.
fn master_ms(port: u16) -> u64 {
    let reply = blocking_cmd(port, &[b"TIME"], Duration::from_secs(2))
        .unwrap_or_else(|err| panic!("TIME on port {port}: {err}"));
    let Reply::Array(parts) = reply else {
        panic!("TIME on port {port}: {reply}");
    };
    let number = |r: &Reply| match r {
        Reply::Bulk(b) => String::from_utf8_lossy(b).parse::<u64>().ok(),
        _ => None,
    };
    match parts.as_slice() {
        [secs, micros] => number(secs)
            .zip(number(micros))
            .map(|(s, us)| s * 1000 + us / 1000),
        _ => None,
    }
    .unwrap_or_else(|| panic!("TIME on port {port}: {parts:?}"))
}

/// Whether process `pid` is stopped (state `T` in `/proc/<pid>/stat`).
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('T'))
    })
}

impl Nemesis {
    /// A nemesis over `masters` (all running) and their `relays` (none, or one per master);
    /// `node_timeout` is the proxies' (a healed link is held reset for three of them); `seed`
    /// drives every random choice.
    pub fn new(
        masters: LocalCluster,
        relays: Vec<Relay>,
        node_timeout: Duration,
        seed: u64,
    ) -> Nemesis {
        Nemesis {
            stopped: vec![false; masters.masters.len()],
            faulty_link: vec![false; relays.len()],
            run_ids: masters.masters.iter().map(|m| run_id(m.port)).collect(),
            restart_args: vec![Vec::new(); masters.masters.len()],
            cut_before: vec![None; relays.len()],
            masters,
            relays: Arc::new(relays),
            node_timeout,
            rng: Rng::new(seed),
            log: Vec::new(),
            faults: 0,
            clocks: Vec::new(),
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
            faults: 0,
            stopped: Vec::new(),
            faulty_link: Vec::new(),
            run_ids: Vec::new(),
            restart_args: Vec::new(),
            cut_before: Vec::new(),
            clocks: Vec::new(),
        }
    }

    pub fn n(&self) -> usize {
        self.masters.masters.len()
    }

    /// The proxies' node timeout.
    pub fn node_timeout(&self) -> Duration {
        self.node_timeout
    }

    /// How many faults took effect so far.
    pub fn faults(&self) -> usize {
        self.faults
    }

    pub fn note(&mut self, what: String) {
        self.log.push((now_ns(), what));
    }

    /// Logs a fault the caller checked to have taken effect (one the nemesis does not run
    /// itself: a proxy replaced, a proxy's own link cut), and counts it.
    pub fn note_fault(&mut self, what: String) {
        self.faults += 1;
        self.note(what);
    }

    pub fn sleep(&mut self, lo_ms: u64, hi_ms: u64) {
        std::thread::sleep(Duration::from_millis(self.rng.range(lo_ms, hi_ms)));
    }

    /// SIGKILL (the master forgets everything); panics if it was not running.
    pub fn kill(&mut self, i: usize) {
        assert!(
            self.masters.masters[i].pid().is_some(),
            "kill m{i}: not running"
        );
        self.masters.masters[i].kill();
        self.stopped[i] = false;
        self.note_fault(format!("kill m{i}"));
    }

    /// Start a killed master again on its port, empty (or from its AOF, when it persists:
    /// [`Nemesis::restart_args`]); panics unless it answers with a new `run_id`.
    pub fn restart(&mut self, i: usize) {
        let port = self.masters.masters[i].port;
        let args: Vec<&str> = self.restart_args[i].iter().map(String::as_str).collect();
        self.masters.masters[i]
            .restart(&args)
            .expect("restart redis-server");
        let fresh = run_id(port);
        assert_ne!(
            fresh, self.run_ids[i],
            "restart m{i}: the same run_id as before"
        );
        self.run_ids[i] = fresh;
        let how = match args.contains(&"--appendonly") {
            true => "from its AOF",
            false => "empty",
        };
        self.note(format!("restart m{i} {how}"));
    }

    /// `SIG<sig>` to master `i`, then waits (at most 2 s) until `/proc` shows it stopped
    /// (`STOP`) or not (`CONT`); panics if it has no process or never gets there.
    fn send_signal(&mut self, i: usize, sig: &str) {
        let pid = self.masters.masters[i]
            .pid()
            .unwrap_or_else(|| panic!("SIG{sig} m{i}: not running"));
        signal(pid, sig);
        let want_stopped = sig == "STOP";
        let deadline = Instant::now() + Duration::from_secs(2);
        while stopped(pid) != want_stopped {
            assert!(
                Instant::now() < deadline,
                "SIG{sig} m{i} (pid {pid}): not in effect after 2 s"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        self.note(format!("SIG{sig} m{i}"));
    }

    /// SIGSTOP: the master stops answering; its sockets stay open and fill up.
    pub fn pause(&mut self, i: usize) {
        self.send_signal(i, "STOP");
        self.stopped[i] = true;
        self.faults += 1;
    }

    pub fn resume(&mut self, i: usize) {
        self.send_signal(i, "CONT");
        self.stopped[i] = false;
    }

    /// `FLUSHALL` directly on the master (data loss without a restart); panics unless it
    /// answered `+OK`.
    pub fn flush(&mut self, i: usize) {
        let port = self.masters.masters[i].port;
        let reply =
            blocking_cmd(port, &[b"FLUSHALL"], Duration::from_secs(2)).map(|r| r.to_string());
        assert!(
            matches!(reply.as_deref(), Ok("+OK")),
            "FLUSHALL m{i}: {reply:?}"
        );
        self.note_fault(format!("FLUSHALL m{i}: +OK"));
    }

    /// Steps master `i`'s wall clock forward by `ms` (its monotonic clock stays real);
    /// panics unless its `TIME` moved by at least that much.
    pub fn step_clock(&mut self, i: usize, ms: u64) {
        let port = self.masters.masters[i].port;
        let before = master_ms(port);
        self.clocks[i].step_forward(Duration::from_millis(ms));
        // The shim reads its file at most once per ms.
        std::thread::sleep(Duration::from_millis(5));
        let after = master_ms(port);
        assert!(after >= before + ms, "clock step m{i}: {before} -> {after}");
        self.note_fault(format!("clock of m{i} stepped forward {ms} ms"));
    }

    /// Master `i`'s wall clock runs at `rate` times real time from now on (1.0: real again).
    pub fn speed_clock(&mut self, i: usize, rate: f64) {
        self.clocks[i].set_rate(rate);
        self.note_fault(format!("clock of m{i} at {rate:.2}x"));
    }

    /// Master `i`'s wall clock back to real time (a backward step after a forward fault, as
    /// NTP correcting it would make).
    pub fn restore_clock(&mut self, i: usize) {
        self.clocks[i].reset();
        self.note(format!("clock of m{i} back to real time"));
    }

    /// `SAVE` on master `i`: the data a later [`Nemesis::reload`] brings back.
    pub fn save(&mut self, i: usize) {
        let port = self.masters.masters[i].port;
        let reply = blocking_cmd(port, &[b"SAVE"], Duration::from_secs(5)).map(|r| r.to_string());
        assert!(
            matches!(reply.as_deref(), Ok("+OK")),
            "SAVE m{i}: {reply:?}"
        );
        self.note(format!("SAVE m{i}"));
    }

    /// `DEBUG RELOAD NOSAVE` on master `i`: its data replaced in place by its last `SAVE`
    /// (same `run_id`, its markers as they were then).
    pub fn reload(&mut self, i: usize) {
        let port = self.masters.masters[i].port;
        let command: [&[u8]; 3] = [b"DEBUG", b"RELOAD", b"NOSAVE"];
        let reply = blocking_cmd(port, &command, Duration::from_secs(5)).map(|r| r.to_string());
        assert!(
            matches!(reply.as_deref(), Ok("+OK")),
            "DEBUG RELOAD m{i}: {reply:?}"
        );
        self.note_fault(format!("DEBUG RELOAD NOSAVE m{i}: +OK"));
    }

    /// Blackhole the link to master `i`: nothing passes either way.
    pub fn partition(&mut self, i: usize) {
        self.cut_link(i, Mode::Blackhole, "partition");
    }

    /// Reset every connection to master `i`, and refuse new ones.
    pub fn reset(&mut self, i: usize) {
        self.cut_link(i, Mode::Reset, "reset");
    }

    fn cut_link(&mut self, i: usize, mode: Mode, what: &str) {
        let relay = &self.relays[i];
        self.cut_before[i].get_or_insert((relay.cut_count(), relay.live_connections()));
        self.relays[i].set_mode(mode);
        self.faulty_link[i] = true;
        self.note_fault(format!("{what} m{i}"));
    }

    /// Ends a partition or reset ([`Relay::heal_blocking`]): the connections are reset for
    /// three node timeouts, then new ones pass. Panics if the relay cut nothing since the fault
    /// began although a connection was live then (each is reset at the heal, and the proxies
    /// poll every master several times a second, so a cut link cuts), or if it never forwarded
    /// anything (not in the path). With no connection live when the fault began (the proxies
    /// between two attempts of a reconnect backoff, up to 1 s after a master was paused, reset
    /// or killed) and none attempted during it, there was nothing to cut: the master was
    /// unreachable all the same.
    pub fn heal(&mut self, i: usize) {
        let relay = &self.relays[i];
        relay.heal_blocking(self.node_timeout);
        if let Some((before, live)) = self.cut_before[i].take() {
            let (cut, forwarded) = (relay.cut_count(), relay.forwarded_count());
            assert!(
                forwarded > 0 && (cut > before || live == 0),
                "link m{i}: its fault cut nothing before it healed ({live} connections live when it began, {forwarded} chunks forwarded ever)"
            );
        }
        self.faulty_link[i] = false;
        self.note(format!("heal m{i}"));
    }

    pub fn delay(&mut self, i: usize, ms: u64) {
        self.relays[i].set_delay(Duration::from_millis(ms));
        self.faulty_link[i] |= ms > 0;
        if ms > 0 {
            self.faults += 1;
        }
        self.note(format!("delay m{i} {ms} ms"));
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

/// One master's wall clock steps forward by ½–3 leases, or runs at 1.3–2× for 1–2 leases;
/// then a quarantine passes and the clock is set back to real time (as NTP would correct it:
/// a clock left ahead refuses every token the others' clocks give). Needs masters with clocks.
pub fn step_clock(nem: &mut Nemesis) {
    let i = nem.rng.below(nem.n());
    if nem.rng.chance(0.5) {
        let ms = nem.rng.range(TTL_MS / 2, 3 * TTL_MS);
        nem.step_clock(i, ms);
    } else {
        let rate = 1.3 + nem.rng.range(0, 70) as f64 / 100.0;
        nem.speed_clock(i, rate);
        nem.sleep(TTL_MS, 2 * TTL_MS);
    }
    sleep_past_quarantine(nem);
    nem.restore_clock(i);
}

/// Kleppmann's scenario with the data replaced in place as the loss: every master saved
/// first, then a minority partitioned while locks are granted, healed, and one master of the
/// majority reloads its saved data (`DEBUG RELOAD NOSAVE`: same `run_id`). Needs masters with
/// `enable-debug-command` (proxies with `allow_debug_command`). The next acquire there finds
/// its write witness below the floor its call carries and takes no key, and its `-1` has the
/// master polled and quarantined at once (docs/SAFETY.md, "Acknowledged writes").
pub fn step_partition_then_reload(nem: &mut Nemesis) {
    for i in 0..nem.n() {
        nem.save(i);
    }
    partition_then_lose(nem, Nemesis::reload);
}

/// Every kind of fault, clock steps and rates and reloads in place among them (masters with
/// clocks: [`crate::rig::Rig::start_with_clocks`]).
pub fn step_mixed_with_clocks(nem: &mut Nemesis) {
    match nem.rng.below(4) {
        0 => step_clock(nem),
        1 => step_partition_then_reload(nem),
        _ => step_mixed(nem),
    }
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
