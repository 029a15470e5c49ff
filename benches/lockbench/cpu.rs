//! `cpu`: CPU time per request (issues 14 and 27). The load is
//! `redis-benchmark -c 50 -P depth -r 100000000 -n BENCH_CPU_REQUESTS SET k:__rand_int__ v NX PX ttl`
//! against the cells of [`VARIANTS`]: at `-P 1`, redis-server directly, the proxy over 1 and over
//! 5 masters with `--threads 1` (the current-thread runtime) and with `--threads 2`
//! (multi-thread), and the peer proxies twemproxy and haproxy (TCP mode) over 1 master and
//! twemproxy sharding over 5 (`peers.rs`); at `-P 16`, redis-server, the proxy over 1 and over 5
//! (`--threads 1`) and the same peers. A peer whose binary is missing is left out with a note.
//! Every round (`BENCH_ROUNDS`) runs the cells in that order, so that whatever else the machine
//! does falls on all of them alike, and the ratios are taken within a round.
//!
//! Each cell starts fresh masters (no keys left by an earlier cell, no FLUSHALL under a proxy,
//! which would quarantine the master) and a fresh proxy, runs `BENCH_CPU_WARMUP_REQUESTS`
//! unmeasured requests, then reads utime + stime (/proc/PID/stat) of the proxy, of every master
//! and of the load generator (this process and its reaped children: redis-benchmark) before and
//! after the measured run, and divides by the requests. redis-benchmark does not check replies,
//! so the cell counts the SETs granted itself: through the proxy, the growth of its `INFO stats`
//! `acquires_granted` (and the other `acquires_*` outcomes); direct and through a peer, the growth
//! of `DBSIZE` summed over the masters (through the proxy each grant also writes a fencing token
//! counter key on the masters).

use crate::external::{acquire_counters, dbsize, redis_benchmark, GRANTED};
use crate::peers::{Peer, PeerProcess};
use crate::procs::{CpuProbe, CpuUse};
use crate::settings::{Settings, Target};
use redlock_proxy::LocalCluster;
use redlock_testkit::launcher::ProxyProcess;
use redlock_testkit::masters::pids;
use std::collections::BTreeMap;

/// One of the cells of a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// `Direct` for redis-server alone; `Proxy(n)`: the proxy, or the peer in its place, over
    /// `n` masters.
    pub target: Target,
    /// The proxy's `--threads` (1 for the direct and peer cells).
    pub threads: usize,
    /// redis-benchmark's `-P`.
    pub depth: usize,
    /// A peer proxy (issue 27) in front of the masters instead of redlock-proxy.
    pub peer: Option<Peer>,
}

const fn cell(target: Target, threads: usize, depth: usize, peer: Option<Peer>) -> Variant {
    Variant {
        target,
        threads,
        depth,
        peer,
    }
}

/// The cells of a round, in the order they run: issue 14's five at `-P 1`, the peers at `-P 1`,
/// then redis-server, the proxy over 1 and over 5 and the peers at `-P 16`.
pub const VARIANTS: [Variant; 14] = [
    cell(Target::Direct, 1, 1, None),
    cell(Target::Proxy(1), 1, 1, None),
    cell(Target::Proxy(5), 1, 1, None),
    cell(Target::Proxy(1), 2, 1, None),
    cell(Target::Proxy(5), 2, 1, None),
    cell(Target::Proxy(1), 1, 1, Some(Peer::Twemproxy)),
    cell(Target::Proxy(5), 1, 1, Some(Peer::Twemproxy)),
    cell(Target::Proxy(1), 1, 1, Some(Peer::Haproxy)),
    cell(Target::Direct, 1, 16, None),
    cell(Target::Proxy(1), 1, 16, None),
    cell(Target::Proxy(5), 1, 16, None),
    cell(Target::Proxy(1), 1, 16, Some(Peer::Twemproxy)),
    cell(Target::Proxy(5), 1, 16, Some(Peer::Twemproxy)),
    cell(Target::Proxy(1), 1, 16, Some(Peer::Haproxy)),
];

