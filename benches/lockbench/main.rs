//! lockbench: the redlock-proxy benchmark harness (issue 5). One run starts its own
//! `redis-server` masters and proxy processes on loopback, measures, and prints a markdown
//! report (also written to `target/bench-results.md`).
//!
//! Sections (select with `BENCH_ONLY=a,b` or `cargo bench --bench lockbench -- a b`):
//! - `cycles`: lock cycles (`SET k v NX PX` → compare-and-delete release) from a tokio load
//!   generator on the test kit's RESP client (pre-encoded pipelines): direct redis-server vs the
//!   proxy over 1, 3 and 5 masters, at each connection count and pipeline depth.
//! - `clientside`: the same cycles as an in-process Redlock client over the `redis` crate
//!   (5 multiplexed connections) vs the proxy over the same 5 masters.
//! - `node`: node `redlock` with 5 ioredis clients over the 5 masters vs the same script with
//!   one ioredis client at the proxy; at the largest worker count also with one ioredis client
//!   per worker, and the raw-RESP load generator, in each interleaved round; the CPU per cycle
//!   of node, the proxy and the masters (needs `benches/node/node_modules`, see
//!   scripts/bench.sh).
//! - `redis-benchmark`: `redis-benchmark … SET key:__rand_int__ v NX PX 30000`, direct vs
//!   the proxy over 1 master.
//! - `cpu`: CPU time per request under that redis-benchmark load (a fixed number of requests
//!   per cell): redis-server directly vs the proxy over 1 and 5 fresh masters, `--threads 1`
//!   and `--threads 2`, and the peer proxies twemproxy (over 1, and sharding over 5) and haproxy
//!   (TCP mode, over 1), at `-P 1`, then redis-server, the proxy over 1 and 5 and the peers at
//!   `-P 16`, interleaved rounds;
//!   the proxy's and the masters' CPU per request against redis-server's own and twemproxy's.
//! - `memory`: proxy resident bytes per idle client connection (10k connections, one PING each).
//! - `contention`: 100 clients polling `SET hot v NX PX 30000` every 5 ms while one holder
//!   holds it; master operations per client operation.
//! - `fencing`: `LOCK.ACQUIRE` → `LOCK.RELEASE` loops on 20 shared keys through one proxy, then
//!   through two in front of the same masters (token conflicts between proxies).
//! - `metrics`: lock cycles through the proxy over 5 masters with the metrics endpoint off and
//!   on (scraped every second), interleaved rounds; and a scrape taken under that load.
//! - `wakeup`: a blocked lock waiter woken by the release (python-redis-lock's `BLPOP` on its
//!   signal list, a Redisson-style waiter on its lock channel): release → waiter granted, direct
//!   redis-server vs the proxy over 3 and 5 masters, interleaved rounds, against 5 ms + one
//!   master round trip; then 1,000 waiters blocked on 100 keys: the proxy's memory and its idle
//!   CPU, the masters' pops while idle, who wakes on one push per key (issue 25).
//! - `latency`: p50/p99/p99.9 of `SET k v NX PX` (fresh keys) at fixed offered rates, open loop
//!   (latency from each request's scheduled send time): the closed-loop peaks of one
//!   redis-server and of the proxy over 5 masters at 50 connections, then 50 % of the direct
//!   peak and 25/50/75 % of the proxy's, direct vs the proxy over 5, interleaved rounds, with
//!   the CPU of the proxy, the masters and the load generator (issue 27, target 4).
//! - `masters`: what a granted lock costs each master (issue 27, targets 2 and 5), each cell on
//!   a fresh redis-server: its CPU per granted acquire, direct `SET NX PX` vs the proxy over it at
//!   `-P 1` and `-P 16`, and by script (16 operations per `EVALSHA`: bare `SET NX PX`, + the
//!   token counter, the proxy's `lock.lua`); its memory per held lock beyond the lock key at
//!   several lock counts (through the proxy, and with shorter counter keys and records); a
//!   `perf` summary of where its time goes (see `masters_cost.rs`).
//! - `confirm`: lock cycles through the proxy over 3 fresh masters with a replica each, without
//!   and with `--wait-replicas 1`, at depth 1 and 16, interleaved rounds (issue 26).
//! - `shards`: the proxy over 3 single masters, 3 Redis Clusters of 1 shard and 3 of 3 shards
//!   under redis-benchmark `SET NX PX`: the busiest primary's CPU per acquire and the proxy's
//!   CPU per request, interleaved rounds (issue 26; see `shards.rs`).
//! - `overload` (only when named, not part of `all`): one table (issue 38): the proxy's
//!   closed-loop peak of `SET NX PX` over 3 and 5 masters at `-P 1` and `-P 16`, then open loop
//!   at 50–200 % of each peak through the proxy, redis-server directly and twemproxy: goodput,
//!   nulls, errors by kind, requests not answered in time, retired master connections, p50/p99
//!   of the grants, peak RSS; and a 10 MB `SET` beside small clients (see `overload.rs`).
//!
//! Every proxy is the release binary run as a separate process (the test kit's
//! `launcher::ProxyProcess`), started fresh for each cell. Knobs (`BENCH_*` environment
//! variables): settings.rs and BENCHMARKS.md.

