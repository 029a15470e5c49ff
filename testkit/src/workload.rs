//! The lock workload: W workers, each with its own connection to a proxy, loop
//! acquire (`SET key token NX PX ttl`, a fresh token per attempt) → hold → release (the
//! compare-and-delete `EVAL`) on a few hot keys, bounded in attempts and in wall time, and
//! record every `OK` with its times on one process-wide monotonic clock for the checker.
//!
//! Options (all off by default): acquire with node-redlock's acquire *script* instead of
//! `SET NX PX`; extend mid-hold with redis-cli's compare-then-`PEXPIRE` script or with
//! `LOCK.EXTEND`; retry a refused acquire with the *same* token (like redis-py); follow proxy
//! ports that change during the run (a proxy restarted on a new port).
//!
//! Or, with [`Workload::semaphore`], the same loop over semaphores of L permits: acquire with
//! redis-semaphore's script over a sorted set, release with `ZREM`; the checker then allows L
//! holders of a key at once.

use crate::checker::{Hold, Report};
use crate::resp::Client;
use crate::scripts::{
    semaphore_acquire, ACQUIRE_OR_EXTEND, NODE_REDLOCK_ACQUIRE, NODE_REDLOCK_RELEASE,
    REDIS_CLI_EXTEND,
};
use redlock_proxy::drift_ms;
use redlock_proxy::on_master::COMPARE_AND_DELETE;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// The key of granted extends in [`History::extends`].
const GRANTED: &str = "granted";

/// An acquire reply slower than this is listed in [`History::slow_replies`].
pub const SLOW_REPLY: Duration = Duration::from_millis(250);

/// Proxy ports that may change while a workload runs (a proxy stopped and a fresh one started
/// on another port): workers look their port up here whenever they (re)connect.
pub type PortTable = Arc<Mutex<Vec<u16>>>;

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds since the process-wide epoch (monotonic).
pub fn now_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// A small deterministic PRNG (splitmix64): no dependency, reproducible from a seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// Uniform index below `n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// `k` distinct indexes below `n`.
    pub fn pick(&mut self, n: usize, k: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..n).collect();
        for i in 0..k.min(n) {
            let j = i + self.below(n - i);
            all.swap(i, j);
        }
        all.truncate(k.min(n));
        all
    }
}

