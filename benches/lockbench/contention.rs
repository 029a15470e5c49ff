//! Hot-key contention: PHP-style pollers on one held key, and what they cost the masters.

use crate::cycles::{join_tallies, unique_tag};
use crate::procs::{CpuProbe, CpuUse};
use crate::settings::Settings;
use crate::stats::{percentiles, Latency, Tally, Window, STALL_LIMIT};
use redlock_proxy::on_master::COMPARE_AND_DELETE;
use redlock_testkit::masters::command_stats;
use redlock_testkit::resp::{encode, Client};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct HotResult {
    pub scenario: String,
    pub clients: usize,
    pub client_ops: u64,
    pub client_ops_per_sec: f64,
    pub unexpected_grants: u64,
    pub errors: u64,
    pub latency: Option<Latency>,
    /// Master SET + EVAL + EVALSHA calls.
    pub master_lock_ops: u64,
    /// All master command calls except INFO.
    pub master_all_ops: u64,
    /// Master calls per command (except INFO), for the commands that were called.
    pub breakdown: Vec<(String, u64)>,
    pub cpu: CpuUse,
    pub note: Option<String>,
}

impl HotResult {
    /// Master operations per client SET.
    pub fn per_client_op(&self, master_ops: u64) -> Option<f64> {
        (self.client_ops > 0).then(|| master_ops as f64 / self.client_ops as f64)
    }
}

pub async fn total_command_stats(ports: &[u16]) -> std::io::Result<BTreeMap<String, u64>> {
    let mut total = BTreeMap::new();
    for &port in ports {
        for (name, calls) in command_stats(port).await? {
            *total.entry(name).or_insert(0) += calls;
        }
    }
    Ok(total)
}

/// One PHP-style poller: `SET hot token NX PX 30000`, sleep 5 ms if refused, repeat.
pub async fn hot_poller(
    port: u16,
    key: Arc<String>,
    (id, clients): (usize, usize),
    interval: Duration,
    window: Window,
) -> Tally {
    let mut tally = Tally::default();
    let mut conn = match Client::open(port, Duration::from_secs(5)).await {
        Ok(c) => c,
        Err(err) => {
            tally.error(format!("connect: {err}"));
            return tally;
        }
    };
    let command = encode(&[
        b"SET",
        key.as_bytes(),
        format!("poller-{id}").as_bytes(),
        b"NX",
        b"PX",
        b"30000",
    ]);
    let deadline = window.end + STALL_LIMIT;
    // Spread the pollers over the interval, as independent processes would be.
    tokio::time::sleep(interval.mul_f64(id as f64 / clients.max(1) as f64)).await;
    while Instant::now() < window.end {
        let sent = Instant::now();
        if let Err(err) = conn.write(&command).await {
            tally.error(format!("write: {err}"));
            break;
        }
        match conn.read_reply(deadline).await {
            Ok(reply) => {
                tally.cmds += 1;
                if window.contains(conn.arrived()) {
                    tally
                        .samples
                        .push((conn.arrived() - sent).as_nanos() as u64);
                }
                if reply.is_ok() {
                    // A grant while the holder holds the lock would be a safety bug.
                    tally.fails += 1;
                } else if !reply.is_null() {
                    tally.error(reply.to_string());
                }
            }
            Err(err) => {
                tally.error(format!("read: {err}"));
                break;
            }
        }
        tokio::time::sleep(interval).await;
    }
    tally
}

/// The holder takes the hot key, `clients` pollers run for the window; master command
/// counts are read before the pollers start and after they all finished.
pub async fn run_hot(
    settings: &Settings,
    scenario: &str,
    port: u16,
    master_ports: &[u16],
    cpu: &CpuProbe,
) -> Result<HotResult, String> {
    let key = Arc::new(format!("hot:{}", unique_tag()));
    let mut holder = Client::open(port, Duration::from_secs(5))
        .await
        .map_err(|e| e.to_string())?;
    let taken = holder
        .request(&[b"SET", key.as_bytes(), b"holder", b"NX", b"PX", b"60000"])
        .await
        .map_err(|e| e.to_string())?;
    if !taken.is_ok() {
        return Err(format!("the holder could not take the hot key: {taken}"));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = total_command_stats(master_ports)
        .await
        .map_err(|e| e.to_string())?;
    // The pollers start inside the window (no warm-up needed: they never hold anything).
    let window = Window {
        start: Instant::now(),
        end: Instant::now() + Duration::from_secs_f64(settings.secs),
    };
    let interval = Duration::from_millis(settings.hot_interval_ms);
    let tasks: Vec<_> = (0..settings.hot_clients)
        .map(|id| {
            let who = (id, settings.hot_clients);
            tokio::spawn(hot_poller(port, key.clone(), who, interval, window))
        })
        .collect();
    let cpu = cpu.over(window).await;
    let tally = Tally::merge(join_tallies(tasks).await);
    // Let anything the proxy still sends after its replies (roll-backs) reach the masters.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = total_command_stats(master_ports)
        .await
        .map_err(|e| e.to_string())?;
    let _ = holder
        .request(&[
            b"EVAL",
            COMPARE_AND_DELETE.text().as_bytes(),
            b"1",
            key.as_bytes(),
            b"holder",
        ])
        .await;
    let delta = |names: &[&str]| -> u64 {
        names
            .iter()
            .map(|n| {
                after
                    .get(*n)
                    .unwrap_or(&0)
                    .saturating_sub(*before.get(*n).unwrap_or(&0))
            })
            .sum()
    };
    let all_names: Vec<&str> = after
        .keys()
        .map(String::as_str)
        .filter(|n| *n != "info")
        .collect();
    Ok(HotResult {
        scenario: scenario.into(),
        clients: settings.hot_clients,
        client_ops: tally.cmds,
        client_ops_per_sec: tally.cmds as f64 / window.secs(),
        unexpected_grants: tally.fails,
        errors: tally.errors,
        latency: percentiles(&tally.samples),
        master_lock_ops: delta(&["set", "eval", "evalsha"]),
        master_all_ops: delta(&all_names),
        breakdown: all_names
            .iter()
            .map(|n| (n.to_string(), delta(&[n])))
            .filter(|(_, calls)| *calls > 0)
            .collect(),
        cpu,
        note: tally.first_error,
    })
}
