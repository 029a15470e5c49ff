//! The acquire load of `latency` and `overload`: fresh servers for one cell ([`Site`]), and
//! `SET PREFIX:TAG:ID v NX PX ttl` on a fresh key per request, closed loop ([`closed_loop`]) or
//! open loop ([`open_loop`]).
//!
//! - **Closed loop**: each of `conns` connections writes `depth` requests in one write, waits for
//!   their replies, writes the next `depth`. Latency = reply arrival − write.
//! - **Open loop**: batch *j* of `depth` requests is scheduled at `t0 + j × depth / rate` and goes
//!   out in one write on connection `j mod conns`, whether or not earlier requests were answered
//!   (at depth 1: request *i* at `t0 + i / rate`). Its latency is its reply's arrival minus its
//!   *scheduled* time, so a stall of the server (or of the load generator) is counted in full by
//!   every request that should have been sent during it (no coordinated omission). A request
//!   scheduled in the measured window that is never sent (its connection's socket stayed full
//!   until the window ended) or never answered (within [`DRAIN`] after the window, or the load's
//!   bound) counts as infinitely late.
//!
//! The open-loop sender is one OS thread (timer slack 1 µs) writing each batch with its own
//! `write` on non-blocking sockets; each connection's replies are read by a task on the harness's
//! runtime (the test kit's RESP decoder), woken by readiness, not by a timer. The sender's
//! lateness (actual write − scheduled time) is kept, so the load generator's own share of a
//! latency is visible. Every key is fresh, so every acquire should be granted: grants, nulls and
//! errors (by kind: the error's first word) are counted. CPU (/proc) of the proxy (or peer), the
//! masters, this process and everything else is sampled over the measured window.

use crate::cycles::{connect_many, unique_tag};
use crate::peers::{Peer, PeerProcess};
use crate::procs::{CpuProbe, CpuUse};
use crate::settings::{Settings, Target};
use crate::stats::Window;
use bytes::BytesMut;
use redlock_proxy::LocalCluster;
use redlock_testkit::launcher::{master_number, ready_for_load, ProxyProcess};
use redlock_testkit::masters::pids;
use redlock_testkit::resp::{decode, encode, Client, Reply};
use std::collections::{BTreeMap, VecDeque};
use std::io::Write as _;
use std::net::TcpStream as StdStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;

/// How long after the measured window the replies of its requests are waited for (a load
/// without a bound).
pub const DRAIN: Duration = Duration::from_secs(5);

/// A latency this large is a request never answered (or never sent).
pub const NEVER: u64 = u64::MAX;

/// What serves one cell's load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    /// One redis-server, no proxy.
    Direct,
    /// redlock-proxy over this many masters.
    Proxy(usize),
    /// A peer proxy (`peers.rs`) in front of this many masters.
    Peer(Peer, usize),
}

impl From<Target> for Server {
    fn from(target: Target) -> Server {
        match target {
            Target::Direct => Server::Direct,
            Target::Proxy(n) => Server::Proxy(n),
        }
    }
}

impl Server {
    pub fn masters(self) -> usize {
        match self {
            Server::Direct => 1,
            Server::Proxy(n) | Server::Peer(_, n) => n,
        }
    }
}

/// Fresh masters (one for a direct cell), a fresh proxy or peer in front of them, and what to
/// sample.
pub struct Site {
    pub port: u16,
    // Dropped in this order: the proxy or peer stops before its masters do.
    proxy: Option<ProxyProcess>,
    peer: Option<PeerProcess>,
    masters: LocalCluster,
    pub probe: CpuProbe,
}

impl Site {
    /// Starts the masters, then the proxy (waiting until it is ready for load: a cell that is
    /// not ready runs anyway, and shows it) or the peer.
    pub async fn open(settings: &Settings, server: Server, hz: f64) -> Result<Site, String> {
        let masters = LocalCluster::start(server.masters()).map_err(|e| e.to_string())?;
        let mut proxy = None;
        let mut peer = None;
        match server {
            Server::Direct => {}
            Server::Proxy(_) => {
                let started = settings
                    .start_proxy(&masters.addrs())
                    .map_err(|e| e.to_string())?;
                if let Err(err) = ready_for_load(started.port).await {
                    eprintln!("lockbench: warning: {err}");
                }
                proxy = Some(started);
            }
            Server::Peer(which, _) => {
                let bin = settings
                    .peer_bin(which)
                    .ok_or_else(|| format!("{} not found", settings.peer_bin_name(which)))?;
                let ports: Vec<u16> = masters.masters.iter().map(|m| m.port).collect();
                peer = Some(PeerProcess::start(which, &bin, &ports)?);
            }
        }
        let port = proxy
            .as_ref()
            .map(|p| p.port)
            .or(peer.as_ref().map(|p| p.port))
            .unwrap_or(masters.masters[0].port);
        let front = proxy
            .as_ref()
            .map(ProxyProcess::pid)
            .or(peer.as_ref().map(PeerProcess::pid));
        let probe = CpuProbe::new(front, &pids(&masters.masters), hz);
        Ok(Site {
            port,
            proxy,
            peer,
            masters,
            probe,
        })
    }

