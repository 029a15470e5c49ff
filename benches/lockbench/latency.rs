//! `latency`: the latency of an acquire at a fixed offered rate (issue 27, target 4: p99 through
//! the proxy over 5 masters ≤ 2× the p99 of a direct `SET NX PX` on one redis-server at the same
//! offered load, 50 % of the direct peak).
//!
//! 1. **Peaks** (closed loop): `BENCH_LATENCY_CONNS` connections each send `SET lb:lat:TAG:…
//!    v NX PX ttl` (a fresh key per request) and wait for its reply, for
//!    `BENCH_LATENCY_PEAK_SECS` after the warm-up: to one fresh redis-server directly, then to a
//!    fresh proxy over 5 fresh masters. The completed requests per second are the peaks.
//! 2. **Fixed offered rates** (open loop): request *i* is scheduled at `t0 + i / rate` and goes
//!    out on connection `i mod conns`, whether or not earlier requests were answered; its
//!    latency is its reply's arrival minus its *scheduled* time, so a stall of the server (or of
//!    the load generator) is counted in full by every request that should have been sent during
//!    it (no coordinated omission). A request scheduled in the measured window that is never
//!    sent (its connection's socket stayed full until the window ended) or never answered
//!    (within [`DRAIN`] after the window) counts as infinitely late. The points: 50 % of the
//!    direct peak (the target), then `BENCH_LATENCY_FRACTIONS` (25, 50, 75 %) of the proxy's
//!    peak; at each point a fresh redis-server directly, then a fresh proxy over 5 fresh
//!    masters, every round (`BENCH_ROUNDS`) running all points in turn.
//!
//! The load (the sender thread, the readers, the fresh processes of a cell) is `openloop.rs`'s,
//! shared with `overload`. The sender's lateness (actual write − scheduled time) is reported, so
//! the load generator's own share of a latency is visible. Every key is fresh, so every acquire
//! should be granted: grants, nulls and errors are counted. CPU (/proc) of the proxy, the
//! masters, this process and everything else is sampled over the measured window.

use crate::openloop::{self, Load, Plan, Site, DRAIN, NEVER};
use crate::procs::CpuUse;
use crate::report::{cell, fmt_rate, fmt_ratio, noisy_mark, Verdict};
use crate::settings::{Settings, Target};
use crate::stats::{median, percentiles, Latency};
use std::fmt::Write as _;

/// The proxy's masters.
const MASTERS: usize = 5;

/// A closed-loop peak.
#[derive(Clone, Debug)]
pub struct Peak {
    pub target: Target,
    pub rate: f64,
    pub latency: Option<Latency>,
    pub granted: u64,
    pub nulls: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub cpu: CpuUse,
    pub note: Option<String>,
}

/// One offered rate.
#[derive(Clone, Debug)]
pub struct Point {
    pub label: String,
    pub rate: f64,
    /// The target's point (50 % of the direct peak).
    pub target: bool,
}

/// One open-loop cell.
#[derive(Clone, Debug)]
pub struct OpenCell {
    pub target: Target,
    pub round: usize,
    pub point: usize,
    pub offered: f64,
    /// Requests scheduled inside the measured window.
    pub scheduled: u64,
    /// Replies that arrived inside the measured window, per second (any request's).
    pub completed_per_sec: f64,
    pub granted: u64,
    pub nulls: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Scheduled in the window and never sent / sent and never answered.
    pub unsent: u64,
    pub unanswered: u64,
    /// From the scheduled time, µs (infinite for the unsent and unanswered).
    pub latency: Option<Latency>,
    pub max_us: f64,
    /// The sender's lateness (write − scheduled time), µs.
    pub send_lag: Option<Latency>,
    pub cpu: CpuUse,
    pub note: Option<String>,
}

impl OpenCell {
    /// Answered all it was offered: every request of the window answered, and replies came at
    /// 95 % of the offered rate or more.
    pub fn kept_up(&self) -> bool {
        self.unsent == 0 && self.unanswered == 0 && self.completed_per_sec >= 0.95 * self.offered
    }
}

#[derive(Default)]
pub struct LatencyRun {
    pub conns: usize,
    pub secs: f64,
    pub peaks: Vec<Peak>,
    pub points: Vec<Point>,
    pub cells: Vec<OpenCell>,
    pub failures: Vec<String>,
}

