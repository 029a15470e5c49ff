//! The markdown report and the verdicts against the targets.

use crate::contention::HotResult;
use crate::external::{
    NodeResult, RbResult, NODE_DIRECT, NODE_PROXY, NODE_PROXY_PER_WORKER, NODE_RAW, RB_CONNS,
};
use crate::memory::MemResult;
use crate::procs::CpuUse;
use crate::settings::{ReleaseKind, Settings, Target};
use crate::stats::{median, CycleResult, Latency};
use std::fmt::Write as _;
use std::time::Duration;

#[derive(Default)]
pub struct Results {
    pub cycles: Vec<CycleResult>,
    pub clientside: Vec<CycleResult>,
    pub node: Vec<NodeResult>,
    pub rb: Vec<RbResult>,
    pub cpu: Vec<crate::cpu::CpuCell>,
    pub memory: Vec<MemResult>,
    pub hot: Vec<HotResult>,
    pub fencing: Vec<crate::fencing::FenceResult>,
    pub metrics: Option<crate::metrics_cost::MetricsCost>,
    pub wakeup: Option<crate::wakeup::WakeRun>,
    pub idle: Vec<crate::wakeup::IdleResult>,
    pub latency: Option<crate::latency::LatencyRun>,
    pub masters: Option<crate::masters_cost::MastersRun>,
    pub confirm: Option<crate::confirm::ConfirmRun>,
    pub shards: Vec<crate::shards::Cell>,
    pub overload: Option<crate::overload::OverloadRun>,
    pub skipped: Vec<String>,
}

pub fn fmt_us(us: f64) -> String {
    let ms = us / 1000.0;
    if ms < 1.0 {
        format!("{ms:.3}")
    } else if ms < 10.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.1}")
    }
}

pub fn fmt_rate(x: f64) -> String {
    let whole = x.round() as u64;
    let digits = whole.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn fmt_ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}×")
    } else {
        "–".into()
    }
}

pub fn fmt_lat(l: Option<Latency>) -> (String, String, String) {
    match l {
        Some(l) => (fmt_us(l.p50), fmt_us(l.p99), fmt_us(l.p999)),
        None => ("–".into(), "–".into(), "–".into()),
    }
}

/// Above this much CPU (% of one core) used by other processes, a cell is flagged as noisy.
pub const NOISY_OTHER_CPU: f64 = 50.0;

pub fn fmt_cpu(c: &CpuUse) -> String {
    let proxy = c.proxy.map_or("–".into(), |p| format!("{p:.0}"));
    let noisy = noisy_mark(c.other);
    format!(
        "{proxy} / {:.0} / {:.0} / {:.0}{noisy}",
        c.masters, c.client, c.other
    )
}

/// " ⚠" when other processes used more than [`NOISY_OTHER_CPU`] (% of one core).
pub fn noisy_mark(other_pct: f64) -> &'static str {
    if other_pct > NOISY_OTHER_CPU {
        " ⚠"
    } else {
        ""
    }
}

pub fn fmt_kib(bytes: f64) -> String {
    format!("{:.1} KiB", bytes / 1024.0)
}

pub fn fmt_mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

pub fn fails_text(r: &CycleResult) -> String {
    let mut text = format!("{}", r.fails);
    if r.errors > 0 {
        let _ = write!(
            text,
            " (+{} errors: {})",
            r.errors,
            r.first_error.as_deref().unwrap_or("?")
        );
    }
    if let Some(note) = &r.note {
        let _ = write!(text, "; {note}");
    }
    cell(&text)
}

/// Text safe inside a markdown table cell.
pub fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

pub fn find_cycle(
    results: &[CycleResult],
    target: Target,
    conns: usize,
    depth: usize,
) -> Option<&CycleResult> {
    results
        .iter()
        .find(|r| r.target == target && r.conns == conns && r.depth == depth)
}

/// A target verdict line for the summary.
pub struct Verdict {
    pub target: &'static str,
    pub measured: String,
    pub met: Option<bool>,
}