mod confirm;
mod contention;
mod cpu;
mod cycles;
mod external;
mod fencing;
mod latency;
mod masters_cost;
mod memory;
mod metrics_cost;
mod openloop;
mod overload;
mod peers;
mod procs;
mod report;
mod settings;
mod shards;
mod stats;
mod wakeup;

use procs::CpuProbe;
use redlock_proxy::on_master::ARMED_KEY;
use redlock_proxy::{LocalCluster, LocalMaster};
use redlock_testkit::launcher::{ready_for_load, ProxyProcess};
use redlock_testkit::masters::pids;
use redlock_testkit::resp::blocking_cmd;
use report::{fmt_kib, fmt_lat, fmt_mib, fmt_rate, fmt_ratio, fmt_us, Results};
use settings::{Settings, Target, SECTIONS};
use stats::CycleResult;
use std::future::Future;
use std::time::{Duration, Instant};

/// What every section needs: the settings, the load generator's runtime, the 5 masters.
struct Bench {
    settings: Settings,
    rt: tokio::runtime::Runtime,
    masters: LocalCluster,
    master_ports: Vec<u16>,
    hz: f64,
    results: Results,
}

impl Bench {
    fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Waits until a fresh proxy has its masters up (see [`ready_for_load`]); the cell runs
    /// anyway if it does not, and shows the failures.
    fn prepare(&self, port: u16) {
        if let Err(err) = self.block_on(ready_for_load(port)) {
            progress(&format!("warning: {err}"));
        }
    }

    fn skip(&mut self, why: String) {
        progress(&format!("skipped: {why}"));
        self.results.skipped.push(why);
    }

    fn record_cycle(&mut self, r: CycleResult) {
        progress(&cycle_line(&r));
        self.results.cycles.push(r);
    }

    fn cycles(&mut self) {
        let s = self.settings.clone();
        for &target in &s.targets {
            for &conns in &s.conns {
                for &depth in &s.depths {
                    let cell =
                        cycles::run_cycle_cell(&s, &self.masters, target, conns, depth, self.hz);
                    let r = self.block_on(cell);
                    self.record_cycle(r);
                }
            }
        }
    }

    fn clientside(&mut self) {
        let s = self.settings.clone();
        for &workers in &s.clientside_conns {
            let r = self.block_on(cycles::run_clientside_cell(
                &s,
                &self.masters,
                workers,
                self.hz,
            ));
            progress(&cycle_line(&r));
            self.results.clientside.push(r);
            self.ensure_proxy5_cell(workers);
        }
    }

    fn node(&mut self) {
        if let Err(why) = external::node_ready() {
            return self.skip(format!("node: {why}"));
        }
        let master_pids = pids(&self.masters.masters);
        let _hogs = match external::Hogs::start(self.settings.node_hogs) {
            Ok(hogs) => hogs,
            Err(why) => return self.skip(format!("node: {why}")),
        };
        if self.settings.node_hogs > 0 {
            progress(&format!(
                "node: {} CPU hog(s) (`yes > /dev/null`) running beside every cell",
                self.settings.node_hogs
            ));
        }
        // The largest worker count is the target comparison: repeated, interleaved, with the
        // other clients of the proxy beside it.
        let target_workers = self.settings.node_workers.iter().copied().max();
        for workers in self.settings.node_workers.clone() {
            let target = Some(workers) == target_workers;
            let rounds = if target { self.settings.rounds } else { 1 };
            for round in 1..=rounds {
                self.node_round(workers, round, target, &master_pids);
            }
        }
    }

