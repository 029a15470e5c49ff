//! costguard: the cost guard of CI (issue 41). CPU time per request moves with the machine and
//! whatever else runs on it; the number of instructions a process executes per request does
//! not, so callgrind counts them, and this compares the counts with the numbers committed in
//! `benches/cost-baseline.toml`. It fails when a cell grows by more than the baseline's
//! `margin_pct`; with `COST_GUARD_UPDATE=1` it writes what it measured into that file instead.
//! scripts/cost-guard.sh runs it; README.md ("Cost guard") says how to refresh the baseline.
//!
//! Cells, each measured `COST_GUARD_RUNS` times (3), each run on fresh processes:
//! - the proxy (`--threads 1`) under callgrind over 1 and over 5 native masters: instructions
//!   per `SET key value NX PX` on a fresh key, and per compare-and-delete release (`EVALSHA` of
//!   the release the clients send) of those keys, at pipeline depth 1 and 16;
//! - one master under callgrind behind the native proxy: its instructions per granted acquire
//!   (the proxy's lock script as it runs there), and per bare `SET key value NX PX` sent to it
//!   directly, at depth 1 and 16.
//!
//! The load generator is this process (the test kit's RESP client, outside valgrind): its
//! commands are encoded before a window opens and every reply is checked (a grant `OK`, a
//! release `1`), so a cell counts granted work only. Start-up and warm-up cancel out: after
//! [`WARMUP`] cycles a `callgrind_control --dump` zeroes the counters, and each cell is the dump
//! taken right after its [`REQUESTS`] requests. The keys are the same in every run, so each run
//! does the same work; what differs between runs is the time-driven work (timers, health
//! polls) that falls into a window, which only adds instructions: a cell is the least of its
//! runs, and the spread (max / min − 1) of every cell is printed beside it.

use redlock_proxy::LocalCluster;
use redlock_testkit::launcher::{ready_for_load, ProxyProcess};
use redlock_testkit::resp::{blocking_cmd, encode, Client, Reply};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Requests per cell: under callgrind a request costs the proxy about half a millisecond, so
/// 4,000 keep a run of every cell near a minute while start-up is long gone (it is not counted).
const REQUESTS: usize = 4000;
/// Unmeasured lock cycles (acquire and release) at each depth before the first window: the
/// script caches, connection buffers and allocator pools are warm when counting starts.
const WARMUP: usize = 500;
const DEPTHS: [usize; 2] = [1, 16];
/// The masters of the proxy cells.
const MASTER_COUNTS: [usize; 2] = [1, 5];
/// The proxy's largest lock TTL (`max_lock_ttl_ms`): no key expires while a run lasts, so no
/// master spends a window expiring keys.
const TTL_MS: &str = "60000";
/// How long a process under callgrind may take to answer one reply, start or dump: it runs
/// 50–100× slower than natively, and the other CI jobs share the machine.
const SLOW_LIMIT: Duration = Duration::from_secs(60);
/// The proxy's flags in every cell. `--threads 1`: one runtime thread, no work stealing, whose
/// wake-ups would count differently from run to run. The vote timeout is long because a proxy
/// under callgrind reads its masters' replies late (a vote is not lost for it). The health
/// poll (`TIME`, markers, `INFO` of every master, every 100 ms by default) is time-driven work:
/// every 10 s, a window sees at most one.
const HEALTH_CONFIG: &str = "health_interval_ms = 10000\n";
const PROXY_FLAGS: [&str; 4] = ["--threads", "1", "--node-timeout-ms", "5000"];

struct Settings {
    runs: usize,
    update: bool,
    baseline: PathBuf,
    proxy_bin: PathBuf,
    /// Callgrind's output, the proxy's config and wrapper (`target/cost-guard`).
    dir: PathBuf,
}

