//! Wake-ups of blocked lock waiters (issue 25, item 4): how soon a waiter that waits to be woken
//! gets the lock after the holder's release, directly on one redis-server and through the proxy
//! over 3 and 5 masters, and what 1,000 blocked waiters cost while nothing happens.
//!
//! - **python-redis-lock** ([`Kind::List`]): the holder holds `lock:K` (`SET NX PX 30000`); the
//!   waiter's `SET NX PX` fails, it sends `BLPOP lock-signal:K 0`; the holder releases with the
//!   library's UNLOCK script (by `EVALSHA`, as redis-py's `Script` calls it); when `BLPOP`
//!   returns, the waiter's retry is granted.
//! - **Redisson** ([`Kind::PubSub`]): the waiter `SUBSCRIBE`s (its own connection) to
//!   `redisson_lock__channel:{K}`, its `SET NX PX` fails, it waits for a message; the holder's
//!   release script deletes the lock and publishes `0`; on the message the waiter's retry is
//!   granted.
//!
//! Latency = the release written → the waiter's `OK` arrived ("granted"; "woken" = the `BLPOP`
//! reply or the message arrived). Each round is one fresh key per target and kind, the release
//! is written only once the waiter is blocked (redis-server: `blocked_clients`; the proxy: every
//! master counted the waiter's first pop try, `LMPOP`; pub/sub: the `SUBSCRIBE` was confirmed)
//! and [`SETTLE`] later. Targets, kinds and a few `PING`s to a master (the master round trip of
//! the bound) are interleaved in every round. Rounds stop at `BENCH_WAKEUP_ROUNDS` or after
//! `BENCH_WAKEUP_SECS`.
//!
//! [`run_idle`]: `BENCH_WAKEUP_WAITERS` connections blocked in `BLPOP key 0` on
//! `BENCH_WAKEUP_KEYS` keys: resident memory before and after, CPU of the server and the
//! masters' commands over `BENCH_WAKEUP_IDLE_SECS` idle seconds without and with the waiters,
//! then one push on each key and who woke.

use crate::procs::{vm_rss_bytes, CpuProbe};
use crate::settings::{Settings, Target};
use crate::stats::{percentiles, Latency};
use futures::stream::{self, StreamExt};
use redlock_proxy::on_master::COMPARE_AND_DELETE;
use redlock_testkit::resp::{encode, Client, Reply};
use std::io;
use std::time::{Duration, Instant};

/// python-redis-lock's release script (`redis_lock.UNLOCK_SCRIPT`), exactly.
pub const UNLOCK: &str = r#"if redis.call("get", KEYS[1]) ~= ARGV[1] then return 1 else redis.call("del", KEYS[2]) redis.call("lpush", KEYS[2], 1) redis.call("pexpire", KEYS[2], ARGV[2]) redis.call("del", KEYS[1]) return 0 end"#;
/// A Redisson-style release: delete the lock, publish the unlock message on the lock's channel.
pub const PUBLISH_UNLOCK: &str =
    "redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], ARGV[1]); return 1";
/// The wake-up target: the waiter granted within this much + one master round trip.
pub const BOUND_US: f64 = 5_000.0;
/// The idle target: the proxy's resident memory grows by less than this for the waiters.
pub const MEMORY_LIMIT: u64 = 10_000_000;
/// How long the waiter stays blocked before the release is written.
pub const SETTLE: Duration = Duration::from_millis(5);
/// Unmeasured rounds before the measured ones (first script call, first subscription).
pub const WARMUP_ROUNDS: usize = 3;
/// `PING`s to a master per round.
const PINGS_PER_ROUND: usize = 3;
/// Longest a round (or one step of it) may take before it counts as failed.
const ROUND_LIMIT: Duration = Duration::from_secs(5);
/// How long the idle waiters may take to be woken by the pushes.
pub const WOKEN_LIMIT: Duration = Duration::from_secs(3);
const HOLDER: &[u8] = b"holder";
const WAITER: &[u8] = b"waiter";

/// How a waiter waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// python-redis-lock: `BLPOP lock-signal:K 0`.
    List,
    /// Redisson: a message on `redisson_lock__channel:{K}`.
    PubSub,
}