    /// node redlock over the 5 masters, then the same script through a fresh proxy over them
    /// with one ioredis client; with `all`, also with one ioredis client per worker, and the
    /// raw-RESP load generator at as many connections (target 2 (a)).
    fn node_round(&mut self, workers: usize, round: usize, all: bool, master_pids: &[u32]) {
        let s = self.settings.clone();
        let probe = CpuProbe::new(None, master_pids, self.hz);
        let mut runs = vec![external::run_node(
            &s,
            &self.master_ports,
            workers,
            1,
            external::NODE_DIRECT,
            &probe,
        )];
        if all && workers > 1 && s.node_direct_per_worker {
            runs.push(external::run_node(
                &s,
                &self.master_ports,
                workers,
                workers,
                external::NODE_DIRECT_PER_WORKER,
                &probe,
            ));
        }
        runs.push(self.node_via_proxy(workers, 1, external::NODE_PROXY, master_pids));
        if all && workers > 1 {
            let per_worker = external::NODE_PROXY_PER_WORKER;
            runs.push(self.node_via_proxy(workers, workers, per_worker, master_pids));
        }
        if all {
            let cell =
                cycles::run_cycle_cell(&s, &self.masters, Target::Proxy(5), workers, 1, self.hz);
            runs.push(Ok(external::NodeResult::from_cycles(self.block_on(cell))));
        }
        for r in runs {
            match r {
                Ok(mut r) => {
                    r.round = round;
                    let (p50, p99, _) = fmt_lat(r.latency);
                    let per = r.cpu_per_cycle();
                    progress(&format!(
                        "{} workers {} round {round}: {} cycles/s p50 {p50} p99 {p99} ms, load gen CPU {} %, CPU µs/cycle gen/proxy/masters {:.0}/{}/{:.0}, other CPU {:.0} %, refused {}",
                        r.scenario,
                        r.workers,
                        fmt_rate(r.cycles_per_sec),
                        r.node_cpu.map_or("–".into(), |c| format!("{c:.0}")),
                        per.client,
                        per.proxy.map_or("–".into(), |p| format!("{p:.0}")),
                        per.masters,
                        r.cpu.other,
                        r.fails
                    ));
                    self.results.node.push(r);
                }
                Err(err) => self.skip(format!("node ({workers} workers): {err}")),
            }
        }
    }

    /// The node script through a fresh proxy over the 5 masters, `conns` ioredis clients.
    fn node_via_proxy(
        &mut self,
        workers: usize,
        conns: usize,
        scenario: &str,
        master_pids: &[u32],
    ) -> Result<external::NodeResult, String> {
        let s = self.settings.clone();
        let mut proxy = s
            .start_proxy(&self.masters.addrs())
            .map_err(|e| e.to_string())?;
        self.prepare(proxy.port);
        let probe = CpuProbe::new(Some(proxy.pid()), master_pids, self.hz);
        let mut r = external::run_node(&s, &[proxy.port], workers, conns, scenario, &probe)?;
        r.note = proxy.health_note();
        Ok(r)
    }

    /// Runs the proxy-over-5 lock-cycle cell at `conns` connections, depth 1, unless the
    /// `cycles` section already did.
    fn ensure_proxy5_cell(&mut self, conns: usize) {
        if report::find_cycle(&self.results.cycles, Target::Proxy(5), conns, 1).is_none() {
            let s = self.settings.clone();
            let cell =
                cycles::run_cycle_cell(&s, &self.masters, Target::Proxy(5), conns, 1, self.hz);
            let r = self.block_on(cell);
            self.record_cycle(r);
        }
    }

    fn redis_benchmark(&mut self) {
        if let Err(why) = external::redis_benchmark_ready() {
            return self.skip(format!("redis-benchmark: {why}"));
        }
        let s = self.settings.clone();
        // Depth 1 is the target comparison: repeated, direct and proxy interleaved.
        for depth in [1, 16] {
            let rounds = if depth == 1 { s.rounds } else { 1 };
            for round in 1..=rounds {
                for target in [Target::Direct, Target::Proxy(1)] {
                    self.redis_benchmark_run(target, depth, round);
                }
            }
        }
    }

    fn redis_benchmark_run(&mut self, target: Target, depth: usize, round: usize) {
        let s = self.settings.clone();
        let master = self.master_ports[0];
        let mut proxy = None;
        if target != Target::Direct {
            match s.start_proxy(&self.masters.addrs()[..1]) {
                Ok(p) => proxy = Some(p),
                Err(err) => return self.skip(format!("redis-benchmark via proxy: {err}")),
            }
        }
        let port = proxy.as_ref().map_or(master, |p| p.port);
        if proxy.is_some() {
            // Wait until the proxy reaches its master (SCRIPT LOAD fans out).
            self.prepare(port);
        }
        match external::redis_benchmark_cell(&s, port, master, depth) {
            Ok(mut r) => {
                r.scenario = target.label();
                r.round = round;
                r.note = proxy.as_mut().and_then(ProxyProcess::health_note);
                progress(&format!(
                    "redis-benchmark {} -P {depth} round {round}: {} SET/s p50 {} p99 {} ms, {} of {} granted",
                    r.scenario,
                    fmt_rate(r.rps),
                    r.p50_ms,
                    r.p99_ms,
                    r.granted.map_or("?".into(), |g| g.to_string()),
                    r.requests
                ));
                self.results.rb.push(r);
            }
            Err(err) => self.skip(format!("redis-benchmark {}: {err}", target.label())),
        }
        // Drop the ~N keys (30 s TTL) left behind, once the proxy is gone, and arm the master
        // again: later sections' proxies over all 5 would otherwise find it unarmed while the
        // others are armed, and quarantine it (about a minute) as a master that lost its data.
        drop(proxy);
        let _ = blocking_cmd(master, &[b"FLUSHALL"], Duration::from_secs(30));
        arm(master);
    }

