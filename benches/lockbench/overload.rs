//! `overload` (issue 38): what the proxy does with more acquires than it can carry, beside
//! redis-server and twemproxy at the same offered rates. One table:
//!
//! 1. **Peaks** (closed loop): the proxy's grants per second of `SET lb:ovl:TAG:ID v NX PX
//!    10000` (a fresh key per request) over `BENCH_OVERLOAD_MASTERS` (3 and 5) fresh masters, at
//!    each of `BENCH_OVERLOAD_DEPTHS` (1 and 16 requests in flight per connection), on
//!    `BENCH_OVERLOAD_CONNS` connections.
//! 2. **Open loop** at `BENCH_OVERLOAD_FRACTIONS` (25, 50, 100, 150, 200 %) of each configuration's
//!    peak: the proxy over as many masters, one redis-server directly, and twemproxy sharding
//!    over as many masters, at the same offered rate and depth (open loop at depth 16: 16
//!    requests scheduled together, written in one write).
//! 3. **A big value**: `BENCH_OVERLOAD_BIG_CONNS` small clients acquiring fresh keys at
//!    `BENCH_OVERLOAD_BIG_FRACTION` of the proxy-over-5 `-P 1` peak through the proxy over 5
//!    masters, without, then with one more client sending `SET lb:ovl:TAG:big <BENCH_OVERLOAD_BIG_MB
//!    MB> NX PX 5000` every `BENCH_OVERLOAD_BIG_EVERY_SECS`; its replies are listed as they came.
//!
//! Each cell runs on fresh processes (`openloop::Site`), `BENCH_OVERLOAD_SECS` measured after
//! `BENCH_WARMUP_SECS`. A request of the window whose reply did not come within
//! `BENCH_OVERLOAD_BOUND_SECS` of its scheduled (open loop) or written (closed loop) time is
//! counted as not answered, whatever it said (and a cell waits no longer than that after its
//! window). Errors are counted by their first word (`ERR`, `TRYAGAIN`, …; `client` for the load
//! generator's own failures). Through the proxy, the delta of its `INFO masters`
//! `retired_connections` (summed over the masters) over the cell; for every server, the peak
//! VmRSS of the process the clients talk to (the proxy, twemproxy, the redis-server), sampled
//! every 10 ms from before the load to the end of its drain.

use crate::openloop::{self, Load, Outcome, Plan, Server, Site};
use crate::peers::Peer;
use crate::procs::{CpuUse, RssPeak};
use crate::report::{cell, fmt_rate, fmt_us, noisy_mark};
use crate::settings::Settings;
use crate::stats::{percentiles, Latency, Window};
use redlock_testkit::resp::{encode, Client};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The small acquires' TTL, and the big value's.
pub const TTL_MS: u64 = 10_000;
pub const BIG_TTL_MS: u64 = 5_000;

const PREFIX: &str = "lb:ovl";

/// Up to this many replies of the big client are listed one by one.
const BIG_LISTED: usize = 16;

/// What a row measured.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// The proxy's closed-loop peak.
    Peak,
    /// Open loop at this fraction of the configuration's peak.
    Fraction(f64),
    /// The small clients of the big-value case, without or with the big client.
    Big { with: bool },
}

/// One row of the table.
#[derive(Clone, Debug)]
pub struct Row {
    pub kind: Kind,
    /// The configuration whose peak set the rate: the proxy's masters and depth.
    pub masters: usize,
    pub depth: usize,
    pub server: Server,
    pub conns: usize,
    /// Open loop: requests per second offered (none for a peak).
    pub offered: Option<f64>,
    /// Grants per second: OK replies that arrived in the window, within the bound.
    pub goodput: f64,
    pub scheduled: u64,
    pub granted: u64,
    pub nulls: u64,
    /// Errors by kind, with the first text of each.
    pub errors: BTreeMap<String, (u64, String)>,
    /// Requests of the window not answered within the bound: never sent, answered too late,
    /// never answered.
    pub unsent: u64,
    pub late: u64,
    pub unanswered: u64,
    /// Through the proxy: master connections retired during the cell.
    pub retired: Option<u64>,
    /// Granted acquires, from the scheduled (open loop) or written (closed loop) time.
    pub granted_latency: Option<Latency>,
    pub rss_peak: Option<u64>,
    pub cpu: CpuUse,
    pub notes: Vec<String>,
}