    /// The process the clients talk to: the proxy, the peer, or the redis-server.
    pub fn front_pid(&self) -> Option<u32> {
        match (&self.proxy, &self.peer) {
            (Some(proxy), _) => Some(proxy.pid()),
            (_, Some(peer)) => Some(peer.pid()),
            _ => self.masters.masters[0].pid(),
        }
    }

    /// The proxy's or the peer's exit, or the proxy's WARN/ERROR lines so far.
    pub fn note(&mut self) -> Option<String> {
        match (&mut self.proxy, &mut self.peer) {
            (Some(proxy), _) => proxy.health_note(),
            (_, Some(peer)) => peer.health_note(),
            _ => None,
        }
    }

    /// Lines the proxy logged at WARN or ERROR so far (`None` without a proxy).
    pub fn proxy_warnings(&self) -> Option<usize> {
        Some(self.proxy.as_ref()?.warnings.load(Ordering::Relaxed))
    }

    /// The proxy's master connections retired so far (aborted or lost, to be replaced): the sum
    /// of `retired_connections` over the master lines of its `INFO masters`. `None` without a
    /// proxy, or if it does not answer within 10 s.
    pub async fn retired_connections(&self) -> Option<u64> {
        let proxy = self.proxy.as_ref()?;
        let mut conn = Client::open(proxy.port, Duration::from_secs(5))
            .await
            .ok()?;
        let info = conn.request(&[b"INFO", b"masters"]).await.ok()?.text()?;
        let retired = (0..self.masters.masters.len())
            .map(|i| master_number(&info, i, "retired_connections"))
            .collect::<Option<Vec<i64>>>()?;
        Some(retired.iter().map(|n| *n as u64).sum())
    }
}

/// One cell's load: its shape and how long it runs.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    /// The keys' prefix (`lb:lat`, …): `PREFIX:TAG:ID`.
    pub prefix: &'static str,
    pub conns: usize,
    /// Requests per write: closed loop, in flight on each connection; open loop, scheduled
    /// together.
    pub depth: usize,
    pub ttl_ms: u64,
    /// Unmeasured seconds before the window, measured seconds.
    pub warmup: f64,
    pub secs: f64,
    /// With a bound, a reply later than this after its request's scheduled (open loop) or
    /// written (closed loop) time is counted as late, not by what it says, and replies are
    /// waited for this long after the window; without, for [`DRAIN`].
    pub bound: Option<Duration>,
}

impl Load {
    fn drain(&self) -> Duration {
        self.bound.unwrap_or(DRAIN)
    }

    /// `depth` requests `SET PREFIX:TAG:ID v NX PX ttl`, IDs `first..first + depth`.
    fn batch(&self, tag: &str, label: &str, first: u64) -> Vec<u8> {
        let ttl = self.ttl_ms.to_string();
        let mut out = Vec::new();
        for id in first..first + self.depth as u64 {
            let key = format!("{}:{tag}:{label}{id}", self.prefix);
            out.extend(encode(&[
                b"SET",
                key.as_bytes(),
                b"v",
                b"NX",
                b"PX",
                ttl.as_bytes(),
            ]));
        }
        out
    }
}

/// An error's kind: the first word of an error reply (`ERR`, `TRYAGAIN`, …), `client` for the
/// load generator's own failures (a connection lost, a reply that never came, …).
pub const CLIENT_ERROR: &str = "client";

/// Grants, nulls, errors and latencies (ns) of some requests.
#[derive(Default)]
pub struct Counts {
    pub granted: u64,
    pub nulls: u64,
    pub errors: u64,
    /// Errors by kind, with the first text of each.
    pub kinds: BTreeMap<String, (u64, String)>,
    pub first_error: Option<String>,
    /// Latencies of every reply counted, and of the grants alone (sorted once merged).
    pub samples: Vec<u64>,
    pub granted_ns: Vec<u64>,
    /// Replies that arrived inside the window (to any request), and the grants among them that
    /// came within the load's bound.
    pub completed: u64,
    pub good: u64,
    /// Replies to the window's requests that came later than the load's bound.
    pub late: u64,
}

