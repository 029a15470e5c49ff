//! What to run: the `BENCH_*` environment and the section filters.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `BENCH_ONLY` | `all` | sections, comma-separated (or as arguments after `--`) |
//! | `BENCH_SECS` | `4` | measured seconds per cell |
//! | `BENCH_WARMUP_SECS` | `0.5` | unmeasured seconds before each cell's window |
//! | `BENCH_TARGETS` | `direct,proxy1,proxy3,proxy5` | `cycles` targets (`proxyN`, N ≤ 5) |
//! | `BENCH_CONNS` / `BENCH_DEPTHS` | `1,50,500` / `1,16` | `cycles` connections and pipeline depths |
//! | `BENCH_CLIENTSIDE_CONNS` | `1,50,500` | `clientside` worker counts |
//! | `BENCH_NODE_WORKERS` | `1,50` | `node` worker counts |
//! | `BENCH_NODE_KEYS` | `own` | `node`: each worker's own key, a fresh `random` one per cycle, or `shared:N` keys drawn at random by every worker |
//! | `BENCH_NODE_RETRIES` | `0` | `node`: redlock's `retryCount` (its own 200 ms delay and jitter) |
//! | `BENCH_NODE_DIRECT_PER_WORKER` | `0` | `node`: `1` adds, at the largest worker count, node redlock with one ioredis client per worker per master (5 × W connections) |
//! | `BENCH_NODE_PROCS` | `1` | `node`: node processes sharing the workers (each with its own ioredis clients): the load generator is no longer one thread |
//! | `BENCH_NODE_HOGS` | `0` | `node`: busy processes (`yes > /dev/null`) running beside every node cell, a loaded machine |
//! | `BENCH_ROUNDS` | `3` | repetitions (interleaved) of redis-benchmark `-P 1`, of node at the most workers, of `cpu`'s cells, of `metrics` and of `confirm` |
//! | `BENCH_CLIENT_THREADS` | `1` | tokio worker threads of the load generator |
//! | `BENCH_RELEASE` | `evalsha` | release command of `cycles`: `evalsha` or `eval` |
//! | `BENCH_TTL_MS` | `30000` | lock TTL |
//! | `BENCH_PROXY_BIN` | this build's `redlock-proxy` | proxy binary to measure |
//! | `BENCH_PROXY_ARGS` | none | extra proxy flags, e.g. `--node-timeout-ms 200` |
//! | `BENCH_BASELINE_BIN` | `BENCH_PROXY_BIN` | `metrics`: the proxy of the cells without metrics (e.g. a build without the metrics code) |
//! | `BENCH_CPU_REQUESTS` | `100000` | `cpu`: measured `SET NX PX` requests per cell |
//! | `BENCH_CPU_WARMUP_REQUESTS` | `10000` | `cpu`: unmeasured requests before each cell's measured run |
//! | `BENCH_TWEMPROXY_BIN` / `BENCH_HAPROXY_BIN` | `nutcracker` / `haproxy` | `cpu`: the peer proxies (a name is looked up on `PATH`; missing: their cells are skipped) |
//! | `BENCH_MEM_CONNS` | `10000` | idle connections of `memory` |
//! | `BENCH_HOT_CLIENTS` / `BENCH_HOT_INTERVAL_MS` | `100` / `5` | `contention` pollers and their sleep |
//! | `BENCH_WAKEUP_ROUNDS` / `BENCH_WAKEUP_SECS` | `300` / `60` | `wakeup`: measured rounds (each: every target, both kinds), stopped early after this many seconds |
//! | `BENCH_WAKEUP_WAITERS` / `BENCH_WAKEUP_KEYS` | `1000` / `100` | `wakeup`: idle blocked waiters and their keys |
//! | `BENCH_WAKEUP_IDLE_SECS` | `5` | `wakeup`: idle seconds measured without and with the waiters |
//! | `BENCH_LATENCY_CONNS` | `50` | `latency`: connections of the peaks and of the fixed-rate cells |
//! | `BENCH_LATENCY_SECS` / `BENCH_LATENCY_PEAK_SECS` | `3` / `2` | `latency`: measured seconds of a fixed-rate cell / of a closed-loop peak (each after `BENCH_WARMUP_SECS`) |
//! | `BENCH_LATENCY_DIRECT_FRACTION` | `0.5` | `latency`: the target's offered rate, as a fraction of the direct peak |
//! | `BENCH_LATENCY_FRACTIONS` | `0.25,0.5,0.75` | `latency`: more offered rates, as fractions of the proxy-over-5 peak |
//! | `BENCH_MASTERS_OPS` | `200000` | `masters`: measured lock operations per CPU cell |
//! | `BENCH_MASTERS_LOCKS` | `100000,200000,400000` | `masters`: held-lock counts of the memory cells |
//! | `BENCH_MASTERS_PERF` | `1` | `masters`: `0` skips the `perf record` summary of the master |
//! | `BENCH_OVERLOAD_SECS` | `8` | `overload`: measured seconds of every cell (after `BENCH_WARMUP_SECS`) |
//! | `BENCH_OVERLOAD_CONNS` | `50` | `overload`: connections of the peaks and of the open-loop cells |
//! | `BENCH_OVERLOAD_MASTERS` / `BENCH_OVERLOAD_DEPTHS` | `3,5` / `1,16` | `overload`: the configurations (the proxy's masters, requests per write) |
//! | `BENCH_OVERLOAD_FRACTIONS` | `0.25,0.5,1,1.5,2` | `overload`: offered rates, as fractions of each configuration's peak |
//! | `BENCH_OVERLOAD_BOUND_SECS` | `2` | `overload`: a reply later than this after its scheduled time counts as not answered |
//! | `BENCH_OVERLOAD_BIG_CONNS` / `BENCH_OVERLOAD_BIG_FRACTION` | `20` / `0.25` | `overload`: the big-value case's small clients and their rate (fraction of the proxy-over-5 `-P 1` peak) |
//! | `BENCH_OVERLOAD_BIG_MB` / `BENCH_OVERLOAD_BIG_EVERY_SECS` | `10` / `1` | `overload`: the big value's size, and how often it is sent |
//! | `BENCH_OUT` | `target/bench-results.md` | where the report is written |

