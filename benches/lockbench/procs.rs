//! Processes around the load: the proxy (release binary) as a child process, CPU time and
//! resident memory from /proc, and the machine description for the report.

use crate::resp::io_err;
use crate::settings::Settings;
use crate::stats::Window;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// A proxy process (the release binary) over some masters.
pub struct ProxyProc {
    child: Child,
    pub port: u16,
    /// Lines the proxy logged at WARN or ERROR.
    pub warnings: Arc<AtomicUsize>,
}

impl ProxyProc {
    pub fn start(settings: &Settings, backends: &[String]) -> std::io::Result<ProxyProc> {
        let mut cmd = Command::new(&settings.proxy_bin);
        cmd.args(["--bind", "127.0.0.1", "--port", "0", "--log-format", "json"]);
        for backend in backends {
            cmd.args(["--backend", backend]);
        }
        cmd.args(&settings.proxy_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|err| {
            io_err(format!(
                "cannot start {}: {err} (run `cargo build --release`)",
                settings.proxy_bin.display()
            ))
        })?;
        let warnings = Arc::new(AtomicUsize::new(0));
        let (port_tx, port_rx) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            let (tx, warnings) = (port_tx.clone(), warnings.clone());
            std::thread::spawn(move || drain_proxy_log(out, tx, warnings));
        }
        if let Some(err) = child.stderr.take() {
            let warnings = warnings.clone();
            std::thread::spawn(move || drain_proxy_log(err, port_tx, warnings));
        }
        let port = match port_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(port) => port,
            Err(_) => {
                let _ = child.kill();
                let status = child.wait().ok();
                return Err(io_err(format!(
                    "the proxy did not log its listening address within 10 s (exit: {status:?})"
                )));
            }
        };
        Ok(ProxyProc {
            child,
            port,
            warnings,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A note for the report if the proxy exited or logged at WARN/ERROR so far.
    pub fn health_note(&mut self) -> Option<String> {
        if let Some(status) = self.exited() {
            return Some(format!("PROXY EXITED ({status})"));
        }
        let warnings = self.warnings.load(Ordering::Relaxed);
        (warnings > 0).then(|| format!("{warnings} proxy WARN/ERROR log lines"))
    }

    /// `Some(status)` if the process has exited (it never should during a cell).
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            _ => None,
        }
    }
}

impl Drop for ProxyProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads the proxy's log: sends the port of its "listening on ADDR" line, echoes WARN/ERROR
/// lines (the first 20) to stderr and counts them.
fn drain_proxy_log(pipe: impl Read, port_tx: mpsc::Sender<u16>, warnings: Arc<AtomicUsize>) {
    let mut port_tx = Some(port_tx);
    for line in BufReader::new(pipe).lines() {
        let Ok(line) = line else { break };
        if let Some(tx) = &port_tx {
            if let Some(port) = listening_port(&line) {
                let _ = tx.send(port);
                port_tx = None;
                continue;
            }
        }
        let level_warn = [
            "\"level\":\"WARN\"",
            "\"level\":\"ERROR\"",
            " WARN ",
            " ERROR ",
        ];
        if level_warn.iter().any(|l| line.contains(l)) {
            let seen = warnings.fetch_add(1, Ordering::Relaxed);
            if seen < 20 {
                eprintln!("    [proxy log] {line}");
            }
        }
    }
}

fn listening_port(line: &str) -> Option<u16> {
    let rest = &line[line.find("listening on ")? + "listening on ".len()..];
    let addr: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
        .collect();
    addr.rsplit(':').next()?.parse().ok()
}

pub fn clock_ticks_per_sec() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime + stime of a process plus those of its reaped children (so the load generator's
/// figure includes a node child once it has exited), in clock ticks (`/proc/PID/stat`
/// fields 14 to 17).
fn cpu_ticks(pid: &str) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // The command name may contain spaces: fields are counted after its closing parenthesis.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12) + field(13) + field(14)
}

/// Busy ticks of the whole machine (`/proc/stat`: user, nice, system, irq, softirq, steal).
fn machine_busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return 0;
    };
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    [0, 1, 2, 5, 6, 7]
        .iter()
        .map(|&i| fields.get(i).copied().unwrap_or(0))
        .sum()
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