impl Row {
    pub fn not_answered(&self) -> u64 {
        self.unsent + self.late + self.unanswered
    }
}

#[derive(Default)]
pub struct OverloadRun {
    pub rows: Vec<Row>,
    pub failures: Vec<String>,
}

/// The big client: its pre-encoded `SET`, how often, how long a reply may take.
#[derive(Clone)]
struct Big {
    command: Arc<Vec<u8>>,
    every: Duration,
    limit: Duration,
}

/// One reply (or failure) of the big client.
#[derive(Clone, Debug)]
struct BigReply {
    text: String,
    ms: f64,
}

/// What a cell measured beside the load's own outcome.
struct Measured {
    outcome: Outcome,
    retired: Option<u64>,
    rss_peak: Option<u64>,
    notes: Vec<String>,
}

fn load(settings: &Settings, conns: usize, depth: usize) -> Load {
    Load {
        prefix: PREFIX,
        conns,
        depth,
        ttl_ms: TTL_MS,
        warmup: settings.warmup,
        secs: settings.overload_secs,
        bound: Some(Duration::from_secs_f64(settings.overload_bound_secs)),
    }
}

fn server_label(server: Server) -> String {
    match server {
        Server::Direct => "redis-server (direct)".into(),
        Server::Proxy(n) => format!("redlock-proxy over {n}"),
        Server::Peer(peer, n) => format!("{} over {n}", peer.label()),
    }
}

/// One cell on fresh processes: closed loop without a rate, else open loop, with the big
/// client beside it if given.
async fn measure(
    settings: &Settings,
    server: Server,
    load: &Load,
    rate: Option<f64>,
    big: Option<&Big>,
    hz: f64,
) -> Result<Measured, String> {
    let mut site = Site::open(settings, server, hz).await?;
    let retired_before = site.retired_connections().await;
    let warnings_before = site.proxy_warnings();
    let rss = RssPeak::watch(site.front_pid());
    let mut big_replies = None;
    let outcome = match rate {
        None => openloop::closed_loop(site.port, &site.probe, load).await,
        Some(rate) => {
            let plan = Plan::new(load);
            let big_task = big.map(|b| tokio::spawn(big_client(site.port, plan.window, b.clone())));
            let outcome = openloop::open_loop(site.port, &site.probe, load, rate, plan).await;
            if let Some(task) = big_task {
                big_replies = Some(task.await.unwrap_or_else(|e| {
                    vec![BigReply {
                        text: format!("client: task: {e}"),
                        ms: f64::NAN,
                    }]
                }));
            }
            outcome
        }
    };
    let rss_peak = rss.stop();
    let outcome = outcome?;
    let retired = match (retired_before, site.retired_connections().await) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    let mut notes = Vec::new();
    if let Some(replies) = big_replies {
        notes.push(big_summary(&replies));
    }
    if let (Some(before), Some(after)) = (warnings_before, site.proxy_warnings()) {
        if after > before {
            notes.push(format!("{} proxy WARN/ERROR log lines", after - before));
        }
    }
    if let Some(note) = site
        .note()
        .filter(|n| n.contains("EXITED") || n.contains("exited"))
    {
        notes.push(note);
    }
    Ok(Measured {
        outcome,
        retired,
        rss_peak,
        notes,
    })
}