impl Variant {
    pub fn label(self) -> String {
        match (self.peer, self.target) {
            (Some(peer), _) => format!("{} over {}", peer.label(), self.masters()),
            (None, Target::Direct) => self.target.label(),
            (None, Target::Proxy(_)) => {
                format!("{}, --threads {}", self.target.label(), self.threads)
            }
        }
    }

    fn masters(self) -> usize {
        match self.target {
            Target::Direct => 1,
            Target::Proxy(n) => n,
        }
    }

    /// redis-server alone, no proxy of any kind.
    pub fn is_direct(self) -> bool {
        self.target == Target::Direct && self.peer.is_none()
    }

    /// The same proxy with `--threads 1` (itself when it is the direct cell).
    pub fn single_threaded(self) -> Variant {
        Variant { threads: 1, ..self }
    }

    /// The direct redis-server cell at the same pipeline depth.
    pub fn direct(self) -> Variant {
        cell(Target::Direct, 1, self.depth, None)
    }

    /// The twemproxy cell over as many masters, at the same pipeline depth.
    pub fn twemproxy(self) -> Variant {
        cell(
            Target::Proxy(self.masters()),
            1,
            self.depth,
            Some(Peer::Twemproxy),
        )
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
    let master_ports: Vec<u16> = masters.masters.iter().map(|m| m.port).collect();
    let master_port = master_ports[0];
    let mut proxy = match (variant.target, variant.peer) {
        (Target::Direct, _) | (_, Some(_)) => None,
        (Target::Proxy(_), None) => {
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
    let mut peer = match variant.peer {
        Some(which) => Some(PeerProcess::start(
            which,
            &settings
                .peer_bin(which)
                .ok_or_else(|| format!("{} not found", settings.peer_bin_name(which)))?,
            &master_ports,
        )?),
        None => None,
    };
    let port = proxy
        .as_ref()
        .map(|p| p.port)
        .or(peer.as_ref().map(|p| p.port))
        .unwrap_or(master_port);
    let ttl = settings.ttl_ms;
    if settings.cpu_warmup_requests > 0 {
        redis_benchmark(port, variant.depth, settings.cpu_warmup_requests, ttl)?;
    }
    let probe = CpuProbe::new(
        proxy
            .as_ref()
            .map(ProxyProcess::pid)
            .or(peer.as_ref().map(PeerProcess::pid)),
        &pids(&masters.masters),
        hz,
    );
    let count = || match proxy {
        Some(_) => acquire_counters(port),
        // Direct or through a peer: the keys added on every master (twemproxy shards them).
        None => master_ports
            .iter()
            .map(|&port| dbsize(port))
            .sum::<Option<u64>>()
            .map(|keys| BTreeMap::from([(GRANTED.to_string(), keys)])),
    };
    let counted_before = count();
    let before = probe.snap();
    let run = redis_benchmark(port, variant.depth, settings.cpu_requests, ttl)?;
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
        note: match peer.as_mut() {
            Some(peer) => peer.health_note(),
            None => proxy.as_mut().and_then(ProxyProcess::health_note),
        },
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
    /// Proxy CPU per request (the direct cell: redis-server's own) / twemproxy's CPU per
    /// request at the same depth in the same round.
    pub vs_twemproxy: Option<f64>,
}

pub fn ratios(cells: &[CpuCell], cell: &CpuCell) -> Ratios {
    let direct = cell.variant.direct();
    let base = find(cells, direct, cell.round)
        .map(CpuCell::masters_us)
        .filter(|&us| us > 0.0 && cell.variant != direct);
    let twemproxy = find(cells, cell.variant.twemproxy(), cell.round)
        .and_then(CpuCell::proxy_us)
        .filter(|&us| us > 0.0);
    let own = if cell.variant.is_direct() {
        Some(cell.masters_us())
    } else {
        cell.proxy_us()
    };
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
        vs_twemproxy: twemproxy.zip(own).map(|(t, o)| o / t),
    }
}
