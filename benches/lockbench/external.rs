//! Load from other programs: node `redlock` (benches/node/lockbench.js) and `redis-benchmark`.

use crate::cycles::unique_tag;
use crate::procs::{CpuProbe, CpuUse};
use crate::settings::Settings;
use crate::stats::{CycleResult, Latency};
use redlock_testkit::resp::{blocking_cmd, Reply};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct NodeResult {
    pub scenario: String,
    /// 1-based repetition of the same comparison (`BENCH_ROUNDS`).
    pub round: usize,
    pub workers: usize,
    /// Connections of the load generator (node: ioredis clients, over all ports).
    pub conns: usize,
    pub cycles_per_sec: f64,
    pub latency: Option<Latency>,
    pub fails: u64,
    pub first_error: Option<String>,
    /// CPU % of the load generator over its measured window: node's own
    /// `process.cpuUsage()`, or this process for the raw-RESP load generator.
    pub node_cpu: Option<f64>,
    /// CPU % of the proxy and the masters over the measured window ("client" = this process
    /// alone while node runs; "other" = everything else, node's own CPU taken out).
    pub cpu: CpuUse,
    pub note: Option<String>,
}

pub fn node_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/node")
}

pub fn node_ready() -> Result<(), String> {
    let dir = node_dir();
    for module in ["redlock", "ioredis"] {
        if !dir
            .join("node_modules")
            .join(module)
            .join("package.json")
            .exists()
        {
            return Err(format!(
                "benches/node/node_modules/{module} is missing: run `npm ci` in benches/node (scripts/bench.sh does)"
            ));
        }
    }
    match Command::new("node").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err("node is not installed".into()),
    }
}

impl NodeResult {
    /// The `cycles` cell of the raw-RESP load generator through the proxy, as a row of the
    /// node comparison (its load generator is this process).
    pub fn from_cycles(c: CycleResult) -> NodeResult {
        NodeResult {
            scenario: NODE_RAW.into(),
            round: 1,
            workers: c.conns,
            conns: c.conns,
            cycles_per_sec: c.cycles_per_sec,
            latency: c.latency,
            fails: c.fails + c.errors,
            first_error: c.first_error,
            node_cpu: Some(c.cpu.client),
            cpu: c.cpu,
            note: c.note,
        }
    }

    /// CPU µs per cycle over the measured window: load generator ("client"), proxy, masters
    /// (summed), everything else on the machine.
    pub fn cpu_per_cycle(&self) -> CpuUse {
        CpuUse {
            client: self.node_cpu.unwrap_or(f64::NAN),
            ..self.cpu
        }
        .scaled(1e4 / self.cycles_per_sec.max(f64::EPSILON))
    }

    /// The CPU µs per cycle of the load generator, the proxy and the masters together.
    pub fn total_cpu_per_cycle(&self) -> f64 {
        let per = self.cpu_per_cycle();
        per.client + per.proxy.unwrap_or(0.0) + per.masters
    }
}

/// Busy processes beside the node cells (`BENCH_NODE_HOGS`): each `yes` writing to /dev/null,
/// under `timeout` so that none outlives a harness that dies; stopped (by pid) when dropped.
pub struct Hogs(Vec<std::process::Child>);

/// No hog runs longer than this, whatever happens to the harness.
const HOG_LIMIT_SECS: &str = "900";

