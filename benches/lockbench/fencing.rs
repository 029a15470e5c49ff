//! Fencing tokens under contention across proxies: the same workload (50 connections looping
//! `LOCK.ACQUIRE` → `LOCK.RELEASE` on 20 shared keys) through one proxy, then split over two
//! proxies in front of the same masters. Tokens from two proxies can conflict (a master refuses
//! a token not above the key's counter, and the acquire is tried once more); the grant rates
//! side by side show what that costs.

use crate::settings::Settings;
use redlock_testkit::lock_grant;
use redlock_testkit::resp::Client;
use redlock_testkit::workload::Rng;
use std::sync::Arc;
use std::time::Instant;

/// Connections and shared keys of every cell.
const CONNS: usize = 50;
const KEYS: usize = 20;

pub struct FenceResult {
    pub proxies: usize,
    pub grants_per_sec: f64,
    pub attempts_per_sec: f64,
    /// Grants whose token was not above the last token seen for the key by this run.
    pub regressions: u64,
}

/// Runs the workload with its connections spread over `ports` for the settings' window.
pub async fn run(s: &Settings, tag: &str, ports: &[u16]) -> FenceResult {
    let window = s.window();
    let last_tokens = Arc::new(std::sync::Mutex::new(vec![0u64; KEYS]));
    let tasks: Vec<_> = (0..CONNS)
        .map(|conn| {
            let port = ports[conn % ports.len()];
            let (tag, last_tokens) = (tag.to_string(), last_tokens.clone());
            let (start, end) = (window.start, window.end);
            tokio::spawn(async move {
                let mut c = Client::connect(port).await;
                let (mut grants, mut attempts, mut regressions) = (0u64, 0u64, 0u64);
                let mut rng = Rng::new(conn as u64 + 1);
                for n in 0u64.. {
                    if Instant::now() >= end {
                        break;
                    }
                    let slot = rng.below(KEYS);
                    let key = format!("fence:{tag}:{slot}");
                    let value = format!("{conn}-{n}");
                    let reply = c.cmd(&["LOCK.ACQUIRE", &key, &value, "30000"]).await;
                    let counted = Instant::now() >= start;
                    attempts += u64::from(counted);
                    let Some((token, _)) = lock_grant(&reply) else {
                        continue;
                    };
                    {
                        let mut last = last_tokens.lock().unwrap();
                        if token <= last[slot] {
                            regressions += 1;
                        }
                        last[slot] = last[slot].max(token);
                    }
                    c.cmd(&["LOCK.RELEASE", &key, &value]).await;
                    grants += u64::from(counted);
                }
                (grants, attempts, regressions)
            })
        })
        .collect();
    let (mut grants, mut attempts, mut regressions) = (0, 0, 0);
    for task in tasks {
        if let Ok((g, a, r)) = task.await {
            grants += g;
            attempts += a;
            regressions += r;
        }
    }
    let secs = (window.end - window.start).as_secs_f64().max(f64::EPSILON);
    FenceResult {
        proxies: ports.len(),
        grants_per_sec: grants as f64 / secs,
        attempts_per_sec: attempts as f64 / secs,
        regressions,
    }
}