pub fn render(settings: &Settings, env: &str, results: &Results, elapsed: Duration) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# redlock-proxy benchmark results\n");
    md.push_str(env);
    let _ = writeln!(
        md,
        "\nEach cell ran {} s measured after {} s warm-up; release = `{}`; lock TTL {} ms; load generator on {} tokio worker thread(s). Total run time {:.0} s.\n",
        settings.secs,
        settings.warmup,
        match settings.release {
            ReleaseKind::Evalsha => "EVALSHA",
            ReleaseKind::Eval => "EVAL",
        },
        settings.ttl_ms,
        settings.client_threads,
        elapsed.as_secs_f64()
    );
    let verdicts = verdicts(results);
    if !verdicts.is_empty() {
        let _ = writeln!(md, "## Targets\n");
        let _ = writeln!(md, "| target | measured | met |");
        let _ = writeln!(md, "|---|---|---|");
        for v in &verdicts {
            let met = match v.met {
                Some(true) => "**yes**",
                Some(false) => "**no**",
                None => "not run",
            };
            let _ = writeln!(md, "| {} | {} | {} |", v.target, v.measured, met);
        }
        md.push('\n');
    }

    if !results.cycles.is_empty() {
        let _ = writeln!(
            md,
            "## 1. Lock cycles: direct redis-server vs proxy over 1, 3, 5 masters\n"
        );
        let _ = writeln!(
            md,
            "A cycle = `SET k tok NX PX {}` then the compare-and-delete release, each connection on its own keys. Depth d = d acquires pipelined, then the d releases pipelined. Latency = one cycle (acquire reply time + release reply time), ms. CPU = % of one core for proxy / masters / load generator / everything else on the machine (2 cores = 200 %); ⚠ = other processes used more than {NOISY_OTHER_CPU:.0} % during the cell, so it measured a shared machine.\n",
            settings.ttl_ms
        );
        let _ = writeln!(
            md,
            "| scenario | conns | depth | cycles/s | cmds/s | p50 ms | p99 ms | p999 ms | vs direct | CPU % p/m/c/o | refused / errors |"
        );
        let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|");
        for r in &results.cycles {
            let (p50, p99, p999) = fmt_lat(r.latency);
            let vs = find_cycle(&results.cycles, Target::Direct, r.conns, r.depth)
                .filter(|d| d.cycles_per_sec > 0.0 && r.target != Target::Direct)
                .map_or("–".into(), |d| {
                    fmt_ratio(r.cycles_per_sec / d.cycles_per_sec)
                });
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.scenario,
                r.conns,
                r.depth,
                fmt_rate(r.cycles_per_sec),
                fmt_rate(r.cmds_per_sec),
                p50,
                p99,
                p999,
                vs,
                fmt_cpu(&r.cpu),
                fails_text(r)
            );
        }
        md.push('\n');
        // Ratio matrix.
        let proxies: Vec<Target> = settings
            .targets
            .iter()
            .copied()
            .filter(|t| *t != Target::Direct)
            .collect();
        if results.cycles.iter().any(|r| r.target == Target::Direct) && !proxies.is_empty() {
            let _ = writeln!(
                md,
                "Throughput relative to direct redis-server (cycles/s ratio):\n"
            );
            let mut header = "| conns | depth |".to_string();
            let mut rule = "|---:|---:|".to_string();
            for p in &proxies {
                let _ = write!(header, " {} |", p.label());
                rule.push_str("---:|");
            }
            let _ = writeln!(md, "{header}\n{rule}");
            for &c in &settings.conns {
                for &d in &settings.depths {
                    let mut row = format!("| {c} | {d} |");
                    let direct = find_cycle(&results.cycles, Target::Direct, c, d);
                    for p in &proxies {
                        let cell = match (direct, find_cycle(&results.cycles, *p, c, d)) {
                            (Some(x), Some(y)) if x.cycles_per_sec > 0.0 => {
                                fmt_ratio(y.cycles_per_sec / x.cycles_per_sec)
                            }
                            _ => "–".into(),
                        };
                        let _ = write!(row, " {cell} |");
                    }
                    let _ = writeln!(md, "{row}");
                }
            }
            md.push('\n');
        }
    }

    if !results.clientside.is_empty() || !results.node.is_empty() {
        let _ = writeln!(
            md,
            "## 2. Client-side Redlock vs the proxy over the same 5 masters\n"
        );
    }
    if !results.clientside.is_empty() {
        let _ = writeln!(
            md,
            "In-process Redlock over the `redis` crate (5 multiplexed connections shared by all workers; concurrent SET NX PX to all 5, quorum 3 + validity, release script on all 5, each round waiting for all 5 replies) vs the raw-RESP load generator through the proxy over the same 5 masters (depth 1). Latency = one cycle, ms.\n"
        );
        let _ = writeln!(
            md,
            "| workers / conns | client-side cycles/s | p50 | p99 | p999 | proxy-5 cycles/s | p50 | p99 | p999 | proxy / client-side | CPU % client-side m/c/o | refused / errors |"
        );
        let _ = writeln!(
            md,
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
        );
        for r in &results.clientside {
            let (a50, a99, a999) = fmt_lat(r.latency);
            let proxy = find_cycle(&results.cycles, Target::Proxy(5), r.conns, 1);
            let (rate, (b50, b99, b999), ratio) = match proxy {
                Some(p) => (
                    fmt_rate(p.cycles_per_sec),
                    fmt_lat(p.latency),
                    fmt_ratio(p.cycles_per_sec / r.cycles_per_sec),
                ),
                None => ("not run".into(), fmt_lat(None), "–".into()),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} / {:.0} / {:.0} | {} |",
                r.conns,
                fmt_rate(r.cycles_per_sec),
                a50,
                a99,
                a999,
                rate,
                b50,
                b99,
                b999,
                ratio,
                r.cpu.masters,
                r.cpu.client,
                r.cpu.other,
                fails_text(r)
            );
        }
        md.push('\n');
    }
    if !results.node.is_empty() {
        render_node(&mut md, settings, &results.node);
    }

    if !results.rb.is_empty() {
        let _ = writeln!(
            md,
            "## 3. redis-benchmark: SET NX PX, direct vs proxy over 1 master, {RB_CONNS} connections\n"
        );
        let _ = writeln!(
            md,
            "`redis-benchmark -c {RB_CONNS} -P d -r 100000000 -n N --csv SET lb:rb:TAG:__rand_int__ v NX PX {}` (N sized from a calibration run to last about {} s; keys are random, so nearly every SET is granted). `-P 1` runs {} interleaved round(s) of direct then proxy; the target uses the median ratio.\n",
            settings.ttl_ms, settings.secs, settings.rounds
        );
        let _ = writeln!(
            md,
            "| scenario | pipeline | round | requests | SET/s | p50 ms | p99 ms | vs direct (same round) | granted (keys left on the master) |"
        );
        let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in &results.rb {
            let direct = results.rb.iter().find(|d| {
                d.scenario == Target::Direct.label()
                    && d.pipeline == r.pipeline
                    && d.round == r.round
            });
            let vs = match direct {
                Some(d) if d.scenario != r.scenario => fmt_ratio(r.rps / d.rps),
                _ => "–".into(),
            };
            let note = r
                .note
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default();
            let _ = writeln!(
                md,
                "| {}{} | {} | {} | {} | {} | {:.3} | {:.3} | {} | {} |",
                r.scenario,
                note,
                r.pipeline,
                r.round,
                fmt_rate(r.requests as f64),
                fmt_rate(r.rps),
                r.p50_ms,
                r.p99_ms,
                vs,
                r.granted.map_or("?".into(), |g| format!(
                    "{:.1} %",
                    g as f64 * 100.0 / r.requests.max(1) as f64
                ))
            );
        }
        md.push('\n');
    }

    if !results.cpu.is_empty() {
        render_cpu(&mut md, settings, &results.cpu);
    }

    if !results.memory.is_empty() {
        let _ = writeln!(md, "## 4. Memory per idle client connection\n");
        let _ = writeln!(
            md,
            "Separate process; N connections opened, each sends `PING` and reads `PONG`, then stays idle; VmRSS from /proc/PID/status before (after one warm-up connection) and 1 s after the last PONG.\n"
        );
        let _ = writeln!(
            md,
            "| process | connections | VmRSS before | VmRSS after | per connection | notes |"
        );
        let _ = writeln!(md, "|---|---:|---:|---:|---:|---|");
        for m in &results.memory {
            let _ = writeln!(
                md,
                "| {} | {} of {} | {} | {} | {} | {} |",
                m.scenario,
                m.opened,
                m.conns,
                fmt_mib(m.before),
                fmt_mib(m.after),
                m.per_conn().map_or("–".into(), fmt_kib),
                m.note.as_deref().unwrap_or("")
            );
        }
        md.push('\n');
    }

    if let [one, two, ..] = results.fencing.as_slice() {
        let _ = writeln!(
            md,
            "## 6. Fencing tokens: one proxy vs two on the same keys\n"
        );
        let _ = writeln!(
            md,
            "50 connections loop `LOCK.ACQUIRE key v 30000` → `LOCK.RELEASE` on 20 shared keys for {} s, all through one proxy, then split over two proxies in front of the same 5 masters. Tokens seen going backwards for a key must be 0.\n",
            settings.secs
        );
        let _ = writeln!(md, "| proxies | grants/s | attempts/s | tokens backwards |");
        let _ = writeln!(md, "|---:|---:|---:|---:|");
        for r in [one, two] {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} |",
                r.proxies,
                fmt_rate(r.grants_per_sec),
                fmt_rate(r.attempts_per_sec),
                r.regressions
            );
        }
        let _ = writeln!(
            md,
            "\nTwo proxies / one proxy, grants/s: {:.2}.\n",
            two.grants_per_sec / one.grants_per_sec.max(f64::EPSILON)
        );
    }

    if let Some(cost) = &results.metrics {
        render_metrics_cost(&mut md, settings, cost);
    }

    if !results.hot.is_empty() {
        let _ = writeln!(md, "## 5. Hot-key contention\n");
        let _ = writeln!(
            md,
            "One holder takes `hot` (PX 60000, the default max_lock_ttl_ms); {} clients, each on its own connection, loop `SET hot tok NX PX 30000` and sleep {} ms after each (refused) reply, for {} s. Master ops = sum over the masters of the `INFO commandstats` call deltas (SET + EVAL + EVALSHA; \"all\" = every command except INFO). Latency = one SET, ms.\n",
            settings.hot_clients, settings.hot_interval_ms, settings.secs
        );
        let _ = writeln!(
            md,
            "| scenario | pollers | client SETs | client SET/s | master lock ops | per client op | master ops (all) | per client op (all) | p50 | p99 | p999 | CPU % p/m/c/o | grants (must be 0) / errors; master calls by command |"
        );
        let _ = writeln!(
            md,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
        );
        for h in &results.hot {
            let (p50, p99, p999) = fmt_lat(h.latency);
            let per = |x: u64| h.per_client_op(x).map_or("–".into(), |p| format!("{p:.2}"));
            let mut notes = format!("{} / {}", h.unexpected_grants, h.errors);
            let calls: Vec<String> = h
                .breakdown
                .iter()
                .map(|(name, calls)| format!("{name} {}", fmt_rate(*calls as f64)))
                .collect();
            if !calls.is_empty() {
                let _ = write!(notes, "; master calls: {}", calls.join(", "));
            }
            if let Some(n) = &h.note {
                let _ = write!(notes, " ({n})");
            }
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                h.scenario,
                h.clients,
                fmt_rate(h.client_ops as f64),
                fmt_rate(h.client_ops_per_sec),
                fmt_rate(h.master_lock_ops as f64),
                per(h.master_lock_ops),
                fmt_rate(h.master_all_ops as f64),
                per(h.master_all_ops),
                p50,
                p99,
                p999,
                fmt_cpu(&h.cpu),
                cell(&notes)
            );
        }
        md.push('\n');
    }

    if results.wakeup.is_some() || !results.idle.is_empty() {
        render_wakeup(&mut md, settings, results);
    }

    if let Some(run) = &results.latency {
        crate::latency::render(&mut md, settings, run);
    }

    if let Some(run) = &results.masters {
        crate::masters_cost::render(&mut md, settings, run);
    }

    if let Some(run) = &results.confirm {
        crate::confirm::render(&mut md, settings, run);
    }

    if !results.shards.is_empty() {
        crate::shards::render(&mut md, settings, &results.shards);
    }

    if let Some(run) = &results.overload {
        crate::overload::render(&mut md, settings, run);
    }

    if !results.skipped.is_empty() {
        let _ = writeln!(md, "## Skipped\n");
        for s in &results.skipped {
            let _ = writeln!(md, "- {s}");
        }
        md.push('\n');
    }
    md
}

