//! Lock cycles: the load generator (direct or through the proxy; pre-encoded pipelines on the
//! test kit's RESP client) and the in-process client-side Redlock over the `redis` crate.

use crate::procs::CpuProbe;
use crate::settings::{ReleaseKind, Settings, Target};
use crate::stats::{CycleResult, Tally, Window, STALL_LIMIT};
use futures::stream::{self, StreamExt};
use redlock_proxy::on_master::COMPARE_AND_DELETE;
use redlock_proxy::LocalCluster;
use redlock_testkit::launcher::{ready_for_load, ProxyProcess};
use redlock_testkit::masters::pids;
use redlock_testkit::resp::{encode, Client, Reply};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Redlock drift allowance of the in-process client: `ttl × 0.01 + 2 ms`, as node redlock.
const DRIFT_FACTOR: f64 = 0.01;

/// The pre-encoded commands of one connection: `depth` keys, each with its acquire and its
/// release, concatenated so that a round is one write. Every token ends in a 16-hex-digit
/// round number that [`ConnPlan::stamp`] rewrites in place, so each acquire carries a fresh
/// value (as real clients send) without encoding anything per cycle.
pub struct ConnPlan {
    pub acquires: Vec<u8>,
    pub releases: Vec<u8>,
    /// Where each slot's release lies in `releases` (for rounds where not all were granted).
    pub release_spans: Vec<Range<usize>>,
    acquire_stamps: Vec<usize>,
    release_stamps: Vec<usize>,
}

const STAMP_LEN: usize = 16;

impl ConnPlan {
    pub fn new(
        tag: &str,
        conn: usize,
        depth: usize,
        ttl_ms: u64,
        release: &ReleaseCmd,
    ) -> ConnPlan {
        let ttl = ttl_ms.to_string();
        let mut plan = ConnPlan {
            acquires: Vec::new(),
            releases: Vec::new(),
            release_spans: Vec::new(),
            acquire_stamps: Vec::new(),
            release_stamps: Vec::new(),
        };
        for slot in 0..depth {
            let key = format!("lb:{tag}:{conn}:{slot}");
            let token = format!("tok-{tag}-{conn}-{slot}-{}", "0".repeat(STAMP_LEN));
            let acquire = encode(&[
                b"SET",
                key.as_bytes(),
                token.as_bytes(),
                b"NX",
                b"PX",
                ttl.as_bytes(),
            ]);
            let release = release.encode(&key, &token);
            // The token is the last bulk string of the release, the third of the acquire:
            // its stamp ends right before that argument's CRLF.
            let stamp_in = |cmd: &[u8]| -> usize {
                let at = cmd
                    .windows(token.len())
                    .rposition(|w| w == token.as_bytes())
                    .expect("the token is in the command");
                at + token.len() - STAMP_LEN
            };
            plan.acquire_stamps
                .push(plan.acquires.len() + stamp_in(&acquire));
            plan.release_stamps
                .push(plan.releases.len() + stamp_in(&release));
            let start = plan.releases.len();
            plan.release_spans.push(start..start + release.len());
            plan.acquires.extend_from_slice(&acquire);
            plan.releases.extend_from_slice(&release);
        }
        plan
    }

    pub fn depth(&self) -> usize {
        self.release_spans.len()
    }

    /// Writes `round` (hex) into every token.
    pub fn stamp(&mut self, round: u64) {
        let hex = format!("{round:016x}");
        for &at in &self.acquire_stamps {
            self.acquires[at..at + STAMP_LEN].copy_from_slice(hex.as_bytes());
        }
        for &at in &self.release_stamps {
            self.releases[at..at + STAMP_LEN].copy_from_slice(hex.as_bytes());
        }
    }
}

/// `EVALSHA sha 1 key token` or `EVAL body 1 key token`.
#[derive(Clone)]
pub struct ReleaseCmd {
    pub kind: ReleaseKind,
    pub sha: String,
}

impl ReleaseCmd {
    pub fn encode(&self, key: &str, token: &str) -> Vec<u8> {
        let (verb, script): (&[u8], &[u8]) = match self.kind {
            ReleaseKind::Evalsha => (b"EVALSHA", self.sha.as_bytes()),
            ReleaseKind::Eval => (b"EVAL", COMPARE_AND_DELETE.text().as_bytes()),
        };
        encode(&[verb, script, b"1", key.as_bytes(), token.as_bytes()])
    }
}

