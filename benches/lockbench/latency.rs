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
//! The sender is one OS thread (timer slack 1 µs) writing each request with its own `write` on
//! non-blocking sockets; each connection's replies are read by a task on the harness's runtime
//! (the test kit's RESP decoder), woken by readiness, not by a timer. The sender's lateness
//! (actual write − scheduled time) is reported, so the load generator's own share of a latency
//! is visible. Every key is fresh, so every acquire should be granted: grants, nulls and errors
//! are counted. CPU (/proc) of the proxy, the masters, this process and everything else is
//! sampled over the measured window.

use crate::cycles::{connect_many, unique_tag};
use crate::procs::{CpuProbe, CpuUse};
use crate::report::{cell, fmt_rate, fmt_ratio, noisy_mark, Verdict};
use crate::settings::{Settings, Target};
use crate::stats::{median, percentiles, Latency, Window};
use bytes::BytesMut;
use redlock_proxy::LocalCluster;
use redlock_testkit::launcher::{ready_for_load, ProxyProcess};
use redlock_testkit::masters::pids;
use redlock_testkit::resp::{decode, encode, Reply};
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::TcpStream as StdStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;

/// How long after the measured window the replies of its requests are waited for.
pub const DRAIN: Duration = Duration::from_secs(5);

/// A latency this large is a request never answered (or never sent).
const NEVER: u64 = u64::MAX;

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

/// Fresh masters (1 for the direct cells, 5 behind a fresh proxy), and what to sample.
struct Site {
    port: u16,
    _masters: LocalCluster,
    proxy: Option<ProxyProcess>,
    probe: CpuProbe,
}

impl Site {
    /// Starts the masters (and the proxy, waiting until it is ready for load: a cell that is
    /// not ready runs anyway, and shows it).
    async fn open(settings: &Settings, target: Target, hz: f64) -> Result<Site, String> {
        let n = match target {
            Target::Direct => 1,
            Target::Proxy(n) => n,
        };
        let masters = LocalCluster::start(n).map_err(|e| e.to_string())?;
        let proxy = match target {
            Target::Direct => None,
            Target::Proxy(_) => {
                let proxy = settings
                    .start_proxy(&masters.addrs())
                    .map_err(|e| e.to_string())?;
                if let Err(err) = ready_for_load(proxy.port).await {
                    eprintln!("lockbench: warning: {err}");
                }
                Some(proxy)
            }
        };
        let port = proxy.as_ref().map_or(masters.masters[0].port, |p| p.port);
        let probe = CpuProbe::new(
            proxy.as_ref().map(ProxyProcess::pid),
            &pids(&masters.masters),
            hz,
        );
        Ok(Site {
            port,
            _masters: masters,
            proxy,
            probe,
        })
    }

    fn note(&mut self) -> Option<String> {
        self.proxy.as_mut().and_then(ProxyProcess::health_note)
    }
}

/// `SET lb:lat:TAG:ID v NX PX ttl`.
fn set_nx(tag: &str, id: &str, ttl: &str) -> Vec<u8> {
    let key = format!("lb:lat:{tag}:{id}");
    encode(&[b"SET", key.as_bytes(), b"v", b"NX", b"PX", ttl.as_bytes()])
}

/// Grants, nulls, errors and latencies (ns) of some requests.
#[derive(Default)]
struct Counts {
    granted: u64,
    nulls: u64,
    errors: u64,
    first_error: Option<String>,
    samples: Vec<u64>,
    /// Replies that arrived inside the window.
    completed: u64,
}

impl Counts {
    fn reply(&mut self, reply: &Reply) {
        if reply.is_ok() {
            self.granted += 1;
        } else if reply.is_null() {
            self.nulls += 1;
        } else {
            self.error(format!("{reply}"));
        }
    }

    fn error(&mut self, text: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(text);
        }
    }

    fn merge(all: Vec<Counts>) -> Counts {
        let mut out = Counts::default();
        for c in all {
            out.granted += c.granted;
            out.nulls += c.nulls;
            out.errors += c.errors;
            out.completed += c.completed;
            if out.first_error.is_none() {
                out.first_error = c.first_error;
            }
            out.samples.extend(c.samples);
        }
        out.samples.sort_unstable();
        out
    }
}