impl Kind {
    pub const ALL: [Kind; 2] = [Kind::List, Kind::PubSub];

    pub fn label(self) -> &'static str {
        match self {
            Kind::List => "python-redis-lock (BLPOP)",
            Kind::PubSub => "Redisson-style (SUBSCRIBE)",
        }
    }
}

/// The measured rounds of one kind against one target.
#[derive(Clone, Debug)]
pub struct WakeCell {
    pub kind: Kind,
    pub target: Target,
    /// Release written → the waiter's grant arrived, ns, sorted.
    pub granted: Vec<u64>,
    /// Release written → the `BLPOP` reply or the message arrived, ns, sorted.
    pub woken: Vec<u64>,
    pub failures: u64,
    pub first_error: Option<String>,
    /// Pub/sub messages beyond the first for one release (copies the proxy did not drop).
    pub duplicates: u64,
    pub note: Option<String>,
}

impl WakeCell {
    pub fn latency(&self) -> Option<Latency> {
        percentiles(&self.granted)
    }

    pub fn woken_latency(&self) -> Option<Latency> {
        percentiles(&self.woken)
    }

    /// The slowest grant, µs.
    pub fn max_us(&self) -> Option<f64> {
        self.granted.last().map(|ns| *ns as f64 / 1000.0)
    }
}

/// Everything [`run_latency`] measured.
#[derive(Clone, Debug, Default)]
pub struct WakeRun {
    pub cells: Vec<WakeCell>,
    /// `PING` round trips to a master, ns, sorted.
    pub rtt: Vec<u64>,
    pub rounds: usize,
    pub secs: f64,
}

impl WakeRun {
    pub fn cell(&self, kind: Kind, target: Target) -> Option<&WakeCell> {
        self.cells
            .iter()
            .find(|c| c.kind == kind && c.target == target)
    }

    /// One master round trip (the p50 of the `PING`s), µs.
    pub fn rtt_p50(&self) -> Option<f64> {
        percentiles(&self.rtt).map(|l| l.p50)
    }

    /// 5 ms + one master round trip, µs.
    pub fn bound_us(&self) -> Option<f64> {
        self.rtt_p50().map(|rtt| BOUND_US + rtt)
    }
}

/// Where one target's rounds run: the port clients talk to, and what shows a blocked waiter.
pub struct Endpoint {
    pub target: Target,
    pub port: u16,
    /// The masters behind a proxy (their `LMPOP` counts show the waiter's first try); empty
    /// for a redis-server (its `blocked_clients` shows it).
    pub masters: Vec<u16>,
}

/// The connections of one target.
struct Rig {
    target: Target,
    port: u16,
    holder: Client,
    waiter: Client,
    subscriber: Client,
    /// One connection to each master behind a proxy, or to the redis-server itself.
    watch: Vec<Client>,
    behind_proxy: bool,
    unlock_sha: Vec<u8>,
}

fn other<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |err| format!("{what}: {err}")
}

impl Rig {
    async fn open(end: &Endpoint) -> io::Result<Rig> {
        let open = |port| Client::open(port, Duration::from_secs(5));
        let behind_proxy = !end.masters.is_empty();
        let watched = if behind_proxy {
            end.masters.clone()
        } else {
            vec![end.port]
        };
        let mut watch = Vec::new();
        for port in watched {
            watch.push(open(port).await?);
        }
        let mut holder = open(end.port).await?;
        let loaded = holder
            .request(&[b"SCRIPT", b"LOAD", UNLOCK.as_bytes()])
            .await?;
        let Reply::Bulk(sha) = loaded else {
            return Err(io::Error::other(format!("SCRIPT LOAD answered {loaded}")));
        };
        Ok(Rig {
            target: end.target,
            port: end.port,
            holder,
            waiter: open(end.port).await?,
            subscriber: open(end.port).await?,
            watch,
            behind_proxy,
            unlock_sha: sha.to_vec(),
        })
    }