impl Settings {
    fn from_env() -> Settings {
        let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let target = std::env::var("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| manifest.join("target"));
        Settings {
            runs: std::env::var("COST_GUARD_RUNS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(3usize)
                .max(1),
            update: std::env::var("COST_GUARD_UPDATE").is_ok_and(|v| v == "1"),
            baseline: std::env::var("COST_GUARD_BASELINE")
                .map(PathBuf::from)
                .unwrap_or_else(|_| manifest.join("benches/cost-baseline.toml")),
            proxy_bin: PathBuf::from(env!("CARGO_BIN_EXE_redlock-proxy")),
            dir: target.join("cost-guard"),
        }
    }

    fn proxy_args(&self) -> Vec<String> {
        let mut args = vec![
            "--config".to_string(),
            self.dir.join("proxy.toml").display().to_string(),
        ];
        args.extend(PROXY_FLAGS.iter().map(|f| f.to_string()));
        args
    }
}

/// The committed numbers.
#[derive(Deserialize)]
struct Baseline {
    commit: String,
    machine: String,
    redis_server: String,
    margin_pct: f64,
    cells: BTreeMap<String, BaselineCell>,
}

#[derive(Deserialize)]
struct BaselineCell {
    instructions: u64,
    /// This cell's own margin, where its runs spread wider than the default allows for.
    margin_pct: Option<f64>,
}

impl Baseline {
    /// The margin of cell `name`: its own, or the file's.
    fn margin(&self, name: &str) -> f64 {
        self.cells
            .get(name)
            .and_then(|c| c.margin_pct)
            .unwrap_or(self.margin_pct)
    }
}

/// One cell's runs: instructions per request.
#[derive(Default)]
struct Measured {
    runs: Vec<u64>,
}

impl Measured {
    fn min(&self) -> u64 {
        self.runs.iter().copied().min().unwrap_or(0)
    }

    fn max(&self) -> u64 {
        self.runs.iter().copied().max().unwrap_or(0)
    }

    fn spread_pct(&self) -> f64 {
        (self.max() as f64 / self.min().max(1) as f64 - 1.0) * 100.0
    }
}

/// A process under callgrind whose counters this reads with `callgrind_control --dump`.
struct Counter {
    pid: u32,
    prefix: PathBuf,
    dumps: u32,
}

impl Counter {
    /// The process `pid`, started with `--callgrind-out-file=<prefix>.%p`.
    fn new(pid: u32, prefix: PathBuf) -> Counter {
        Counter {
            pid,
            prefix,
            dumps: 0,
        }
    }

    /// Instructions executed since the previous dump (or since start): callgrind zeroes its
    /// counters after each dump, and writes dump N to `<prefix>.<pid>.N`.
    fn dump(&mut self) -> Result<u64, String> {
        self.dumps += 1;
        let out = Command::new("timeout")
            .arg(SLOW_LIMIT.as_secs().to_string())
            .args(["callgrind_control", "--dump"])
            .arg(self.pid.to_string())
            .output()
            .map_err(|e| format!("callgrind_control: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "callgrind_control --dump {}: {} {}",
                self.pid,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let file = PathBuf::from(format!(
            "{}.{}.{}",
            self.prefix.display(),
            self.pid,
            self.dumps
        ));
        // callgrind_control returns once the dump is requested; the file is complete when its
        // `totals:` line is written.
        let deadline = Instant::now() + SLOW_LIMIT;
        loop {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            if let Some(total) = text
                .lines()
                .find_map(|l| l.strip_prefix("totals:"))
                .and_then(|t| t.split_whitespace().next())
                .and_then(|t| t.parse().ok())
            {
                let _ = std::fs::remove_file(&file);
                return Ok(total);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} has no totals after {SLOW_LIMIT:?}",
                    file.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `valgrind --tool=callgrind <program>` with this output prefix.
fn callgrind(prefix: &Path) -> Vec<String> {
    vec![
        "--tool=callgrind".into(),
        "-q".into(),
        format!("--callgrind-out-file={}.%p", prefix.display()),
    ]
}

/// One redis-server under callgrind, with the flags of the test kit's masters (no
/// persistence, `noeviction`) and `--hz 1`: its cron (expiry sampling, client timeouts) is
/// time-driven work, 10 times a second by default.
struct CountedMaster {
    child: Child,
    port: u16,
}

impl CountedMaster {
    fn start(dir: &Path) -> Result<CountedMaster, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("free port: {e}"))?
            .port();
        let child = Command::new("valgrind")
            .args(callgrind(&dir.join("master")))
            .arg("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--maxmemory-policy", "noeviction", "--hz", "1"])
            .arg("--dir")
            .arg(dir)
            .args(["--dbfilename", &format!("master-{port}.rdb")])
            .args(["--loglevel", "warning"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("valgrind redis-server: {e}"))?;
        let mut master = CountedMaster { child, port };
        let deadline = Instant::now() + SLOW_LIMIT;
        loop {
            if let Ok(Some(status)) = master.child.try_wait() {
                return Err(format!("redis-server under valgrind exited: {status}"));
            }
            if blocking_cmd(port, &[b"PING"], Duration::from_secs(1))
                .is_ok_and(|r| r.text().is_some())
            {
                return Ok(master);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "redis-server under valgrind not up after {SLOW_LIMIT:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for CountedMaster {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `SET key value NX PX` of `n` fresh keys named by `tag`, and the release of each.
struct Locks {
    acquires: Vec<Vec<u8>>,
    releases: Vec<Vec<u8>>,
}

impl Locks {
    fn new(tag: &str, n: usize, release_sha: &str) -> Locks {
        let (acquires, releases) = (0..n)
            .map(|i| {
                let (key, value) = (format!("cg:{tag}:{i}"), format!("tok:{tag}:{i}"));
                let (key, value) = (key.as_bytes(), value.as_bytes());
                (
                    encode(&[b"SET", key, value, b"NX", b"PX", TTL_MS.as_bytes()]),
                    encode(&[b"EVALSHA", release_sha.as_bytes(), b"1", key, value]),
                )
            })
            .unzip();
        Locks { acquires, releases }
    }
}

/// Sends `commands` `depth` at a time (one write each) and checks every reply.
async fn pipelined(
    conn: &mut Client,
    commands: &[Vec<u8>],
    depth: usize,
    expected: fn(&Reply) -> bool,
) -> Result<(), String> {
    for batch in commands.chunks(depth) {
        conn.write(&batch.concat())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let deadline = Instant::now() + SLOW_LIMIT;
        for _ in batch {
            let reply = conn
                .read_reply(deadline)
                .await
                .map_err(|e| format!("read: {e}"))?;
            if !expected(&reply) {
                return Err(format!("unexpected reply {reply:?}"));
            }
        }
    }
    Ok(())
}

fn granted(reply: &Reply) -> bool {
    reply.is_ok()
}

fn released(reply: &Reply) -> bool {
    *reply == Reply::Int(1)
}

/// A cell's name in the baseline and its label in the report.
fn proxy_cell(masters: usize, what: &str, depth: usize) -> (String, String) {
    (
        format!("proxy{masters}_{what}_p{depth}"),
        format!("proxy over {masters}: {what}, -P {depth}"),
    )
}

fn master_cell(what: &str, depth: usize) -> (String, String) {
    let label = match what {
        "lock" => "master: the proxy's acquire",
        _ => "master: bare SET NX PX",
    };
    (
        format!("master_{what}_p{depth}"),
        format!("{label}, -P {depth}"),
    )
}

type Run = Vec<((String, String), u64)>;

/// The proxy under callgrind over `masters` native masters: acquires and releases.
fn proxy_run(s: &Settings, rt: &tokio::runtime::Runtime, masters: usize) -> Result<Run, String> {
    let cluster = LocalCluster::start(masters).map_err(|e| e.to_string())?;
    let proxy = ProxyProcess::start(
        &s.dir.join("callgrind-proxy.sh"),
        &cluster.addrs(),
        &s.proxy_args(),
    )
    .map_err(|e| e.to_string())?;
    let mut counter = Counter::new(proxy.pid(), s.dir.join("proxy"));
    rt.block_on(async {
        let sha = ready_for_load(proxy.port)
            .await
            .map_err(|e| e.to_string())?;
        let mut conn = Client::open(proxy.port, SLOW_LIMIT)
            .await
            .map_err(|e| e.to_string())?;
        for depth in DEPTHS {
            let warm = Locks::new(&format!("warm{depth}"), WARMUP, &sha);
            pipelined(&mut conn, &warm.acquires, depth, granted).await?;
            pipelined(&mut conn, &warm.releases, depth, released).await?;
        }
        counter.dump()?;
        let mut run = Vec::new();
        for depth in DEPTHS {
            let locks = Locks::new(&format!("p{depth}"), REQUESTS, &sha);
            pipelined(&mut conn, &locks.acquires, depth, granted).await?;
            run.push((proxy_cell(masters, "acquire", depth), counter.dump()?));
            pipelined(&mut conn, &locks.releases, depth, released).await?;
            run.push((proxy_cell(masters, "release", depth), counter.dump()?));
        }
        Ok(run)
    })
}

/// One master under callgrind behind the native proxy: its acquires through the proxy, then
/// bare `SET NX PX` sent to it directly.
fn master_run(s: &Settings, rt: &tokio::runtime::Runtime) -> Result<Run, String> {
    let master = CountedMaster::start(&s.dir)?;
    let proxy = ProxyProcess::start(
        &s.proxy_bin,
        &[format!("127.0.0.1:{}", master.port)],
        &s.proxy_args(),
    )
    .map_err(|e| e.to_string())?;
    let mut counter = Counter::new(master.child.id(), s.dir.join("master"));
    rt.block_on(async {
        let sha = ready_for_load(proxy.port)
            .await
            .map_err(|e| e.to_string())?;
        let mut via_proxy = Client::open(proxy.port, SLOW_LIMIT)
            .await
            .map_err(|e| e.to_string())?;
        let mut direct = Client::open(master.port, SLOW_LIMIT)
            .await
            .map_err(|e| e.to_string())?;
        for depth in DEPTHS {
            let warm = Locks::new(&format!("warm{depth}"), WARMUP, &sha);
            pipelined(&mut via_proxy, &warm.acquires, depth, granted).await?;
            pipelined(&mut via_proxy, &warm.releases, depth, released).await?;
            let bare = Locks::new(&format!("warmbare{depth}"), WARMUP, &sha);
            pipelined(&mut direct, &bare.acquires, depth, granted).await?;
        }
        counter.dump()?;
        let mut run = Vec::new();
        for depth in DEPTHS {
            let locks = Locks::new(&format!("p{depth}"), REQUESTS, &sha);
            pipelined(&mut via_proxy, &locks.acquires, depth, granted).await?;
            run.push((master_cell("lock", depth), counter.dump()?));
            let bare = Locks::new(&format!("bare{depth}"), REQUESTS, &sha);
            pipelined(&mut direct, &bare.acquires, depth, granted).await?;
            run.push((master_cell("bare_set", depth), counter.dump()?));
        }
        Ok(run)
    })
}

/// `cmd args…`'s first output line, or `unknown`.
fn first_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unknown".into())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cpu}, {cpus} CPUs")
}

fn commit() -> String {
    let head = first_line("git", &["rev-parse", "--short", "HEAD"]);
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .is_ok_and(|o| !o.stdout.is_empty());
    if dirty {
        format!("{head} (with uncommitted changes)")
    } else {
        head
    }
}

/// The baseline file for `cells` (instructions = the least of the runs), with the margins of
/// `old` (the cells' own kept).
fn baseline_text(cells: &BTreeMap<(String, String), Measured>, old: Option<&Baseline>) -> String {
    let margin_pct = old.map_or(DEFAULT_MARGIN_PCT, |b| b.margin_pct);
    let mut t = String::new();
    let _ = writeln!(
        t,
        "# Instructions per request counted by callgrind (benches/costguard.rs), compared by\n\
         # scripts/cost-guard.sh in CI. Written by `COST_GUARD_UPDATE=1 scripts/cost-guard.sh`;\n\
         # README.md (\"Cost guard\") says when and how to refresh it. `instructions` is the least\n\
         # of the runs, `runs` every run, in order.\n"
    );
    let _ = writeln!(t, "commit = {:?}", commit());
    let _ = writeln!(t, "machine = {:?}", machine());
    let _ = writeln!(
        t,
        "redis_server = {:?}",
        first_line("redis-server", &["--version"])
    );
    let _ = writeln!(t, "valgrind = {:?}", first_line("valgrind", &["--version"]));
    let _ = writeln!(t, "requests_per_cell = {REQUESTS}");
    let _ = writeln!(t, "margin_pct = {margin_pct:?}");
    for ((name, label), m) in cells {
        let _ = writeln!(t, "\n[cells.{name}]  # {label}");
        let _ = writeln!(t, "instructions = {}", m.min());
        if let Some(own) = old
            .and_then(|b| b.cells.get(name))
            .and_then(|c| c.margin_pct)
        {
            let _ = writeln!(t, "margin_pct = {own:?}");
        }
        let _ = writeln!(t, "runs = {:?}", m.runs);
        let _ = writeln!(t, "spread_pct = {:.2}", m.spread_pct());
    }
    t
}

fn progress(line: &str) {
    eprintln!("[costguard] {line}");
}

/// The margin a new baseline gets when there is none: see README.md, "Cost guard".
const DEFAULT_MARGIN_PCT: f64 = 3.0;

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs bench targets without it,
    // and must not start a callgrind run of several minutes.
    if !std::env::args().any(|a| a == "--bench") {
        println!("costguard: skipped (run it with scripts/cost-guard.sh)");
        return;
    }
    let s = Settings::from_env();
    let began = Instant::now();
    if let Err(why) = setup(&s) {
        progress(&format!("cannot start: {why}"));
        std::process::exit(2);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut cells: BTreeMap<(String, String), Measured> = BTreeMap::new();
    for round in 1..=s.runs {
        let runs = MASTER_COUNTS
            .iter()
            .map(|&m| (format!("proxy over {m}"), proxy_run(&s, &rt, m)))
            .chain([("one master".to_string(), master_run(&s, &rt))]);
        for (what, run) in runs {
            match run {
                Ok(run) => {
                    for (cell, per_window) in run {
                        let per_request = (per_window as f64 / REQUESTS as f64).round() as u64;
                        progress(&format!("run {round}: {}: {per_request}", cell.1));
                        cells.entry(cell).or_default().runs.push(per_request);
                    }
                }
                Err(why) => {
                    progress(&format!("run {round}, {what}: {why}"));
                    std::process::exit(2);
                }
            }
        }
    }
    let baseline = std::fs::read_to_string(&s.baseline)
        .map_err(|e| e.to_string())
        .and_then(|t| toml::from_str::<Baseline>(&t).map_err(|e| e.to_string()));
    let (report, grown) = report(&cells, baseline.as_ref().ok());
    println!("{report}");
    progress(&format!("{:.0} s", began.elapsed().as_secs_f64()));
    if s.update {
        let text = baseline_text(&cells, baseline.as_ref().ok());
        std::fs::write(&s.baseline, text).expect("write the baseline");
        progress(&format!("wrote {}", s.baseline.display()));
        return;
    }
    match baseline {
        Err(why) => {
            progress(&format!(
                "no baseline ({}: {why}); write one with COST_GUARD_UPDATE=1",
                s.baseline.display()
            ));
            std::process::exit(1);
        }
        // Instruction counts depend on the CPU (glibc picks its string functions by CPU) and
        // on the redis-server build: a baseline from another machine says nothing here.
        Ok(b)
            if b.machine != machine()
                || b.redis_server != first_line("redis-server", &["--version"]) =>
        {
            progress(&format!(
                "NOT COMPARED: the baseline of {} was measured on {} with {}; here: {} with {}. \
                 Refresh it on this machine type (README, \"Cost guard\") to guard it",
                b.commit,
                b.machine,
                b.redis_server,
                machine(),
                first_line("redis-server", &["--version"])
            ));
        }
        Ok(b) if grown > 0 => {
            progress(&format!(
                "FAIL: {grown} cell(s) cost more than their margin over the baseline of {} \
                 (measured on {}, {}; here: {}, {})",
                b.commit,
                b.machine,
                b.redis_server,
                machine(),
                first_line("redis-server", &["--version"])
            ));
            std::process::exit(1);
        }
        Ok(_) => progress("ok: no cell costs more than the baseline allows"),
    }
}

/// The proxy's config and the script that starts it under callgrind.
fn setup(s: &Settings) -> Result<(), String> {
    std::fs::create_dir_all(&s.dir).map_err(|e| e.to_string())?;
    std::fs::write(s.dir.join("proxy.toml"), HEALTH_CONFIG).map_err(|e| e.to_string())?;
    let wrapper = s.dir.join("callgrind-proxy.sh");
    let script = format!(
        "#!/bin/sh\nexec valgrind {} {} \"$@\"\n",
        callgrind(&s.dir.join("proxy")).join(" "),
        s.proxy_bin.display()
    );
    std::fs::write(&wrapper, script).map_err(|e| e.to_string())?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| e.to_string())
}

/// The markdown table of every cell against the baseline, and how many grew past their margin.
fn report(
    cells: &BTreeMap<(String, String), Measured>,
    baseline: Option<&Baseline>,
) -> (String, usize) {
    let mut t = String::new();
    let mut grown = 0;
    let _ = writeln!(
        t,
        "| cell | instructions per request (least of {} runs) | runs | spread | baseline | change (margin) |\n|---|---|---|---|---|---|",
        cells.values().map(|m| m.runs.len()).max().unwrap_or(0)
    );
    for ((name, label), m) in cells {
        let base = baseline
            .and_then(|b| b.cells.get(name))
            .map(|c| c.instructions);
        let change = match (base, baseline) {
            (Some(base), Some(b)) => {
                let margin = b.margin(name);
                let pct = (m.min() as f64 / base.max(1) as f64 - 1.0) * 100.0;
                let verdict = if pct > margin {
                    grown += 1;
                    " **over the margin**"
                } else if pct < -margin {
                    " (lower: refresh the baseline)"
                } else {
                    ""
                };
                format!("{pct:+.2} % ({margin} %){verdict}")
            }
            _ => {
                grown += 1;
                "not in the baseline".into()
            }
        };
        let _ = writeln!(
            t,
            "| {label} | {} | {} | {:.2} % | {} | {change} |",
            m.min(),
            m.runs
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            m.spread_pct(),
            base.map_or("–".into(), |b| b.to_string()),
        );
    }
    for depth in DEPTHS {
        let lock = cells.get(&master_cell("lock", depth));
        let bare = cells.get(&master_cell("bare_set", depth));
        if let (Some(lock), Some(bare)) = (lock, bare) {
            let _ = writeln!(
                t,
                "\nA master's instructions per granted acquire / per bare `SET NX PX`, -P {depth}: {:.2}",
                lock.min() as f64 / bare.min().max(1) as f64
            );
        }
    }
    (t, grown)
}
