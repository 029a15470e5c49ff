//! `cpu`: CPU time per request (issue 14). The load is
//! `redis-benchmark -c 50 -P 1 -r 100000000 -n BENCH_CPU_REQUESTS SET k:__rand_int__ v NX PX ttl`
//! against five cells: redis-server directly, then the proxy over 1 and over 5 masters with
//! `--threads 1` (the current-thread runtime) and with `--threads 2` (multi-thread). Every round
//! (`BENCH_ROUNDS`) runs the five cells in that order, so that whatever else the machine does
//! falls on all of them alike, and the ratios are taken within a round.
//!
//! Each cell starts fresh masters (no keys left by an earlier cell, no FLUSHALL under a proxy,
//! which would quarantine the master) and a fresh proxy, runs `BENCH_CPU_WARMUP_REQUESTS`
//! unmeasured requests, then reads utime + stime (/proc/PID/stat) of the proxy, of every master
//! and of the load generator (this process and its reaped children: redis-benchmark) before and
//! after the measured run, and divides by the requests. redis-benchmark does not check replies,
//! so the cell counts the SETs granted itself: through the proxy, the growth of its `INFO stats`
//! `acquires_granted` (and the other `acquires_*` outcomes); direct, the growth of `DBSIZE`
//! (through the proxy each grant also writes a fencing token counter key on the masters).

use crate::external::{acquire_counters, dbsize, redis_benchmark, GRANTED};
use crate::procs::{CpuProbe, CpuUse};
use crate::settings::{Settings, Target};
use redlock_proxy::LocalCluster;
use redlock_testkit::launcher::ProxyProcess;
use redlock_testkit::masters::pids;
use std::collections::BTreeMap;

/// One of the five cells of a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub target: Target,
    /// The proxy's `--threads` (1 for the direct cell).
    pub threads: usize,
}

/// The cells of a round, in the order they run.
pub const VARIANTS: [Variant; 5] = [
    Variant {
        target: Target::Direct,
        threads: 1,
    },
    Variant {
        target: Target::Proxy(1),
        threads: 1,
    },
    Variant {
        target: Target::Proxy(5),
        threads: 1,
    },
    Variant {
        target: Target::Proxy(1),
        threads: 2,
    },
    Variant {
        target: Target::Proxy(5),
        threads: 2,
    },
];

impl Variant {
    pub fn label(self) -> String {
        match self.target {
            Target::Direct => self.target.label(),
            Target::Proxy(_) => format!("{}, --threads {}", self.target.label(), self.threads),
        }
    }

    fn masters(self) -> usize {
        match self.target {
            Target::Direct => 1,
            Target::Proxy(n) => n,
        }
    }

    /// The same proxy with `--threads 1` (itself when it is the direct cell).
    pub fn single_threaded(self) -> Variant {
        Variant { threads: 1, ..self }
    }
}

/// One measured cell.
#[derive(Clone, Debug)]
pub struct CpuCell {
    pub variant: Variant,
    /// 1-based round.
    pub round: usize,
    pub requests: u64,
    /// redis-benchmark's requests per second.
    pub rps: f64,
    /// CPU µs per request: proxy (none for the direct cell), masters summed (the direct cell's
    /// redis-server), load generator (redis-benchmark), everything else on the machine.
    pub per_request: CpuUse,
    /// CPU % of one core used by everything else on the machine during the measured run.
    pub other_pct: f64,
    pub granted: Option<u64>,
    /// Through the proxy: the acquires not granted, by outcome (`contended`, `no_quorum`, …).
    pub not_granted: Vec<(String, u64)>,
    pub note: Option<String>,
}

impl CpuCell {
    pub fn proxy_us(&self) -> Option<f64> {
        self.per_request.proxy
    }

    /// The masters' CPU µs per request (per acquire through the proxy), summed over them.
    pub fn masters_us(&self) -> f64 {
        self.per_request.masters
    }
}