pub fn verdicts(results: &Results) -> Vec<Verdict> {
    let mut out = Vec::new();
    // 1. proxy over 1 ≥ 1.0× direct, SET NX PX at 50 connections: redis-benchmark -P 1, the
    // median over the interleaved rounds of proxy/direct.
    const RB_TARGET: &str =
        "proxy over 1 master ≥ 1.0× direct redis-server, SET NX PX at 50 connections";
    let rb_pairs: Vec<(&RbResult, &RbResult)> = results
        .rb
        .iter()
        .filter(|d| d.pipeline == 1 && d.scenario == Target::Direct.label())
        .filter_map(|d| {
            let p = results.rb.iter().find(|p| {
                p.pipeline == 1 && p.round == d.round && p.scenario == Target::Proxy(1).label()
            })?;
            Some((p, d))
        })
        .collect();
    let loadgen = find_cycle(&results.cycles, Target::Proxy(1), 50, 1)
        .zip(find_cycle(&results.cycles, Target::Direct, 50, 1))
        .map(|(p, d)| p.cycles_per_sec / d.cycles_per_sec);
    if rb_pairs.is_empty() {
        out.push(Verdict {
            target: RB_TARGET,
            measured: loadgen.map_or("redis-benchmark section not run".into(), |l| {
                format!(
                    "lock cycles only (redis-benchmark not run): {}",
                    fmt_ratio(l)
                )
            }),
            met: None,
        });
    } else {
        let ratios: Vec<f64> = rb_pairs.iter().map(|(p, d)| p.rps / d.rps).collect();
        let ratio = median(ratios.clone());
        let mut measured = format!(
            "redis-benchmark -c 50 -P 1, {} interleaved round(s): proxy/direct {} → median **{}** (median SET/s: proxy {} vs direct {})",
            ratios.len(),
            ratios.iter().map(|r| fmt_ratio(*r)).collect::<Vec<_>>().join(", "),
            fmt_ratio(ratio),
            fmt_rate(median(rb_pairs.iter().map(|(p, _)| p.rps).collect())),
            fmt_rate(median(rb_pairs.iter().map(|(_, d)| d.rps).collect())),
        );
        if let Some(l) = loadgen {
            let _ = write!(
                measured,
                "; lock cycles at 50 conns, depth 1: {}",
                fmt_ratio(l)
            );
        }
        out.push(Verdict {
            target: RB_TARGET,
            measured,
            met: Some(ratio >= 1.0),
        });
    }
    // 2. proxy over 5 ≥ 2× node redlock over 5, p99 no worse, against the medians of node
    // redlock's rounds at its largest worker count: (a) the proxy's capacity, seen by raw-RESP
    // clients; (b) the same node script with one ioredis client at the proxy.
    const NODE_TARGET: &str =
        "proxy over 5 masters ≥ 2× node redlock over the same 5 masters (lock cycles/s), p99 no worse";
    let p99 = |l: Option<Latency>| l.map_or(f64::NAN, |l| l.p99);
    let workers = results
        .node
        .iter()
        .filter(|n| n.scenario == NODE_DIRECT)
        .map(|n| n.workers)
        .max();
    let Some(workers) = workers else {
        out.push(Verdict {
            target: NODE_TARGET,
            measured: "node section not run".into(),
            met: None,
        });
        return finish_verdicts(out, results);
    };
    let direct = node_runs(&results.node, NODE_DIRECT, workers);
    let direct_rate = median(direct.iter().map(|n| n.cycles_per_sec).collect());
    let direct_p99 = median(direct.iter().map(|n| p99(n.latency)).collect());
    let compare = |what: String, runs: &[&NodeResult]| {
        let ratios: Vec<f64> = runs
            .iter()
            .filter_map(|r| node_vs_direct(&results.node, r))
            .collect();
        let ratio = median(ratios.clone());
        let lat_p99 = median(runs.iter().map(|n| p99(n.latency)).collect());
        Verdict {
            target: NODE_TARGET,
            measured: format!(
                "{what}: {} vs node redlock {} cycles/s ({workers} workers, medians of {}); per-round ratios {} → median **{}**; p99 {} vs {} ms; load generator CPU {} % vs node's {} %",
                fmt_rate(median(runs.iter().map(|n| n.cycles_per_sec).collect())),
                fmt_rate(direct_rate),
                runs.len(),
                ratios.iter().map(|r| fmt_ratio(*r)).collect::<Vec<_>>().join(", "),
                fmt_ratio(ratio),
                fmt_us(lat_p99),
                fmt_us(direct_p99),
                fmt_pct(median(runs.iter().filter_map(|n| n.node_cpu).collect())),
                fmt_pct(median(direct.iter().filter_map(|n| n.node_cpu).collect())),
            ),
            met: Some(ratio >= 2.0 && lat_p99 <= direct_p99),
        }
    };
    let raw = node_runs(&results.node, NODE_RAW, workers);
    if !raw.is_empty() {
        let what = format!("(a) raw-RESP clients → proxy, {workers} conns, depth 1");
        out.push(compare(what, &raw));
    } else if let Some(r) = find_cycle(&results.cycles, Target::Proxy(5), workers, 1) {
        // Not interleaved: the `cycles` cell against the median of node's rounds.
        out.push(Verdict {
            target: NODE_TARGET,
            measured: format!(
                "(a) raw-RESP clients → proxy, {} conns, depth 1 (cycles section, not interleaved): {} vs node redlock {} cycles/s = **{}**; p99 {} vs {} ms",
                r.conns,
                fmt_rate(r.cycles_per_sec),
                fmt_rate(direct_rate),
                fmt_ratio(r.cycles_per_sec / direct_rate),
                fmt_us(p99(r.latency)),
                fmt_us(direct_p99)
            ),
            met: Some(r.cycles_per_sec >= 2.0 * direct_rate && p99(r.latency) <= direct_p99),
        });
    }
    for (tag, scenario) in [
        ("(b) same node script, 1 ioredis client", NODE_PROXY),
        (
            "(b') same node script, 1 ioredis client per worker",
            NODE_PROXY_PER_WORKER,
        ),
    ] {
        let runs = node_runs(&results.node, scenario, workers);
        if !runs.is_empty() {
            out.push(compare(format!("{tag} → proxy"), &runs));
        }
    }
    finish_verdicts(out, results)
}