impl LatencyRun {
    pub fn peak(&self, target: Target) -> Option<&Peak> {
        self.peaks.iter().find(|p| p.target == target)
    }

    pub fn find(&self, target: Target, round: usize, point: usize) -> Option<&OpenCell> {
        self.cells
            .iter()
            .find(|c| c.target == target && c.round == round && c.point == point)
    }

    /// p99 through the proxy / p99 direct at `point`, per round.
    pub fn p99_ratios(&self, point: usize) -> Vec<f64> {
        self.cells
            .iter()
            .filter(|c| c.target == Target::Direct && c.point == point)
            .filter_map(|d| {
                let p = self.find(Target::Proxy(MASTERS), d.round, point)?;
                Some(p.latency?.p99 / d.latency?.p99)
            })
            .collect()
    }
}

/// The load of this section: `BENCH_LATENCY_CONNS` connections, one request per write, the
/// lock TTL of `BENCH_TTL_MS`, replies waited for [`DRAIN`] after the window.
fn load(settings: &Settings, secs: f64) -> Load {
    Load {
        prefix: "lb:lat",
        conns: settings.latency_conns,
        depth: 1,
        ttl_ms: settings.ttl_ms,
        warmup: settings.warmup,
        secs,
        bound: None,
    }
}

/// The closed-loop peak of `target` (see the module header).
pub async fn peak(settings: &Settings, target: Target, hz: f64) -> Result<Peak, String> {
    let mut site = Site::open(settings, target.into(), hz).await?;
    let load = load(settings, settings.latency_peak_secs);
    let run = openloop::closed_loop(site.port, &site.probe, &load).await?;
    let counts = run.counts;
    Ok(Peak {
        target,
        rate: counts.completed as f64 / run.window.secs(),
        latency: percentiles(&counts.samples),
        granted: counts.granted,
        nulls: counts.nulls,
        errors: counts.errors,
        first_error: counts.first_error,
        cpu: run.cpu,
        note: site.note(),
    })
}

/// One open-loop cell: `rate` requests per second at `target` (see the module header).
pub async fn open_loop(
    settings: &Settings,
    target: Target,
    rate: f64,
    round: usize,
    point: usize,
    hz: f64,
) -> Result<OpenCell, String> {
    let mut site = Site::open(settings, target.into(), hz).await?;
    let load = load(settings, settings.latency_secs);
    let run = openloop::open_loop(site.port, &site.probe, &load, rate, Plan::new(&load)).await?;
    let scheduled = run.scheduled();
    let (unsent, unanswered) = (run.unsent, run.unanswered);
    let mut counts = run.counts;
    counts
        .samples
        .extend(std::iter::repeat_n(NEVER, (unanswered + unsent) as usize));
    Ok(OpenCell {
        target,
        round,
        point,
        offered: rate,
        scheduled,
        completed_per_sec: counts.completed as f64 / run.window.secs(),
        granted: counts.granted,
        nulls: counts.nulls,
        errors: counts.errors,
        first_error: counts.first_error,
        unsent,
        unanswered,
        latency: percentiles(&counts.samples),
        max_us: counts
            .samples
            .last()
            .map_or(f64::NAN, |&ns| ns as f64 / 1000.0),
        send_lag: percentiles(&run.lags),
        cpu: run.cpu,
        note: site.note(),
    })
}

/// Milliseconds, or "∞" for a request never answered.
pub fn fmt_ms(us: f64) -> String {
    if us >= NEVER as f64 / 1000.0 / 2.0 {
        "∞".into()
    } else {
        crate::report::fmt_us(us)
    }
}

/// A ratio of latencies, "∞" when the numerator was a request never answered.
fn fmt_vs(x: f64) -> String {
    if x.is_finite() && x < 1e9 {
        fmt_ratio(x)
    } else if x.is_nan() {
        "–".into()
    } else {
        "∞".into()
    }
}

fn fmt_lats(l: Option<Latency>) -> (String, String, String) {
    match l {
        Some(l) => (fmt_ms(l.p50), fmt_ms(l.p99), fmt_ms(l.p999)),
        None => ("–".into(), "–".into(), "–".into()),
    }
}

