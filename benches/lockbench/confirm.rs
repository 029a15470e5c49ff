//! `confirm`: what `wait_replicas` costs (issue 26, item 3). Three fresh masters, each with one
//! replica (`--replicaof`, in sync before the first cell); lock cycles through the proxy over
//! them, 50 connections at depth 1 and at depth 16, each round running the cell without
//! `--wait-replicas` and then with `--wait-replicas 1` (every vote waits for the `WAIT 1` that
//! ends its write burst), for `BENCH_ROUNDS` interleaved rounds.

use crate::cycles::run_cycle_cell;
use crate::report::{fmt_rate, fmt_us};
use crate::settings::{Settings, Target};
use crate::stats::{median, CycleResult};
use redlock_proxy::{LocalCluster, LocalError, LocalMaster};
use redlock_testkit::masters::start_replicas;
use std::fmt::Write;

/// Connections of each cell.
pub const CONNS: usize = 50;
/// Pipeline depths of the cells.
pub const DEPTHS: [usize; 2] = [1, 16];

/// One round at one depth: the cell without `wait_replicas`, then the cell with it.
pub struct Round {
    pub depth: usize,
    pub off: CycleResult,
    pub on: CycleResult,
}

pub struct ConfirmRun {
    pub rounds: Vec<Round>,
}

/// Three masters with a replica each, the replicas in sync.
fn masters_with_replicas() -> Result<(LocalCluster, Vec<LocalMaster>), LocalError> {
    let masters = LocalCluster::start(3)?;
    let replicas = start_replicas(&masters.masters)?;
    Ok((masters, replicas))
}

pub async fn run(settings: &Settings, hz: f64, arm: fn(u16)) -> Result<ConfirmRun, LocalError> {
    let (masters, _replicas) = tokio::task::block_in_place(masters_with_replicas)?;
    for master in &masters.masters {
        arm(master.port);
    }
    let mut confirmed = settings.clone();
    confirmed
        .proxy_args
        .extend(["--wait-replicas".to_string(), "1".to_string()]);
    let mut run = ConfirmRun { rounds: Vec::new() };
    for _ in 0..settings.rounds {
        for depth in DEPTHS {
            let off = run_cycle_cell(settings, &masters, Target::Proxy(3), CONNS, depth, hz).await;
            let mut on =
                run_cycle_cell(&confirmed, &masters, Target::Proxy(3), CONNS, depth, hz).await;
            on.scenario = format!("{} + wait_replicas 1", on.scenario);
            run.rounds.push(Round { depth, off, on });
        }
    }
    Ok(run)
}

/// Section 12: cycles/s and latency without and with `wait_replicas`, per round and the
/// medians per depth.
pub fn render(md: &mut String, settings: &Settings, run: &ConfirmRun) {
    let _ = writeln!(
        md,
        "## 12. The cost of confirmed writes: `wait_replicas` 0 vs 1 (issue 26)\n"
    );
    let _ = writeln!(
        md,
        "Lock cycles through the proxy over 3 masters, each with one replica on this machine, {CONNS} connections, {} s per cell; each round runs the cell without `--wait-replicas`, then with `--wait-replicas 1` (every vote waits for the `WAIT 1` that ends its write burst on the master's connection). Latency: one lock cycle (acquire and release), ms.\n",
        settings.secs,
    );
    let _ = writeln!(
        md,
        "| depth | off cycles/s | on cycles/s | on / off | off p50 / p99 | on p50 / p99 | notes |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|---:|---:|---|");
    let latency = |r: &CycleResult| {
        r.latency.as_ref().map_or("–".into(), |l| {
            format!("{} / {}", fmt_us(l.p50), fmt_us(l.p99))
        })
    };
    for round in &run.rounds {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.3} | {} | {} | {} |",
            round.depth,
            fmt_rate(round.off.cycles_per_sec),
            fmt_rate(round.on.cycles_per_sec),
            round.on.cycles_per_sec / round.off.cycles_per_sec.max(f64::EPSILON),
            latency(&round.off),
            latency(&round.on),
            CycleResult::pair_notes(&round.off, &round.on)
        );
    }
    let _ = writeln!(md);
    for depth in DEPTHS {
        let at_depth = || run.rounds.iter().filter(|r| r.depth == depth);
        let ratio = median(
            at_depth()
                .map(|r| r.on.cycles_per_sec / r.off.cycles_per_sec.max(f64::EPSILON))
                .collect(),
        );
        let _ = writeln!(
            md,
            "Depth {depth}: `wait_replicas 1` gives {ratio:.2}× the cycles/s (median of {} rounds).\n",
            at_depth().count()
        );
    }
}