/// One connection's acquire→release loop: each round pipelines `depth` acquires, then the
/// releases of those that were granted. A cycle's latency is the acquire's reply time (from
/// its round's send) plus the release's reply time (from the release round's send).
pub async fn cycle_conn(mut conn: Client, mut plan: ConnPlan, window: Window) -> Tally {
    let mut tally = Tally::default();
    let depth = plan.depth();
    let deadline = window.end + STALL_LIMIT;
    let mut acquired_in = vec![Duration::ZERO; depth];
    let mut granted = Vec::with_capacity(depth);
    let mut release_buf = Vec::new();
    let mut round = 0;
    while Instant::now() < window.end {
        round += 1;
        plan.stamp(round);
        let sent = Instant::now();
        if let Err(err) = conn.write(&plan.acquires).await {
            tally.error(format!("write: {err}"));
            break;
        }
        granted.clear();
        for (slot, took) in acquired_in.iter_mut().enumerate() {
            match conn.read_reply(deadline).await {
                Ok(reply) => {
                    let arrived = conn.arrived();
                    if window.contains(arrived) {
                        tally.cmds += 1;
                    }
                    if reply.is_ok() {
                        *took = arrived - sent;
                        granted.push(slot);
                    } else if reply.is_null() {
                        if window.contains(arrived) {
                            tally.fails += 1;
                        }
                    } else {
                        tally.error(format!("acquire: {reply}"));
                    }
                }
                Err(err) => {
                    tally.error(format!("acquire: {err}"));
                    return tally;
                }
            }
        }
        if granted.is_empty() {
            continue;
        }
        let releases: &[u8] = if granted.len() == depth {
            &plan.releases
        } else {
            release_buf.clear();
            for &slot in &granted {
                release_buf.extend_from_slice(&plan.releases[plan.release_spans[slot].clone()]);
            }
            &release_buf
        };
        let sent = Instant::now();
        if let Err(err) = conn.write(releases).await {
            tally.error(format!("write: {err}"));
            break;
        }
        for &slot in &granted {
            match conn.read_reply(deadline).await {
                Ok(reply) => {
                    let arrived = conn.arrived();
                    let in_window = window.contains(arrived);
                    if in_window {
                        tally.cmds += 1;
                    }
                    match reply {
                        Reply::Int(1) if in_window => {
                            tally.cycles += 1;
                            let total = acquired_in[slot] + (arrived - sent);
                            tally.samples.push(total.as_nanos() as u64);
                        }
                        Reply::Int(1) => {}
                        Reply::Int(_) | Reply::Nil | Reply::NilArray | Reply::Null => {
                            if in_window {
                                tally.fails += 1;
                            }
                        }
                        other => tally.error(format!("release: {other}")),
                    }
                }
                Err(err) => {
                    tally.error(format!("release: {err}"));
                    return tally;
                }
            }
        }
    }
    tally
}

/// Connects `n` connections (at most 64 connects at once, 5 s each).
pub async fn connect_many(port: u16, n: usize) -> std::io::Result<Vec<Client>> {
    stream::iter(0..n)
        .map(|_| Client::open(port, Duration::from_secs(5)))
        .buffered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// Where one cell's load goes: a port, and the processes whose CPU is sampled.
pub struct Endpoint {
    pub port: u16,
    pub proxy: Option<ProxyProcess>,
    pub master_pids: Vec<u32>,
}

impl Endpoint {
    /// Direct to master 0, or a fresh proxy over the first `n` masters.
    pub fn open(
        settings: &Settings,
        masters: &LocalCluster,
        target: Target,
    ) -> std::io::Result<Self> {
        let master_pids = |n: usize| pids(&masters.masters[..n]);
        match target {
            Target::Direct => Ok(Endpoint {
                port: masters.masters[0].port,
                proxy: None,
                master_pids: master_pids(1),
            }),
            Target::Proxy(n) => {
                let proxy = settings.start_proxy(&masters.addrs()[..n])?;
                Ok(Endpoint {
                    port: proxy.port,
                    proxy: Some(proxy),
                    master_pids: master_pids(n),
                })
            }
        }
    }

    pub fn cpu_probe(&self, hz: f64) -> CpuProbe {
        CpuProbe::new(
            self.proxy.as_ref().map(ProxyProcess::pid),
            &self.master_pids,
            hz,
        )
    }

    /// A note if the proxy crashed or logged warnings during the cell.
    pub fn health_note(&mut self) -> Option<String> {
        self.proxy.as_mut().and_then(ProxyProcess::health_note)
    }
}

pub async fn run_cycle_cell(
    settings: &Settings,
    masters: &LocalCluster,
    target: Target,
    conns: usize,
    depth: usize,
    hz: f64,
) -> CycleResult {
    let scenario = target.label();
    let fail = |why: String| CycleResult::failed(scenario.clone(), target, conns, depth, why);
    let mut endpoint = match Endpoint::open(settings, masters, target) {
        Ok(e) => e,
        Err(err) => return fail(err.to_string()),
    };
    let sha = match ready_for_load(endpoint.port).await {
        Ok(sha) => sha,
        Err(err) => return fail(err.to_string()),
    };
    let release = ReleaseCmd {
        kind: settings.release,
        sha,
    };
    let tag = unique_tag();
    let streams = match connect_many(endpoint.port, conns).await {
        Ok(s) => s,
        Err(err) => return fail(format!("connect: {err}")),
    };
    let window = settings.window();
    let tasks: Vec<_> = streams
        .into_iter()
        .enumerate()
        .map(|(i, conn)| {
            let plan = ConnPlan::new(&tag, i, depth, settings.ttl_ms, &release);
            tokio::spawn(cycle_conn(conn, plan, window))
        })
        .collect();
    let cpu = endpoint.cpu_probe(hz).over(window).await;
    let tallies = join_tallies(tasks).await;
    let mut result = CycleResult::from_tally(
        scenario,
        target,
        conns,
        depth,
        Tally::merge(tallies),
        window,
        cpu,
    );
    result.note = endpoint.health_note();
    result
}

pub async fn join_tallies(tasks: Vec<tokio::task::JoinHandle<Tally>>) -> Vec<Tally> {
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        match task.await {
            Ok(t) => out.push(t),
            Err(err) => {
                let mut t = Tally::default();
                t.error(format!("task: {err}"));
                out.push(t);
            }
        }
    }
    out
}