impl Hogs {
    pub fn start(n: usize) -> Result<Hogs, String> {
        let mut hogs = Hogs(Vec::new());
        for _ in 0..n {
            let child = Command::new("timeout")
                .args([HOG_LIMIT_SECS, "yes"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|err| format!("cannot start a CPU hog (`timeout yes`): {err}"))?;
            hogs.0.push(child);
        }
        Ok(hogs)
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for child in &mut self.0 {
            // `timeout` passes the signal on to `yes`.
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }
}

/// How long past its own end a node run may take before it is killed.
const NODE_GRACE: Duration = Duration::from_secs(30);

/// Runs benches/node/lockbench.js against `ports` with `conns` ioredis clients per port and
/// parses its JSON line; `probe` samples the proxy's and the masters' CPU over node's measured
/// window (between its "window start" and "window end" lines). With `BENCH_NODE_PROCS` P > 1,
/// P node processes share the workers (and each has its own `conns` clients per port, or one
/// per worker when `conns == workers`); the window runs from the first process's start to the
/// last one's end, cycles, fails and node CPU are summed, p50 is the mean of the processes'
/// weighted by their cycles, p99 and p99.9 the largest of theirs.
pub fn run_node(
    settings: &Settings,
    ports: &[u16],
    workers: usize,
    conns: usize,
    scenario: &str,
    probe: &CpuProbe,
) -> Result<NodeResult, String> {
    let ports_text = ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let procs = settings.node_procs.clamp(1, workers.max(1));
    let (tx, lines) = mpsc::channel();
    let mut children = Vec::new();
    let mut total_conns = 0;
    for i in 0..procs {
        let share = workers / procs + usize::from(i < workers % procs);
        let share_conns = if conns == workers { share } else { conns };
        total_conns += share_conns * ports.len();
        let mut child = Command::new("node")
            .arg(node_dir().join("lockbench.js"))
            .args(["--ports", &ports_text])
            .args(["--workers", &share.to_string()])
            .args(["--conns", &share_conns.to_string()])
            .args(["--secs", &settings.secs.to_string()])
            .args(["--warmup", &settings.warmup.to_string()])
            .args(["--ttl", &settings.ttl_ms.to_string()])
            .args(["--keys", &settings.node_keys])
            .args(["--retries", &settings.node_retries.to_string()])
            .args(["--tag", &unique_tag()])
            .current_dir(node_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|err| format!("cannot run node: {err}"))?;
        if let Some(out) = child.stdout.take() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        let stderr = child.stderr.take().map(|mut err| {
            std::thread::spawn(move || {
                let mut text = String::new();
                let _ = err.read_to_string(&mut text);
                text
            })
        });
        children.push((child, stderr));
    }
    drop(tx);
    let deadline =
        Instant::now() + Duration::from_secs_f64(settings.warmup + settings.secs) + NODE_GRACE;
    let (mut opened, mut window, mut results, mut ended) = (None, None, Vec::new(), 0);
    // One line at a time until every node closes its stdout (it exits) or the deadline passes.
    while let Ok(line) = lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        match line.as_str() {
            "window start" if opened.is_none() => opened = Some(probe.snap()),
            "window end" => {
                ended += 1;
                if ended == procs {
                    window = opened.map(|a| probe.between(a, probe.snap()));
                }
            }
            l if l.starts_with('{') => results.push(line),
            _ => {}
        }
    }
    let mut errors = Vec::new();
    for (mut child, stderr) in children {
        if Instant::now() >= deadline {
            let _ = child.kill();
        }
        let status = child.wait().map_err(|err| format!("node: {err}"))?;
        if !status.success() {
            let err = stderr.and_then(|t| t.join().ok()).unwrap_or_default();
            errors.push(format!("node exited ({status}): {}", err.trim()));
        }
    }
    if results.len() < procs {
        return Err(format!(
            "{} of {procs} node processes printed no result: {}",
            procs - results.len(),
            errors.join("; ")
        ));
    }
    let sum = |name: &str| -> f64 {
        results
            .iter()
            .map(|line| json_number(line, name).unwrap_or(0.0))
            .sum()
    };
    let cycles = sum("cycles");
    let most = |name: &str| -> Option<f64> {
        results
            .iter()
            .map(|line| json_number(line, name))
            .try_fold(f64::NAN, |m, x| x.map(|x| m.max(x)))
    };
    let p50 = if cycles > 0.0 {
        results
            .iter()
            .map(|l| {
                json_number(l, "p50_us").unwrap_or(0.0) * json_number(l, "cycles").unwrap_or(0.0)
            })
            .sum::<f64>()
            / cycles
    } else {
        f64::NAN
    };
    let latency = match (p50.is_finite(), most("p99_us"), most("p999_us")) {
        (true, Some(p99), Some(p999)) => Some(Latency { p50, p99, p999 }),
        _ => None,
    };
    let node_cpu = results
        .iter()
        .map(|line| json_number(line, "cpu_pct"))
        .sum::<Option<f64>>();
    Ok(NodeResult {
        scenario: scenario.into(),
        round: 1,
        workers,
        conns: total_conns,
        cycles_per_sec: sum("cycles_per_sec"),
        latency,
        fails: sum("fails") as u64,
        first_error: results
            .iter()
            .find_map(|line| json_string(line, "first_error")),
        node_cpu,
        // node is not this process: what the probe saw as "other" includes it.
        cpu: window.map_or_else(CpuUse::default, |mut cpu| {
            cpu.other = (cpu.other - node_cpu.unwrap_or(0.0)).max(0.0);
            cpu
        }),
        note: None,
    })
}

/// A number field of a flat JSON object (enough for the node script's one-line output).
pub fn json_number(json: &str, name: &str) -> Option<f64> {
    let pattern = format!("\"{name}\":");
    let rest = &json[json.find(&pattern)? + pattern.len()..];
    let text: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | 'e' | 'E' | '+'))
        .collect();
    text.parse().ok()
}