/// The big client (see the module header): one `SET` at the window's start and every
/// `big.every` after (later if a reply takes longer), on one connection, opened again after an
/// error or a failure.
async fn big_client(port: u16, window: Window, big: Big) -> Vec<BigReply> {
    let mut replies = Vec::new();
    let mut conn: Option<Client> = None;
    let mut next = window.start;
    while next < window.end {
        tokio::time::sleep_until(next.into()).await;
        next += big.every;
        let began = Instant::now();
        let deadline = began + big.limit;
        if conn.is_none() {
            conn = Client::open(port, Duration::from_secs(2)).await.ok();
        }
        let reply = match conn.as_mut() {
            None => Err("client: cannot connect".to_string()),
            Some(c) => {
                match tokio::time::timeout_at(deadline.into(), c.write(&big.command)).await {
                    Err(_) => Err(format!("client: not written within {:?}", big.limit)),
                    // The server may have answered (an error) before it closed the connection.
                    Ok(Err(err)) => c
                        .read_reply(Instant::now() + Duration::from_millis(200))
                        .await
                        .map_err(|_| format!("client: write: {err}")),
                    Ok(Ok(())) => c
                        .read_reply(deadline)
                        .await
                        .map_err(|err| format!("client: read: {err}")),
                }
            }
        };
        let ms = began.elapsed().as_secs_f64() * 1000.0;
        let text = match reply {
            Ok(r) if r.is_ok() => "OK".to_string(),
            Ok(r) if r.is_null() => "null".to_string(),
            Ok(r) => {
                // What else the server makes of the rest of the value is not this client's
                // next reply: a fresh connection for the next one.
                conn = None;
                let text = format!("{r}");
                text.chars().take(100).collect()
            }
            Err(text) => {
                conn = None;
                text
            }
        };
        replies.push(BigReply { text, ms });
    }
    replies
}

/// The big client's replies in order ("big client, 3 sent: `OK` 41 ms, `null` 30 ms, …"), or
/// grouped by text when there are more than [`BIG_LISTED`] ("`null` ×6 (max 30 ms)").
fn big_summary(replies: &[BigReply]) -> String {
    let parts: Vec<String> = if replies.len() <= BIG_LISTED {
        replies
            .iter()
            .map(|r| format!("`{}` {:.0} ms", r.text, r.ms))
            .collect()
    } else {
        let mut by_text: Vec<(&str, usize, f64)> = Vec::new();
        for r in replies {
            match by_text.iter_mut().find(|(t, _, _)| *t == r.text) {
                Some(entry) => {
                    entry.1 += 1;
                    entry.2 = entry.2.max(r.ms);
                }
                None => by_text.push((&r.text, 1, r.ms)),
            }
        }
        by_text
            .iter()
            .map(|(text, n, ms)| format!("`{text}` ×{n} (max {ms:.0} ms)"))
            .collect()
    };
    format!(
        "big client, {} sent: {}",
        replies.len(),
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    )
}

/// The row of a measured cell.
fn row(
    kind: Kind,
    (masters, depth): (usize, usize),
    server: Server,
    load: &Load,
    offered: Option<f64>,
    m: Measured,
) -> Row {
    let o = m.outcome;
    let c = &o.counts;
    let mut notes = m.notes;
    if o.unsent + c.late + o.unanswered > 0 {
        notes.push(format!(
            "not answered: {} never sent, {} late, {} never answered",
            o.unsent, c.late, o.unanswered
        ));
    }
    for (kind, (_, text)) in &c.kinds {
        let text: String = text.chars().take(120).collect();
        notes.push(format!("{kind}: `{text}`"));
    }
    let send_lag = percentiles(&o.lags);
    if let Some(lag) = send_lag.filter(|l| l.p99 > 10_000.0) {
        notes.push(format!("sender lag p99 {} ms", fmt_us(lag.p99)));
    }
    if !noisy_mark(o.cpu.other).is_empty() {
        notes.push(format!("⚠ other CPU {:.0} %", o.cpu.other));
    }
    Row {
        kind,
        masters,
        depth,
        server,
        conns: load.conns,
        offered,
        goodput: c.good as f64 / o.window.secs(),
        scheduled: o.scheduled(),
        granted: c.granted,
        nulls: c.nulls,
        errors: c.kinds.clone(),
        unsent: o.unsent,
        late: c.late,
        unanswered: o.unanswered,
        retired: m.retired,
        granted_latency: percentiles(&c.granted_ns),
        rss_peak: m.rss_peak,
        cpu: o.cpu,
        notes,
    }
}