pub fn vm_rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

pub fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// CPU use (% of one core) of the proxy, the masters and this load generator over a window.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuUse {
    pub proxy: Option<f64>,
    pub masters: f64,
    pub client: f64,
    /// Everything else busy on the machine (other processes, the kernel outside them).
    pub other: f64,
}

/// Samples the CPU time of the proxy, the masters, this process and the whole machine.
pub struct CpuProbe {
    proxy: Option<String>,
    masters: Vec<String>,
    hz: f64,
}

#[derive(Clone, Copy)]
pub struct CpuSnap {
    at: Instant,
    proxy: u64,
    masters: u64,
    client: u64,
    machine: u64,
}

impl CpuProbe {
    pub fn new(proxy: Option<u32>, masters: &[u32], hz: f64) -> CpuProbe {
        CpuProbe {
            proxy: proxy.map(|p| p.to_string()),
            masters: masters.iter().map(u32::to_string).collect(),
            hz,
        }
    }

    pub fn snap(&self) -> CpuSnap {
        CpuSnap {
            at: Instant::now(),
            proxy: self.proxy.as_deref().map_or(0, cpu_ticks),
            masters: self.masters.iter().map(|p| cpu_ticks(p)).sum(),
            client: cpu_ticks("self"),
            machine: machine_busy_ticks(),
        }
    }

    pub fn between(&self, a: CpuSnap, b: CpuSnap) -> CpuUse {
        let secs = (b.at - a.at).as_secs_f64().max(1e-9);
        let pct = |x: u64, y: u64| (y.saturating_sub(x)) as f64 / self.hz / secs * 100.0;
        CpuUse {
            proxy: self.proxy.as_ref().map(|_| pct(a.proxy, b.proxy)),
            masters: pct(a.masters, b.masters),
            client: pct(a.client, b.client),
            other: (pct(a.machine, b.machine)
                - pct(a.proxy, b.proxy)
                - pct(a.masters, b.masters)
                - pct(a.client, b.client))
            .max(0.0),
        }
    }

    /// Samples CPU exactly over `window` (sleeping until its start and end).
    pub async fn over(&self, window: Window) -> CpuUse {
        tokio::time::sleep_until(window.start.into()).await;
        let a = self.snap();
        tokio::time::sleep_until(window.end.into()).await;
        let b = self.snap();
        self.between(a, b)
    }
}

/// Machine and software description for the report header.
pub fn environment(settings: &Settings) -> String {
    let run = |cmd: &str, args: &[&str]| -> String {
        Command::new(cmd)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "unknown".into())
    };
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown".into(), |(_, v)| v.trim().to_string());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or("unknown".into(), |s| s.trim().to_string());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<f64>().ok())
        })
        .map_or("unknown".into(), |kib| {
            format!("{:.1} GiB", kib / 1024.0 / 1024.0)
        });
    let manifest = env!("CARGO_MANIFEST_DIR");
    let commit = run("git", &["-C", manifest, "rev-parse", "--short", "HEAD"]);
    let dirty = if run(
        "git",
        &["-C", manifest, "status", "--porcelain", "--", "src"],
    )
    .is_empty()
    {
        ""
    } else {
        " (src/ has uncommitted changes)"
    };
    let redis = run("redis-server", &["--version"]);
    let node = run("node", &["--version"]);
    let mut out = String::new();
    let _ = writeln!(out, "| | |\n|---|---|");
    let _ = writeln!(out, "| CPUs (nproc) | {} |", run("nproc", &[]));
    let _ = writeln!(out, "| CPU model | {cpu} |");
    let _ = writeln!(out, "| memory | {mem} |");
    let _ = writeln!(out, "| kernel | {kernel} |");
    let _ = writeln!(out, "| redis-server | {redis} |");
    let _ = writeln!(out, "| node | {node} |");
    let _ = writeln!(out, "| commit | {commit}{dirty} |");
    let _ = writeln!(out, "| load average at start | {} |", load_average());
    let _ = writeln!(out, "| proxy binary | {} |", settings.proxy_bin.display());
    if !settings.proxy_args.is_empty() {
        let _ = writeln!(
            out,
            "| extra proxy flags | `{}` |",
            settings.proxy_args.join(" ")
        );
    }
    out
}