/// The seed of a run: `SEED` from the environment, else the clock. Printed by the scenarios so
/// that a failing run's fault schedule can be replayed (timing still varies).
pub fn seed() -> u64 {
    std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

/// What the workers do.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Proxy ports; worker `i` uses `ports[i % ports.len()]`.
    pub ports: Vec<u16>,
    pub workers: usize,
    pub keys: Vec<String>,
    pub ttl_ms: u64,
    /// Most holds last `short_hold_ms` (a range); with `long_hold_chance`, `long_hold_ms`.
    pub short_hold_ms: (u64, u64),
    pub long_hold_ms: (u64, u64),
    pub long_hold_chance: f64,
    /// With this chance a holder never releases (a crashed client): the lock must expire.
    pub abandon_chance: f64,
    /// Pause after a refusal, error or timeout.
    pub retry_pause_ms: (u64, u64),
    /// Wall-time bound of the whole run.
    pub duration: Duration,
    /// Count bound per worker.
    pub max_attempts_per_worker: u64,
    /// How long a worker waits for one reply before giving up on the connection.
    pub reply_timeout: Duration,
    pub seed: u64,
    /// Prefix of every token (distinct per run).
    pub tag: String,
    /// With this chance an acquire is node-redlock's acquire script instead of `SET NX PX`.
    pub acquire_via_script_chance: f64,
    /// With this chance a script acquire is [`ACQUIRE_OR_EXTEND`] (a lease the proxy knows by
    /// its effect) instead of node-redlock's; a grant's fencing token is then read with
    /// `LOCK.TOKEN` and checked as `LOCK.ACQUIRE`'s.
    pub lease_script_chance: f64,
    /// With this chance a script acquire that was refused (`:0`) or failed (an error) is
    /// followed by node-redlock's release of its token, as node-redlock does (the proxy has no
    /// rollback for scripts). Otherwise (a client that crashed right then) the token may stay on
    /// a minority until it expires, and acquires of that key fail until then.
    pub script_refusal_release_chance: f64,
    /// With this chance a holder extends its lease mid-hold (redis-cli's extend script, or
    /// `LOCK.EXTEND` with `extend_via_lock_extend`; same TTL), possibly twice, and then holds
    /// past its original lease end.
    pub extend_chance: f64,
    /// Extends are `LOCK.EXTEND key value ttl_ms` (granted: an integer, the new validity;
    /// refused: null) instead of redis-cli's script (granted: `:1`).
    pub extend_via_lock_extend: bool,
    /// Redis 8.4's lock commands: releases are `DELEX key IFEQ token` and extends (unless
    /// `extend_via_lock_extend`) `SET key token IFEQ token PX ttl` (granted: `+OK`).
    pub redis84: bool,
    /// After a refusal, with this chance the next attempt is on the same key with the same
    /// token (redis-py's retry) instead of a fresh one.
    pub same_token_retry_chance: f64,
    /// With this chance an acquire (not a script one) is `LOCK.ACQUIRE`, whose fencing token is
    /// recorded and checked ([`crate::checker::token_regressions`]).
    pub lock_acquire_chance: f64,
    /// When set, overrides `ports`: read at every (re)connect, so workers follow a proxy that
    /// restarted on a new port.
    pub live_ports: Option<PortTable>,
    /// Semaphores of this many permits instead of locks ([`Workload::semaphore`]).
    pub semaphore: Option<usize>,
    /// How many holders of one key at once the checker allows, if not the permits (a lock's
    /// 1, a semaphore's L): [`Workload::allowing`].
    pub holders_allowed: Option<usize>,
}

impl Workload {
    /// Defaults: 8 workers on 3 hot keys, TTL 500 ms, mostly short holds, some long, a few
    /// abandoned, 10 s.
    pub fn new(ports: Vec<u16>, name: &str, seed: u64) -> Workload {
        let keys = (0..3)
            .map(|i| format!("faults:{name}:{}:hot{i}", std::process::id()))
            .collect();
        Workload {
            ports,
            workers: 8,
            keys,
            ttl_ms: 500,
            short_hold_ms: (1, 20),
            long_hold_ms: (100, 400),
            long_hold_chance: 0.15,
            abandon_chance: 0.05,
            retry_pause_ms: (0, 5),
            duration: Duration::from_secs(10),
            max_attempts_per_worker: 1_000_000,
            reply_timeout: Duration::from_secs(3),
            seed,
            tag: format!("{name}-{seed:x}"),
            acquire_via_script_chance: 0.0,
            lease_script_chance: 0.0,
            script_refusal_release_chance: 1.0,
            extend_chance: 0.0,
            extend_via_lock_extend: false,
            redis84: false,
            same_token_retry_chance: 0.0,
            lock_acquire_chance: 0.0,
            live_ports: None,
            semaphore: None,
            holders_allowed: None,
        }
    }

    /// Every key a semaphore of `limit` permits, as redis-semaphore's `Semaphore` keeps one:
    /// acquired with its script (`:1` admitted, `:0` full; a refused attempt is followed by a
    /// `ZREM` of its identifier with `script_refusal_release_chance`), released with `ZREM`.
    /// The script's `now` is read after `t_send` ([`semaphore_acquire`]), so a member's score
    /// is never earlier than its hold's start and the filter of later acquires drops it no
    /// earlier than the hold's lease end. Not combined with the other acquire or extend
    /// options.
    pub fn semaphore(mut self, limit: usize) -> Workload {
        self.semaphore = Some(limit);
        self
    }