/// The row's line of the table.
fn table_row(r: &Row) -> String {
    let lat = |f: fn(&Latency) -> f64| {
        r.granted_latency
            .as_ref()
            .map_or("–".into(), |l| fmt_us(f(l)))
    };
    let config = match r.kind {
        Kind::Big { .. } => format!(
            "big value: {} masters, -P {}, {} conns",
            r.masters, r.depth, r.conns
        ),
        _ => format!("{} masters, -P {}", r.masters, r.depth),
    };
    format!(
        "| {config} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        kind_label(&r.kind),
        server_label(r.server),
        r.offered.map_or("closed loop".into(), fmt_rate),
        fmt_rate(r.goodput),
        r.nulls,
        errors_text(&r.errors),
        r.not_answered(),
        r.retired.map_or("–".into(), |n| n.to_string()),
        lat(|l| l.p50),
        lat(|l| l.p99),
        fmt_rss(r.rss_peak),
        cell(&r.notes.join("; ")),
    )
}

/// The progress line of a row: its line of the table, the requests, the CPU.
pub fn line(r: &Row) -> String {
    format!(
        "overload: {} granted of {} in the window, CPU % p/m/c/o {}: {}",
        r.granted,
        r.scheduled,
        crate::report::fmt_cpu(&r.cpu),
        table_row(r)
    )
}

fn kind_label(kind: &Kind) -> String {
    match kind {
        Kind::Peak => "peak (closed loop)".into(),
        Kind::Fraction(f) => format!("{:.0} % of the peak", f * 100.0),
        Kind::Big { with: false } => "small clients alone".into(),
        Kind::Big { with: true } => "small clients + big client".into(),
    }
}