    /// The cells of [`cpu::VARIANTS`] in each of `BENCH_ROUNDS` rounds (a peer proxy's only if
    /// its binary is found).
    fn cpu(&mut self) {
        if let Err(why) = external::redis_benchmark_ready() {
            return self.skip(format!("cpu: redis-benchmark {why}"));
        }
        let s = self.settings.clone();
        let mut missing = Vec::new();
        for peer in peers::Peer::ALL {
            match s.peer_bin(peer) {
                Some(bin) => progress(&format!(
                    "cpu: {} is {} ({})",
                    peer.label(),
                    bin.display(),
                    peers::version(peer, &bin)
                )),
                None => {
                    missing.push(peer);
                    self.skip(format!(
                        "cpu: the {} cells: `{}` not found (Debian: `apt-get install {}`; scripts/bench.sh installs it)",
                        peer.label(),
                        s.peer_bin_name(peer),
                        peer.package()
                    ));
                }
            }
        }
        let variants: Vec<cpu::Variant> = cpu::VARIANTS
            .into_iter()
            .filter(|v| v.peer.is_none_or(|p| !missing.contains(&p)))
            .collect();
        for round in 1..=s.rounds {
            for variant in variants.iter().copied() {
                match cpu::run_cell(&s, variant, round, self.hz, |port| self.prepare(port)) {
                    Ok(cell) => {
                        let r = cpu::ratios(&self.results.cpu, &cell);
                        progress(&format!(
                            "cpu round {round} {} -P {}: {} req/s, µs/req proxy {} masters {:.2} (×direct proxy {} masters {}; ×twemproxy {}), threads2/1 req/s {}, {} of {} granted{}",
                            variant.label(),
                            variant.depth,
                            fmt_rate(cell.rps),
                            cell.proxy_us().map_or("–".into(), |p| format!("{p:.2}")),
                            cell.masters_us(),
                            r.proxy_vs_direct.map_or("–".into(), fmt_ratio),
                            r.masters_vs_direct.map_or("–".into(), fmt_ratio),
                            r.vs_twemproxy.map_or("–".into(), fmt_ratio),
                            r.rps_vs_threads1.map_or("–".into(), fmt_ratio),
                            cell.granted.map_or("?".into(), |g| g.to_string()),
                            cell.requests,
                            cell.note.as_deref().map(|n| format!(" ({n})")).unwrap_or_default()
                        ));
                        self.results.cpu.push(cell);
                    }
                    Err(err) => self.skip(format!(
                        "cpu {} -P {} round {round}: {err}",
                        variant.label(),
                        variant.depth
                    )),
                }
            }
        }
    }

    fn memory(&mut self) {
        let s = self.settings.clone();
        let needed = s.mem_conns as u64 + 200;
        if let Some(limit) = procs::open_files_limit().filter(|l| *l < needed) {
            return self.skip(format!(
                "memory: open-files limit {limit} < {needed}; raise it (`ulimit -n 20000`; scripts/bench.sh does)"
            ));
        }
        match s.start_proxy(&self.masters.addrs()) {
            Ok(mut proxy) => {
                self.prepare(proxy.port);
                let label = "redlock-proxy (over 5 masters)";
                let mut m = self.block_on(memory::measure_idle(
                    label,
                    proxy.pid(),
                    proxy.port,
                    s.mem_conns,
                ));
                m.note = m.note.take().or_else(|| proxy.health_note());
                self.record_memory(m);
            }
            Err(err) => self.skip(format!("memory: {err}")),
        }
        let maxclients = (s.mem_conns + 100).to_string();
        match LocalMaster::start(None, &["--maxclients", &maxclients]) {
            Ok(redis) => {
                let label = "redis-server (reference)";
                let pid = redis.pid().unwrap_or(0);
                let m = self.block_on(memory::measure_idle(label, pid, redis.port, s.mem_conns));
                self.record_memory(m);
            }
            Err(err) => self.skip(format!("memory reference redis-server: {err}")),
        }
    }

    fn record_memory(&mut self, m: memory::MemResult) {
        progress(&format!(
            "memory {}: {} → {} = {} per connection ({} of {} opened)",
            m.scenario,
            fmt_mib(m.before),
            fmt_mib(m.after),
            m.per_conn().map_or("–".into(), fmt_kib),
            m.opened,
            m.conns
        ));
        self.results.memory.push(m);
    }