pub fn json_string(json: &str, name: &str) -> Option<String> {
    let pattern = format!("\"{name}\":\"");
    let rest = &json[json.find(&pattern)? + pattern.len()..];
    let mut out = String::new();
    let mut escaped = false;
    for c in rest.chars() {
        match (escaped, c) {
            (true, c) => {
                out.push(c);
                escaped = false;
            }
            (false, '\\') => escaped = true,
            (false, '"') => return Some(out),
            (false, c) => out.push(c),
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------
// Section 2c: redis-benchmark
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct RbResult {
    pub scenario: String,
    /// 1-based repetition of the same comparison (`BENCH_ROUNDS`).
    pub round: usize,
    pub pipeline: usize,
    pub requests: u64,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// SETs that left a key on the master (redis-benchmark does not check replies).
    pub granted: Option<u64>,
    pub note: Option<String>,
}

pub const RB_CONNS: usize = 50;

pub const NODE_DIRECT: &str = "node redlock, 5 ioredis clients → 5 masters";
pub const NODE_PROXY: &str = "node redlock, 1 ioredis client → proxy over 5";
/// Node redlock over the masters with one ioredis client per worker per master.
pub const NODE_DIRECT_PER_WORKER: &str =
    "node redlock, 1 ioredis client per worker per master → 5 masters";
/// One ioredis client (connection) per worker, as many connections as the raw-RESP cell.
pub const NODE_PROXY_PER_WORKER: &str = "node redlock, 1 ioredis client per worker → proxy over 5";
/// The lock-cycle load generator of `cycles` (one connection per worker, pre-encoded RESP).
pub const NODE_RAW: &str = "raw-RESP load generator (Rust), 1 connection per worker → proxy over 5";

/// `redis-benchmark -c 50 -P depth -n requests -r 1e8 --csv SET lb:rb:TAG:__rand_int__ v NX PX ttl`.
pub fn redis_benchmark(
    port: u16,
    depth: usize,
    requests: u64,
    ttl_ms: u64,
) -> Result<RbResult, String> {
    redis_benchmark_keys(port, depth, requests, ttl_ms, false)
}

/// [`redis_benchmark`], with every key in one hash slot if `one_slot` (`lb:rb:{TAG}:…`: on a
/// Redis Cluster, one primary serves them all).
pub fn redis_benchmark_keys(
    port: u16,
    depth: usize,
    requests: u64,
    ttl_ms: u64,
    one_slot: bool,
) -> Result<RbResult, String> {
    let tag = unique_tag();
    let key = match one_slot {
        true => format!("lb:rb:{{{tag}}}:__rand_int__"),
        false => format!("lb:rb:{tag}:__rand_int__"),
    };
    let output = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &RB_CONNS.to_string()])
        .args(["-n", &requests.to_string()])
        .args(["-P", &depth.to_string()])
        .args(["-r", "100000000", "--csv"])
        // A fresh prefix per run: redis-benchmark's __rand_int__ sequence can repeat between
        // runs started close together, which would turn the real run's first SETs into
        // refusals on the calibration run's keys.
        .args(["SET", &key])
        .args(["v", "NX", "PX", &ttl_ms.to_string()])
        .stdin(Stdio::null())
        .output()
        .map_err(|err| format!("cannot run redis-benchmark: {err}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut lines = stdout.lines().filter(|l| l.starts_with('"'));
    let header = lines.next().ok_or_else(|| {
        format!(
            "redis-benchmark printed nothing ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )
    })?;
    let row = lines
        .next()
        .ok_or_else(|| format!("redis-benchmark printed no result: {stdout}"))?;
    let split = |l: &str| -> Vec<String> {
        l.trim_matches('"')
            .split("\",\"")
            .map(str::to_string)
            .collect()
    };
    let (header, row) = (split(header), split(row));
    let field = |name: &str| -> f64 {
        header
            .iter()
            .position(|h| h == name)
            .and_then(|i| row.get(i))
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    Ok(RbResult {
        scenario: String::new(),
        round: 1,
        pipeline: depth,
        requests,
        rps: field("rps"),
        p50_ms: field("p50_latency_ms"),
        p99_ms: field("p99_latency_ms"),
        granted: None,
        note: None,
    })
}

/// `DBSIZE` of a redis-server (`None` if it does not answer an integer within 30 s).
pub fn dbsize(port: u16) -> Option<u64> {
    match blocking_cmd(port, &[b"DBSIZE"], Duration::from_secs(30)) {
        Ok(Reply::Int(n)) => u64::try_from(n).ok(),
        _ => None,
    }
}

pub const GRANTED: &str = "granted";

/// Script calls a master has run (`INFO commandstats`: `EVALSHA` and `EVAL` together).
pub fn script_calls(port: u16) -> Option<u64> {
    let info = blocking_cmd(port, &[b"INFO", b"commandstats"], Duration::from_secs(30))
        .ok()?
        .text()?;
    let calls = (info.lines())
        .filter_map(|l| {
            let stats =
                (l.strip_prefix("cmdstat_evalsha:")).or_else(|| l.strip_prefix("cmdstat_eval:"))?;
            stats
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    Some(calls)
}

/// The proxy's acquire outcomes (`INFO stats`: `acquires_granted` → `granted`, …).
pub fn acquire_counters(port: u16) -> Option<BTreeMap<String, u64>> {
    let info = blocking_cmd(port, &[b"INFO", b"stats"], Duration::from_secs(30))
        .ok()?
        .text()?;
    let counters: BTreeMap<String, u64> = info
        .lines()
        .filter_map(|l| l.strip_prefix("acquires_")?.trim().split_once(':'))
        .filter_map(|(name, n)| Some((name.to_string(), n.parse().ok()?)))
        .collect();
    counters.contains_key(GRANTED).then_some(counters)
}

/// SETs granted so far: the proxy's `acquires_granted` when `port` is a proxy, else the keys
/// on the master (each grant through the proxy also leaves a fencing token counter key there).
pub fn granted_so_far(port: u16, master_port: u16) -> Option<u64> {
    if port == master_port {
        dbsize(master_port)
    } else {
        acquire_counters(port)?.get(GRANTED).copied()
    }
}

pub fn redis_benchmark_ready() -> Result<(), String> {
    match Command::new("redis-benchmark").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err("not installed (apt-get install redis-tools)".into()),
    }
}

/// One redis-benchmark cell against `port` (master 0 directly, or the proxy over it) for about
/// `settings.secs`: a short calibration run sizes the real one. The SETs granted over the real
/// run: [`granted_so_far`] (directly, the growth of `DBSIZE`: random keys in a space of 10⁸
/// practically never collide). The caller empties master 0 afterwards, once no proxy is
/// attached (a proxy treats a `FLUSHALL` under it as lost data and quarantines the master),
/// and arms it again.
pub fn redis_benchmark_cell(
    settings: &Settings,
    port: u16,
    master_port: u16,
    depth: usize,
) -> Result<RbResult, String> {
    let ttl = settings.ttl_ms;
    let granted = || granted_so_far(port, master_port);
    let probe = redis_benchmark(port, depth, 20_000 * depth as u64, ttl)?;
    let requests = if probe.rps.is_finite() {
        ((probe.rps * settings.secs) as u64).clamp(20_000, 20_000_000)
    } else {
        200_000
    };
    let before = granted();
    let mut result = redis_benchmark(port, depth, requests, ttl)?;
    result.granted = before.zip(granted()).map(|(b, a)| a.saturating_sub(b));
    Ok(result)
}