fn label(target: Target) -> String {
    match target {
        Target::Direct => "direct redis-server".into(),
        Target::Proxy(n) => format!("proxy over {n}"),
    }
}

/// Issue 27, target 4: at the target point, the median per-round ratio of p99s ≤ 2.
pub fn verdict(run: Option<&LatencyRun>) -> Verdict {
    const TARGET: &str = "p99 of an acquire through the proxy over 5 masters ≤ 2× the p99 of a direct SET NX PX on one redis-server at the same offered rate, 50 % of the direct peak (issue 27)";
    let Some(run) = run else {
        return Verdict {
            target: TARGET,
            measured: "latency section not run".into(),
            met: None,
        };
    };
    let Some(point) = run.points.iter().position(|p| p.target) else {
        return Verdict {
            target: TARGET,
            measured: format!("no direct peak ({})", run.failures.join("; ")),
            met: None,
        };
    };
    let ratios = run.p99_ratios(point);
    let ratio = median(ratios.clone());
    let kept = run
        .cells
        .iter()
        .filter(|c| c.point == point && c.target == Target::Proxy(MASTERS))
        .filter(|c| c.kept_up())
        .count();
    let proxied = run
        .cells
        .iter()
        .filter(|c| c.point == point && c.target == Target::Proxy(MASTERS))
        .count();
    let mut measured = format!(
        "at {} req/s ({}, {}): p99 proxy / direct per round {} → median **{}**; the proxy kept up with the offered rate in {kept} of {proxied} rounds",
        fmt_rate(run.points[point].rate),
        run.points[point].label,
        run.peak(Target::Direct).map_or("–".into(), |p| fmt_rate(p.rate)),
        ratios.iter().map(|r| fmt_vs(*r)).collect::<Vec<_>>().join(", "),
        fmt_vs(ratio),
    );
    let others: Vec<String> = run
        .points
        .iter()
        .enumerate()
        .filter(|(_, p)| !p.target)
        .map(|(i, p)| {
            format!(
                "{} ({} req/s): {}",
                p.label,
                fmt_rate(p.rate),
                fmt_vs(median(run.p99_ratios(i)))
            )
        })
        .collect();
    if !others.is_empty() {
        let _ = write!(measured, "; at the proxy's own load: {}", others.join(", "));
    }
    Verdict {
        target: TARGET,
        measured,
        met: ratio.is_finite().then_some(ratio <= 2.0 && kept == proxied),
    }
}