    fn contention(&mut self) {
        let s = self.settings.clone();
        let ports = self.master_ports.clone();
        let master_pids = pids(&self.masters.masters);
        match s.start_proxy(&self.masters.addrs()) {
            Ok(mut proxy) => {
                self.prepare(proxy.port);
                let probe = CpuProbe::new(Some(proxy.pid()), &master_pids, self.hz);
                let run = contention::run_hot(&s, "proxy over 5", proxy.port, &ports, &probe);
                match self.block_on(run) {
                    Ok(mut h) => {
                        h.note = h.note.take().or_else(|| proxy.health_note());
                        self.record_hot(h);
                    }
                    Err(err) => self.skip(format!("contention via proxy: {err}")),
                }
            }
            Err(err) => self.skip(format!("contention: {err}")),
        }
        let label = "direct redis-server (reference)";
        let probe = CpuProbe::new(None, &master_pids[..1], self.hz);
        match self.block_on(contention::run_hot(
            &s,
            label,
            ports[0],
            &ports[..1],
            &probe,
        )) {
            Ok(h) => self.record_hot(h),
            Err(err) => self.skip(format!("contention direct: {err}")),
        }
    }

    /// One proxy, then two, in front of the same masters (see [`fencing`]).
    fn fencing(&mut self) {
        let s = self.settings.clone();
        let addrs = self.masters.addrs();
        let (one, two) = match (s.start_proxy(&addrs), s.start_proxy(&addrs)) {
            (Ok(one), Ok(two)) => (one, two),
            (Err(err), _) | (_, Err(err)) => return self.skip(format!("fencing: {err}")),
        };
        self.prepare(one.port);
        self.prepare(two.port);
        for (tag, ports) in [("one", vec![one.port]), ("two", vec![one.port, two.port])] {
            let r = self.block_on(fencing::run(&s, tag, &ports));
            progress(&format!(
                "fencing over {} prox{}: {} grants/s, {} attempts/s, {} tokens backwards",
                r.proxies,
                if r.proxies == 1 { "y" } else { "ies" },
                fmt_rate(r.grants_per_sec),
                fmt_rate(r.attempts_per_sec),
                r.regressions
            ));
            self.results.fencing.push(r);
        }
    }

    /// Metrics off vs on, interleaved (see [`metrics_cost`]).
    fn metrics(&mut self) {
        let s = self.settings.clone();
        match self.block_on(metrics_cost::run(&s, &self.masters, self.hz)) {
            Ok(cost) => {
                for round in &cost.rounds {
                    progress(&cycle_line(&round.off));
                    progress(&cycle_line(&round.on));
                }
                self.results.metrics = Some(cost);
            }
            Err(err) => self.skip(format!("metrics: {err}")),
        }
    }

    /// The proxy over single masters and over clusters of 1 and 3 shards (see [`shards`]).
    fn shards(&mut self) {
        let s = self.settings.clone();
        let mut skipped = Vec::new();
        let cells = shards::run(
            &s,
            self.hz,
            |port| self.prepare(port),
            |why| skipped.push(why),
            progress,
        );
        for why in skipped {
            self.skip(why);
        }
        self.results.shards = cells;
    }

    /// `wait_replicas` 0 vs 1 over masters with replicas (see [`confirm`]).
    fn confirm(&mut self) {
        let s = self.settings.clone();
        match self.block_on(confirm::run(&s, self.hz, arm)) {
            Ok(run) => {
                for round in &run.rounds {
                    progress(&cycle_line(&round.off));
                    progress(&cycle_line(&round.on));
                }
                self.results.confirm = Some(run);
            }
            Err(err) => self.skip(format!("confirm: {err}")),
        }
    }

