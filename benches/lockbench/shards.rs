//! `shards`: what masters that are Redis Clusters cost and save (issue 26). Each round, fresh
//! masters and a fresh proxy for each cell, under the `cpu` section's redis-benchmark load
//! (`SET key:__rand_int__ v NX PX`, `-c 50`, at `-P 1` and `-P 16`, `BENCH_CPU_REQUESTS`
//! measured after `BENCH_CPU_WARMUP_REQUESTS`): the proxy over 3 single masters, over 3
//! clusters of 1 shard, over 3 clusters of 3 shards, and over 3 clusters of 3 shards with every
//! key in one slot (the control: the same operations on one busy primary per cluster; every
//! cluster a fresh `RedisCluster`, no replicas). Per cell: the proxy's CPU µs per request,
//! each primary's CPU µs per granted acquire (the busiest primary's, and the mean), and the
//! script calls each primary ran (what its cost is made of: each call's fixed cost, and each
//! operation's). Targets: the busiest primary's cost per acquire at 3 shards ≤ 0.4× that at
//! 1 shard (the per-shard load falls with the shard count), and the proxy's own CPU per
//! request over clusters within 1.2× of over single masters.

use crate::external::{acquire_counters, redis_benchmark_keys, script_calls, GRANTED};
use crate::procs::CpuProbe;
use crate::report::{fmt_rate, fmt_ratio};
use crate::settings::Settings;
use crate::stats::median;
use redlock_proxy::{LocalCluster, LocalMaster};
use redlock_testkit::cluster::RedisCluster;
use redlock_testkit::launcher::ProxyProcess;
use std::fmt::Write;

/// redis-benchmark's pipeline depths of the cells.
pub const DEPTHS: [usize; 2] = [1, 16];

/// The masters of a cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Masters {
    /// 3 single redis-servers.
    Single,
    /// 3 Redis Clusters of this many shards.
    Clusters(usize),
    /// 3 Redis Clusters of 3 shards, every key of the load in one slot: the control that
    /// tells what spreading a cluster's operations over its primaries costs them (the same
    /// operations, on one busy node of each cluster instead of three).
    OneSlot,
}

impl Masters {
    pub const ALL: [Masters; 4] = [
        Masters::Single,
        Masters::Clusters(1),
        Masters::Clusters(3),
        Masters::OneSlot,
    ];

    /// The shards of each of its clusters (`None`: single masters).
    fn shards(self) -> Option<usize> {
        match self {
            Masters::Single => None,
            Masters::Clusters(shards) => Some(shards),
            Masters::OneSlot => Some(3),
        }
    }

    pub fn label(self) -> String {
        match self {
            Masters::Single => "3 single masters".into(),
            Masters::Clusters(1) => "3 clusters × 1 shard".into(),
            Masters::Clusters(n) => format!("3 clusters × {n} shards"),
            Masters::OneSlot => "3 clusters × 3 shards, keys in one slot".into(),
        }
    }
}

pub struct Cell {
    pub masters: Masters,
    /// redis-benchmark's `-P`.
    pub depth: usize,
    pub round: usize,
    pub rps: f64,
    pub granted: u64,
    /// The proxy's CPU µs per request.
    pub proxy_us: f64,
    /// The busiest primary's CPU µs per granted acquire, and the mean over the primaries.
    pub busiest_us: f64,
    pub mean_us: f64,
    pub primaries: usize,
    /// Script calls a primary ran per 1,000 requests (the mean over the primaries), and the
    /// lock operations each carried: what a primary's cost per acquire is made of.
    pub calls_per_k: f64,
    pub ops_per_call: f64,
}

/// The servers of a cell, kept running for its length.
enum Running {
    Single(LocalCluster),
    Clusters(Vec<RedisCluster>),
}

impl Running {
    fn start(masters: Masters) -> Result<Running, String> {
        Ok(match masters.shards() {
            None => Running::Single(LocalCluster::start(3).map_err(|e| e.to_string())?),
            Some(shards) => Running::Clusters(std::thread::scope(|s| {
                let starts: Vec<_> = (0..3)
                    .map(|_| s.spawn(move || RedisCluster::start(shards, 0)))
                    .collect();
                starts
                    .into_iter()
                    .map(|h| h.join().expect("a cluster"))
                    .collect()
            })),
        })
    }