    /// Fresh connections after a failed round (replies may still be on their way).
    async fn reopen(&mut self) -> io::Result<()> {
        let open = |port| Client::open(port, Duration::from_secs(5));
        self.holder = open(self.port).await?;
        self.waiter = open(self.port).await?;
        self.subscriber = open(self.port).await?;
        Ok(())
    }

    /// Per watched server: `LMPOP` calls (masters behind a proxy) or `blocked_clients`.
    async fn counters(&mut self) -> Result<Vec<u64>, String> {
        let mut out = Vec::with_capacity(self.watch.len());
        for conn in &mut self.watch {
            let n = if self.behind_proxy {
                let reply = conn.request(&[b"INFO", b"commandstats"]).await;
                lmpop_calls(&reply.map_err(other("INFO commandstats"))?)
            } else {
                let reply = conn.request(&[b"INFO", b"clients"]).await;
                info_field(&reply.map_err(other("INFO clients"))?, "blocked_clients")
            };
            out.push(n.ok_or("no counter in INFO")?);
        }
        Ok(out)
    }

    /// Waits until the waiter is blocked: every master behind the proxy counted its try since
    /// `before`, or the redis-server counts a blocked client.
    async fn wait_blocked(&mut self, before: &[u64]) -> Result<(), String> {
        let deadline = Instant::now() + ROUND_LIMIT;
        loop {
            let now = self.counters().await?;
            let blocked = if self.behind_proxy {
                now.iter().zip(before).all(|(n, b)| n > b)
            } else {
                now.first().is_some_and(|n| *n >= 1)
            };
            if blocked {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("the waiter was not blocked within {ROUND_LIMIT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// One python-redis-lock round on fresh keys `lock:K`, `lock-signal:K`.
    async fn list_round(&mut self, k: &str) -> Result<Sample, String> {
        let (lock, signal) = (format!("lock:{k}"), format!("lock-signal:{k}"));
        let (lock, signal) = (lock.as_bytes(), signal.as_bytes());
        let acquire = |who: &'static [u8]| encode(&[b"SET", lock, who, b"NX", b"PX", b"30000"]);
        take(&mut self.holder, lock).await?;
        let refused = request_raw(&mut self.waiter, &acquire(WAITER)).await?;
        if !refused.is_null() {
            return Err(format!("the waiter's first SET NX answered {refused}"));
        }
        let before = self.counters().await?;
        let blpop = encode(&[b"BLPOP", signal, b"0"]);
        self.waiter.write(&blpop).await.map_err(other("BLPOP"))?;
        self.wait_blocked(&before).await?;
        tokio::time::sleep(SETTLE).await;
        let release = encode(&[
            b"EVALSHA",
            &self.unlock_sha,
            b"2",
            lock,
            signal,
            HOLDER,
            b"1000",
        ]);
        let retry = acquire(WAITER);
        let deadline = Instant::now() + ROUND_LIMIT;
        let (holder, waiter) = (&mut self.holder, &mut self.waiter);
        let sent = Instant::now();
        holder.write(&release).await.map_err(other("release"))?;
        let (released, woken) = tokio::join!(holder.read_reply(deadline), async {
            let popped = waiter.read_reply(deadline).await?;
            let woken = waiter.arrived();
            waiter.write(&retry).await?;
            let granted = waiter.read_reply(deadline).await?;
            io::Result::Ok((popped, woken, granted, waiter.arrived()))
        });
        let released = released.map_err(other("release reply"))?;
        let (popped, woken, granted, at) = woken.map_err(other("waiter"))?;
        let expected = Reply::Array(vec![
            Reply::Bulk(signal.to_vec().into()),
            Reply::Bulk("1".into()),
        ]);
        if popped != expected {
            return Err(format!("BLPOP answered {popped}"));
        }
        if released != Reply::Int(0) {
            return Err(format!("the UNLOCK script answered {released}"));
        }
        if !granted.is_ok() {
            return Err(format!("woken, but the retried SET NX answered {granted}"));
        }
        give_back(&mut self.waiter, lock).await?;
        Ok(Sample::new(sent, woken, at, 0))
    }

    /// One Redisson-style round on a fresh lock `lock:K` and channel `redisson_lock__channel:{K}`.
    async fn pubsub_round(&mut self, k: &str) -> Result<Sample, String> {
        let (lock, channel) = (
            format!("lock:{k}"),
            format!("redisson_lock__channel:{{{k}}}"),
        );
        let (lock, channel) = (lock.as_bytes(), channel.as_bytes());
        let acquire = |who: &'static [u8]| encode(&[b"SET", lock, who, b"NX", b"PX", b"30000"]);
        take(&mut self.holder, lock).await?;
        let deadline = Instant::now() + ROUND_LIMIT;
        let sub = &mut self.subscriber;
        sub.write(&encode(&[b"SUBSCRIBE", channel]))
            .await
            .map_err(other("SUBSCRIBE"))?;
        let (_, skipped) = read_until(sub, deadline, |r| is_push(r, b"subscribe", channel)).await?;
        let refused = request_raw(&mut self.waiter, &acquire(WAITER)).await?;
        if !refused.is_null() {
            return Err(format!("the waiter's first SET NX answered {refused}"));
        }
        tokio::time::sleep(SETTLE).await;
        let release = encode(&[
            b"EVAL",
            PUBLISH_UNLOCK.as_bytes(),
            b"2",
            lock,
            channel,
            b"0",
        ]);
        let retry = acquire(WAITER);
        let deadline = Instant::now() + ROUND_LIMIT;
        let (holder, waiter, sub) = (&mut self.holder, &mut self.waiter, &mut self.subscriber);
        let sent = Instant::now();
        holder.write(&release).await.map_err(other("release"))?;
        let (released, woken) = tokio::join!(holder.read_reply(deadline), async {
            read_until(sub, deadline, |r| is_push(r, b"message", channel)).await?;
            let woken = sub.arrived();
            waiter.write(&retry).await.map_err(other("retry"))?;
            let granted = waiter.read_reply(deadline).await.map_err(other("retry"))?;
            Ok::<_, String>((woken, granted, waiter.arrived()))
        });
        let released = released.map_err(other("release reply"))?;
        let (woken, granted, at) = woken?;
        if released != Reply::Int(1) {
            return Err(format!("the release script answered {released}"));
        }
        if !granted.is_ok() {
            return Err(format!("woken, but the retried SET NX answered {granted}"));
        }
        give_back(&mut self.waiter, lock).await?;
        let sub = &mut self.subscriber;
        sub.write(&encode(&[b"UNSUBSCRIBE", channel]))
            .await
            .map_err(other("UNSUBSCRIBE"))?;
        let deadline = Instant::now() + ROUND_LIMIT;
        let (_, late) = read_until(sub, deadline, |r| is_push(r, b"unsubscribe", channel)).await?;
        Ok(Sample::new(sent, woken, at, skipped + late))
    }
}

/// One measured round.
struct Sample {
    woken_ns: u64,
    granted_ns: u64,
    duplicates: u64,
}

impl Sample {
    fn new(sent: Instant, woken: Instant, granted: Instant, duplicates: u64) -> Sample {
        let ns = |t: Instant| t.saturating_duration_since(sent).as_nanos() as u64;
        Sample {
            woken_ns: ns(woken),
            granted_ns: ns(granted),
            duplicates,
        }
    }
}

async fn request_raw(conn: &mut Client, command: &[u8]) -> Result<Reply, String> {
    conn.write(command).await.map_err(other("write"))?;
    conn.read_reply(Instant::now() + ROUND_LIMIT)
        .await
        .map_err(other("read"))
}

/// The holder's `SET lock holder NX PX 30000`, which must be granted.
async fn take(holder: &mut Client, lock: &[u8]) -> Result<(), String> {
    let command = encode(&[b"SET", lock, HOLDER, b"NX", b"PX", b"30000"]);
    let reply = request_raw(holder, &command).await?;
    if reply.is_ok() {
        Ok(())
    } else {
        Err(format!("the holder's SET NX answered {reply}"))
    }
}

/// The waiter releases what it was granted (compare-and-delete, not measured).
async fn give_back(waiter: &mut Client, lock: &[u8]) -> Result<(), String> {
    let script = COMPARE_AND_DELETE.text().as_bytes();
    let command = encode(&[b"EVAL", script, b"1", lock, WAITER]);
    match request_raw(waiter, &command).await? {
        Reply::Int(1) => Ok(()),
        other => Err(format!("the waiter's release answered {other}")),
    }
}

/// Reads replies until one satisfies `wanted`; also returns how many messages came before it.
async fn read_until(
    conn: &mut Client,
    deadline: Instant,
    wanted: impl Fn(&Reply) -> bool,
) -> Result<(Reply, u64), String> {
    let mut skipped = 0;
    loop {
        let reply = conn.read_reply(deadline).await.map_err(other("read"))?;
        if wanted(&reply) {
            return Ok((reply, skipped));
        }
        if !matches!(&reply, Reply::Array(items) if items.first() == Some(&Reply::Bulk("message".into())))
        {
            return Err(format!("unexpected {reply} on the subscriber connection"));
        }
        skipped += 1;
    }
}

/// `[kind, channel, …]` as RESP2 subscribed mode frames it.
fn is_push(reply: &Reply, kind: &[u8], channel: &[u8]) -> bool {
    match reply {
        Reply::Array(items) => {
            items.first() == Some(&Reply::Bulk(kind.to_vec().into()))
                && items.get(1) == Some(&Reply::Bulk(channel.to_vec().into()))
        }
        _ => false,
    }
}

/// `cmdstat_lmpop` calls in an `INFO commandstats` reply (0 before the first call).
fn lmpop_calls(reply: &Reply) -> Option<u64> {
    let text = reply.text()?;
    Some(
        text.lines()
            .find_map(|l| l.strip_prefix("cmdstat_lmpop:calls="))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0),
    )
}

/// A numeric `field:value` line of an INFO reply.
fn info_field(reply: &Reply, field: &str) -> Option<u64> {
    let text = reply.text()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

/// The wake-up rounds: every endpoint, both kinds, and `PING`s to `ping_port`, interleaved.
pub async fn run_latency(s: &Settings, endpoints: &[Endpoint], ping_port: u16) -> WakeRun {
    let mut run = WakeRun::default();
    let tag = crate::cycles::unique_tag();
    let mut rigs = Vec::new();
    for end in endpoints {
        match Rig::open(end).await {
            Ok(rig) => rigs.push(rig),
            Err(err) => run.cells.push(WakeCell {
                note: Some(format!("cannot connect: {err}")),
                failures: 1,
                ..WakeCell::empty(Kind::List, end.target)
            }),
        }
        for kind in Kind::ALL {
            if run.cell(kind, end.target).is_none() {
                run.cells.push(WakeCell::empty(kind, end.target));
            }
        }
    }
    let mut ping = match Client::open(ping_port, Duration::from_secs(5)).await {
        Ok(c) => Some(c),
        Err(err) => {
            crate::progress(&format!("wakeup: no PING connection to {ping_port}: {err}"));
            None
        }
    };
    let began = Instant::now();
    let limit = Duration::from_secs_f64(s.wakeup_secs);
    for round in 0..WARMUP_ROUNDS + s.wakeup_rounds {
        let measured = round >= WARMUP_ROUNDS;
        if measured && began.elapsed() > limit {
            break;
        }
        // Rotate which target goes first, so none always follows the same one.
        let first = round % rigs.len().max(1);
        let n = rigs.len();
        for i in 0..n {
            let rig = &mut rigs[(first + i) % n];
            for kind in Kind::ALL {
                let k = format!("wk:{tag}:{}:{round}:{kind:?}", rig.port);
                let result = match kind {
                    Kind::List => rig.list_round(&k).await,
                    Kind::PubSub => rig.pubsub_round(&k).await,
                };
                let target = rig.target;
                let Some(cell) = run
                    .cells
                    .iter_mut()
                    .find(|c| c.kind == kind && c.target == target)
                else {
                    continue;
                };
                match result {
                    Ok(sample) if measured => {
                        cell.granted.push(sample.granted_ns);
                        cell.woken.push(sample.woken_ns);
                        cell.duplicates += sample.duplicates;
                    }
                    Ok(_) => {}
                    Err(err) => {
                        cell.failures += 1;
                        if cell.first_error.is_none() {
                            crate::progress(&format!(
                                "wakeup {} {}: {err}",
                                kind.label(),
                                target.label()
                            ));
                            cell.first_error = Some(err);
                        }
                        if let Err(err) = rig.reopen().await {
                            cell.note = Some(format!("cannot reconnect: {err}"));
                        }
                    }
                }
            }
        }
        if let (Some(conn), true) = (ping.as_mut(), measured) {
            for _ in 0..PINGS_PER_ROUND {
                let sent = Instant::now();
                if conn.write(b"*1\r\n$4\r\nPING\r\n").await.is_err()
                    || conn.read_reply(Instant::now() + ROUND_LIMIT).await.is_err()
                {
                    ping = None;
                    break;
                }
                run.rtt.push((conn.arrived() - sent).as_nanos() as u64);
            }
        }
        if measured {
            run.rounds += 1;
        }
    }
    run.secs = began.elapsed().as_secs_f64();
    run.rtt.sort_unstable();
    for cell in &mut run.cells {
        cell.granted.sort_unstable();
        cell.woken.sort_unstable();
    }
    run
}

impl WakeCell {
    fn empty(kind: Kind, target: Target) -> WakeCell {
        WakeCell {
            kind,
            target,
            granted: Vec::new(),
            woken: Vec::new(),
            failures: 0,
            first_error: None,
            duplicates: 0,
            note: None,
        }
    }
}

/// Many blocked waiters and nothing happening: what they cost one server.
#[derive(Clone, Debug, Default)]
pub struct IdleResult {
    pub scenario: String,
    pub direct: bool,
    pub waiters: usize,
    pub keys: usize,
    /// Waiters whose `BLPOP` was sent.
    pub opened: usize,
    pub rss_before: u64,
    pub rss_after: u64,
    pub idle_secs: f64,
    /// CPU ticks of the server (the proxy, or the redis-server) over the idle window, without
    /// and with the waiters.
    pub ticks_empty: u64,
    pub ticks_waiting: u64,
    /// CPU ticks of the masters behind the proxy over the same windows.
    pub master_ticks_empty: u64,
    pub master_ticks_waiting: u64,
    /// `LMPOP` calls on the masters (redis-server: its own) over the idle windows.
    pub lmpop_empty: u64,
    pub lmpop_waiting: u64,
    /// Every command except INFO on the masters over the idle windows.
    pub calls_empty: u64,
    pub calls_waiting: u64,
    /// After one push on each key: keys with at least one waiter woken, waiters woken, the
    /// most waiters one push woke.
    pub keys_woken: usize,
    pub waiters_woken: usize,
    pub most_woken_by_one_push: usize,
    /// Pop commands the masters ran for the pushes (`LMPOP`; redis-server: its `BLPOP`s).
    pub pops_for_pushes: u64,
    /// The pushes written → each key's first waiter woken, µs: median and slowest key.
    pub first_wake_p50_us: Option<f64>,
    pub first_wake_max_us: Option<f64>,
    /// VmRSS growth of a fresh process of the same kind for as many plain idle connections
    /// (one `PING` each, as the `memory` section opens them): what the connections cost without
    /// blocking.
    pub plain_growth: Option<i64>,
    pub hz: f64,
    pub note: Option<String>,
}

impl IdleResult {
    pub fn rss_growth(&self) -> i64 {
        self.rss_after as i64 - self.rss_before as i64
    }

    /// What blocking added beyond as many plain idle connections, bytes.
    pub fn blocking_growth(&self) -> Option<i64> {
        self.plain_growth.map(|plain| self.rss_growth() - plain)
    }
}

/// `LMPOP` calls and every call except INFO, summed over `ports`.
async fn master_calls(ports: &[u16]) -> io::Result<(u64, u64)> {
    let stats = crate::contention::total_command_stats(ports).await?;
    let lmpop = stats.get("lmpop").copied().unwrap_or(0);
    let all = stats
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .map(|(_, calls)| calls)
        .sum();
    Ok((lmpop, all))
}

/// `LMPOP` + `BLPOP` calls summed over `ports`.
async fn pop_calls(ports: &[u16]) -> io::Result<u64> {
    let stats = crate::contention::total_command_stats(ports).await?;
    Ok(["lmpop", "blpop"]
        .iter()
        .map(|name| stats.get(*name).copied().unwrap_or(0))
        .sum())
}

/// `blocked_clients` of a redis-server.
async fn blocked_clients(port: u16) -> io::Result<u64> {
    let mut conn = Client::open(port, Duration::from_secs(5)).await?;
    let reply = conn.request(&[b"INFO", b"clients"]).await?;
    info_field(&reply, "blocked_clients").ok_or_else(|| io::Error::other("no blocked_clients"))
}

/// One idle window: the server's and the masters' CPU ticks, the masters' calls.
async fn idle_window(
    probe: &CpuProbe,
    hz: f64,
    secs: f64,
    ports: &[u16],
) -> io::Result<(u64, u64, u64, u64)> {
    let (lmpop_a, all_a) = master_calls(ports).await?;
    let a = probe.snap();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    let b = probe.snap();
    let (lmpop_b, all_b) = master_calls(ports).await?;
    let used = probe.seconds(a, b);
    let ticks = |s: f64| (s * hz).round() as u64;
    Ok((
        ticks(used.proxy.unwrap_or(0.0)),
        ticks(used.masters),
        lmpop_b.saturating_sub(lmpop_a),
        // The second stats read itself is not idle traffic: the INFO calls are left out.
        all_b.saturating_sub(all_a),
    ))
}

/// `s.wakeup_waiters` connections blocked in `BLPOP key 0` on `s.wakeup_keys` keys of the server
/// on `port` (process `pid`); `masters` = the masters behind a proxy (empty: `port` is a
/// redis-server, whose own commands are counted). `probe` samples `pid` as its proxy and the
/// masters.
pub async fn run_idle(
    s: &Settings,
    scenario: &str,
    pid: u32,
    port: u16,
    masters: &[u16],
    probe: &CpuProbe,
    hz: f64,
) -> Result<IdleResult, String> {
    let direct = masters.is_empty();
    let counted: Vec<u16> = if direct { vec![port] } else { masters.to_vec() };
    let tag = crate::cycles::unique_tag();
    let key = |j: usize| format!("lock-signal:idle:{tag}:{j}");
    let mut r = IdleResult {
        scenario: scenario.into(),
        direct,
        waiters: s.wakeup_waiters,
        keys: s.wakeup_keys.max(1),
        idle_secs: s.wakeup_idle_secs,
        hz,
        ..IdleResult::default()
    };
    // Warm-up: one waiter woken by one push, so first-use allocations are not counted.
    let warm = format!("lock-signal:idle:{tag}:warm");
    let mut waiter = Client::open(port, Duration::from_secs(5))
        .await
        .map_err(other("connect"))?;
    let mut pusher = Client::open(port, Duration::from_secs(5))
        .await
        .map_err(other("connect"))?;
    waiter
        .write(&encode(&[b"BLPOP", warm.as_bytes(), b"0"]))
        .await
        .map_err(other("warm-up BLPOP"))?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pushed = pusher.request(&[b"LPUSH", warm.as_bytes(), b"1"]).await;
    pushed.map_err(other("warm-up LPUSH"))?;
    let woke = waiter.read_reply(Instant::now() + ROUND_LIMIT).await;
    woke.map_err(other("warm-up waiter"))?;
    drop(waiter);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Idle without waiters: the server's own background work (health checks, cron).
    let io = |e: io::Error| e.to_string();
    (
        r.ticks_empty,
        r.master_ticks_empty,
        r.lmpop_empty,
        r.calls_empty,
    ) = idle_window(probe, hz, r.idle_secs, &counted)
        .await
        .map_err(io)?;
    r.rss_before = vm_rss_bytes(pid).unwrap_or(0);
    let lmpop_before = lmpop_per_master(masters).await.map_err(io)?;
    let keys = r.keys;
    let opened: Vec<io::Result<(usize, Client)>> = stream::iter(0..r.waiters)
        .map(|i| {
            let key = key(i % keys);
            async move {
                let mut c = Client::open(port, Duration::from_secs(10)).await?;
                c.write(&encode(&[b"BLPOP", key.as_bytes(), b"0"])).await?;
                Ok((i % keys, c))
            }
        })
        .buffer_unordered(200)
        .collect()
        .await;
    let mut waiters = Vec::with_capacity(opened.len());
    let mut first_error = None;
    for o in opened {
        match o {
            Ok(w) => waiters.push(w),
            Err(err) => {
                first_error.get_or_insert_with(|| err.to_string());
            }
        }
    }
    r.opened = waiters.len();
    if let Some(err) = first_error {
        r.note = Some(format!("{} waiters failed: {err}", r.waiters - r.opened));
    }
    // Every waiter blocked: the redis-server counts them; behind the proxy every master
    // counted each waiter's first try.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let blocked = if direct {
            blocked_clients(port).await.map_err(io)? >= r.opened as u64
        } else {
            let now = lmpop_per_master(masters).await.map_err(io)?;
            now.iter()
                .zip(&lmpop_before)
                .all(|(n, b)| *n >= b + r.opened as u64)
        };
        if blocked {
            break;
        }
        if Instant::now() > deadline {
            r.note = Some("not every waiter was seen blocked within 30 s".into());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Tries already sent have arrived (a late subscription confirmation may try once more).
    tokio::time::sleep(Duration::from_millis(500)).await;
    r.rss_after = vm_rss_bytes(pid).unwrap_or(0);
    (
        r.ticks_waiting,
        r.master_ticks_waiting,
        r.lmpop_waiting,
        r.calls_waiting,
    ) = idle_window(probe, hz, r.idle_secs, &counted)
        .await
        .map_err(io)?;
    // One push on each key, pipelined; then who woke.
    let pops_before = pop_calls(&counted).await.map_err(io)?;
    let mut pushes = Vec::new();
    for j in 0..keys {
        pushes.extend(encode(&[b"LPUSH", key(j).as_bytes(), b"1"]));
    }
    let sent = Instant::now();
    pusher.write(&pushes).await.map_err(other("LPUSH"))?;
    for _ in 0..keys {
        let reply = pusher.read_reply(Instant::now() + ROUND_LIMIT).await;
        let reply = reply.map_err(other("LPUSH reply"))?;
        if !matches!(reply, Reply::Int(_)) {
            return Err(format!("LPUSH answered {reply}"));
        }
    }
    let until = sent + WOKEN_LIMIT;
    let tasks: Vec<_> = waiters
        .into_iter()
        .map(|(j, mut c)| {
            tokio::spawn(async move {
                let woken = match c.read_reply(until).await {
                    Ok(reply) if !reply.is_null() => Some(c.arrived()),
                    _ => None,
                };
                (j, woken)
            })
        })
        .collect();
    let mut per_key = vec![(0usize, None::<Instant>); keys];
    for task in tasks {
        if let Ok((j, Some(at))) = task.await {
            let (count, first) = &mut per_key[j];
            *count += 1;
            *first = Some(first.map_or(at, |f| f.min(at)));
        }
    }
    r.pops_for_pushes = pop_calls(&counted)
        .await
        .map_err(io)?
        .saturating_sub(pops_before);
    r.keys_woken = per_key.iter().filter(|(n, _)| *n > 0).count();
    r.waiters_woken = per_key.iter().map(|(n, _)| n).sum();
    r.most_woken_by_one_push = per_key.iter().map(|(n, _)| *n).max().unwrap_or(0);
    let mut firsts: Vec<u64> = per_key
        .iter()
        .filter_map(|(_, f)| f.map(|at| (at - sent).as_nanos() as u64))
        .collect();
    firsts.sort_unstable();
    r.first_wake_p50_us = percentiles(&firsts).map(|l| l.p50);
    r.first_wake_max_us = firsts.last().map(|ns| *ns as f64 / 1000.0);
    Ok(r)
}

/// `LMPOP` calls of each master.
async fn lmpop_per_master(masters: &[u16]) -> io::Result<Vec<u64>> {
    let mut out = Vec::with_capacity(masters.len());
    for &m in masters {
        out.push(master_calls(&[m]).await?.0);
    }
    Ok(out)
}