pub fn unique_tag() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{:x}{nanos:x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

// ---------------------------------------------------------------------------------------------
// Section 2a: client-side Redlock in-process (the `redis` crate)
// ---------------------------------------------------------------------------------------------

/// One Redlock worker over multiplexed connections shared by all workers: concurrent
/// `SET NX PX` to every master, granted with a quorum and positive validity
/// (`ttl − elapsed − drift`), then the release script on every master (or, if refused, the
/// release as roll-back). Both rounds wait for every master's reply.
pub async fn redlock_worker(
    masters: Arc<Vec<redis::aio::MultiplexedConnection>>,
    script: Arc<redis::Script>,
    id: usize,
    tag: Arc<String>,
    ttl_ms: u64,
    window: Window,
) -> Tally {
    let mut tally = Tally::default();
    let quorum = masters.len() / 2 + 1;
    let drift = Duration::from_millis((ttl_ms as f64 * DRIFT_FACTOR) as u64 + 2);
    let ttl = Duration::from_millis(ttl_ms);
    let key = format!("rl:{tag}:{id}");
    let mut n: u64 = 0;
    while Instant::now() < window.end {
        n += 1;
        let token = format!("tok-{id}-{n}");
        let begin = Instant::now();
        let votes = futures::future::join_all(masters.iter().map(|m| {
            let mut m = m.clone();
            let mut set = redis::cmd("SET");
            set.arg(&key).arg(&token).arg("NX").arg("PX").arg(ttl_ms);
            async move { set.query_async::<redis::Value>(&mut m).await }
        }))
        .await;
        let mut granted = 0;
        for vote in &votes {
            match vote {
                Ok(redis::Value::Okay) => granted += 1,
                Ok(_) => {}
                Err(err) => tally.error(format!("SET: {err}")),
            }
        }
        let valid = ttl.saturating_sub(begin.elapsed()) > drift;
        let releases = futures::future::join_all(masters.iter().map(|m| {
            let mut m = m.clone();
            let mut invocation = script.key(&key);
            invocation.arg(&token);
            async move { invocation.invoke_async::<i64>(&mut m).await }
        }))
        .await;
        let done = Instant::now();
        if !window.contains(done) {
            continue;
        }
        tally.cmds += 2;
        let released = releases.iter().filter(|r| matches!(r, Ok(1))).count();
        if granted >= quorum && valid && released >= quorum {
            tally.cycles += 1;
            tally.samples.push((done - begin).as_nanos() as u64);
        } else {
            tally.fails += 1;
        }
        for err in releases.iter().filter_map(|r| r.as_ref().err()) {
            tally.error(format!("release: {err}"));
        }
    }
    tally
}

pub async fn run_clientside_cell(
    settings: &Settings,
    masters: &LocalCluster,
    workers: usize,
    hz: f64,
) -> CycleResult {
    let scenario = "client-side Redlock (redis crate) over 5".to_string();
    let target = Target::Proxy(5);
    let mut conns = Vec::new();
    for addr in masters.addrs() {
        let conn = async {
            redis::Client::open(format!("redis://{addr}/"))?
                .get_multiplexed_async_connection()
                .await
        };
        match conn.await {
            Ok(c) => conns.push(c),
            Err(err) => {
                return CycleResult::failed(scenario, target, workers, 1, format!("{addr}: {err}"))
            }
        }
    }
    let masters_conns = Arc::new(conns);
    let script = Arc::new(redis::Script::new(COMPARE_AND_DELETE.text()));
    let tag = Arc::new(unique_tag());
    let window = settings.window();
    let tasks: Vec<_> = (0..workers)
        .map(|id| {
            tokio::spawn(redlock_worker(
                masters_conns.clone(),
                script.clone(),
                id,
                tag.clone(),
                settings.ttl_ms,
                window,
            ))
        })
        .collect();
    let cpu = CpuProbe::new(None, &pids(&masters.masters), hz)
        .over(window)
        .await;
    let tallies = join_tallies(tasks).await;
    CycleResult::from_tally(
        scenario,
        target,
        workers,
        1,
        Tally::merge(tallies),
        window,
        cpu,
    )
}