    /// Wake-ups of blocked waiters (see [`wakeup`]): the latency rounds against the first
    /// master directly and fresh proxies over 3 and 5 masters, then the idle waiters through a
    /// fresh proxy over 5 masters and on a fresh redis-server.
    fn wakeup(&mut self) {
        let s = self.settings.clone();
        let addrs = self.masters.addrs();
        let mut endpoints = vec![wakeup::Endpoint {
            target: Target::Direct,
            port: self.master_ports[0],
            masters: Vec::new(),
        }];
        let mut proxies = Vec::new();
        for n in [3, 5] {
            match s.start_proxy(&addrs[..n]) {
                Ok(proxy) => {
                    self.prepare(proxy.port);
                    endpoints.push(wakeup::Endpoint {
                        target: Target::Proxy(n),
                        port: proxy.port,
                        masters: self.master_ports[..n].to_vec(),
                    });
                    proxies.push((n, proxy));
                }
                Err(err) => self.skip(format!("wakeup over {n} masters: {err}")),
            }
        }
        let mut run = self.block_on(wakeup::run_latency(&s, &endpoints, self.master_ports[0]));
        for (n, proxy) in &mut proxies {
            // The proxy's acquire outcomes other than grants (each round's first waiter try
            // is `contended`), and what it logged at WARN or ERROR.
            let mut notes = Vec::new();
            if let Some(counters) = external::acquire_counters(proxy.port) {
                let outcomes: Vec<String> = counters
                    .iter()
                    .filter(|(name, n)| name.as_str() != "granted" && **n > 0)
                    .map(|(name, n)| format!("{name} {n}"))
                    .collect();
                notes.push(format!(
                    "proxy acquires not granted: {}",
                    outcomes.join(", ")
                ));
            }
            if let Some(note) = proxy.health_note() {
                notes.push(note);
                let mut logged = proxy.logged(&["\"level\":\"WARN\""]);
                logged.extend(proxy.logged(&["\"level\":\"ERROR\""]));
                if let Some(first) = logged.first() {
                    let first: String = first.chars().take(300).collect();
                    notes.push(format!("first: {first}"));
                }
            }
            for cell in run
                .cells
                .iter_mut()
                .filter(|c| c.target == Target::Proxy(*n))
            {
                let mut all: Vec<String> = cell.note.take().into_iter().collect();
                all.extend(notes.iter().cloned());
                cell.note = Some(all.join("; "));
            }
        }
        drop(proxies);
        let rtt = run.rtt_p50();
        for c in &run.cells {
            let (p50, p99, _) = fmt_lat(c.latency());
            let (w50, w99, _) = fmt_lat(c.woken_latency());
            progress(&format!(
                "wakeup {} {}: {} rounds, granted p50 {p50} p99 {p99} ms, woken p50 {w50} p99 {w99} ms, {} failed{}{}",
                c.kind.label(),
                c.target.label(),
                c.granted.len(),
                c.failures,
                c.first_error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default(),
                c.note.as_deref().map(|n| format!("; {n}")).unwrap_or_default()
            ));
        }
        progress(&format!(
            "wakeup: {} rounds in {:.0} s; master round trip (PING p50) {} ms",
            run.rounds,
            run.secs,
            rtt.map_or("–".into(), fmt_us)
        ));
        self.results.wakeup = Some(run);
        self.wakeup_idle();
    }

    /// The idle waiters of [`Bench::wakeup`].
    fn wakeup_idle(&mut self) {
        let s = self.settings.clone();
        let needed = s.wakeup_waiters as u64 + 200;
        if let Some(limit) = procs::open_files_limit().filter(|l| *l < needed) {
            return self.skip(format!(
                "wakeup idle waiters: open-files limit {limit} < {needed}; raise it (`ulimit -n 20000`; scripts/bench.sh does)"
            ));
        }
        let master_pids = pids(&self.masters.masters);
        let ports = self.master_ports.clone();
        match s.start_proxy(&self.masters.addrs()) {
            Ok(mut proxy) => {
                self.prepare(proxy.port);
                let probe = CpuProbe::new(Some(proxy.pid()), &master_pids, self.hz);
                let label = "redlock-proxy (over 5 masters)";
                let run =
                    wakeup::run_idle(&s, label, proxy.pid(), proxy.port, &ports, &probe, self.hz);
                match self.block_on(run) {
                    Ok(mut r) => {
                        r.note = r.note.take().or_else(|| proxy.health_note());
                        drop(proxy);
                        // As many plain idle connections on a fresh proxy, for comparison.
                        r.plain_growth = match s.start_proxy(&self.masters.addrs()) {
                            Ok(plain) => {
                                self.prepare(plain.port);
                                self.plain_growth(plain.pid(), plain.port)
                            }
                            Err(err) => {
                                progress(&format!("wakeup plain connections: {err}"));
                                None
                            }
                        };
                        self.record_idle(r);
                    }
                    Err(err) => self.skip(format!("wakeup idle waiters via proxy: {err}")),
                }
            }
            Err(err) => self.skip(format!("wakeup idle waiters: {err}")),
        }
        let maxclients = (s.wakeup_waiters + 100).to_string();
        match LocalMaster::start(None, &["--maxclients", &maxclients]) {
            Ok(redis) => {
                let pid = redis.pid().unwrap_or(0);
                let probe = CpuProbe::new(Some(pid), &[], self.hz);
                let label = "redis-server (reference)";
                let run = wakeup::run_idle(&s, label, pid, redis.port, &[], &probe, self.hz);
                match self.block_on(run) {
                    Ok(mut r) => {
                        drop(redis);
                        r.plain_growth =
                            match LocalMaster::start(None, &["--maxclients", &maxclients]) {
                                Ok(plain) => {
                                    self.plain_growth(plain.pid().unwrap_or(0), plain.port)
                                }
                                Err(err) => {
                                    progress(&format!("wakeup plain connections: {err}"));
                                    None
                                }
                            };
                        self.record_idle(r);
                    }
                    Err(err) => self.skip(format!("wakeup idle waiters on redis-server: {err}")),
                }
            }
            Err(err) => self.skip(format!("wakeup reference redis-server: {err}")),
        }
    }