    fn backends(&self) -> Vec<String> {
        match self {
            Running::Single(masters) => masters.addrs(),
            Running::Clusters(clusters) => clusters
                .iter()
                .map(|c| format!("cluster://{}", c.seeds().join(",")))
                .collect(),
        }
    }

    /// Every primary.
    fn primaries(&self) -> Vec<&LocalMaster> {
        match self {
            Running::Single(masters) => masters.masters.iter().collect(),
            Running::Clusters(clusters) => clusters.iter().flat_map(|c| &c.nodes).collect(),
        }
    }
}

/// One cell; `prepare` waits until the fresh proxy is ready for load.
fn run_cell(
    settings: &Settings,
    masters: Masters,
    depth: usize,
    round: usize,
    hz: f64,
    prepare: impl Fn(u16),
) -> Result<Cell, String> {
    let running = Running::start(masters)?;
    let mut proxy: ProxyProcess = settings
        .start_proxy(&running.backends())
        .map_err(|e| e.to_string())?;
    prepare(proxy.port);
    let ttl = settings.ttl_ms;
    let one_slot = masters == Masters::OneSlot;
    if settings.cpu_warmup_requests > 0 {
        redis_benchmark_keys(
            proxy.port,
            depth,
            settings.cpu_warmup_requests,
            ttl,
            one_slot,
        )?;
    }
    let primaries = running.primaries();
    let pids: Vec<u32> = primaries.iter().filter_map(|n| n.pid()).collect();
    let calls = || -> u64 { primaries.iter().filter_map(|n| script_calls(n.port)).sum() };
    let whole = CpuProbe::new(Some(proxy.pid()), &[], hz);
    let each: Vec<CpuProbe> = pids
        .iter()
        .map(|&p| CpuProbe::new(None, &[p], hz))
        .collect();
    let granted = || acquire_counters(proxy.port).and_then(|c| c.get(GRANTED).copied());
    let granted_before = granted().unwrap_or(0);
    let calls_before = calls();
    let before = whole.snap();
    let before_each: Vec<_> = each.iter().map(CpuProbe::snap).collect();
    let run = redis_benchmark_keys(proxy.port, depth, settings.cpu_requests, ttl, one_slot)?;
    let after = whole.snap();
    let primary_secs: Vec<f64> = (each.iter().zip(before_each))
        .map(|(probe, b)| probe.seconds(b, probe.snap()).masters)
        .collect();
    let granted = granted().unwrap_or(0).saturating_sub(granted_before);
    let calls_made = calls().saturating_sub(calls_before) as f64;
    if let Some(note) = proxy.health_note() {
        return Err(format!("{}: {note}", masters.label()));
    }
    let per_grant = 1e6 / granted.max(1) as f64;
    let proxy_secs = whole.seconds(before, after).proxy.unwrap_or(0.0);
    Ok(Cell {
        masters,
        depth,
        round,
        rps: run.rps,
        granted,
        proxy_us: proxy_secs * 1e6 / run.requests.max(1) as f64,
        busiest_us: primary_secs.iter().copied().fold(0.0, f64::max) * per_grant,
        mean_us: primary_secs.iter().sum::<f64>() / primary_secs.len().max(1) as f64 * per_grant,
        primaries: primary_secs.len(),
        calls_per_k: calls_made / primaries.len() as f64 * 1e3 / run.requests.max(1) as f64,
        // Each acquire is one lock operation on each of the 3 masters.
        ops_per_call: (3 * granted) as f64 / calls_made.max(1.0),
    })
}

/// Every cell of every round, interleaved; a cell that fails is reported and skipped.
pub fn run(
    settings: &Settings,
    hz: f64,
    prepare: impl Fn(u16),
    mut skip: impl FnMut(String),
    progress: impl Fn(&str),
) -> Vec<Cell> {
    let mut cells = Vec::new();
    for round in 1..=settings.rounds {
        for (depth, masters) in DEPTHS
            .into_iter()
            .flat_map(|d| Masters::ALL.map(|m| (d, m)))
        {
            match run_cell(settings, masters, depth, round, hz, &prepare) {
                Ok(cell) => {
                    progress(&format!(
                        "shards {} -P {depth} round {round}: {} SET/s, {} granted, proxy {:.1} µs/request, busiest primary {:.1} µs/acquire (mean {:.1} over {}), {:.1} script calls per primary per 1,000 requests, {:.1} operations each",
                        masters.label(),
                        fmt_rate(cell.rps),
                        cell.granted,
                        cell.proxy_us,
                        cell.busiest_us,
                        cell.mean_us,
                        cell.primaries,
                        cell.calls_per_k,
                        cell.ops_per_call
                    ));
                    cells.push(cell);
                }
                Err(err) => skip(format!(
                    "shards {} -P {depth} round {round}: {err}",
                    masters.label()
                )),
            }
        }
    }
    cells
}