impl Counts {
    fn reply(&mut self, reply: &Reply, ns: u64) {
        self.samples.push(ns);
        if reply.is_ok() {
            self.granted += 1;
            self.granted_ns.push(ns);
        } else if reply.is_null() {
            self.nulls += 1;
        } else {
            let text = format!("{reply}");
            let kind = match reply {
                Reply::Error(e) => String::from_utf8_lossy(e)
                    .split_whitespace()
                    .next()
                    .unwrap_or("(empty)")
                    .to_string(),
                _ => "unexpected".into(),
            };
            self.count_error(kind, text);
        }
    }

    /// A failure of the load generator itself (not a reply).
    fn error(&mut self, text: String) {
        self.count_error(CLIENT_ERROR.into(), text);
    }

    fn count_error(&mut self, kind: String, text: String) {
        self.errors += 1;
        let entry = self.kinds.entry(kind).or_insert_with(|| (0, text.clone()));
        entry.0 += 1;
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
            out.good += c.good;
            out.late += c.late;
            for (kind, (n, text)) in c.kinds {
                out.kinds.entry(kind).or_insert((0, text)).0 += n;
            }
            if out.first_error.is_none() {
                out.first_error = c.first_error;
            }
            out.samples.extend(c.samples);
            out.granted_ns.extend(c.granted_ns);
        }
        out.samples.sort_unstable();
        out.granted_ns.sort_unstable();
        out
    }

    /// A reply that arrived inside the window, `ns` after its request was scheduled or written.
    fn arrived_in_window(&mut self, reply: &Reply, ns: u64, bound: Option<Duration>) {
        self.completed += 1;
        if reply.is_ok() && !too_late(ns, bound) {
            self.good += 1;
        }
    }

    /// A reply to a request of the window that arrived `ns` after it was scheduled or written.
    fn answer(&mut self, reply: &Reply, ns: u64, bound: Option<Duration>) {
        if too_late(ns, bound) {
            self.late += 1;
        } else {
            self.reply(reply, ns);
        }
    }

    fn failed_task(err: tokio::task::JoinError) -> Counts {
        let mut c = Counts::default();
        c.error(format!("task: {err}"));
        c
    }
}

fn too_late(ns: u64, bound: Option<Duration>) -> bool {
    bound.is_some_and(|b| ns > b.as_nanos() as u64)
}

/// What one cell's load measured.
pub struct Outcome {
    pub window: Window,
    pub counts: Counts,
    /// Open loop: requests of the window never sent / sent and never answered.
    pub unsent: u64,
    pub unanswered: u64,
    /// Open loop: the sender's lateness (write − scheduled time) in the window, ns, sorted.
    pub lags: Vec<u64>,
    pub cpu: CpuUse,
}

impl Outcome {
    /// Open loop: the requests scheduled in the window.
    pub fn scheduled(&self) -> u64 {
        let c = &self.counts;
        c.granted + c.nulls + c.errors + c.late + self.unanswered + self.unsent
    }
}

/// Closed loop on `port` (see the module header); the window starts after the warm-up.
pub async fn closed_loop(port: u16, probe: &CpuProbe, load: &Load) -> Result<Outcome, String> {
    let conns = connect_many(port, load.conns)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let start = Instant::now() + Duration::from_secs_f64(load.warmup);
    let window = Window {
        start,
        end: start + Duration::from_secs_f64(load.secs),
    };
    let tag = unique_tag();
    let load = *load;
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(c, mut conn)| {
            let tag = tag.clone();
            tokio::spawn(async move {
                let mut counts = Counts::default();
                let label = format!("p{c}:");
                let mut n = 0u64;
                'run: while Instant::now() < window.end {
                    let batch = load.batch(&tag, &label, n);
                    n += load.depth as u64;
                    let sent = Instant::now();
                    if let Err(err) = conn.write(&batch).await {
                        counts.error(format!("write: {err}"));
                        break;
                    }
                    for _ in 0..load.depth {
                        match conn.read_reply(window.end + load.drain()).await {
                            Ok(reply) => {
                                let arrived = conn.arrived();
                                if window.contains(arrived) {
                                    let ns = (arrived - sent).as_nanos() as u64;
                                    counts.arrived_in_window(&reply, ns, load.bound);
                                    counts.answer(&reply, ns, load.bound);
                                }
                            }
                            Err(err) => {
                                counts.error(format!("read: {err}"));
                                break 'run;
                            }
                        }
                    }
                }
                counts
            })
        })
        .collect();
    let cpu = probe.over(window).await;
    let mut all = Vec::new();
    for t in tasks {
        all.push(t.await.unwrap_or_else(Counts::failed_task));
    }
    Ok(Outcome {
        window,
        counts: Counts::merge(all),
        unsent: 0,
        unanswered: 0,
        lags: Vec::new(),
        cpu,
    })
}