/// The report's section.
pub fn render(md: &mut String, settings: &Settings, run: &LatencyRun) {
    let _ = writeln!(
        md,
        "## 10. Latency at a fixed offered rate: direct vs the proxy over 5 masters (issue 27)\n"
    );
    let _ = writeln!(
        md,
        "`SET lb:lat:TAG:<id> v NX PX {}`, a fresh key per request, {} connections. Peaks: closed loop (each connection waits for its reply), {} s after {} s warm-up, a fresh redis-server and a fresh proxy over 5 fresh masters. Then open loop: request i scheduled at t0 + i / rate on connection i mod {}, sent whether or not earlier ones were answered; latency = reply arrival − *scheduled* time (no coordinated omission; never sent or never answered within {} s = ∞); {} s measured after {} s warm-up; each of {} round(s) runs every point, direct then proxy, each cell on fresh processes. Completed/s = replies arriving in the window. Kept up = every request answered and completions ≥ 95 % of the offered rate. Send lag = the load generator's own lateness (write − scheduled). CPU % of one core: proxy / masters / load generator (this process) / everything else (2 cores = 200 %).\n",
        settings.ttl_ms,
        run.conns,
        settings.latency_peak_secs,
        settings.warmup,
        run.conns,
        DRAIN.as_secs(),
        run.secs,
        settings.warmup,
        settings.rounds,
    );
    let _ = writeln!(md, "| peak (closed loop) | req/s | p50 ms | p99 ms | p999 ms | granted / null / errors | CPU % p/m/c/o |");
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---|---|");
    for p in &run.peaks {
        let (p50, p99, p999) = fmt_lats(p.latency);
        let mut outcome = format!("{} / {} / {}", p.granted, p.nulls, p.errors);
        if let Some(e) = &p.first_error {
            let _ = write!(outcome, " ({e})");
        }
        if let Some(n) = &p.note {
            let _ = write!(outcome, "; {n}");
        }
        let _ = writeln!(
            md,
            "| {} | {} | {p50} | {p99} | {p999} | {} | {} |",
            label(p.target),
            fmt_rate(p.rate),
            cell(&outcome),
            crate::report::fmt_cpu(&p.cpu)
        );
    }
    md.push('\n');
    let _ = writeln!(md, "| point | offered req/s | round | target | completed/s | kept up | p50 ms | p99 ms | p99.9 ms | max ms | p99 vs direct | send lag p50 / p99 ms | scheduled: granted / null / errors / unsent / unanswered | CPU % p/m/c/o |");
    let _ = writeln!(
        md,
        "|---|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---|---|---|"
    );
    for c in &run.cells {
        let (p50, p99, p999) = fmt_lats(c.latency);
        let (l50, l99, _) = fmt_lats(c.send_lag);
        let vs = match c.target {
            Target::Direct => "–".into(),
            _ => run
                .find(Target::Direct, c.round, c.point)
                .and_then(|d| Some(c.latency?.p99 / d.latency?.p99))
                .map_or("–".into(), fmt_vs),
        };
        let mut outcome = format!(
            "{}: {} / {} / {} / {} / {}",
            c.scheduled, c.granted, c.nulls, c.errors, c.unsent, c.unanswered
        );
        if let Some(e) = &c.first_error {
            let _ = write!(outcome, " ({e})");
        }
        if let Some(n) = &c.note {
            let _ = write!(outcome, "; {n}");
        }
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {p50} | {p99} | {p999} | {} | {vs} | {l50} / {l99} | {} | {} |",
            run.points[c.point].label,
            fmt_rate(c.offered),
            c.round,
            label(c.target),
            fmt_rate(c.completed_per_sec),
            if c.kept_up() { "yes" } else { "**no**" },
            fmt_ms(c.max_us),
            cell(&outcome),
            crate::report::fmt_cpu(&c.cpu),
        );
    }
    md.push('\n');
    let _ = writeln!(md, "Medians of the rounds:\n");
    let _ = writeln!(md, "| point | offered req/s | direct p50 / p99 / p99.9 ms | proxy over 5 p50 / p99 / p99.9 ms | p99 proxy / direct (median of per-round ratios) | proxy kept up | CPU % p/m/c/o, proxy cells (median) |");
    let _ = writeln!(md, "|---|---:|---|---|---:|---|---|");
    for (i, point) in run.points.iter().enumerate() {
        let of = |target: Target| -> Vec<&OpenCell> {
            run.cells
                .iter()
                .filter(|c| c.point == i && c.target == target)
                .collect()
        };
        let lat = |cells: &[&OpenCell]| -> String {
            let m = |f: fn(&Latency) -> f64| {
                median(
                    cells
                        .iter()
                        .filter_map(|c| c.latency.as_ref().map(f))
                        .collect(),
                )
            };
            format!(
                "{} / {} / {}",
                fmt_ms(m(|l| l.p50)),
                fmt_ms(m(|l| l.p99)),
                fmt_ms(m(|l| l.p999))
            )
        };
        let (direct, proxy) = (of(Target::Direct), of(Target::Proxy(MASTERS)));
        let cpu = |f: fn(&CpuUse) -> f64| median(proxy.iter().map(|c| f(&c.cpu)).collect());
        let other = cpu(|c| c.other);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} of {} | {:.0} / {:.0} / {:.0} / {:.0}{} |",
            point.label,
            fmt_rate(point.rate),
            lat(&direct),
            lat(&proxy),
            fmt_vs(median(run.p99_ratios(i))),
            proxy.iter().filter(|c| c.kept_up()).count(),
            proxy.len(),
            cpu(|c| c.proxy.unwrap_or(f64::NAN)),
            cpu(|c| c.masters),
            cpu(|c| c.client),
            other,
            noisy_mark(other),
        );
    }
    md.push('\n');
    for f in &run.failures {
        let _ = writeln!(md, "- not measured: {f}");
    }
    if !run.failures.is_empty() {
        md.push('\n');
    }
}