fn errors_text(errors: &BTreeMap<String, (u64, String)>) -> String {
    if errors.is_empty() {
        return "0".into();
    }
    errors
        .iter()
        .map(|(kind, (n, _))| format!("{kind} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn fmt_rss(bytes: Option<u64>) -> String {
    bytes.map_or("–".into(), |b| {
        format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
    })
}

/// Runs the whole table (see the module header); `progress` gets a line per row.
pub async fn run(settings: &Settings, hz: f64, progress: &dyn Fn(&str)) -> OverloadRun {
    let s = settings;
    let mut run = OverloadRun::default();
    let record = |run: &mut OverloadRun, r: Result<Row, String>, what: String| match r {
        Ok(row) => {
            progress(&line(&row));
            run.rows.push(row);
        }
        Err(err) => {
            progress(&format!("overload {what}: {err}"));
            run.failures.push(format!("{what}: {err}"));
        }
    };
    let configs: Vec<(usize, usize)> = s
        .overload_masters
        .iter()
        .flat_map(|&m| s.overload_depths.iter().map(move |&d| (m, d)))
        .collect();
    let mut peaks = Vec::new();
    for &(m, d) in &configs {
        let load = load(s, s.overload_conns, d);
        let server = Server::Proxy(m);
        let r = measure(s, server, &load, None, None, hz)
            .await
            .map(|got| row(Kind::Peak, (m, d), server, &load, None, got));
        if let Ok(peak) = &r {
            if peak.goodput > 0.0 {
                peaks.push(((m, d), peak.goodput));
            }
        }
        record(&mut run, r, format!("peak over {m} masters, -P {d}"));
    }
    let twemproxy = s.peer_bin(Peer::Twemproxy).is_some();
    if !twemproxy {
        let why = format!(
            "twemproxy cells: `{}` not found (Debian: `apt-get install {}`; scripts/bench.sh installs it)",
            s.peer_bin_name(Peer::Twemproxy),
            Peer::Twemproxy.package()
        );
        progress(&format!("overload: {why}"));
        run.failures.push(why);
    }
    for &((m, d), peak) in &peaks {
        let load = load(s, s.overload_conns, d);
        for &f in &s.overload_fractions {
            let rate = peak * f;
            let mut servers = vec![Server::Proxy(m), Server::Direct];
            if twemproxy {
                servers.push(Server::Peer(Peer::Twemproxy, m));
            }
            for server in servers {
                let r = measure(s, server, &load, Some(rate), None, hz)
                    .await
                    .map(|got| row(Kind::Fraction(f), (m, d), server, &load, Some(rate), got));
                let what = format!(
                    "{} at {:.0} % of the peak over {m}, -P {d}",
                    server_label(server),
                    f * 100.0
                );
                record(&mut run, r, what);
            }
        }
    }
    // The big value: through the proxy over 5 masters, at a share of its own -P 1 peak.
    let big_masters = 5;
    let Some(&(_, peak)) = peaks.iter().find(|(c, _)| *c == (big_masters, 1)) else {
        run.failures.push(format!(
            "big value: no closed-loop peak of the proxy over {big_masters} masters at -P 1 (BENCH_OVERLOAD_MASTERS and BENCH_OVERLOAD_DEPTHS must include 5 and 1)"
        ));
        return run;
    };
    let rate = peak * s.overload_big_fraction;
    let value = vec![b'x'; (s.overload_big_mb * 1024.0 * 1024.0) as usize];
    let key = format!("{PREFIX}:{}:big", crate::cycles::unique_tag());
    let big = Big {
        command: Arc::new(encode(&[
            b"SET",
            key.as_bytes(),
            &value,
            b"NX",
            b"PX",
            BIG_TTL_MS.to_string().as_bytes(),
        ])),
        every: Duration::from_secs_f64(s.overload_big_every_secs),
        limit: Duration::from_secs_f64(s.overload_bound_secs),
    };
    drop(value);
    let load = load(s, s.overload_big_conns, 1);
    let server = Server::Proxy(big_masters);
    for with in [false, true] {
        let r = measure(s, server, &load, Some(rate), with.then_some(&big), hz)
            .await
            .map(|got| {
                row(
                    Kind::Big { with },
                    (big_masters, 1),
                    server,
                    &load,
                    Some(rate),
                    got,
                )
            });
        record(&mut run, r, format!("big value, big client {with}"));
    }
    run
}

/// The report's section: the column definitions and the one table.
pub fn render(md: &mut String, settings: &Settings, run: &OverloadRun) {
    let s = settings;
    let bound = s.overload_bound_secs;
    let _ = writeln!(md, "## 14. Overload: the proxy past its peak (issue 38)\n");
    let _ = writeln!(
        md,
        "`SET lb:ovl:TAG:<id> v NX PX {TTL_MS}`, a fresh key per request, {} connections; each cell on fresh processes, {} s measured after {} s warm-up. **Peak** rows: the proxy's closed loop (each connection writes `-P` requests, waits for their replies); their goodput sets the offered rates of the rows below it. **Open-loop** rows: `-P` requests scheduled together every `-P` / rate s on the next connection, sent whether or not earlier ones were answered: the proxy over as many masters, one redis-server directly, twemproxy (Debian's nutcracker, ketama over as many masters). **Big value** rows: {} small clients at {:.0} % of the proxy-over-5 `-P 1` peak through the proxy over 5, alone, then beside one client sending `SET lb:ovl:TAG:big <{} MB> NX PX {BIG_TTL_MS}` every {} s (its replies, in the notes).\n",
        s.overload_conns,
        s.overload_secs,
        s.warmup,
        s.overload_big_conns,
        s.overload_big_fraction * 100.0,
        s.overload_big_mb,
        s.overload_big_every_secs,
    );
    let _ = writeln!(
        md,
        "Columns: **offered/s** the open loop's rate; **goodput/s** grants per second (OK replies that arrived in the window, within {bound} s of their request's scheduled time); to the window's requests: **nulls** null replies (every key is fresh: each is a null on a key nobody holds), **errors** error replies by their first word (`client`: the load generator's own failures); **not answered in {bound} s** the window's requests never sent, answered later than {bound} s after their scheduled (peaks: written) time, or never; **retired** master connections the proxy retired during the cell (`INFO masters` `retired_connections`, summed); **p50 / p99** of the granted acquires, ms from the scheduled time (peaks: from the write); **peak RSS** of the process the clients talk to (the proxy, twemproxy, the redis-server), sampled every 10 ms. ⚠ in the notes: other processes used more than half a CPU during the cell.\n"
    );
    let _ = writeln!(
        md,
        "| configuration | load | server | offered/s | goodput/s | nulls | errors | not answered in {bound} s | retired | p50 ms | p99 ms | peak RSS | notes |"
    );
    let _ = writeln!(
        md,
        "|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|"
    );
    for r in &run.rows {
        let _ = writeln!(md, "{}", table_row(r));
    }
    md.push('\n');
    for f in &run.failures {
        let _ = writeln!(md, "- not measured: {f}");
    }
    if !run.failures.is_empty() {
        md.push('\n');
    }
}