    /// Issue 27, target 4 (see [`latency`]): the closed-loop peaks, then every offered rate,
    /// direct then through the proxy over 5 masters, in each round.
    fn latency(&mut self) {
        let s = self.settings.clone();
        let hz = self.hz;
        let mut run = latency::LatencyRun {
            conns: s.latency_conns,
            secs: s.latency_secs,
            ..Default::default()
        };
        for target in [Target::Direct, Target::Proxy(5)] {
            match self.rt.block_on(latency::peak(&s, target, hz)) {
                Ok(p) => {
                    progress(&format!(
                        "latency peak {}: {} req/s closed loop, p99 {} ms, {} granted, {} null, {} errors",
                        target.label(),
                        fmt_rate(p.rate),
                        p.latency.map_or("–".into(), |l| fmt_us(l.p99)),
                        p.granted,
                        p.nulls,
                        p.errors
                    ));
                    run.peaks.push(p);
                }
                Err(err) => run
                    .failures
                    .push(format!("peak of {}: {err}", target.label())),
            }
        }
        let peak = |t: Target| run.peak(t).map(|p| p.rate).filter(|r| *r > 0.0);
        let (direct_peak, proxy_peak) = (peak(Target::Direct), peak(Target::Proxy(5)));
        if let Some(direct) = direct_peak {
            let f = s.latency_direct_fraction;
            run.points.push(latency::Point {
                label: format!("{:.0} % of the direct peak", f * 100.0),
                rate: direct * f,
                target: true,
            });
        }
        if let Some(proxy) = proxy_peak {
            for &f in &s.latency_fractions {
                run.points.push(latency::Point {
                    label: format!("{:.0} % of the proxy-over-5 peak", f * 100.0),
                    rate: proxy * f,
                    target: false,
                });
            }
        }
        for round in 1..=s.rounds {
            for (i, point) in run.points.clone().iter().enumerate() {
                for target in [Target::Direct, Target::Proxy(5)] {
                    let cell = latency::open_loop(&s, target, point.rate, round, i, hz);
                    match self.rt.block_on(cell) {
                        Ok(c) => {
                            let (p50, p99, p999) = (
                                c.latency.map_or("–".into(), |l| latency::fmt_ms(l.p50)),
                                c.latency.map_or("–".into(), |l| latency::fmt_ms(l.p99)),
                                c.latency.map_or("–".into(), |l| latency::fmt_ms(l.p999)),
                            );
                            progress(&format!(
                                "latency round {round} {} at {} req/s ({}): completed {}/s, p50 {p50} p99 {p99} p99.9 {p999} ms, send lag p99 {} ms, {} granted {} null {} errors {} unsent {} unanswered, CPU p/m/c/o {}",
                                target.label(),
                                fmt_rate(point.rate),
                                point.label,
                                fmt_rate(c.completed_per_sec),
                                c.send_lag.map_or("–".into(), |l| latency::fmt_ms(l.p99)),
                                c.granted,
                                c.nulls,
                                c.errors,
                                c.unsent,
                                c.unanswered,
                                report::fmt_cpu(&c.cpu)
                            ));
                            run.cells.push(c);
                        }
                        Err(err) => run.failures.push(format!(
                            "round {round}, {} at {}: {err}",
                            target.label(),
                            point.label
                        )),
                    }
                }
            }
        }
        self.results.latency = Some(run);
    }

    /// Issue 38 (see [`overload`]): the one overload table.
    fn overload(&mut self) {
        let s = self.settings.clone();
        let run = self.block_on(overload::run(&s, self.hz, &progress));
        self.results.overload = Some(run);
    }

    /// VmRSS growth of a fresh process for `wakeup_waiters` plain idle connections (`memory`'s).
    fn plain_growth(&self, pid: u32, port: u16) -> Option<i64> {
        let n = self.settings.wakeup_waiters;
        let m = self.block_on(memory::measure_idle("plain", pid, port, n));
        (m.opened == n).then(|| m.after as i64 - m.before as i64)
    }

    fn record_idle(&mut self, r: wakeup::IdleResult) {
        progress(&format!(
            "wakeup idle {}: {} of {} waiters on {} keys, VmRSS {} → {} ({:+.2} MiB; as many plain connections {}); {} s idle: CPU ticks {} without → {} with waiters, masters' LMPOP {} → {}; one push per key woke {} keys, {} waiters (at most {} per key; {} master pops){}",
            r.scenario,
            r.opened,
            r.waiters,
            r.keys,
            fmt_mib(r.rss_before),
            fmt_mib(r.rss_after),
            r.rss_growth() as f64 / (1024.0 * 1024.0),
            r.plain_growth.map_or("–".into(), |g| format!("{:+.2} MiB", g as f64 / (1024.0 * 1024.0))),
            r.idle_secs,
            r.ticks_empty,
            r.ticks_waiting,
            r.lmpop_empty,
            r.lmpop_waiting,
            r.keys_woken,
            r.waiters_woken,
            r.most_woken_by_one_push,
            r.pops_for_pushes,
            r.note.as_deref().map(|n| format!(" ({n})")).unwrap_or_default()
        ));
        self.results.idle.push(r);
    }