use crate::peers::Peer;
use crate::stats::Window;
use redlock_testkit::launcher::ProxyProcess;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Every section, in the order they run.
pub const SECTIONS: [&str; 15] = [
    "cycles",
    "clientside",
    "node",
    "redis-benchmark",
    "cpu",
    "memory",
    "contention",
    "fencing",
    "metrics",
    "wakeup",
    "latency",
    "masters",
    "confirm",
    "shards",
    "overload",
];

/// Sections that run only when named: not part of `all` (`overload` alone takes about 10
/// minutes).
pub const NOT_IN_ALL: [&str; 1] = ["overload"];

/// Which server a load runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// One redis-server, no proxy.
    Direct,
    /// The proxy over this many masters.
    Proxy(usize),
}

impl Target {
    pub fn parse(text: &str) -> Option<Target> {
        match text {
            "direct" => Some(Target::Direct),
            _ => text
                .strip_prefix("proxy")
                .and_then(|n| n.parse().ok())
                .filter(|n| (1..=5).contains(n))
                .map(Target::Proxy),
        }
    }

    pub fn label(self) -> String {
        match self {
            Target::Direct => "direct redis-server".into(),
            Target::Proxy(n) => format!("proxy over {n}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseKind {
    Evalsha,
    Eval,
}

#[derive(Clone, Debug)]
pub struct Settings {
    pub sections: Vec<String>,
    pub secs: f64,
    pub warmup: f64,
    pub targets: Vec<Target>,
    pub conns: Vec<usize>,
    pub depths: Vec<usize>,
    pub clientside_conns: Vec<usize>,
    pub node_workers: Vec<usize>,
    /// `node`: `own`, `random` or `shared:N` (lockbench.js `--keys`).
    pub node_keys: String,
    /// `node`: redlock's `retryCount`.
    pub node_retries: u32,
    /// `node`: also node redlock with one ioredis client per worker per master.
    pub node_direct_per_worker: bool,
    /// `node`: node processes sharing the workers.
    pub node_procs: usize,
    /// `node`: CPU hogs beside the node cells.
    pub node_hogs: usize,
    pub client_threads: usize,
    /// Repetitions of the two target comparisons (redis-benchmark -P 1, node at most workers).
    pub rounds: usize,
    pub release: ReleaseKind,
    pub ttl_ms: u64,
    pub proxy_bin: PathBuf,
    pub proxy_args: Vec<String>,
    /// The proxy of `metrics`' cells without metrics.
    pub baseline_bin: Option<PathBuf>,
    /// `cpu`: measured requests per cell, and unmeasured ones before them.
    pub cpu_requests: u64,
    pub cpu_warmup_requests: u64,
    /// `cpu`: the peer proxies' binaries (names looked up on `PATH`, or paths).
    pub twemproxy_bin: String,
    pub haproxy_bin: String,
    pub mem_conns: usize,
    pub hot_clients: usize,
    pub hot_interval_ms: u64,
    /// `wakeup`: measured rounds, and the seconds after which no round starts.
    pub wakeup_rounds: usize,
    pub wakeup_secs: f64,
    /// `wakeup`: idle blocked waiters, their keys, the idle seconds measured.
    pub wakeup_waiters: usize,
    pub wakeup_keys: usize,
    pub wakeup_idle_secs: f64,
    /// `latency`: connections, measured seconds of a fixed-rate cell and of a peak, the
    /// target's fraction of the direct peak, fractions of the proxy's peak.
    pub latency_conns: usize,
    pub latency_secs: f64,
    pub latency_peak_secs: f64,
    pub latency_direct_fraction: f64,
    pub latency_fractions: Vec<f64>,
    /// `masters`: lock operations per CPU cell, held-lock counts, the perf summary on/off.
    pub masters_ops: u64,
    pub masters_locks: Vec<u64>,
    pub masters_perf: bool,
    /// `overload`: measured seconds per cell, connections, the configurations (masters,
    /// depths), the offered fractions of each peak, the bound on a reply's lateness; the
    /// big-value case's small clients, their fraction of the proxy-over-5 peak, the big value's
    /// size in MB and its period.
    pub overload_secs: f64,
    pub overload_conns: usize,
    pub overload_masters: Vec<usize>,
    pub overload_depths: Vec<usize>,
    pub overload_fractions: Vec<f64>,
    pub overload_bound_secs: f64,
    pub overload_big_conns: usize,
    pub overload_big_fraction: f64,
    pub overload_big_mb: f64,
    pub overload_big_every_secs: f64,
    pub out: PathBuf,
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| default.to_string())
}

fn env_num<T: std::str::FromStr>(name: &str, default: &str) -> T {
    let text = env_or(name, default);
    text.trim()
        .parse()
        .unwrap_or_else(|_| fail(&format!("{name}={text:?} is not a number")))
}

fn env_list<T>(name: &str, default: &str, parse: impl Fn(&str) -> Option<T>) -> Vec<T> {
    let text = env_or(name, default);
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| parse(s).unwrap_or_else(|| fail(&format!("{name}: cannot parse {s:?}"))))
        .collect()
}

fn positive(text: &str) -> Option<usize> {
    text.parse().ok().filter(|n| *n > 0)
}

pub fn fail(message: &str) -> ! {
    eprintln!("lockbench: {message}");
    std::process::exit(2);
}

impl Settings {
    /// Reads the `BENCH_*` environment and the command-line section filters.
    pub fn from_env() -> Settings {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        // `cargo bench` passes `--bench`; other non-flag arguments select sections.
        let args: Vec<String> = std::env::args()
            .skip(1)
            .filter(|a| !a.starts_with("--"))
            .collect();
        let only = if args.is_empty() {
            env_or("BENCH_ONLY", "all")
        } else {
            args.join(",")
        };
        let mut sections = Vec::new();
        for name in only.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let name = match name {
                "rb" | "redis-bench" | "redisbench" => "redis-benchmark",
                "mem" => "memory",
                "hot" => "contention",
                "rust-redlock" | "client" => "clientside",
                "wake" | "wakeups" => "wakeup",
                "lat" | "open-loop" => "latency",
                "overload-table" | "issue38" => "overload",
                other => other,
            };
            if name == "all" {
                sections.extend(
                    SECTIONS
                        .iter()
                        .filter(|s| !NOT_IN_ALL.contains(s))
                        .map(|s| s.to_string()),
                );
            } else if SECTIONS.contains(&name) {
                sections.push(name.to_string());
            } else {
                fail(&format!(
                    "unknown section {name:?}; known: all, {}",
                    SECTIONS.join(", ")
                ));
            }
        }
        sections.dedup();
        let target_dir = std::env::var("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| manifest.join("target"));
        let secs: f64 = env_num("BENCH_SECS", "4");
        if secs.is_nan() || secs <= 0.0 {
            fail("BENCH_SECS must be positive");
        }
        Settings {
            sections,
            secs,
            warmup: env_num("BENCH_WARMUP_SECS", "0.5"),
            targets: env_list(
                "BENCH_TARGETS",
                "direct,proxy1,proxy3,proxy5",
                Target::parse,
            ),
            conns: env_list("BENCH_CONNS", "1,50,500", positive),
            depths: env_list("BENCH_DEPTHS", "1,16", positive),
            clientside_conns: env_list("BENCH_CLIENTSIDE_CONNS", "1,50,500", positive),
            node_workers: env_list("BENCH_NODE_WORKERS", "1,50", positive),
            node_keys: {
                let keys = env_or("BENCH_NODE_KEYS", "own");
                let shared = keys
                    .strip_prefix("shared:")
                    .is_some_and(|n| positive(n).is_some());
                if keys != "own" && keys != "random" && !shared {
                    fail(&format!(
                        "BENCH_NODE_KEYS={keys:?}: use own, random or shared:N"
                    ));
                }
                keys
            },
            node_retries: env_num("BENCH_NODE_RETRIES", "0"),
            node_direct_per_worker: env_num::<u8>("BENCH_NODE_DIRECT_PER_WORKER", "0") != 0,
            node_procs: env_num::<usize>("BENCH_NODE_PROCS", "1").max(1),
            node_hogs: env_num("BENCH_NODE_HOGS", "0"),
            client_threads: env_num("BENCH_CLIENT_THREADS", "1"),
            rounds: env_num::<usize>("BENCH_ROUNDS", "3").max(1),
            release: match env_or("BENCH_RELEASE", "evalsha").as_str() {
                "evalsha" => ReleaseKind::Evalsha,
                "eval" => ReleaseKind::Eval,
                other => fail(&format!("BENCH_RELEASE={other:?}: use evalsha or eval")),
            },
            ttl_ms: env_num("BENCH_TTL_MS", "30000"),
            proxy_bin: std::env::var("BENCH_PROXY_BIN")
                .map(PathBuf::from)
                .unwrap_or_else(|_| PathBuf::from(env!("CARGO_BIN_EXE_redlock-proxy"))),
            proxy_args: env_or("BENCH_PROXY_ARGS", "")
                .split_whitespace()
                .map(str::to_string)
                .collect(),
            baseline_bin: std::env::var("BENCH_BASELINE_BIN").ok().map(PathBuf::from),
            cpu_requests: env_num::<u64>("BENCH_CPU_REQUESTS", "100000").max(1),
            cpu_warmup_requests: env_num("BENCH_CPU_WARMUP_REQUESTS", "10000"),
            twemproxy_bin: env_or("BENCH_TWEMPROXY_BIN", "nutcracker"),
            haproxy_bin: env_or("BENCH_HAPROXY_BIN", "haproxy"),
            mem_conns: env_num("BENCH_MEM_CONNS", "10000"),
            hot_clients: env_num("BENCH_HOT_CLIENTS", "100"),
            hot_interval_ms: env_num("BENCH_HOT_INTERVAL_MS", "5"),
            wakeup_rounds: env_num::<usize>("BENCH_WAKEUP_ROUNDS", "300").max(1),
            wakeup_secs: env_num("BENCH_WAKEUP_SECS", "60"),
            wakeup_waiters: env_num("BENCH_WAKEUP_WAITERS", "1000"),
            wakeup_keys: env_num::<usize>("BENCH_WAKEUP_KEYS", "100").max(1),
            wakeup_idle_secs: env_num("BENCH_WAKEUP_IDLE_SECS", "5"),
            latency_conns: env_num::<usize>("BENCH_LATENCY_CONNS", "50").max(1),
            latency_secs: env_num::<f64>("BENCH_LATENCY_SECS", "3").max(0.1),
            latency_peak_secs: env_num::<f64>("BENCH_LATENCY_PEAK_SECS", "2").max(0.1),
            latency_direct_fraction: env_num("BENCH_LATENCY_DIRECT_FRACTION", "0.5"),
            latency_fractions: env_list("BENCH_LATENCY_FRACTIONS", "0.25,0.5,0.75", |f| {
                f.parse().ok().filter(|f: &f64| *f > 0.0)
            }),
            masters_ops: env_num::<u64>("BENCH_MASTERS_OPS", "200000").max(16),
            masters_locks: env_list("BENCH_MASTERS_LOCKS", "100000,200000,400000", |s| {
                s.parse().ok().filter(|n: &u64| *n > 0)
            }),
            masters_perf: env_or("BENCH_MASTERS_PERF", "1") != "0",
            overload_secs: env_num::<f64>("BENCH_OVERLOAD_SECS", "8").max(0.1),
            overload_conns: env_num::<usize>("BENCH_OVERLOAD_CONNS", "50").max(1),
            overload_masters: env_list("BENCH_OVERLOAD_MASTERS", "3,5", positive),
            overload_depths: env_list("BENCH_OVERLOAD_DEPTHS", "1,16", positive),
            overload_fractions: env_list("BENCH_OVERLOAD_FRACTIONS", "0.25,0.5,1,1.5,2", |f| {
                f.parse().ok().filter(|f: &f64| *f > 0.0)
            }),
            overload_bound_secs: env_num::<f64>("BENCH_OVERLOAD_BOUND_SECS", "2").max(0.01),
            overload_big_conns: env_num::<usize>("BENCH_OVERLOAD_BIG_CONNS", "20").max(1),
            overload_big_fraction: env_num::<f64>("BENCH_OVERLOAD_BIG_FRACTION", "0.25").max(0.0),
            overload_big_mb: env_num::<f64>("BENCH_OVERLOAD_BIG_MB", "10").max(0.0),
            overload_big_every_secs: env_num::<f64>("BENCH_OVERLOAD_BIG_EVERY_SECS", "1").max(0.01),
            out: std::env::var("BENCH_OUT")
                .map(PathBuf::from)
                .unwrap_or_else(|_| target_dir.join("bench-results.md")),
        }
    }

    /// A fresh proxy process (`BENCH_PROXY_BIN` with `BENCH_PROXY_ARGS`) over `backends`.
    pub fn start_proxy(&self, backends: &[String]) -> std::io::Result<ProxyProcess> {
        ProxyProcess::start(&self.proxy_bin, backends, &self.proxy_args)
    }

    /// The binary a peer proxy is started from, as configured.
    pub fn peer_bin_name(&self, peer: Peer) -> &str {
        match peer {
            Peer::Twemproxy => &self.twemproxy_bin,
            Peer::Haproxy => &self.haproxy_bin,
        }
    }

    /// The peer proxy's binary, if it exists.
    pub fn peer_bin(&self, peer: Peer) -> Option<PathBuf> {
        crate::peers::resolve(self.peer_bin_name(peer))
    }

    pub fn wants(&self, section: &str) -> bool {
        self.sections.iter().any(|s| s == section)
    }

    pub fn window(&self) -> Window {
        let start = Instant::now() + Duration::from_secs_f64(self.warmup);
        Window {
            start,
            end: start + Duration::from_secs_f64(self.secs),
        }
    }
}