/// When an open-loop load runs: `t0` (its first request) and the measured window after the
/// warm-up. Known before [`open_loop`] starts, so that other clients can run beside it.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub t0: Instant,
    pub window: Window,
}

impl Plan {
    /// Starting in 20 ms.
    pub fn new(load: &Load) -> Plan {
        let t0 = Instant::now() + Duration::from_millis(20);
        let start = t0 + Duration::from_secs_f64(load.warmup);
        Plan {
            t0,
            window: Window {
                start,
                end: start + Duration::from_secs_f64(load.secs),
            },
        }
    }
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
    /// The connection failed, or stayed full in the middle of a batch.
    Broken(String),
}

/// Writes all of `bytes` to a non-blocking socket, waiting for room in 50 µs steps; gives up
/// on a batch not begun at `give_up`, and on the connection at `give_up + DRAIN`.
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

/// The sender thread: batch `j` at `t0 + j × depth / rate` on connection `j mod n`, until the
/// window's end (batches scheduled before it and not yet sent are still sent, late).
fn send_all(
    mut writers: Vec<StdStream>,
    pending: Vec<Pending>,
    plan: Plan,
    load: Load,
    rate: f64,
    tag: String,
) -> Sent {
    // SAFETY: prctl(PR_SET_TIMERSLACK) changes only this thread's timer slack (1 µs instead of
    // 50 µs), so that its sleeps end close to the next scheduled time.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0);
    }
    let window = plan.window;
    let depth = load.depth as u64;
    let mut sent = Sent::default();
    let mut broken = vec![false; writers.len()];
    let interval = 1e9 * depth as f64 / rate;
    for j in 0u64.. {
        let at = plan.t0 + Duration::from_nanos((j as f64 * interval) as u64);
        if at >= window.end {
            break;
        }
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
        let c = (j % writers.len() as u64) as usize;
        let in_window = window.contains(at);
        if broken[c] {
            sent.unsent += u64::from(in_window) * depth;
            continue;
        }
        let batch = load.batch(&tag, "", j * depth);
        pending[c]
            .lock()
            .unwrap()
            .extend(std::iter::repeat_n(at, load.depth));
        match write_all(&mut writers[c], &batch, window.end) {
            Ok(()) => {
                if in_window {
                    sent.lags.push((Instant::now() - at).as_nanos() as u64);
                }
            }
            Err(WriteFailed::NotSent) => {
                // Nothing of this batch reached the socket: its replies will never come (the
                // reader cannot have taken its entries: it takes one only for a reply, and
                // replies come in order).
                let mut queue = pending[c].lock().unwrap();
                let kept = queue.len() - load.depth;
                queue.truncate(kept);
                sent.unsent += u64::from(in_window) * depth;
            }
            Err(WriteFailed::Broken(why)) => {
                // Part of the batch may have gone out: its entries stay pending, answered or
                // not; the connection's later batches are not sent.
                broken[c] = true;
                if sent.first_error.is_none() {
                    sent.first_error = Some(format!("write: {why}"));
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
    bound: Option<Duration>,
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
                    let ns = (arrived - at).as_nanos() as u64;
                    if window.contains(arrived) {
                        counts.arrived_in_window(&reply, ns, bound);
                    }
                    if window.contains(at) {
                        counts.answer(&reply, ns, bound);
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

/// Open loop on `port` at `rate` requests per second (see the module header), as planned.
pub async fn open_loop(
    port: u16,
    probe: &CpuProbe,
    load: &Load,
    rate: f64,
    plan: Plan,
) -> Result<Outcome, String> {
    let n = load.conns.max(1);
    let mut writers = Vec::with_capacity(n);
    let mut readers = Vec::with_capacity(n);
    for _ in 0..n {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
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
    let window = plan.window;
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
                window.end + load.drain(),
                load.bound,
            ))
        })
        .collect();
    let (queues, load_copy) = (pending.clone(), *load);
    let sender = tokio::task::spawn_blocking(move || {
        let sent = send_all(writers, queues, plan, load_copy, rate, unique_tag());
        let _ = done_tx.send(true);
        sent
    });
    let cpu = probe.over(window).await;
    let sent = sender.await.map_err(|e| format!("sender: {e}"))?;
    let mut all = Vec::new();
    for t in tasks {
        all.push(t.await.unwrap_or_else(Counts::failed_task));
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
    let mut lags = sent.lags;
    lags.sort_unstable();
    if counts.first_error.is_none() {
        counts.first_error = sent.first_error;
    }
    Ok(Outcome {
        window,
        counts,
        unsent: sent.unsent,
        unanswered,
        lags,
        cpu,
    })
}