/// The section: every cell, then the medians and the two ratios against their targets.
pub fn render(md: &mut String, settings: &Settings, cells: &[Cell]) {
    let _ = writeln!(
        md,
        "## 13. Masters that are Redis Clusters: cost per shard (issue 26)\n"
    );
    let _ = writeln!(
        md,
        "redis-benchmark `SET key:__rand_int__ v NX PX {}` at `-c 50`, `-P 1` and `-P 16`, {} measured requests per cell through a fresh proxy over fresh masters: 3 single redis-servers, 3 Redis Clusters of 1 shard, 3 of 3 shards, and 3 of 3 shards with every key of the load in one slot (`lb:rb:{{TAG}}:…`: one busy primary per cluster, the control for what spreading costs) (no replicas; each acquire is one lock operation per master, on the primary of the key's slot, merged with others into one script call per node). CPU is utime + stime from /proc: the proxy's per request, each primary's per granted acquire. Script calls are each primary's `EVALSHA` and `EVAL` calls from `INFO commandstats` (the health monitors' few included); operations per call: the 3 lock operations of each grant over the primaries, per call.\n",
        settings.ttl_ms, settings.cpu_requests
    );
    let _ = writeln!(md, "| masters | -P | round | SET/s | granted | proxy µs/request | busiest primary µs/acquire | mean primary µs/acquire | script calls per primary per 1k requests | operations per call |");
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for c in cells {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} (of {}) | {:.1} | {:.1} |",
            c.masters.label(),
            c.depth,
            c.round,
            fmt_rate(c.rps),
            c.granted,
            c.proxy_us,
            c.busiest_us,
            c.mean_us,
            c.primaries,
            c.calls_per_k,
            c.ops_per_call
        );
    }
    let verdict = |r: Option<f64>, target: f64| match r {
        Some(r) if r <= target => format!("{} (target ≤ {target}×: met)", fmt_ratio(r)),
        Some(r) => format!("{} (target ≤ {target}×: **not met**)", fmt_ratio(r)),
        None => "– (cells missing)".into(),
    };
    let _ = writeln!(md, "\nMedians over the rounds:\n");
    for depth in DEPTHS {
        let med = |masters: Masters, of: fn(&Cell) -> f64| {
            let values: Vec<f64> = (cells.iter())
                .filter(|c| c.masters == masters && c.depth == depth)
                .map(of)
                .collect();
            (!values.is_empty()).then(|| median(values))
        };
        let ratio = |a: Masters, b: Masters, of: fn(&Cell) -> f64| {
            med(a, of)
                .zip(med(b, of))
                .map(|(a, b)| a / b.max(f64::EPSILON))
        };
        let busiest = |c: &Cell| c.busiest_us;
        let proxy = |c: &Cell| c.proxy_us;
        // A cluster's CPU per acquire: its primaries' mean times its 3 of them.
        let cluster = |c: &Cell| c.mean_us * 3.0;
        let _ = writeln!(
            md,
            "- `-P {depth}`: busiest primary's CPU per acquire, 3 shards / 1 shard: {}; the proxy's CPU per request, clusters of 1 shard / single masters: {}, clusters of 3 shards / single masters: {}",
            verdict(ratio(Masters::Clusters(3), Masters::Clusters(1), busiest), 0.4),
            verdict(ratio(Masters::Clusters(1), Masters::Single, proxy), 1.2),
            verdict(ratio(Masters::Clusters(3), Masters::Single, proxy), 1.2),
        );
        let us = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.1} µs"));
        let _ = writeln!(
            md,
            "  - a 3-shard cluster's CPU per acquire (its 3 primaries together), the load spread over its slots: {}; every key in one slot: {}",
            us(med(Masters::Clusters(3), cluster)),
            us(med(Masters::OneSlot, cluster)),
        );
    }
    let _ = writeln!(md);
}