/// The closed-loop peak of `target` (see the module header).
pub async fn peak(settings: &Settings, target: Target, hz: f64) -> Result<Peak, String> {
    let mut site = Site::open(settings, target, hz).await?;
    let conns = connect_many(site.port, settings.latency_conns)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let start = Instant::now() + Duration::from_secs_f64(settings.warmup);
    let window = Window {
        start,
        end: start + Duration::from_secs_f64(settings.latency_peak_secs),
    };
    let tag = unique_tag();
    let ttl = settings.ttl_ms.to_string();
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(c, mut conn)| {
            let (tag, ttl) = (tag.clone(), ttl.clone());
            tokio::spawn(async move {
                let mut counts = Counts::default();
                let mut n = 0u64;
                while Instant::now() < window.end {
                    n += 1;
                    let cmd = set_nx(&tag, &format!("p{c}:{n}"), &ttl);
                    let sent = Instant::now();
                    if let Err(err) = conn.write(&cmd).await {
                        counts.error(format!("write: {err}"));
                        break;
                    }
                    match conn.read_reply(window.end + DRAIN).await {
                        Ok(reply) => {
                            let arrived = conn.arrived();
                            if window.contains(arrived) {
                                counts.completed += 1;
                                counts.samples.push((arrived - sent).as_nanos() as u64);
                                counts.reply(&reply);
                            }
                        }
                        Err(err) => {
                            counts.error(format!("read: {err}"));
                            break;
                        }
                    }
                }
                counts
            })
        })
        .collect();
    let cpu = site.probe.over(window).await;
    let mut all = Vec::new();
    for t in tasks {
        all.push(t.await.unwrap_or_else(|e| {
            let mut c = Counts::default();
            c.error(format!("task: {e}"));
            c
        }));
    }
    let counts = Counts::merge(all);
    Ok(Peak {
        target,
        rate: counts.completed as f64 / window.secs(),
        latency: percentiles(&counts.samples),
        granted: counts.granted,
        nulls: counts.nulls,
        errors: counts.errors,
        first_error: counts.first_error,
        cpu,
        note: site.note(),
    })
}

/// Each connection's scheduled times of the requests sent and not yet answered, in order.
type Pending = Arc<Mutex<VecDeque<Instant>>>;

/// What the sender did with the requests scheduled inside the window.
#[derive(Default)]
struct Sent {
    unsent: u64,
    lags: Vec<u64>,
    first_error: Option<String>,
}

enum WriteFailed {
    /// Nothing of it was written: the socket stayed full past the give-up time.
    NotSent,
    /// The connection failed, or stayed full in the middle of a request.
    Broken(String),
}

/// Writes all of `bytes` to a non-blocking socket, waiting for room in 50 µs steps; gives up
/// on a request not begun at `give_up`, and on the connection at `give_up + DRAIN`.
fn write_all(stream: &mut StdStream, bytes: &[u8], give_up: Instant) -> Result<(), WriteFailed> {
    let mut written = 0;
    while written < bytes.len() {
        match stream.write(&bytes[written..]) {
            Ok(0) => return Err(WriteFailed::Broken("write returned 0".into())),
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let now = Instant::now();
                if written == 0 && now >= give_up {
                    return Err(WriteFailed::NotSent);
                }
                if now >= give_up + DRAIN {
                    return Err(WriteFailed::Broken("socket full".into()));
                }
                std::thread::sleep(Duration::from_micros(50));
            }
            Err(e) => return Err(WriteFailed::Broken(e.to_string())),
        }
    }
    Ok(())
}

/// The sender thread: request `i` at `t0 + i / rate` on connection `i mod n`, until the
/// window's end (requests scheduled before it and not yet sent are still sent, late).
fn send_all(
    mut writers: Vec<StdStream>,
    pending: Vec<Pending>,
    t0: Instant,
    rate: f64,
    window: Window,
    tag: String,
    ttl: String,
) -> Sent {
    // SAFETY: prctl(PR_SET_TIMERSLACK) changes only this thread's timer slack (1 µs instead of
    // 50 µs), so that its sleeps end close to the next scheduled time.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0);
    }
    let mut sent = Sent::default();
    let mut broken = vec![false; writers.len()];
    let interval = 1e9 / rate;
    for i in 0u64.. {
        let at = t0 + Duration::from_nanos((i as f64 * interval) as u64);
        if at >= window.end {
            break;
        }
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
        let c = (i % writers.len() as u64) as usize;
        let in_window = window.contains(at);
        if broken[c] {
            sent.unsent += u64::from(in_window);
            continue;
        }
        let cmd = set_nx(&tag, &i.to_string(), &ttl);
        pending[c].lock().unwrap().push_back(at);
        match write_all(&mut writers[c], &cmd, window.end) {
            Ok(()) => {
                if in_window {
                    sent.lags.push((Instant::now() - at).as_nanos() as u64);
                }
            }
            Err(failed) => {
                // Nothing of this request reached the socket, or the connection is lost: its
                // reply will never come (the reader cannot have taken it: it takes an entry
                // only for a reply, and replies come in order).
                pending[c].lock().unwrap().pop_back();
                sent.unsent += u64::from(in_window);
                if let WriteFailed::Broken(why) = failed {
                    broken[c] = true;
                    if sent.first_error.is_none() {
                        sent.first_error = Some(format!("write: {why}"));
                    }
                }
            }
        }
    }
    sent
}