/// Runs one cell; `prepare` waits until a fresh proxy is ready for load.
pub fn run_cell(
    settings: &Settings,
    variant: Variant,
    round: usize,
    hz: f64,
    prepare: impl Fn(u16),
) -> Result<CpuCell, String> {
    let masters = LocalCluster::start(variant.masters()).map_err(|e| e.to_string())?;
    let master_port = masters.masters[0].port;
    let mut proxy = match variant.target {
        Target::Direct => None,
        Target::Proxy(_) => {
            let mut with_threads = settings.clone();
            with_threads
                .proxy_args
                .extend(["--threads".to_string(), variant.threads.to_string()]);
            let proxy = with_threads
                .start_proxy(&masters.addrs())
                .map_err(|e| e.to_string())?;
            prepare(proxy.port);
            Some(proxy)
        }
    };
    let port = proxy.as_ref().map_or(master_port, |p| p.port);
    let ttl = settings.ttl_ms;
    if settings.cpu_warmup_requests > 0 {
        redis_benchmark(port, 1, settings.cpu_warmup_requests, ttl)?;
    }
    let probe = CpuProbe::new(
        proxy.as_ref().map(ProxyProcess::pid),
        &pids(&masters.masters),
        hz,
    );
    let count = || match proxy {
        Some(_) => acquire_counters(port),
        None => dbsize(master_port).map(|keys| BTreeMap::from([(GRANTED.to_string(), keys)])),
    };
    let counted_before = count();
    let before = probe.snap();
    let run = redis_benchmark(port, 1, settings.cpu_requests, ttl)?;
    let after = probe.snap();
    let counted = counted_before.zip(count()).map(|(b, a)| {
        a.into_iter()
            .map(|(name, n)| {
                let grew = n.saturating_sub(b.get(&name).copied().unwrap_or(0));
                (name, grew)
            })
            .collect::<BTreeMap<_, _>>()
    });
    let used = probe.seconds(before, after);
    let wall = run.requests as f64 / run.rps.max(f64::EPSILON);
    Ok(CpuCell {
        variant,
        round,
        requests: run.requests,
        rps: run.rps,
        per_request: used.scaled(1e6 / run.requests.max(1) as f64),
        other_pct: used.other / wall * 100.0,
        granted: counted.as_ref().and_then(|c| c.get(GRANTED).copied()),
        not_granted: counted
            .into_iter()
            .flatten()
            .filter(|(name, n)| name != GRANTED && *n > 0)
            .collect(),
        note: proxy.as_mut().and_then(ProxyProcess::health_note),
    })
}

/// The cell of `variant` in `round`.
pub fn find(cells: &[CpuCell], variant: Variant, round: usize) -> Option<&CpuCell> {
    cells
        .iter()
        .find(|c| c.variant == variant && c.round == round)
}

/// Ratios of a cell to the others of its round.
pub struct Ratios {
    /// Proxy CPU per request / the direct redis-server's CPU per request.
    pub proxy_vs_direct: Option<f64>,
    /// Masters' CPU per acquire (summed) / the direct redis-server's CPU per request.
    pub masters_vs_direct: Option<f64>,
    /// req/s / the same proxy's with `--threads 1` (only for `--threads` > 1).
    pub rps_vs_threads1: Option<f64>,
    /// Proxy CPU per request / the same proxy's with `--threads 1`.
    pub proxy_cpu_vs_threads1: Option<f64>,
}

pub fn ratios(cells: &[CpuCell], cell: &CpuCell) -> Ratios {
    let direct = VARIANTS[0];
    let base = find(cells, direct, cell.round)
        .map(CpuCell::masters_us)
        .filter(|&us| us > 0.0 && cell.variant != direct);
    let single = Some(cell.variant.single_threaded())
        .filter(|v| *v != cell.variant)
        .and_then(|v| find(cells, v, cell.round));
    Ratios {
        proxy_vs_direct: base.zip(cell.proxy_us()).map(|(d, p)| p / d),
        masters_vs_direct: base.map(|d| cell.masters_us() / d),
        rps_vs_threads1: single.map(|s| cell.rps / s.rps),
        proxy_cpu_vs_threads1: single
            .and_then(|s| s.proxy_us().zip(cell.proxy_us()))
            .map(|(s, p)| p / s),
    }
}
