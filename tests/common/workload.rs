//! The lock workload: W workers, each with its own connection to a proxy, loop
//! acquire (`SET key token NX PX ttl`, a fresh token per attempt) → hold → release (the
//! compare-and-delete `EVAL`) on a few hot keys, bounded in attempts and in wall time, and
//! record every `OK` with its times on one process-wide monotonic clock for the checker.

use super::checker::{Hold, Report};
use super::{Client, RELEASE};
use redlock_proxy::redlock::drift_ms;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

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
}

/// What the workers saw.
#[derive(Debug, Default)]
pub struct History {
    pub holds: Vec<Hold>,
    pub attempts: u64,
    pub refusals: u64,
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
}

impl History {
    pub fn merge(&mut self, other: History) {
        self.holds.extend(other.holds);
        self.attempts += other.attempts;
        self.refusals += other.refusals;
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
    }
}

async fn pause(rng: &mut Rng, (lo, hi): (u64, u64)) {
    let ms = rng.range(lo, hi);
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

async fn worker(id: usize, cfg: Workload, stop: Arc<AtomicBool>) -> History {
    let mut rng = Rng::new(
        cfg.seed
            .wrapping_add((id as u64 + 1).wrapping_mul(0x1000_0000_01B3)),
    );
    let proxy = id % cfg.ports.len();
    let port = cfg.ports[proxy];
    let deadline = Instant::now() + cfg.duration;
    let ttl = cfg.ttl_ms.to_string();
    let mut h = History::default();
    let mut conn: Option<Client> = None;
    for seq in 0..cfg.max_attempts_per_worker {
        if Instant::now() >= deadline || stop.load(Ordering::Relaxed) {
            break;
        }
        let Some(c) = conn.as_mut() else {
            conn = Client::try_connect(port).await;
            if conn.is_none() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            continue;
        };
        let key = &cfg.keys[rng.below(cfg.keys.len())];
        let token = format!("{}-w{id}-{seq}", cfg.tag);
        let t_send = now_ns();
        let reply = c
            .try_cmd(&["SET", key, &token, "NX", "PX", &ttl], cfg.reply_timeout)
            .await;
        let t_reply = now_ns();
        h.attempts += 1;
        h.reply_us.push((t_reply - t_send) / 1000);
        match reply.as_deref() {
            Some("+OK") => {
                let mut hold = Hold {
                    key: key.clone(),
                    token: token.clone(),
                    worker: id,
                    proxy,
                    ttl_ms: cfg.ttl_ms,
                    t_send,
                    t_ok: t_reply,
                    t_release_sent: None,
                };
                let held = if rng.chance(cfg.long_hold_chance) {
                    cfg.long_hold_ms
                } else {
                    cfg.short_hold_ms
                };
                pause(&mut rng, held).await;
                if rng.chance(cfg.abandon_chance) {
                    h.abandoned += 1;
                    h.holds.push(hold);
                    continue;
                }
                let t_release = now_ns();
                hold.t_release_sent = Some(t_release);
                h.holds.push(hold);
                let validity_ns = cfg.ttl_ms.saturating_sub(drift_ms(cfg.ttl_ms, 0.01)) * 1_000_000;
                let in_validity = t_release - t_send < validity_ns;
                let released = c
                    .try_cmd(&["EVAL", RELEASE, "1", key, &token], cfg.reply_timeout)
                    .await;
                let text = released.unwrap_or_else(|| {
                    conn = None;
                    "timeout".to_string()
                });
                if in_validity && (text.starts_with('-') || text == "timeout") {
                    h.release_errors_in_validity += 1;
                }
                *h.releases.entry(text).or_default() += 1;
            }
            Some("$nil") | Some("_") => {
                h.refusals += 1;
                pause(&mut rng, cfg.retry_pause_ms).await;
            }
            Some(other) => {
                let text: String = other.chars().take(80).collect();
                *h.errors.entry(text).or_default() += 1;
                pause(&mut rng, cfg.retry_pause_ms).await;
            }
            None => {
                // The reply may still come: never reuse a connection that could deliver it.
                h.timeouts += 1;
                conn = None;
                pause(&mut rng, cfg.retry_pause_ms).await;
            }
        }
    }
    h
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
                    c.try_cmd(&["EVAL", RELEASE, "1", key, &token], Duration::from_secs(2))
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