/// One connection's reader: each reply takes the oldest pending scheduled time. Stops when the
/// sender is done and nothing is pending, or at `deadline`.
async fn read_all(
    mut stream: tokio::net::TcpStream,
    pending: Pending,
    mut done: watch::Receiver<bool>,
    window: Window,
    deadline: Instant,
) -> Counts {
    let mut counts = Counts::default();
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let give_up = tokio::time::sleep_until(deadline.into());
    tokio::pin!(give_up);
    let mut arrived = Instant::now();
    loop {
        loop {
            match decode(&mut buf) {
                Ok(Some(reply)) => {
                    let Some(at) = pending.lock().unwrap().pop_front() else {
                        counts.error("a reply without a request".into());
                        return counts;
                    };
                    if window.contains(arrived) {
                        counts.completed += 1;
                    }
                    if window.contains(at) {
                        counts.samples.push((arrived - at).as_nanos() as u64);
                        counts.reply(&reply);
                    }
                }
                Ok(None) => break,
                Err(err) => {
                    counts.error(format!("invalid RESP: {err:?}"));
                    return counts;
                }
            }
        }
        if *done.borrow() && pending.lock().unwrap().is_empty() {
            return counts;
        }
        buf.reserve(16 * 1024);
        tokio::select! {
            biased;
            read = stream.read_buf(&mut buf) => match read {
                Ok(0) => {
                    counts.error("connection closed".into());
                    return counts;
                }
                Ok(_) => arrived = Instant::now(),
                Err(err) => {
                    counts.error(format!("read: {err}"));
                    return counts;
                }
            },
            _ = done.changed(), if !*done.borrow() => {}
            () = &mut give_up => return counts,
        }
    }
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
    let mut site = Site::open(settings, target, hz).await?;
    let n = settings.latency_conns.max(1);
    let mut writers = Vec::with_capacity(n);
    let mut readers = Vec::with_capacity(n);
    for _ in 0..n {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], site.port));
        let stream = StdStream::connect_timeout(&addr, Duration::from_secs(5))
            .map_err(|e| format!("connect: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let reader = stream.try_clone().map_err(|e| e.to_string())?;
        // Both handles share one file description: both are non-blocking now.
        reader.set_nonblocking(true).map_err(|e| e.to_string())?;
        readers.push(tokio::net::TcpStream::from_std(reader).map_err(|e| e.to_string())?);
        writers.push(stream);
    }
    let pending: Vec<Pending> = (0..n).map(|_| Pending::default()).collect();
    let t0 = Instant::now() + Duration::from_millis(20);
    let start = t0 + Duration::from_secs_f64(settings.warmup);
    let window = Window {
        start,
        end: start + Duration::from_secs_f64(settings.latency_secs),
    };
    let (done_tx, done_rx) = watch::channel(false);
    let tasks: Vec<_> = readers
        .into_iter()
        .zip(&pending)
        .map(|(stream, p)| {
            tokio::spawn(read_all(
                stream,
                p.clone(),
                done_rx.clone(),
                window,
                window.end + DRAIN,
            ))
        })
        .collect();
    let (tag, ttl) = (unique_tag(), settings.ttl_ms.to_string());
    let queues = pending.clone();
    let sender = tokio::task::spawn_blocking(move || {
        let sent = send_all(writers, queues, t0, rate, window, tag, ttl);
        let _ = done_tx.send(true);
        sent
    });
    let cpu = site.probe.over(window).await;
    let sent = sender.await.map_err(|e| format!("sender: {e}"))?;
    let mut all = Vec::new();
    for t in tasks {
        all.push(t.await.unwrap_or_else(|e| {
            let mut c = Counts::default();
            c.error(format!("task: {e}"));
            c
        }));
    }
    let mut counts = Counts::merge(all);
    // Requests of the window still pending: never answered.
    let unanswered = pending
        .iter()
        .map(|p| {
            p.lock()
                .unwrap()
                .iter()
                .filter(|at| window.contains(**at))
                .count() as u64
        })
        .sum::<u64>();
    let scheduled = counts.granted + counts.nulls + counts.errors + unanswered + sent.unsent;
    counts.samples.extend(std::iter::repeat_n(
        NEVER,
        (unanswered + sent.unsent) as usize,
    ));
    let mut lags = sent.lags;
    lags.sort_unstable();
    if counts.first_error.is_none() {
        counts.first_error = sent.first_error;
    }
    Ok(OpenCell {
        target,
        round,
        point,
        offered: rate,
        scheduled,
        completed_per_sec: counts.completed as f64 / window.secs(),
        granted: counts.granted,
        nulls: counts.nulls,
        errors: counts.errors,
        first_error: counts.first_error,
        unsent: sent.unsent,
        unanswered,
        latency: percentiles(&counts.samples),
        max_us: counts
            .samples
            .last()
            .map_or(f64::NAN, |&ns| ns as f64 / 1000.0),
        send_lag: percentiles(&lags),
        cpu,
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