/// Targets 3, 4 and 5.
fn finish_verdicts(mut out: Vec<Verdict>, results: &Results) -> Vec<Verdict> {
    // 3. ≤ 16 KiB per idle connection.
    let mem = results
        .memory
        .iter()
        .find(|m| m.scenario.starts_with("redlock-proxy"));
    out.push(Verdict {
        target: "≤ 16 KiB resident per idle client connection (10k connections)",
        measured: mem
            .and_then(MemResult::per_conn)
            .map_or("memory section not run".into(), |b| {
                format!("{} per connection", fmt_kib(b))
            }),
        met: mem
            .and_then(MemResult::per_conn)
            .map(|b| b <= 16.0 * 1024.0 && mem.is_some_and(|m| m.refused == 0)),
    });
    // 4. ≤ 1.5 master operations per client operation on the hot key.
    let hot = results.hot.iter().find(|h| h.scenario.starts_with("proxy"));
    let per = hot.and_then(|h| h.per_client_op(h.master_lock_ops));
    out.push(Verdict {
        target: "hot-key pollers over 5 masters: ≤ 1.5 master operations per client operation",
        measured: match (hot, per) {
            (Some(h), Some(p)) => format!(
                "{p:.2} master SET/EVAL/EVALSHA per client SET ({} client SETs); client p99 {} ms",
                fmt_rate(h.client_ops as f64),
                h.latency.map_or("–".into(), |l| fmt_us(l.p99))
            ),
            _ => "contention section not run".into(),
        },
        met: per.map(|p| p <= 1.5),
    });
    // The median per-round ratio `pick` of the proxy over `target` (`--threads 1`) at `depth`.
    let median_ratio =
        |target: Target, depth: usize, pick: fn(crate::cpu::Ratios) -> Option<f64>| {
            let variant = crate::cpu::Variant {
                target,
                threads: 1,
                depth,
                peer: None,
            };
            median(
                results
                    .cpu
                    .iter()
                    .filter(|c| c.variant == variant)
                    .filter_map(|c| pick(crate::cpu::ratios(&results.cpu, c)))
                    .collect(),
            )
        };
    // 5. Proxy CPU per request ≤ 1.0× redis-server's own (issue 14), the default --threads 1.
    let ratio = |target: Target| median_ratio(target, 1, |r| r.proxy_vs_direct);
    let (one, five) = (ratio(Target::Proxy(1)), ratio(Target::Proxy(5)));
    out.push(Verdict {
        target: "proxy CPU per SET NX PX ≤ 1.0× redis-server's own CPU per SET NX PX (redis-benchmark -c 50 -P 1)",
        measured: if one.is_finite() {
            format!(
                "median per-round ratio over 1 master **{}**, over 5 masters {} (`--threads 1`)",
                fmt_ratio(one),
                fmt_ratio(five)
            )
        } else {
            "cpu section not run".into()
        },
        met: one.is_finite().then_some(one <= 1.0),
    });
    // Issue 27, target 1: proxy CPU per request against twemproxy's over as many masters.
    let vs_twemproxy = |masters: usize, depth: usize| {
        median_ratio(Target::Proxy(masters), depth, |r| r.vs_twemproxy)
    };
    let shown = |r: f64| {
        if r.is_finite() {
            fmt_ratio(r)
        } else {
            "–".into()
        }
    };
    let (p16, p1) = (vs_twemproxy(1, 16), vs_twemproxy(1, 1));
    out.push(Verdict {
        target: "proxy over 1 master, CPU per SET NX PX: ≤ 1.25× twemproxy's at -P 16, ≤ 1.0× at -P 1 (issue 27)",
        measured: if p16.is_finite() || p1.is_finite() {
            format!(
                "median per-round ratio at -P 16 **{}**, at -P 1 **{}** (`--threads 1`)",
                shown(p16),
                shown(p1),
            )
        } else {
            "cpu section not run, or twemproxy missing".into()
        },
        met: (p16.is_finite() && p1.is_finite()).then_some(p16 <= 1.25 && p1 <= 1.0),
    });
    let five = vs_twemproxy(5, 16);
    out.push(Verdict {
        target: "proxy over 5 masters, CPU per SET NX PX: ≤ 1.25× twemproxy's over 5 at -P 16 (issue 27)",
        measured: if five.is_finite() {
            format!(
                "median per-round ratio at -P 16 **{}**, at -P 1 {} (`--threads 1`)",
                shown(five),
                shown(vs_twemproxy(5, 1)),
            )
        } else {
            "cpu section not run, or twemproxy missing".into()
        },
        met: five.is_finite().then_some(five <= 1.25),
    });
    wakeup_verdicts(&mut out, results);
    if results.latency.is_some() {
        out.push(crate::latency::verdict(results.latency.as_ref()));
    }
    crate::masters_cost::verdicts(&mut out, results.masters.as_ref());
    out
}