    /// The masters' CPU per grant and memory per held lock (see [`masters_cost`]).
    fn masters(&mut self) {
        if let Err(why) = external::redis_benchmark_ready() {
            return self.skip(format!("masters: redis-benchmark {why}"));
        }
        let s = self.settings.clone();
        let prepare = |port: u16| self.prepare(port);
        let acquire = |port: u16, n: u64| self.block_on(masters_cost::acquire_through(port, n));
        let run = masters_cost::run(&s, self.hz, &prepare, &acquire, &progress);
        self.results.masters = Some(run);
    }

    fn record_hot(&mut self, h: contention::HotResult) {
        progress(&format!(
            "contention {}: {} client SETs, {} master SET/EVAL/EVALSHA, p99 {} ms",
            h.scenario,
            h.client_ops,
            h.master_lock_ops,
            h.latency.map_or("–".into(), |l| fmt_us(l.p99))
        ));
        self.results.hot.push(h);
    }
}

/// Sets the lock marker on a master (directly, no proxy attached).
fn arm(port: u16) {
    let armed = blocking_cmd(
        port,
        &[b"SET", ARMED_KEY.as_bytes(), b"1"],
        Duration::from_secs(5),
    );
    if !armed.as_ref().is_ok_and(|reply| reply.is_ok()) {
        settings::fail(&format!("cannot arm master {port}: {armed:?}"));
    }
}

fn progress(text: &str) {
    eprintln!("lockbench: {text}");
}

fn cycle_line(r: &CycleResult) -> String {
    let (p50, p99, p999) = fmt_lat(r.latency);
    format!(
        "{:<28} conns {:>3} depth {:>2}: {:>9} cycles/s  p50 {p50} p99 {p99} p999 {p999} ms  cpu p/m/c/o {}  refused {}{}",
        r.scenario,
        r.conns,
        r.depth,
        fmt_rate(r.cycles_per_sec),
        report::fmt_cpu(&r.cpu),
        r.fails,
        r.first_error
            .as_deref()
            .map(|e| format!(" errors {} ({e})", r.errors))
            .unwrap_or_default()
    )
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs bench targets without it,
    // and must not start a 4-minute benchmark.
    if !std::env::args().any(|a| a == "--bench") {
        println!(
            "lockbench: skipped (run it with `cargo bench --bench lockbench` or scripts/bench.sh)"
        );
        return;
    }
    let settings = Settings::from_env();
    let began = Instant::now();
    let machine = procs::environment(&settings);
    progress(&format!(
        "sections {:?}, {} s per cell (+{} s warm-up); results go to {}",
        settings.sections,
        settings.secs,
        settings.warmup,
        settings.out.display()
    ));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(settings.client_threads.max(1))
        .enable_all()
        .build()
        .expect("tokio runtime");
    let masters = LocalCluster::start(5).unwrap_or_else(|err| settings::fail(&err.to_string()));
    progress(&format!("5 masters on {:?}", masters.addrs()));
    // The masters are one lock deployment for every cell, armed from the start: a proxy over
    // 1, 3 or 5 of them must never find some armed (by an earlier cell's proxy) and others
    // not, which it has to take for lost data and quarantine (docs/SAFETY.md).
    for master in &masters.masters {
        arm(master.port);
    }
    let mut bench = Bench {
        master_ports: masters.masters.iter().map(|m| m.port).collect(),
        settings,
        rt,
        masters,
        hz: procs::clock_ticks_per_sec(),
        results: Results::default(),
    };
    // Always in this order: `clientside` reuses the proxy-5 cells of `cycles`.
    for section in SECTIONS {
        if !bench.settings.wants(section) {
            continue;
        }
        match section {
            "cycles" => bench.cycles(),
            "clientside" => bench.clientside(),
            "node" => bench.node(),
            "redis-benchmark" => bench.redis_benchmark(),
            "cpu" => bench.cpu(),
            "memory" => bench.memory(),
            "contention" => bench.contention(),
            "fencing" => bench.fencing(),
            "metrics" => bench.metrics(),
            "wakeup" => bench.wakeup(),
            "latency" => bench.latency(),
            "masters" => bench.masters(),
            "confirm" => bench.confirm(),
            "shards" => bench.shards(),
            "overload" => bench.overload(),
            _ => unreachable!("every section is handled"),
        }
    }
    let Bench {
        settings,
        masters,
        results,
        ..
    } = bench;
    drop(masters);
    let text = report::render(&settings, &machine, &results, began.elapsed());
    println!("{text}");
    if let Some(dir) = settings.out.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    match std::fs::write(&settings.out, &text) {
        Ok(()) => progress(&format!("wrote {}", settings.out.display())),
        Err(err) => progress(&format!("cannot write {}: {err}", settings.out.display())),
    }
}
