//! Measurement windows, per-connection tallies, latency percentiles.

use crate::procs::CpuUse;
use crate::settings::Target;
use std::time::{Duration, Instant};

/// How long a stalled reply may be late past the end of a cell before the cell gives up.
pub const STALL_LIMIT: Duration = Duration::from_secs(10);

/// The measured interval of a cell: work before `start` is warm-up, nothing starts after `end`.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub start: Instant,
    pub end: Instant,
}

impl Window {
    pub fn contains(&self, t: Instant) -> bool {
        t >= self.start && t < self.end
    }

    pub fn secs(&self) -> f64 {
        (self.end - self.start).as_secs_f64()
    }
}

/// What one connection (or worker) measured inside the window.
#[derive(Default)]
pub struct Tally {
    pub cycles: u64,
    /// Client commands answered inside the window.
    pub cmds: u64,
    /// Acquires refused or releases that did not delete (inside the window).
    pub fails: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Cycle latencies in nanoseconds.
    pub samples: Vec<u64>,
}

impl Tally {
    pub fn error(&mut self, text: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(text);
        }
    }

    pub fn merge(tallies: Vec<Tally>) -> Tally {
        let mut all = Tally::default();
        for t in tallies {
            all.cycles += t.cycles;
            all.cmds += t.cmds;
            all.fails += t.fails;
            all.errors += t.errors;
            if all.first_error.is_none() {
                all.first_error = t.first_error;
            }
            all.samples.extend(t.samples);
        }
        all.samples.sort_unstable();
        all
    }
}

/// Latency percentiles in microseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
}

/// The median (mean of the middle two for an even count); NaN when empty.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.retain(|v| v.is_finite());
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

pub fn percentiles(sorted_ns: &[u64]) -> Option<Latency> {
    if sorted_ns.is_empty() {
        return None;
    }
    let at = |q: f64| {
        let idx = ((q * sorted_ns.len() as f64).ceil() as usize).clamp(1, sorted_ns.len()) - 1;
        sorted_ns[idx] as f64 / 1000.0
    };
    Some(Latency {
        p50: at(0.50),
        p99: at(0.99),
        p999: at(0.999),
    })
}

/// One measured cell of the lock-cycle matrix.
#[derive(Clone, Debug)]
pub struct CycleResult {
    pub scenario: String,
    pub target: Target,
    pub conns: usize,
    pub depth: usize,
    pub cycles_per_sec: f64,
    pub cmds_per_sec: f64,
    pub latency: Option<Latency>,
    pub fails: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub cpu: CpuUse,
    pub note: Option<String>,
}

impl CycleResult {
    /// The notes and first errors of two cells run as a pair (a round of an off/on
    /// comparison), joined for one table cell.
    pub fn pair_notes(off: &CycleResult, on: &CycleResult) -> String {
        [&off.note, &on.note, &off.first_error, &on.first_error]
            .into_iter()
            .filter_map(|n| n.as_deref())
            .collect::<Vec<_>>()
            .join("; ")
    }

    pub fn from_tally(
        scenario: String,
        target: Target,
        conns: usize,
        depth: usize,
        tally: Tally,
        window: Window,
        cpu: CpuUse,
    ) -> CycleResult {
        let secs = window.secs();
        CycleResult {
            scenario,
            target,
            conns,
            depth,
            cycles_per_sec: tally.cycles as f64 / secs,
            cmds_per_sec: tally.cmds as f64 / secs,
            latency: percentiles(&tally.samples),
            fails: tally.fails,
            errors: tally.errors,
            first_error: tally.first_error,
            cpu,
            note: None,
        }
    }

    pub fn failed(
        scenario: String,
        target: Target,
        conns: usize,
        depth: usize,
        why: String,
    ) -> Self {
        CycleResult {
            scenario,
            target,
            conns,
            depth,
            cycles_per_sec: 0.0,
            cmds_per_sec: 0.0,
            latency: None,
            fails: 0,
            errors: 1,
            first_error: Some(why),
            cpu: CpuUse::default(),
            note: None,
        }
    }
}
