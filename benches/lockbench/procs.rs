//! Processes around the load: CPU time and resident memory from /proc, and the machine
//! description for the report. (The proxy runs as a child process through the test kit's
//! `launcher::ProxyProcess`.)

use crate::settings::Settings;
use crate::stats::Window;
use std::fmt::Write as _;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// The highest VmRSS of a process while it is watched: sampled every 10 ms by a thread of its
/// own (not the load generator's runtime) from [`RssPeak::watch`] to [`RssPeak::stop`].
pub struct RssPeak {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Option<u64>>>,
}

impl RssPeak {
    /// Starts sampling `pid` (nothing to sample without one).
    pub fn watch(pid: Option<u32>) -> RssPeak {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = pid.map(|pid| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut peak = vm_rss_bytes(pid);
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(10));
                    peak = peak.max(vm_rss_bytes(pid));
                }
                peak
            })
        });
        RssPeak { stop, thread }
    }

    /// The highest VmRSS seen, in bytes (`None` if the process could not be read).
    pub fn stop(mut self) -> Option<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take()?.join().ok()?
    }
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

impl CpuUse {
    /// Every figure multiplied by `factor` (seconds → %, seconds → µs per request, …).
    pub fn scaled(self, factor: f64) -> CpuUse {
        CpuUse {
            proxy: self.proxy.map(|p| p * factor),
            masters: self.masters * factor,
            client: self.client * factor,
            other: self.other * factor,
        }
    }
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

    /// CPU use between two snaps as % of one core.
    pub fn between(&self, a: CpuSnap, b: CpuSnap) -> CpuUse {
        let secs = (b.at - a.at).as_secs_f64().max(1e-9);
        self.seconds(a, b).scaled(100.0 / secs)
    }

    /// CPU time used between two snaps, in seconds (not %).
    pub fn seconds(&self, a: CpuSnap, b: CpuSnap) -> CpuUse {
        let secs = |x: u64, y: u64| y.saturating_sub(x) as f64 / self.hz;
        let (proxy, masters, client) = (
            secs(a.proxy, b.proxy),
            secs(a.masters, b.masters),
            secs(a.client, b.client),
        );
        CpuUse {
            proxy: self.proxy.as_ref().map(|_| proxy),
            masters,
            client,
            other: (secs(a.machine, b.machine) - proxy - masters - client).max(0.0),
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