/// Issue 25's targets: wake-ups within 5 ms + one master round trip (each kind), and idle
/// waiters that cost less than 10 MB and no CPU.
fn wakeup_verdicts(out: &mut Vec<Verdict>, results: &Results) {
    use crate::wakeup::{Kind, MEMORY_LIMIT};
    for (kind, target) in [
        (
            Kind::List,
            "python-redis-lock waiter (BLPOP) through the proxy granted within 5 ms + one master round trip of the release, p50 and p99",
        ),
        (
            Kind::PubSub,
            "Redisson-style waiter (SUBSCRIBE) through the proxy granted within 5 ms + one master round trip of the release, p50 and p99",
        ),
    ] {
        let Some(run) = &results.wakeup else {
            out.push(Verdict {
                target,
                measured: "wakeup section not run".into(),
                met: None,
            });
            continue;
        };
        let bound = run.bound_us();
        let mut parts = Vec::new();
        let mut met = bound.is_some();
        for t in [Target::Proxy(3), Target::Proxy(5), Target::Direct] {
            let Some(cell) = run.cell(kind, t) else {
                met &= t == Target::Direct;
                continue;
            };
            let lat = cell.latency();
            if t != Target::Direct {
                met &= cell.failures == 0
                    && lat.zip(bound).is_some_and(|(l, b)| l.p50 <= b && l.p99 <= b);
            }
            let (p50, p99, _) = fmt_lat(lat);
            let failed = if cell.failures > 0 {
                format!(", {} failed", cell.failures)
            } else {
                String::new()
            };
            parts.push(format!(
                "{}: p50 **{p50}** / p99 **{p99}** ms ({} rounds{failed})",
                t.label(),
                cell.granted.len()
            ));
        }
        out.push(Verdict {
            target,
            measured: format!(
                "{}; bound {} ms (5 ms + PING p50 {} ms)",
                parts.join("; "),
                bound.map_or("–".into(), fmt_us),
                run.rtt_p50().map_or("–".into(), fmt_us)
            ),
            met: bound.map(|_| met),
        });
    }
    const IDLE: &str =
        "1,000 waiters blocked in BLPOP on 100 keys through the proxy over 5 masters: < 10 MB resident and no CPU while idle";
    match results.idle.iter().find(|r| !r.direct) {
        Some(r) => out.push(Verdict {
            target: IDLE,
            measured: format!(
                "{} waiters: VmRSS {:+.2} MiB (as many plain idle connections on a fresh proxy: {}); over {} idle s the proxy used {} CPU ticks with them against {} without, the masters ran {} LMPOP; one push per key woke {} of {} keys",
                r.opened,
                r.rss_growth() as f64 / (1024.0 * 1024.0),
                r.plain_growth.map_or("–".into(), |g| format!("{:+.2} MiB", g as f64 / (1024.0 * 1024.0))),
                r.idle_secs,
                r.ticks_waiting,
                r.ticks_empty,
                r.lmpop_waiting,
                r.keys_woken,
                r.keys
            ),
            met: Some(
                r.opened == r.waiters
                    && r.rss_growth() < MEMORY_LIMIT as i64
                    && r.ticks_waiting <= r.ticks_empty + 1
                    && r.lmpop_waiting == 0
                    && r.keys_woken == r.keys,
            ),
        }),
        None => out.push(Verdict {
            target: IDLE,
            measured: "wakeup section not run".into(),
            met: None,
        }),
    }
}

