//! The fault-suite rig: N masters (optionally each behind a fault [`Relay`]), proxies over
//! them and a [`Nemesis`] acting on them; scenarios run two at a time, those that bound a
//! latency alone, each on its own 2-thread runtime ([`run`], [`run_alone`]), their durations
//! scaled by `FAULTS_SCALE`; the workload runs while a fault step loops on a blocking thread; the verdict on the history (no overlap, no duplicate live
//! token, no late `OK`, a minimum of grants and of faults that took effect), with the fault log
//! around what went wrong.

use crate::checker::{ms, Report};
use crate::clock::FakeClock;
use crate::launcher::Proxy;
use crate::nemesis::{quarantine_ms, Nemesis, NODE_TIMEOUT_MS};
use crate::relay::Relay;
use crate::resp::Client;
use crate::workload::{wait_grantable, History, PortTable, Workload, SLOW_REPLY};
use redlock_proxy::on_master::COMPARE_AND_DELETE;
use redlock_proxy::{Config, LocalCluster, LocalMaster};
use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Scenarios that may run at once. A scenario mostly waits (on its workload's holds and
/// pauses, and on its faults): seven of them used 39 s of CPU in 109 s one at a time; the
/// suite took 377 s one at a time and 194 s two at a time (passing alone and beside one and
/// two CPU hogs). A scenario that bounds a latency runs alone ([`run_alone`]).
const AT_ONCE: usize = 2;

/// Places taken by the scenarios running now, and the signal that one ended.
static TAKEN: Mutex<usize> = Mutex::new(0);
static ENDED: Condvar = Condvar::new();

/// `places` of the [`AT_ONCE`], held until dropped (by a panicking scenario too).
struct Places(usize);

impl Places {
    fn take(places: usize) -> Places {
        let mut taken = taken();
        while *taken + places > AT_ONCE {
            taken = ENDED.wait(taken).unwrap_or_else(PoisonError::into_inner);
        }
        *taken += places;
        Places(places)
    }
}

impl Drop for Places {
    fn drop(&mut self) {
        *taken() -= self.0;
        ENDED.notify_all();
    }
}

fn taken() -> MutexGuard<'static, usize> {
    TAKEN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs one scenario on its own 2-thread runtime, beside at most one other ([`AT_ONCE`]).
pub fn run(body: impl Future<Output = ()>) {
    run_taking(1, body)
}

/// Runs a scenario that bounds a latency on a 2-core machine alone, on its own 2-thread
/// runtime.
pub fn run_alone(body: impl Future<Output = ()>) {
    run_taking(AT_ONCE, body)
}

fn run_taking(places: usize, body: impl Future<Output = ()>) {
    let _places = Places::take(places);
    let started = Instant::now();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(body);
    println!(
        "[{}] passed in {:.1} s",
        std::thread::current().name().unwrap_or("scenario"),
        started.elapsed().as_secs_f64()
    );
}

/// `FAULTS_SCALE` (default 1.0): the factor of every scenario duration.
pub fn scale() -> f64 {
    std::env::var("FAULTS_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(1.0)
}

/// `secs` scaled by `FAULTS_SCALE`.
pub fn scaled(secs: f64) -> Duration {
    Duration::from_secs_f64(secs * scale())
}

/// Masters (optionally each behind a fault relay) and proxies over them.
pub struct Rig {
    pub nemesis: Nemesis,
    pub proxies: Vec<Proxy>,
    /// The masters' AOF directories ([`Rig::start_durable`]), removed with the rig.
    dirs: Vec<std::path::PathBuf>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        for dir in &self.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Rig {
    /// `n` masters (each behind a relay when `relays`), `proxies` proxies over them configured
    /// by `tweak` (over [`crate::launcher::BEHAVIOUR_NODE_TIMEOUT_MS`]), and a nemesis whose
    /// random choices follow `seed`.
    pub async fn start(
        n: usize,
        relays: bool,
        proxies: usize,
        seed: u64,
        tweak: impl Fn(&mut Config),
    ) -> Rig {
        Rig::start_after(n, relays, proxies, seed, tweak, |_| {}).await
    }

    /// [`Rig::start`], with `before_proxies` acting on the nemesis (on this thread: it may
    /// block) after the masters started and before any proxy does (masters down at the first
    /// start of a deployment).
    pub async fn start_after(
        n: usize,
        relays: bool,
        proxies: usize,
        seed: u64,
        tweak: impl Fn(&mut Config),
        before_proxies: impl FnOnce(&mut Nemesis),
    ) -> Rig {
        let masters = LocalCluster::start(n).expect("redis-server must be installed");
        Rig::start_over(
            masters,
            Vec::new(),
            relays,
            proxies,
            seed,
            tweak,
            before_proxies,
        )
        .await
    }

    /// [`Rig::start`] over `n` masters that each run with a wall clock of their own (the clock
    /// nemesis: [`crate::clock`]) and `enable-debug-command yes` (for reloads in place), the
    /// proxies with `allow_debug_command`.
    pub async fn start_with_clocks(
        n: usize,
        relays: bool,
        proxies: usize,
        seed: u64,
        tweak: impl Fn(&mut Config),
    ) -> Rig {
        let clocks: Vec<FakeClock> = (0..n).map(|_| FakeClock::new()).collect();
        let debug = ["--enable-debug-command", "yes"];
        let masters = LocalCluster {
            masters: clocks
                .iter()
                .map(|clock| {
                    LocalMaster::start_with_env(None, &debug, clock.env())
                        .expect("redis-server with the clock shim")
                })
                .collect(),
        };
        // A master the nemesis kills comes back able to reload in place too.
        let restart_args = vec![debug.map(String::from).to_vec(); n];
        let allowing = |c: &mut Config| {
            tweak(c);
            c.allow_debug_command = true;
        };
        let nemesis_clocks = |nem: &mut Nemesis| nem.clocks = clocks;
        Rig::start_over(
            masters,
            restart_args,
            relays,
            proxies,
            seed,
            allowing,
            nemesis_clocks,
        )
        .await
    }

    /// [`Rig::start`] over `n` masters that persist with `appendonly yes` and `appendfsync
    /// always` (each in a directory of its own, removed with the rig), restarted from their AOF.
    pub async fn start_durable(
        n: usize,
        proxies: usize,
        seed: u64,
        tweak: impl Fn(&mut Config),
    ) -> Rig {
        let dirs: Vec<std::path::PathBuf> = (0..n)
            .map(|i| {
                let dir = std::env::temp_dir().join(format!(
                    "redlock-faults-aof-{}-{seed}-{i}",
                    std::process::id()
                ));
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).expect("a directory for the AOF");
                dir
            })
            .collect();
        let args: Vec<Vec<String>> = dirs
            .iter()
            .map(|dir| {
                ["--appendonly", "yes", "--appendfsync", "always", "--dir"]
                    .map(String::from)
                    .into_iter()
                    .chain([dir.to_string_lossy().into_owned()])
                    .collect()
            })
            .collect();
        let masters = LocalCluster {
            masters: args
                .iter()
                .map(|a| {
                    let a: Vec<&str> = a.iter().map(String::as_str).collect();
                    LocalMaster::start(None, &a).expect("redis-server must be installed")
                })
                .collect(),
        };
        let mut rig = Rig::start_over(masters, args, false, proxies, seed, tweak, |_| {}).await;
        rig.dirs = dirs;
        rig
    }

    async fn start_over(
        masters: LocalCluster,
        restart_args: Vec<Vec<String>>,
        relays: bool,
        proxies: usize,
        seed: u64,
        tweak: impl Fn(&mut Config),
        before_proxies: impl FnOnce(&mut Nemesis),
    ) -> Rig {
        let mut config = Config::default();
        tweak(&mut config);
        let list = if relays {
            Relay::start_each(&masters).await
        } else {
            Vec::new()
        };
        let addrs: Vec<String> = if relays {
            list.iter().map(Relay::addr).collect()
        } else {
            masters.addrs()
        };
        let mut nemesis = Nemesis::new(masters, list, config.node_timeout(), seed);
        if !restart_args.is_empty() {
            nemesis.restart_args = restart_args;
        }
        tokio::task::block_in_place(|| before_proxies(&mut nemesis));
        let mut started = Vec::new();
        for _ in 0..proxies {
            started.push(Proxy::start(addrs.clone(), &tweak).await);
        }
        Rig {
            nemesis,
            proxies: started,
            dirs: Vec::new(),
        }
    }

    /// Sleeps `lo_ms..=hi_ms` (the nemesis' random choice) without blocking the runtime.
    pub async fn sleep(&mut self, lo_ms: u64, hi_ms: u64) {
        let ms = self.nemesis.rng.range(lo_ms, hi_ms);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    /// The proxies' ports.
    pub fn ports(&self) -> Vec<u16> {
        self.proxies.iter().map(|p| p.port).collect()
    }

    /// Waits until every proxy grants a probe lock (masters may start quarantined).
    pub async fn wait_ready(&self, ttl_ms: u64, limit: Duration) {
        for p in &self.proxies {
            let probe = format!("faults:probe:{}:{}", std::process::id(), p.port);
            let took = wait_grantable(p.port, &probe, ttl_ms, limit).await;
            assert!(
                took.is_some(),
                "proxy {} grants nothing within {limit:?}",
                p.port
            );
        }
    }

    /// Runs the workload while `step` is applied in a loop (for `faults_for`, at most
    /// `max_steps` times) on a blocking thread; then heals everything.
    pub async fn run_with_faults(
        &mut self,
        workload: &Workload,
        faults_for: Duration,
        max_steps: usize,
        step: fn(&mut Nemesis),
    ) -> History {
        let mut nemesis = std::mem::replace(&mut self.nemesis, Nemesis::placeholder());
        let stop = Arc::new(AtomicBool::new(false));
        let faults = tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + faults_for;
            for _ in 0..max_steps {
                if Instant::now() >= deadline {
                    break;
                }
                step(&mut nemesis);
            }
            nemesis.heal_all();
            nemesis
        });
        let history = workload.run(stop).await;
        self.nemesis = faults.await.expect("nemesis thread");
        history
    }

    /// Stops proxy `index` and launches a fresh one in its place with the same configuration
    /// (over `backends` when given, else the same masters): a new port, no memory of anything.
    /// `before_start` acts on the nemesis (on this thread: it may block) while no proxy runs
    /// there. The fresh proxy's first request, sent as soon as its port is bound, is an acquire
    /// of a free key: it must answer `OK` or the explicit start-up error, never null (a client
    /// reads null as "held"); it is released if granted. Then the workload's workers of that
    /// proxy follow it through `table`. Counted as a fault.
    pub async fn replace_proxy(
        &mut self,
        index: usize,
        table: &PortTable,
        backends: Option<Vec<String>>,
        before_start: impl FnOnce(&mut Nemesis),
    ) {
        let old = self.proxies.remove(index);
        let old_port = old.port;
        let mut config = old.config().clone();
        if let Some(backends) = backends {
            config.backends = backends
                .iter()
                .map(|b| b.parse().expect("a valid master address"))
                .collect();
        }
        old.stop().await;
        self.nemesis
            .note(format!("proxy {index} (port {old_port}) stopped"));
        tokio::task::block_in_place(|| before_start(&mut self.nemesis));
        let ttl = config.max_lock_ttl_ms.min(1000).to_string();
        let fresh = Proxy::launch(config).await;
        let free = format!("faults:fresh:{}:{}", std::process::id(), fresh.port);
        let mut client = Client::connect(fresh.port).await;
        let first = client.cmd(&["SET", &free, "first", "NX", "PX", &ttl]).await;
        assert!(
            first == "+OK" || first.starts_with(STARTING),
            "the first acquire of a free key through fresh proxy {index} (port {}): {first}",
            fresh.port
        );
        if first == "+OK" {
            client
                .cmd(&["EVAL", COMPARE_AND_DELETE.text(), "1", &free, "first"])
                .await;
        }
        self.nemesis.note_fault(format!(
            "fresh proxy {index} on port {}: first acquire {first}",
            fresh.port
        ));
        table.lock().unwrap_or_else(PoisonError::into_inner)[index] = fresh.port;
        self.proxies.insert(index, fresh);
    }
}

/// The start of the error a proxy answers acquires with until it has judged its masters.
pub const STARTING: &str = "-LOADING redlock-proxy is starting";

/// What a run must show besides safety (no overlap, no duplicate live token, no token
/// regression): at least `min_grants` grants (so it cannot pass vacuously), at least
/// `min_faults` faults that took effect ([`Nemesis::faults`]), and at most `late_oks_allowed`
/// late `OK`s (0 except where masters answer near the TTL by design: see [`verdict`]).
#[derive(Clone, Copy, Debug)]
pub struct Expect {
    pub min_grants: usize,
    pub min_faults: usize,
    pub late_oks_allowed: usize,
}

impl Expect {
    /// No late `OK` allowed.
    pub fn new(min_grants: usize, min_faults: usize) -> Expect {
        Expect {
            min_grants,
            min_faults,
            late_oks_allowed: 0,
        }
    }

    pub fn late_oks(self, late_oks_allowed: usize) -> Expect {
        Expect {
            late_oks_allowed,
            ..self
        }
    }
}

/// Checks a history against `expect`: prints the report, asserts no overlap, no two live grants
/// with one token, no fencing token going backwards, at most `expect.late_oks_allowed` late
/// `OK`s, at least `expect.min_grants` grants, and at least `expect.min_faults` faults that
/// took effect.
///
/// Late `OK`s are read after send + TTL. Only a scenario whose masters answer near the TTL *by
/// design* may allow any: there the proxy writes `OK`s up to TTL − drift after it read the
/// request, and the client's own scheduling on a shared machine can take more than the drift
/// to read them. Everywhere else (`late_oks_allowed` = 0) an `OK` comes back far inside its
/// lease, and a late one means the proxy's validity re-check failed.
pub fn verdict(
    name: &str,
    seed: u64,
    started: Instant,
    h: &History,
    nemesis: &Nemesis,
    expect: Expect,
) -> Report {
    let (faults, took_effect) = (&nemesis.log, nemesis.faults());
    let Expect {
        min_grants,
        min_faults,
        late_oks_allowed,
    } = expect;
    let report = h.report();
    println!(
        "[{name}] seed={seed} {:.1}s {report} {}; {took_effect} faults took effect ({} log entries)",
        started.elapsed().as_secs_f64(),
        h.summary(),
        faults.len()
    );
    if let Some((t_send, _, _)) = h.slow_replies.iter().max_by_key(|s| s.1) {
        let recent: Vec<(u64, String)> = faults
            .iter()
            .filter(|(t, _)| *t + 2_000_000_000 >= *t_send && *t <= *t_send + 3_000_000_000)
            .cloned()
            .collect();
        println!(
            "[{name}] {} acquires answered after more than {:?}:\n{}\nfaults from 2 s before the slowest was sent to 3 s after:\n{}",
            h.slow_replies.len(),
            SLOW_REPLY,
            h.slowest(5),
            render(&recent)
        );
    }
    let log = || render(faults);
    assert!(
        report.violations.is_empty(),
        "[{name}] MUTUAL EXCLUSION VIOLATED (SEED={seed}): {report}\n{}\nfault log (ms):\n{}",
        faults_before_violations(&report, faults),
        log()
    );
    assert_eq!(
        report.duplicate_tokens, 0,
        "[{name}] two live grants carried one token"
    );
    assert!(
        report.token_regressions.is_empty(),
        "[{name}] FENCING TOKENS WENT BACKWARDS (SEED={seed}): {report}"
    );
    assert!(
        report.late_oks <= late_oks_allowed,
        "[{name}] {} OKs read after their lease ended (send + TTL; {late_oks_allowed} allowed): the validity re-check let useless grants through (SEED={seed}): {report}\n{}",
        report.late_oks,
        late_holds(&report)
    );
    assert!(
        report.grants >= min_grants,
        "[{name}] only {} grants (< {min_grants}): the run proves little (SEED={seed}): {report}\nfault log (ms):\n{}",
        report.grants,
        log()
    );
    assert!(
        took_effect >= min_faults,
        "[{name}] only {took_effect} faults took effect (< {min_faults}): the run proves little (SEED={seed})\nfault log (ms):\n{}",
        log()
    );
    report
}

/// The late `OK`s of a report (at most 10), for a failure message.
pub fn late_holds(report: &Report) -> String {
    report
        .holds
        .iter()
        .filter(|h| h.late())
        .take(10)
        .map(|h| {
            format!(
                "  late OK {} on {}: send={:.3} ok={:.3} ({:.1} ms after send, TTL {} ms)",
                h.token,
                h.key,
                ms(h.t_send),
                ms(h.t_ok),
                ms(h.t_ok - h.t_send),
                h.ttl_ms
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A fault log, one action a line with its time (ms).
pub fn render(log: &[(u64, String)]) -> String {
    log.iter()
        .map(|(t, what)| format!("{:>10.3} {what}", ms(*t)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// For each reported overlap, the faults of the 2 s before the second `OK`.
pub fn faults_before_violations(report: &Report, log: &[(u64, String)]) -> String {
    // Which fault came last before each second OK, for all of them.
    let mut last: std::collections::BTreeMap<String, (usize, u64)> = Default::default();
    for v in &report.violations {
        let t_ok = report.holds[v.second].t_ok;
        let (kind, gap) = log.iter().rev().find(|(t, _)| *t <= t_ok).map_or(
            ("none".to_string(), 0),
            |(t, what)| {
                let kind = what.split(' ').next().unwrap_or("").trim_end_matches(':');
                (kind.to_string(), t_ok - t)
            },
        );
        let entry = last.entry(kind).or_default();
        entry.0 += 1;
        entry.1 = entry.1.max(gap);
    }
    let mut out = String::from("last fault before the second OK of each overlap:");
    for (kind, (n, gap)) in &last {
        out.push_str(&format!(" {kind} ×{n} (≤ {:.1} ms before);", ms(*gap)));
    }
    out.push('\n');
    for v in report.violations.iter().take(10) {
        let b = &report.holds[v.second];
        let recent: Vec<(u64, String)> = log
            .iter()
            .filter(|(t, _)| *t <= b.t_ok && b.t_ok - *t <= 2_000_000_000)
            .cloned()
            .collect();
        out.push_str(&format!(
            "faults in the 2 s before the OK at {:.3} ({}):\n{}\n",
            ms(b.t_ok),
            b.token,
            render(&recent)
        ));
    }
    out
}

/// The configuration of most scenarios: [`NODE_TIMEOUT_MS`], TTLs capped at `ttl_ms` (so a
/// master that lost data is quarantined for about that long).
pub fn with_quarantine(ttl_ms: u64) -> impl Fn(&mut Config) {
    move |c: &mut Config| {
        c.node_timeout_ms = NODE_TIMEOUT_MS;
        c.max_lock_ttl_ms = ttl_ms;
    }
}

/// The common shape: rig, wait until grantable, workload under faults, heal, liveness check,
/// verdict ([`verdict`] against `expect`).
pub async fn scenario(
    name: &str,
    rig: &mut Rig,
    seed: u64,
    workload: Workload,
    faults_for: Duration,
    step: fn(&mut Nemesis),
    expect: Expect,
) -> Report {
    let started = Instant::now();
    rig.wait_ready(workload.ttl_ms, Duration::from_secs(5))
        .await;
    let history = rig
        .run_with_faults(&workload, faults_for, 10_000, step)
        .await;
    let report = verdict(name, seed, started, &history, &rig.nemesis, expect);
    // Liveness: once healed, a fresh key is granted within a quarantine plus a margin.
    let limit = Duration::from_millis(quarantine_ms(workload.ttl_ms) + 3000);
    for port in rig.ports() {
        let probe = format!("faults:{name}:after:{}", std::process::id());
        let took = wait_grantable(port, &probe, workload.ttl_ms, limit).await;
        assert!(
            took.is_some(),
            "[{name}] no grant within {limit:?} after healing"
        );
    }
    report
}

/// The time of the first fault-log entry starting with `what`.
pub fn logged_at(log: &[(u64, String)], what: &str) -> u64 {
    log.iter()
        .find(|(_, w)| w.starts_with(what))
        .map(|(t, _)| *t)
        .unwrap_or_else(|| panic!("no {what:?} in the fault log:\n{}", render(log)))
}