    /// The checker allows `holders` holders of one key at once (a bound the proxy promises
    /// above a semaphore's permits: docs/SAFETY.md, "Semaphores over sorted sets").
    pub fn allowing(mut self, holders: usize) -> Workload {
        self.holders_allowed = Some(holders);
        self
    }

    /// The port worker `proxy` connects to now.
    pub fn port(&self, proxy: usize) -> u16 {
        match &self.live_ports {
            Some(table) => table.lock().unwrap_or_else(PoisonError::into_inner)[proxy],
            None => self.ports[proxy],
        }
    }

    pub fn with_keys(mut self, n: usize) -> Workload {
        let prefix = self.keys[0].trim_end_matches("hot0").to_string();
        self.keys = (0..n).map(|i| format!("{prefix}hot{i}")).collect();
        self
    }

    /// Runs every worker until the duration, the attempt bound, or `stop`.
    pub async fn run(&self, stop: Arc<AtomicBool>) -> History {
        let mut tasks = Vec::new();
        for id in 0..self.workers {
            let cfg = self.clone();
            let stop = stop.clone();
            tasks.push(tokio::spawn(async move { worker(id, cfg, stop).await }));
        }
        let mut all = History::default();
        for t in tasks {
            all.merge(t.await.expect("worker task"));
        }
        all
    }

    /// Runs the workload while `faults` runs on a blocking thread, until `faults` returns (or
    /// the workload's own bounds); its report, what `faults` returned, and how long it ran.
    pub async fn run_beside<T: Send + 'static>(
        &self,
        faults: impl FnOnce() -> T + Send + 'static,
    ) -> (Report, T, Duration) {
        let stop = Arc::new(AtomicBool::new(false));
        let faults = {
            let stop = stop.clone();
            tokio::task::spawn_blocking(move || {
                let done = faults();
                stop.store(true, Ordering::Relaxed);
                done
            })
        };
        let started = Instant::now();
        let history = self.run(stop).await;
        let done = faults.await.expect("the fault thread");
        (history.report(), done, started.elapsed())
    }

    /// Runs the workload on its own task (until its duration or attempt bound), while the
    /// caller acts; [`Running::finish`] collects the history.
    pub fn spawn(&self) -> Running {
        let w = self.clone();
        Running {
            limit: self.duration + Duration::from_secs(30),
            task: tokio::spawn(async move { w.run(Arc::new(AtomicBool::new(false))).await }),
        }
    }
}

/// A workload running on its own task ([`Workload::spawn`]).
pub struct Running {
    task: tokio::task::JoinHandle<History>,
    limit: Duration,
}

impl Running {
    /// Waits for the workload to end (at most its duration + 30 s from now) and returns what it
    /// saw.
    pub async fn finish(self) -> History {
        tokio::time::timeout(self.limit, self.task)
            .await
            .expect("the workload ends")
            .expect("workload task")
    }
}

/// Whether a reply to an extend granted it: `:1` to redis-cli's script; an integer (the new
/// validity) to `LOCK.EXTEND`. Only a granted extend moves the holder's lease end.
pub fn extend_granted(reply: &str, via_lock_extend: bool) -> bool {
    if via_lock_extend {
        reply
            .strip_prefix(':')
            .is_some_and(|n| n.parse::<u64>().is_ok())
    } else {
        reply == ":1"
    }
}