/// Section 9: wake-ups of blocked waiters, then the idle waiters.
fn render_wakeup(md: &mut String, settings: &Settings, results: &Results) {
    use crate::wakeup::{Kind, BOUND_US, SETTLE, WARMUP_ROUNDS, WOKEN_LIMIT};
    let _ = writeln!(md, "## 9. Wake-ups of blocked lock waiters (issue 25)\n");
    if let Some(run) = &results.wakeup {
        let bound = run.bound_us();
        let rtt = percentiles_of(&run.rtt);
        let _ = writeln!(
            md,
            "Each round, for each target (the first master directly, a fresh proxy over the first 3 masters, one over all 5; the order rotates) and each waiter, on fresh keys: the holder takes `lock:K` (`SET NX PX 30000`); **python-redis-lock**: the waiter's `SET NX PX` fails, it sends `BLPOP lock-signal:K 0`, and once it is blocked (redis-server: `blocked_clients`; the proxy: every master ran its first pop try, `LMPOP`) and {} ms later, the holder releases with the library's UNLOCK script (`EVALSHA`; `DEL` signal, `LPUSH`, `PEXPIRE 1000`, `DEL` lock); when `BLPOP` returns the waiter retries `SET NX PX` and must be granted. **Redisson-style**: the waiter `SUBSCRIBE`s on its own connection to `redisson_lock__channel:{{K}}` (confirmed), its `SET NX PX` fails, {} ms later the holder runs `EVAL \"redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], ARGV[1]); return 1\"`; on the message the waiter retries and must be granted. Granted = release written → the waiter's `OK` arrived; woken = release written → the `BLPOP` reply or the message arrived. {} measured rounds ({} unmeasured first) in {:.0} s (`BENCH_WAKEUP_ROUNDS` {}, at most `BENCH_WAKEUP_SECS` {}). Bound = 5 ms + one master round trip (p50 of {} `PING`s to the first master directly, interleaved with the rounds).\n",
            SETTLE.as_millis(),
            SETTLE.as_millis(),
            run.rounds,
            WARMUP_ROUNDS,
            run.secs,
            settings.wakeup_rounds,
            settings.wakeup_secs,
            run.rtt.len(),
        );
        let _ = writeln!(
            md,
            "| waiter | target | rounds | granted p50 ms | p99 ms | max ms | p50 vs direct | p99 vs direct | woken p50 ms | woken p99 ms | p50 ≤ bound | p99 ≤ bound | failed / notes |"
        );
        let _ = writeln!(
            md,
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"
        );
        for kind in Kind::ALL {
            let direct = run.cell(kind, Target::Direct).and_then(|c| c.latency());
            for c in run.cells.iter().filter(|c| c.kind == kind) {
                let lat = c.latency();
                let (p50, p99, _) = fmt_lat(lat);
                let (w50, w99, _) = fmt_lat(c.woken_latency());
                let vs = |pick: fn(&Latency) -> f64| match (lat, direct) {
                    (Some(l), Some(d)) if c.target != Target::Direct && pick(&d) > 0.0 => {
                        fmt_ratio(pick(&l) / pick(&d))
                    }
                    _ => "–".into(),
                };
                let within = |pick: fn(&Latency) -> f64| match (lat, bound) {
                    (Some(l), Some(b)) if pick(&l) <= b => "yes",
                    (Some(_), Some(_)) => "**no**",
                    _ => "–",
                };
                let mut notes = c.failures.to_string();
                if let Some(e) = &c.first_error {
                    let _ = write!(notes, " ({e})");
                }
                if c.duplicates > 0 {
                    let _ = write!(notes, "; {} duplicate messages", c.duplicates);
                }
                if let Some(n) = &c.note {
                    let _ = write!(notes, "; {n}");
                }
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    kind.label(),
                    c.target.label(),
                    c.granted.len(),
                    p50,
                    p99,
                    c.max_us().map_or("–".into(), fmt_us),
                    vs(|l| l.p50),
                    vs(|l| l.p99),
                    w50,
                    w99,
                    within(|l| l.p50),
                    within(|l| l.p99),
                    cell(&notes)
                );
            }
        }
        let _ = writeln!(
            md,
            "\nMaster round trip (`PING` to the first master directly): p50 {} ms, p99 {} ms; bound = {} ms + {} ms = **{} ms**.\n",
            rtt.map_or("–".into(), |l| fmt_us(l.p50)),
            rtt.map_or("–".into(), |l| fmt_us(l.p99)),
            fmt_us(BOUND_US),
            rtt.map_or("–".into(), |l| fmt_us(l.p50)),
            bound.map_or("–".into(), fmt_us),
        );
    }
    if !results.idle.is_empty() {
        let _ = writeln!(
            md,
            "**Idle blocked waiters.** {} connections each send `BLPOP lock-signal:idle:TAG:<i mod {}> 0` (fresh process, after one warm-up waiter woken by one push). VmRSS (/proc/PID/status) before the waiters and 0.5 s after every waiter was seen blocked (redis-server: `blocked_clients`; the proxy: every master ran each waiter's first `LMPOP`). CPU = utime + stime ticks ({:.0} per s) of the process over {} idle s, without the waiters (its own background work: the proxy's health checks, redis-server's cron) and with them; the masters' commands over the same windows (`INFO commandstats` deltas; redis-server: its own). Then one `LPUSH key 1` per key, pipelined: keys with at least one waiter woken within {} s, waiters woken (through the proxy a push may wake several waiters: a signal, not a queue, docs/PROTOCOL.md §14), the pop commands the masters ran meanwhile (`LMPOP`; redis-server: `BLPOP`), pushes written → each key's first waiter woken. As many plain idle connections (one `PING` each, as §4 opens them) on a fresh process of the same kind show what the connections cost without blocking; \"blocking's own\" = the difference. Target: < 10 MB (10^7 bytes) more resident in all, no more CPU ticks than without the waiters (+1 tick of rounding) and no master pops while idle.\n",
            settings.wakeup_waiters,
            settings.wakeup_keys,
            results.idle.first().map_or(100.0, |r| r.hz),
            settings.wakeup_idle_secs,
            WOKEN_LIMIT.as_secs(),
        );
        let _ = writeln!(
            md,
            "| process | waiters | VmRSS before | after | growth | growth vs redis-server | as many plain connections (fresh process) | blocking's own | CPU ticks idle without / with waiters | CPU with waiters vs redis-server | masters' CPU ticks without / with | master LMPOP without / with | master calls (not INFO) without / with | keys woken | waiters woken (most by one push) | master pops for the pushes | first wake p50 / slowest key ms | notes |"
        );
        let _ = writeln!(
            md,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        );
        let reference = results.idle.iter().find(|r| r.direct);
        let mib = |b: Option<i64>| {
            b.map_or("–".into(), |b| {
                format!("{:+.2} MiB", b as f64 / (1024.0 * 1024.0))
            })
        };
        for r in &results.idle {
            let growth = r.rss_growth() as f64 / (1024.0 * 1024.0);
            let (vs_mem, vs_cpu) = match reference {
                Some(d) if !r.direct => (
                    if d.rss_growth() > 0 {
                        fmt_ratio(r.rss_growth() as f64 / d.rss_growth() as f64)
                    } else {
                        "–".into()
                    },
                    if d.ticks_waiting > 0 {
                        fmt_ratio(r.ticks_waiting as f64 / d.ticks_waiting as f64)
                    } else {
                        format!("{} vs 0 ticks", r.ticks_waiting)
                    },
                ),
                _ => ("–".into(), "–".into()),
            };
            let masters = |a: u64, b: u64| {
                if r.direct {
                    "–".to_string()
                } else {
                    format!("{a} / {b}")
                }
            };
            let _ = writeln!(
                md,
                "| {} | {} of {} on {} keys | {} | {} | {growth:+.2} MiB | {vs_mem} | {} | {} | {} / {} | {vs_cpu} | {} | {} / {} | {} / {} | {} of {} | {} ({}) | {} | {} / {} | {} |",
                r.scenario,
                r.opened,
                r.waiters,
                r.keys,
                fmt_mib(r.rss_before),
                fmt_mib(r.rss_after),
                mib(r.plain_growth),
                mib(r.blocking_growth()),
                r.ticks_empty,
                r.ticks_waiting,
                masters(r.master_ticks_empty, r.master_ticks_waiting),
                r.lmpop_empty,
                r.lmpop_waiting,
                r.calls_empty,
                r.calls_waiting,
                r.keys_woken,
                r.keys,
                r.waiters_woken,
                r.most_woken_by_one_push,
                fmt_rate(r.pops_for_pushes as f64),
                r.first_wake_p50_us.map_or("–".into(), fmt_us),
                r.first_wake_max_us.map_or("–".into(), fmt_us),
                cell(r.note.as_deref().unwrap_or(""))
            );
        }
        md.push('\n');
    }
}

fn percentiles_of(sorted_ns: &[u64]) -> Option<Latency> {
    crate::stats::percentiles(sorted_ns)
}

fn fmt_pct(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.0}")
    } else {
        "–".into()
    }
}

/// The runs of `scenario` at `workers`.
fn node_runs<'a>(runs: &'a [NodeResult], scenario: &str, workers: usize) -> Vec<&'a NodeResult> {
    runs.iter()
        .filter(|n| n.workers == workers && n.scenario == scenario)
        .collect()
}

/// The node redlock run over the 5 masters of `r`'s round and worker count.
fn node_direct<'a>(runs: &'a [NodeResult], r: &NodeResult) -> Option<&'a NodeResult> {
    runs.iter().find(|d| {
        d.scenario == NODE_DIRECT
            && d.workers == r.workers
            && d.round == r.round
            && d.scenario != r.scenario
    })
}

/// cycles/s of `r` / node redlock's over the 5 masters in the same round.
fn node_vs_direct(runs: &[NodeResult], r: &NodeResult) -> Option<f64> {
    node_direct(runs, r)
        .filter(|d| d.cycles_per_sec > 0.0)
        .map(|d| r.cycles_per_sec / d.cycles_per_sec)
}

/// Section 2 (b): node redlock over the masters and through the proxy, with the CPU each
/// party spent per cycle.
fn render_node(md: &mut String, settings: &Settings, runs: &[NodeResult]) {
    let _ = writeln!(
        md,
        "node `redlock` 5.0.0-beta.2 + ioredis 5.9.2, `retryCount: {}`; W async workers in one node process, each looping `acquire([key], {})` → `release()`, the key: {}{}{}. Redlock acquires with its own Lua script (EVALSHA), so through the proxy this exercises the script fan-out path. Through the proxy node uses one ioredis client (one connection), and at the largest worker count also one per worker; the raw-RESP row is the `cycles` load generator (this process, pre-encoded commands, one connection per worker) through the proxy. At the largest worker count every round runs these rows in this order ({} interleaved round(s)); ratios compare rows of the same round, the targets use their medians. Latency = one cycle, ms. Load gen CPU % = node's own CPU over its measured window (node is single-threaded: near 100 % node limits the rate), or this process for the raw-RESP row. CPU µs/cycle = each party's CPU over the measured window per completed cycle; total = load generator + proxy + masters. Other = CPU % of one core used by everything else on the machine, node itself not included (⚠ above {NOISY_OTHER_CPU:.0} %): the 2 cores are shared, so when they are full, cycles/s follows the total CPU per cycle and the share of the cores the benchmark gets.\n",
        settings.node_retries,
        settings.ttl_ms,
        match settings.node_keys.as_str() {
            "own" => "each worker's own".to_string(),
            "random" => "a fresh random one per cycle".to_string(),
            shared => format!("one of {} shared by all workers, drawn at random per cycle", shared.trim_start_matches("shared:")),
        },
        if settings.node_direct_per_worker {
            "; at the largest worker count node redlock also runs with one ioredis client per worker per master (5 × W connections)"
        } else {
            ""
        },
        {
            let mut more = String::new();
            if settings.node_procs > 1 {
                let _ = write!(more, "; **{} node processes** share the workers, each with its own ioredis clients (cycles and node CPU summed, p50 weighted by cycles, p99 and p99.9 the largest)", settings.node_procs);
            }
            if settings.node_hogs > 0 {
                let _ = write!(more, "; **{} CPU hog(s)** (`yes > /dev/null`) ran beside every cell (they count in \"other\")", settings.node_hogs);
            }
            more
        },
        settings.rounds
    );
    let _ = writeln!(
        md,
        "| scenario | workers | conns | round | cycles/s | vs node direct | p50 | p99 | p999 | load gen CPU % | CPU µs/cycle gen / proxy / masters | total µs/cycle | node direct total / this | other CPU % | refused / errors |"
    );
    let _ = writeln!(
        md,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|"
    );
    for r in runs {
        let (p50, p99, p999) = fmt_lat(r.latency);
        let mut fails = r.fails.to_string();
        if let Some(e) = &r.first_error {
            let _ = write!(fails, " ({e})");
        }
        if let Some(n) = &r.note {
            let _ = write!(fails, "; {n}");
        }
        let per = r.cpu_per_cycle();
        let direct = node_direct(runs, r);
        let noisy = noisy_mark(r.cpu.other);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} / {:.0} | {:.0} | {} | {:.0}{noisy} | {} |",
            r.scenario,
            r.workers,
            r.conns,
            r.round,
            fmt_rate(r.cycles_per_sec),
            node_vs_direct(runs, r).map_or("–".into(), fmt_ratio),
            p50,
            p99,
            p999,
            r.node_cpu.map_or("–".into(), fmt_pct),
            fmt_pct(per.client),
            per.proxy.map_or("–".into(), fmt_pct),
            per.masters,
            r.total_cpu_per_cycle(),
            direct.map_or("–".into(), |d| {
                fmt_ratio(d.total_cpu_per_cycle() / r.total_cpu_per_cycle())
            }),
            r.cpu.other,
            cell(&fails)
        );
    }
    md.push('\n');
}

/// Section 8: CPU per request, every cell, the medians of each variant, then the proxy and the
/// peer proxies side by side.
fn render_cpu(md: &mut String, settings: &Settings, cells: &[crate::cpu::CpuCell]) {
    use crate::cpu::{ratios, VARIANTS};
    let _ = writeln!(
        md,
        "## 8. CPU per request: redis-server, the proxy and the peer proxies\n"
    );
    let _ = writeln!(
        md,
        "`redis-benchmark -c {RB_CONNS} -P depth -r 100000000 -n {} SET lb:rb:TAG:__rand_int__ v NX PX {}`. At `-P 1`: redis-server directly, the proxy over 1 and over 5 fresh masters with `--threads 1` and `--threads 2`, twemproxy (`nutcracker`) over 1 master and sharding over 5 (ketama), and haproxy in TCP mode over 1 master; at `-P 16`: redis-server, the proxy over 1 and over 5 (`--threads 1`), and the same peers. Each of {} round(s) runs those cells in that order, and every ratio compares cells of the same round and depth. Each cell: fresh masters and proxy (a peer: its own process with a generated config, default settings), {} unmeasured requests, then utime + stime (/proc/PID/stat) before and after the measured run, divided by its requests. Masters = the sum over the masters (through the proxy: CPU per acquire); direct = the direct cell's redis-server. ×twemproxy = the cell's proxy CPU per request (the direct cell: redis-server's own) over twemproxy's over as many masters (twemproxy over 5 sends each request to one of them; the proxy to all five). Load gen = redis-benchmark. Other = CPU % of one core used by everything else on the machine meanwhile (noise; ⚠ above {NOISY_OTHER_CPU:.0} %). Granted = the proxy's `acquires_granted` (with its other `acquires_*` outcomes when not 0); direct and through a peer: keys added.\n",
        settings.cpu_requests,
        settings.ttl_ms,
        settings.rounds,
        settings.cpu_warmup_requests,
    );
    let _ = writeln!(
        md,
        "| round | scenario | -P | req/s | proxy µs/req | masters µs/acquire | direct µs/req | proxy / direct | masters / direct | ×twemproxy | req/s vs --threads 1 | proxy CPU vs --threads 1 | load gen µs/req | other CPU % | granted |"
    );
    let _ = writeln!(
        md,
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    let us = |x: Option<f64>| x.map_or("–".into(), |x| format!("{x:.2}"));
    let ratio = |x: Option<f64>| x.map_or("–".into(), fmt_ratio);
    for c in cells {
        let r = ratios(cells, c);
        let direct = crate::cpu::find(cells, c.variant.direct(), c.round).map(|d| d.masters_us());
        let mut granted = c.granted.map_or("?".into(), |g| {
            format!("{:.1} %", g as f64 * 100.0 / c.requests.max(1) as f64)
        });
        for (outcome, n) in &c.not_granted {
            let _ = write!(granted, ", {outcome} {n}");
        }
        if let Some(note) = &c.note {
            let _ = write!(granted, "; {note}");
        }
        let noisy = noisy_mark(c.other_pct);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.2} | {} | {} | {} | {} | {} | {} | {:.2} | {:.0}{noisy} | {} |",
            c.round,
            c.variant.label(),
            c.variant.depth,
            fmt_rate(c.rps),
            us(c.proxy_us()),
            c.masters_us(),
            us(direct),
            ratio(r.proxy_vs_direct),
            ratio(r.masters_vs_direct),
            ratio(r.vs_twemproxy),
            ratio(r.rps_vs_threads1),
            ratio(r.proxy_cpu_vs_threads1),
            c.per_request.client,
            c.other_pct,
            cell(&granted)
        );
    }
    let _ = writeln!(
        md,
        "\nMedians over the rounds (ratios: the median of the per-round ratios):\n"
    );
    let _ = writeln!(
        md,
        "| scenario | -P | req/s | proxy µs/req | masters µs/acquire | proxy / direct | masters / direct | ×twemproxy | req/s vs --threads 1 | proxy CPU vs --threads 1 |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let median_of = |variant: crate::cpu::Variant,
                     f: &dyn Fn(&crate::cpu::CpuCell) -> Option<f64>|
     -> Option<f64> {
        let m = median(
            cells
                .iter()
                .filter(|c| c.variant == variant)
                .filter_map(f)
                .collect(),
        );
        m.is_finite().then_some(m)
    };
    for variant in VARIANTS {
        if !cells.iter().any(|c| c.variant == variant) {
            continue;
        }
        let med = |f: &dyn Fn(&crate::cpu::CpuCell) -> Option<f64>| median_of(variant, f);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            variant.label(),
            variant.depth,
            med(&|c| Some(c.rps)).map_or("–".into(), fmt_rate),
            us(med(&|c| c.proxy_us())),
            us(med(&|c| Some(c.masters_us()))),
            ratio(med(&|c| ratios(cells, c).proxy_vs_direct)),
            ratio(med(&|c| ratios(cells, c).masters_vs_direct)),
            ratio(med(&|c| ratios(cells, c).vs_twemproxy)),
            ratio(med(&|c| ratios(cells, c).rps_vs_threads1)),
            ratio(med(&|c| ratios(cells, c).proxy_cpu_vs_threads1)),
        );
    }
    // Side by side (issue 27): the proxy over 1 (`--threads 1`), the peers, redis-server.
    use crate::cpu::Variant;
    use crate::peers::Peer;
    let columns = |depth: usize| -> [Variant; 6] {
        let v = |target, peer| Variant {
            target,
            threads: 1,
            depth,
            peer,
        };
        [
            v(Target::Proxy(1), None),
            v(Target::Proxy(1), Some(Peer::Twemproxy)),
            v(Target::Proxy(1), Some(Peer::Haproxy)),
            v(Target::Direct, None),
            v(Target::Proxy(5), None),
            v(Target::Proxy(5), Some(Peer::Twemproxy)),
        ]
    };
    let _ = writeln!(
        md,
        "\nSide by side: CPU µs per request of the proxy process (redis-server: its own), median of the rounds, and the median per-round ratio to twemproxy's:\n"
    );
    let _ = writeln!(
        md,
        "| per request | redlock-proxy over 1 (`--threads 1`) | twemproxy over 1 | haproxy (tcp) over 1 | redis-server | redlock-proxy over 5 (`--threads 1`) | twemproxy over 5 (sharding) |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|");
    for depth in [1, 16] {
        let mut row = format!("| proxy CPU, `-P {depth}` |");
        let mut rates = format!("| req/s, `-P {depth}` |");
        for variant in columns(depth) {
            let own = median_of(variant, &|c| {
                if c.variant.is_direct() {
                    Some(c.masters_us())
                } else {
                    c.proxy_us()
                }
            });
            let vs = median_of(variant, &|c| ratios(cells, c).vs_twemproxy);
            let _ = write!(
                row,
                " {} |",
                match (own, vs) {
                    (Some(o), Some(r)) => format!("{o:.2} µs ({} twemproxy)", fmt_ratio(r)),
                    (Some(o), None) => format!("{o:.2} µs"),
                    _ => "– (not run)".into(),
                }
            );
            let _ = write!(
                rates,
                " {} |",
                median_of(variant, &|c| Some(c.rps)).map_or("–".into(), fmt_rate)
            );
        }
        let _ = writeln!(md, "{row}");
        let _ = writeln!(md, "{rates}");
    }
    md.push('\n');
}