/// What the workers saw.
#[derive(Debug, Default)]
pub struct History {
    pub holds: Vec<Hold>,
    pub attempts: u64,
    /// Null replies to `SET NX` and `:0` replies to the acquire script.
    pub refusals: u64,
    /// Acquires sent as node-redlock's acquire script, and how many of them got `:1`.
    pub script_acquires: u64,
    pub script_grants: u64,
    /// Grants of [`ACQUIRE_OR_EXTEND`] whose token `LOCK.TOKEN` answered.
    pub script_tokens: u64,
    /// Attempts that reused the token of a refused attempt (same key, same token).
    pub same_token_retries: u64,
    /// Replies to extends: `granted` ([`extend_granted`]), else by text (`:0` or null refused,
    /// errors, `timeout`).
    pub extends: BTreeMap<String, u64>,
    /// Replies to node-redlock's release after a refused or failed script acquire, by text.
    pub script_cleanups: BTreeMap<String, u64>,
    pub errors: BTreeMap<String, u64>,
    pub timeouts: u64,
    pub abandoned: u64,
    /// Replies to releases, by text (`:1`, `:0`, errors, `timeout`).
    pub releases: BTreeMap<String, u64>,
    /// Releases sent by a holder within its validity (`TTL − drift` after its acquire was
    /// sent) that got an error or no reply: the holder did hold the lock, so each is a lie.
    pub release_errors_in_validity: u64,
    /// Acquire reply times in µs (timeouts count as the full limit).
    pub reply_us: Vec<u64>,
    /// Acquires answered (or given up) more than [`SLOW_REPLY`] after they were sent:
    /// (send time ns, reply time µs, what was sent → what came back), for the report.
    pub slow_replies: Vec<(u64, u64, String)>,
    /// How many holders of one key the workload allows: 1 for locks, L for semaphores.
    pub limit: usize,
}

impl History {
    pub fn merge(&mut self, other: History) {
        self.limit = self.limit.max(other.limit);
        self.holds.extend(other.holds);
        self.attempts += other.attempts;
        self.refusals += other.refusals;
        self.script_acquires += other.script_acquires;
        self.script_grants += other.script_grants;
        self.script_tokens += other.script_tokens;
        self.same_token_retries += other.same_token_retries;
        for (k, v) in other.extends {
            *self.extends.entry(k).or_default() += v;
        }
        for (k, v) in other.script_cleanups {
            *self.script_cleanups.entry(k).or_default() += v;
        }
        self.timeouts += other.timeouts;
        self.abandoned += other.abandoned;
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
        self.release_errors_in_validity += other.release_errors_in_validity;
        for (k, v) in other.releases {
            *self.releases.entry(k).or_default() += v;
        }
        self.reply_us.extend(other.reply_us);
        self.slow_replies.extend(other.slow_replies);
    }

    /// Extends granted.
    pub fn extends_ok(&self) -> u64 {
        self.extends.get(GRANTED).copied().unwrap_or(0)
    }

    /// Extends answered otherwise (`:0`, an error, no reply).
    pub fn extends_failed(&self) -> u64 {
        self.extends.values().sum::<u64>() - self.extends_ok()
    }

    /// One line with the workload's own counters (the checker's are in [`Report`]).
    pub fn summary(&self) -> String {
        format!(
            "attempts={} script_acquires={} (granted {}, tokens read {}, clean-ups after refusals {:?}) same_token_retries={} extends ok={} failed={} {:?} abandoned={} releases={:?} (errors within validity: {})",
            self.attempts,
            self.script_acquires,
            self.script_grants,
            self.script_tokens,
            self.script_cleanups,
            self.same_token_retries,
            self.extends_ok(),
            self.extends_failed(),
            self.extends,
            self.abandoned,
            self.releases,
            self.release_errors_in_validity,
        )
    }