/// Section 7: metrics off vs on, per round, the medians, and a scrape under load.
fn render_metrics_cost(
    md: &mut String,
    settings: &Settings,
    cost: &crate::metrics_cost::MetricsCost,
) {
    let _ = writeln!(md, "## 7. The cost of metrics: off vs on\n");
    let baseline = settings.baseline_bin.as_ref().map_or_else(
        || "this build without `--metrics`".to_string(),
        |bin| format!("`{}`", bin.display()),
    );
    let _ = writeln!(
        md,
        "Lock cycles through the proxy over 5 masters, {} connections, depth 1, {} s per cell; each round runs the cell without metrics ({baseline}), then this build with `--metrics` while `/metrics` is scraped every second. Proxy CPU per cycle (µs of proxy CPU time per lock cycle) is less disturbed by other load on the machine than cycles/s.\n",
        crate::metrics_cost::CONNS,
        settings.secs,
    );
    let _ = writeln!(
        md,
        "| round | off cycles/s | on cycles/s | on / off | off proxy µs/cycle | on proxy µs/cycle | scrapes | notes |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|---|");
    let cpu_per_cycle = |r: &CycleResult| {
        r.cpu
            .proxy
            .map(|pct| pct / 100.0 * 1e6 / r.cycles_per_sec.max(f64::EPSILON))
    };
    let show = |x: Option<f64>| x.map_or("–".into(), |us| format!("{us:.1}"));
    for (i, round) in cost.rounds.iter().enumerate() {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.3} | {} | {} | {} | {} |",
            i + 1,
            fmt_rate(round.off.cycles_per_sec),
            fmt_rate(round.on.cycles_per_sec),
            round.on.cycles_per_sec / round.off.cycles_per_sec.max(f64::EPSILON),
            show(cpu_per_cycle(&round.off)),
            show(cpu_per_cycle(&round.on)),
            round.scrapes,
            CycleResult::pair_notes(&round.off, &round.on)
        );
    }
    let rate = |pick: fn(&crate::metrics_cost::Round) -> &CycleResult| {
        median(cost.rounds.iter().map(|r| pick(r).cycles_per_sec).collect())
    };
    let cpu = |pick: fn(&crate::metrics_cost::Round) -> &CycleResult| {
        median(
            cost.rounds
                .iter()
                .filter_map(|r| cpu_per_cycle(pick(r)))
                .collect(),
        )
    };
    let (off, on) = (rate(|r| &r.off), rate(|r| &r.on));
    let (cpu_off, cpu_on) = (cpu(|r| &r.off), cpu(|r| &r.on));
    let _ = writeln!(
        md,
        "\nMedians: off {} cycles/s, on {} cycles/s ({:+.1} % with metrics); proxy CPU per cycle off {cpu_off:.1} µs, on {cpu_on:.1} µs ({:+.1} %).\n",
        fmt_rate(off),
        fmt_rate(on),
        (on / off.max(f64::EPSILON) - 1.0) * 100.0,
        (cpu_on / cpu_off.max(f64::EPSILON) - 1.0) * 100.0
    );
    if let Some(scrape) = &cost.scrape {
        let _ = writeln!(md, "The last scrape under that load (lock and master series; buckets, zero series and the per-command counters left out):\n\n```text");
        for line in scrape.lines().filter(|l| {
            l.starts_with("redlock_proxy_")
                && !l.contains("_bucket")
                && !l.starts_with("redlock_proxy_commands_total")
                && !l.ends_with(" 0")
        }) {
            let _ = writeln!(md, "{line}");
        }
        let _ = writeln!(md, "```\n");
    }
}