    /// The slowest acquire replies (at most `n`), one a line, slowest first.
    pub fn slowest(&self, n: usize) -> String {
        let mut slow = self.slow_replies.clone();
        slow.sort_by_key(|s| std::cmp::Reverse(s.1));
        slow.iter()
            .take(n)
            .map(|(t, us, what)| {
                format!(
                    "  slow acquire sent at {:.3} ms: {:.1} ms: {what}",
                    *t as f64 / 1e6,
                    *us as f64 / 1e3
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn max_reply_ms(&self) -> f64 {
        self.reply_us.iter().copied().max().unwrap_or(0) as f64 / 1000.0
    }

    /// Acquire replies slower than `limit`.
    pub fn replies_slower_than(&self, limit: Duration) -> usize {
        let limit = limit.as_micros() as u64;
        self.reply_us.iter().filter(|us| **us > limit).count()
    }

    /// Runs the checker.
    pub fn report(&self) -> Report {
        Report::new(
            self.holds.clone(),
            self.refusals,
            self.errors.clone(),
            self.timeouts,
            self.max_reply_ms(),
        )
        .for_limit(self.limit.max(1))
    }
}

async fn pause(rng: &mut Rng, (lo, hi): (u64, u64)) {
    let ms = rng.range(lo, hi);
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// A holder's release: `ZREM key token` from a semaphore, else the compare-and-delete (or
/// Redis 8.4's `DELEX … IFEQ`).
fn release<'a>(cfg: &Workload, key: &'a str, token: &'a str) -> Vec<&'a str> {
    match cfg.semaphore {
        Some(_) => vec!["ZREM", key, token],
        None if cfg.redis84 => vec!["DELEX", key, "IFEQ", token],
        None => vec!["EVAL", COMPARE_AND_DELETE.text(), "1", key, token],
    }
}

async fn worker(id: usize, cfg: Workload, stop: Arc<AtomicBool>) -> History {
    let mut rng = Rng::new(
        cfg.seed
            .wrapping_add((id as u64 + 1).wrapping_mul(0x1000_0000_01B3)),
    );
    let proxy = id % cfg.ports.len();
    let deadline = Instant::now() + cfg.duration;
    let ttl = cfg.ttl_ms.to_string();
    // What the proxy promises: the lease is valid for TTL − drift after the request was sent.
    let validity_ns = cfg.ttl_ms.saturating_sub(drift_ms(cfg.ttl_ms, 0.01)) * 1_000_000;
    let mut h = History {
        limit: cfg.holders_allowed.or(cfg.semaphore).unwrap_or(1),
        ..History::default()
    };
    let mut conn: Option<Client> = None;
    // The key and token of a refused attempt to send again (a same-token retry).
    let mut retry: Option<(String, String)> = None;
    for seq in 0..cfg.max_attempts_per_worker {
        if Instant::now() >= deadline || stop.load(Ordering::Relaxed) {
            break;
        }
        let Some(c) = conn.as_mut() else {
            conn = Client::try_connect(cfg.port(proxy)).await;
            if conn.is_none() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            continue;
        };
        let (key, token) = match retry.take() {
            Some(same) => {
                h.same_token_retries += 1;
                same
            }
            None => (
                cfg.keys[rng.below(cfg.keys.len())].clone(),
                format!("{}-w{id}-{seq}", cfg.tag),
            ),
        };
        let key = &key;
        let via_script = cfg.semaphore.is_some() || rng.chance(cfg.acquire_via_script_chance);
        // Drawn only when used, so runs without tokens keep their random sequences.
        let via_lock =
            !via_script && cfg.lock_acquire_chance > 0.0 && rng.chance(cfg.lock_acquire_chance);
        let via_lease_script = via_script
            && cfg.semaphore.is_none()
            && cfg.lease_script_chance > 0.0
            && rng.chance(cfg.lease_script_chance);
        let t_send = now_ns();
        let reply = if let Some(limit) = cfg.semaphore {
            h.script_acquires += 1;
            let words = semaphore_acquire(key, limit, &token, cfg.ttl_ms);
            let words: Vec<&str> = words.iter().map(String::as_str).collect();
            c.try_cmd(&words, cfg.reply_timeout).await
        } else if via_script {
            h.script_acquires += 1;
            let script = match via_lease_script {
                true => ACQUIRE_OR_EXTEND,
                false => NODE_REDLOCK_ACQUIRE,
            };
            c.try_cmd(&["EVAL", script, "1", key, &token, &ttl], cfg.reply_timeout)
                .await
        } else if via_lock {
            c.try_cmd(&["LOCK.ACQUIRE", key, &token, &ttl], cfg.reply_timeout)
                .await
        } else {
            c.try_cmd(&["SET", key, &token, "NX", "PX", &ttl], cfg.reply_timeout)
                .await
        };
        let t_reply = now_ns();
        let mut fence = reply
            .as_deref()
            .filter(|_| via_lock)
            .and_then(crate::lock_grant)
            .map(|(token, _)| token);
        if via_lease_script && reply.as_deref() == Some(":1") {
            // The grant's token, read once it was granted (null if its lease already ran out).
            let read = c
                .try_cmd(&["LOCK.TOKEN", key, &token], cfg.reply_timeout)
                .await;
            fence = read.and_then(|r| r.strip_prefix(':').and_then(|t| t.parse().ok()));
            h.script_tokens += u64::from(fence.is_some());
        }
        h.attempts += 1;
        h.reply_us.push((t_reply - t_send) / 1000);
        if t_reply - t_send > SLOW_REPLY.as_nanos() as u64 {
            let what = format!(
                "w{id} {} {key} {token} -> {}",
                if via_script { "script" } else { "SET NX" },
                reply.as_deref().unwrap_or("no reply")
            );
            h.slow_replies
                .push((t_send, (t_reply - t_send) / 1000, what));
        }
        let (granted, refused) = match (via_script, reply.as_deref()) {
            _ if fence.is_some() => (true, false),
            (false, Some("+OK")) | (true, Some(":1")) => (true, false),
            (false, Some("$nil")) | (false, Some("_")) | (true, Some(":0")) => (false, true),
            _ => (false, false),
        };
        if granted {
            if via_script {
                h.script_grants += 1;
            }
            let mut hold = Hold {
                key: key.clone(),
                token: token.clone(),
                worker: id,
                proxy,
                ttl_ms: cfg.ttl_ms,
                t_send,
                t_ok: t_reply,
                t_release_sent: None,
                t_extend_sent: None,
                fence,
            };
            let mut usable_conn = true;
            if rng.chance(cfg.extend_chance) {
                // Extend partway through the lease (at most twice), then hold on past the
                // original lease end. A refused or failed extend ends the hold at once: the
                // holder's lease still ends at its last successful (send time + TTL).
                let mut extended = false;
                for round in 0..2 {
                    if round > 0 && !rng.chance(0.5) {
                        break;
                    }
                    pause(&mut rng, (cfg.ttl_ms / 10, cfg.ttl_ms / 2)).await;
                    let lease_start = hold.t_extend_sent.unwrap_or(t_send);
                    // A correct holder extends only while its lease is valid (5 ms margin).
                    if now_ns() + 5_000_000 >= lease_start + validity_ns {
                        break;
                    }
                    let t_extend = now_ns();
                    let extend = if cfg.extend_via_lock_extend {
                        c.try_cmd(&["LOCK.EXTEND", key, &token, &ttl], cfg.reply_timeout)
                            .await
                    } else if cfg.redis84 {
                        let set = ["SET", key, &token, "IFEQ", &token, "PX", &ttl];
                        c.try_cmd(&set, cfg.reply_timeout).await
                    } else {
                        c.try_cmd(
                            &["EVAL", REDIS_CLI_EXTEND, "1", key, &token, &ttl],
                            cfg.reply_timeout,
                        )
                        .await
                    };
                    let text = match extend {
                        Some(text) => text.chars().take(80).collect(),
                        None => {
                            usable_conn = false;
                            "timeout".to_string()
                        }
                    };
                    let ok = extend_granted(&text, cfg.extend_via_lock_extend)
                        || (cfg.redis84 && text == "+OK");
                    let entry = if ok { GRANTED.to_string() } else { text };
                    *h.extends.entry(entry).or_default() += 1;
                    if !ok {
                        extended = false;
                        break;
                    }
                    hold.t_extend_sent = Some(t_extend);
                    extended = true;
                }
                if extended {
                    pause(&mut rng, (0, cfg.ttl_ms * 4 / 5)).await;
                }
            } else {
                let held = if rng.chance(cfg.long_hold_chance) {
                    cfg.long_hold_ms
                } else {
                    cfg.short_hold_ms
                };
                pause(&mut rng, held).await;
            }
            if !usable_conn {
                // No reply to the extend: the connection may still deliver it; the holder
                // stops acting and lets the lease expire.
                conn = None;
                h.abandoned += 1;
                h.holds.push(hold);
                continue;
            }
            if rng.chance(cfg.abandon_chance) {
                h.abandoned += 1;
                h.holds.push(hold);
                continue;
            }
            let lease_start = hold.t_extend_sent.unwrap_or(t_send);
            let t_release = now_ns();
            hold.t_release_sent = Some(t_release);
            h.holds.push(hold);
            let in_validity = t_release - lease_start < validity_ns;
            let released = c
                .try_cmd(&release(&cfg, key, &token), cfg.reply_timeout)
                .await;
            let text = released.unwrap_or_else(|| {
                conn = None;
                "timeout".to_string()
            });
            if in_validity && (text.starts_with('-') || text == "timeout") {
                h.release_errors_in_validity += 1;
            }
            *h.releases.entry(text).or_default() += 1;
        } else {
            if via_script && reply.is_some() && rng.chance(cfg.script_refusal_release_chance) {
                let undo = match cfg.semaphore {
                    Some(_) => release(&cfg, key, &token),
                    None => vec!["EVAL", NODE_REDLOCK_RELEASE, "1", key, &token],
                };
                let text = c
                    .try_cmd(&undo, cfg.reply_timeout)
                    .await
                    .map_or("timeout".to_string(), |t| t.chars().take(80).collect());
                if text == "timeout" {
                    conn = None;
                }
                *h.script_cleanups.entry(text).or_default() += 1;
            }
            if refused {
                h.refusals += 1;
                if rng.chance(cfg.same_token_retry_chance) {
                    retry = Some((key.clone(), token));
                }
            } else if let Some(other) = reply {
                let text: String = other.chars().take(80).collect();
                *h.errors.entry(text).or_default() += 1;
            } else {
                // The reply may still come: never reuse a connection that could deliver it.
                h.timeouts += 1;
                conn = None;
            }
            pause(&mut rng, cfg.retry_pause_ms).await;
        }
    }
    h
}

/// A held key stays held, and the proxy is alive: every `interval` until `until` (at most 1000
/// times) `held` tries `SET key <fresh token> NX PX ttl_ms` and the answer must be a null (the
/// refusal a client reads as "held": not an error, not a timeout); after each, `other`, on the
/// same proxy, tries a free key of its own (`<key>:free<n>`, left to expire), which should be
/// granted. Returns the number of refusals and of free keys granted, for the caller's minimums.
/// `what` names the holder in the failure message.
pub async fn refused_while_free_keys_granted(
    held: &mut Client,
    other: &mut Client,
    key: &str,
    ttl_ms: u64,
    interval: Duration,
    until: Instant,
    what: &str,
) -> (usize, usize) {
    let ttl = ttl_ms.to_string();
    let (mut refused, mut granted) = (0, 0);
    for attempt in 0..1000 {
        if Instant::now() >= until {
            break;
        }
        let token = format!("tok-{attempt}");
        let reply = held.cmd(&["SET", key, &token, "NX", "PX", &ttl]).await;
        assert_eq!(
            reply, "$nil",
            "{key} must be refused with a null while {what} holds it (try {attempt})"
        );
        refused += 1;
        let free = format!("{key}:free{attempt}");
        if other.cmd(&["SET", &free, "v", "NX", "PX", &ttl]).await == "+OK" {
            granted += 1;
        }
        tokio::time::sleep(interval).await;
    }
    (refused, granted)
}

/// A lossy failover's first half: the replica (`replica_pid`) of the primary at `primary`
/// stops hearing it (SIGSTOP, then the primary drops its replica link), then A takes `key` for
/// `ttl_ms` through the proxy at `port`; A's lock is on the primary, not on the replica.
/// Returns the end of A's lease (ns since the epoch). The caller resumes the replica.
pub async fn grant_behind_a_cut_replica(
    port: u16,
    primary: u16,
    replica_pid: u32,
    key: &str,
    ttl_ms: u64,
) -> u64 {
    crate::masters::signal(replica_pid, "STOP");
    let killed = crate::masters::master_cmd(primary, &["CLIENT", "KILL", "TYPE", "replica"]).await;
    assert_eq!(killed, ":1", "the replication link was cut");
    let mut a = Client::connect(port).await;
    let t_send = now_ns();
    let granted = a
        .cmd(&["SET", key, "tok-a", "NX", "PX", &ttl_ms.to_string()])
        .await;
    assert_eq!(granted, "+OK");
    let held = crate::masters::master_get(primary, key).await;
    assert_eq!(held.as_deref(), Some("tok-a"));
    t_send + ttl_ms * 1_000_000 - crate::checker::drift_ns(ttl_ms)
}

/// How long [`contend_until`] contends at most: some 1000 tries, ample for a proxy that just
/// started to judge its masters and for a master that votes for the contender to be found.
const CONTEND_AT_MOST: Duration = Duration::from_secs(20);

/// A contender for `key`, held by someone else until `lease_end` (ns since the epoch): `b`
/// tries `SET key … NX PX 1000` every 20 ms (releasing what it gets) until a margin before
/// that lease ends or [`CONTEND_AT_MOST`] passed, or with `stop_at_first` (a negative control)
/// until its first grant, within the lease (not capped: a loaded machine may take longer to
/// make a master vote for it, and the grant ends the run). Returns its grants; without one,
/// asserts it had a real go (at least 20 tries), or 0 proves nothing.
pub async fn contend_until(
    b: &mut Client,
    key: &str,
    lease_end: u64,
    stop_at_first: bool,
) -> usize {
    let (mut grants, mut attempts) = (0, 0);
    let give_up = match stop_at_first {
        true => lease_end,
        false => now_ns() + CONTEND_AT_MOST.as_nanos() as u64,
    };
    for attempt in 0..100_000 {
        // Stop a margin before the lease ends: a grant after it is no overlap.
        let end = lease_end.saturating_sub(500_000_000).min(give_up);
        if now_ns() >= end || (stop_at_first && grants > 0) {
            break;
        }
        let token = format!("tok-b{attempt}");
        let reply = b.cmd(&["SET", key, &token, "NX", "PX", "1000"]).await;
        attempts += 1;
        if reply == "+OK" {
            grants += 1;
            b.cmd(&["DEL", key]).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        grants > 0 || attempts >= 20,
        "B tried only {attempts} times before A's lease ended"
    );
    grants
}

/// Waits (at most `limit`) until a probe lock on `key` is granted through `port`, then releases
/// it. Returns how long it took, or `None` if no grant came in time.
pub async fn wait_grantable(
    port: u16,
    key: &str,
    ttl_ms: u64,
    limit: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    let ttl = ttl_ms.to_string();
    let mut conn: Option<Client> = None;
    for attempt in 0..100_000u64 {
        if started.elapsed() >= limit {
            return None;
        }
        if conn.is_none() {
            conn = Client::try_connect(port).await;
        }
        if let Some(c) = conn.as_mut() {
            let token = format!("probe-{}-{attempt}", std::process::id());
            match c
                .try_cmd(
                    &["SET", key, &token, "NX", "PX", &ttl],
                    Duration::from_secs(2),
                )
                .await
                .as_deref()
            {
                Some("+OK") => {
                    let took = started.elapsed();
                    c.try_cmd(
                        &["EVAL", COMPARE_AND_DELETE.text(), "1", key, &token],
                        Duration::from_secs(2),
                    )
                    .await;
                    return Some(took);
                }
                None => conn = None,
                Some(_) => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}
