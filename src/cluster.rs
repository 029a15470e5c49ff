//! The set of masters as one voting body: fan-out of a request to every master, collection of
//! the votes into a slot vector, and the script cache that makes `EVALSHA` work on masters
//! that never saw (or forgot) a script (the proxy sends them the body).
//!
//! Invariant: every fan-out sends the *same* request to every master at once and records each
//! master's answer in the slot of that master; the caller's decision rule (pure, in
//! [`crate::redlock`]) says when enough is known. Masters still pending at that point keep
//! their place in their connection's FIFO, so a later command of the same client to that
//! master is never overtaken by it.

use crate::backend::{LateHandler, LateHook, Master};
use crate::config::Config;
use crate::lease_script::{recognise, LeaseShape};
use crate::protocol::reply::encode_command;
use crate::protocol::Reply;
use crate::redlock::{quorum, Vote};
use bytes::{Bytes, BytesMut};
use dashmap::DashMap;
use futures::stream::{FuturesUnordered, StreamExt};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Semaphore};

/// Most fan-outs in progress at once. Enough to keep every master's connection busy (a fan-out
/// is one pipelined request per master), small enough that a backlog of this many is worked
/// off well within a node timeout.
pub const MAX_FANOUTS: usize = 256;

/// All masters, the shared script cache and the timing settings.
pub struct Cluster {
    pub masters: Vec<Arc<Master>>,
    /// SHA1 (lower-case hex) → script, from every `EVAL` and `SCRIPT LOAD` seen.
    pub scripts: DashMap<String, Script>,
    pub drift_factor: f64,
    pub node_timeout: Duration,
    /// Quarantine masters that lost data (off only in tests).
    pub quarantine: bool,
    /// Configured cap on lock TTLs across all proxies, if any.
    pub max_lock_ttl_cap: Option<u64>,
    /// Largest TTL this proxy has sent to the masters in an acquire.
    largest_ttl_sent: AtomicU64,
    /// This proxy's canary key ([`crate::health`]), unique per process.
    pub canary_key: Bytes,
    /// SHA1 of [`ACQUIRE_SCRIPT`].
    pub acquire_sha: String,
    /// Bounds the fan-outs in progress (see [`MAX_FANOUTS`]).
    fanouts: Semaphore,
    stop: watch::Sender<bool>,
}

impl Cluster {
    /// Starts connecting to, and watching, every master of `config.backends`.
    pub fn start(config: &Config) -> Arc<Cluster> {
        let (stop, stop_rx) = watch::channel(false);
        let node_timeout = config.node_timeout();
        let masters: Vec<Arc<Master>> = config
            .backends
            .iter()
            .map(|a| Master::new(a.clone(), node_timeout))
            .collect();
        for master in &masters {
            master.spawn(stop_rx.clone());
        }
        let cluster = Arc::new(Cluster {
            masters,
            scripts: DashMap::new(),
            drift_factor: config.drift_factor,
            node_timeout,
            quarantine: config.quarantine,
            max_lock_ttl_cap: config.max_lock_ttl_ms,
            largest_ttl_sent: AtomicU64::new(0),
            canary_key: Bytes::from(format!(
                "redlock-proxy:canary:{}:{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos())
            )),
            acquire_sha: script_sha(ACQUIRE_SCRIPT.as_bytes()),
            fanouts: Semaphore::new(MAX_FANOUTS),
            stop,
        });
        crate::health::spawn_monitors(
            &cluster,
            Duration::from_millis(config.health_interval_ms),
            stop_rx,
        );
        cluster
    }

    /// Records that an acquire with `ttl_ms` is being sent to the masters.
    pub fn note_ttl(&self, ttl_ms: u64) {
        self.largest_ttl_sent.fetch_max(ttl_ms, Ordering::Relaxed);
    }

    /// The longest lease any master may hold: the configured cap, else the largest TTL this
    /// proxy has sent.
    pub fn max_lock_ttl_ms(&self) -> u64 {
        self.max_lock_ttl_cap
            .unwrap_or_else(|| self.largest_ttl_sent.load(Ordering::Relaxed))
    }

    /// How long a master that lost data is kept out of every quorum now (longest lease plus
    /// drift), or `None` when quarantine is off.
    pub fn quarantine_wait(&self) -> Option<Duration> {
        self.quarantine
            .then(|| crate::health::quarantine_duration(self.max_lock_ttl_ms(), self.drift_factor))
    }

    /// Stops every connection task.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    pub fn quorum(&self) -> usize {
        quorum(self.masters.len())
    }

    /// Sends `payload` to every master at once and collects the votes until `decided` says the
    /// outcome is known or every master has answered or timed out. A master that answers
    /// `NOSCRIPT` is sent `noscript_fallback` (the same call as `EVAL`), if given. Only the
    /// acquire uses this: its vote may simply be lost when the fan-out is decided first, and
    /// the retry may run after a later command of the same client on that master, which can
    /// only leave a lock key behind on that master until it expires (see `commands::lock`).
    pub async fn fan_out(
        &self,
        payload: &Bytes,
        noscript_fallback: Option<&Bytes>,
        late: Option<&LateHandler>,
        decided: impl Fn(&[Vote]) -> bool,
    ) -> Vec<Vote> {
        // Waiting here, before any master is asked, keeps the proxy's own backlog out of the
        // node timeout: under overload requests queue for a permit (and, beyond the per-client
        // bound, in the clients' sockets) instead of timing out on the masters' connections.
        // The semaphore is fair, so a client's requests still leave in its order.
        let _permit = self.fanouts.acquire().await;
        let mut votes = vec![Vote::Pending; self.masters.len()];
        let mut pending: FuturesUnordered<_> = self
            .masters
            .iter()
            .enumerate()
            .map(|(i, master)| {
                let hook = || {
                    late.map(|handler| LateHook {
                        index: i,
                        handler: handler.clone(),
                    })
                };
                let first = master.call(payload.clone(), hook());
                let retry = noscript_fallback.map(|eval| (eval.clone(), hook()));
                async move {
                    match (first.await, retry) {
                        // The master lost the script (restart, SCRIPT FLUSH): send the body.
                        (Vote::Replied(r), Some((eval, hook))) if r.is_error_code("NOSCRIPT") => {
                            (i, master.call(eval, hook).await)
                        }
                        (vote, _) => (i, vote),
                    }
                }
            })
            .collect();
        while let Some((i, vote)) = pending.next().await {
            votes[i] = vote;
            if decided(&votes) {
                break;
            }
        }
        votes
    }

    /// Sends `payload` to the masters where `targets[i]` is true; waits (each bounded by the
    /// node timeout) only for those where `confirm[i]` is also true. Used for rollbacks: a
    /// master whose acquire vote already timed out gets the rollback queued (and its late hook
    /// cleans up after a late OK), so waiting on it would only add a node timeout to the
    /// refusal.
    pub async fn send_to(&self, payload: &Bytes, targets: &[bool], confirm: &[bool]) {
        let calls: FuturesUnordered<_> = self
            .masters
            .iter()
            .enumerate()
            .filter(|(i, _)| targets[*i])
            .filter_map(|(i, m)| {
                if confirm[i] {
                    Some(m.call(payload.clone(), None))
                } else {
                    m.forget(payload.clone());
                    None
                }
            })
            .collect();
        calls.collect::<Vec<_>>().await;
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Encodes a command for the masters.
pub fn command<A: AsRef<[u8]>>(args: &[A]) -> Bytes {
    let mut out = BytesMut::new();
    encode_command(args, &mut out);
    out.freeze()
}

/// A script the proxy has seen: its body and, if it sets a lease from an argument, where.
#[derive(Debug, Clone)]
pub struct Script {
    pub body: Bytes,
    pub lease: Option<LeaseShape>,
}

impl Cluster {
    /// The cached script for `body`, analysed once and remembered under its SHA1.
    pub fn remember_script(&self, body: Bytes) -> Script {
        self.scripts
            .entry(script_sha(&body))
            .or_insert_with(|| Script {
                lease: recognise(&body),
                body,
            })
            .clone()
    }

    /// The cached script with this SHA1 (any case), if known.
    pub fn script_by_sha(&self, sha: &[u8]) -> Option<Script> {
        let sha = String::from_utf8_lossy(sha).to_ascii_lowercase();
        self.scripts.get(&sha).map(|s| s.clone())
    }
}

/// Lower-case hex SHA1 of a script body, as Redis computes it for `EVALSHA`.
pub fn script_sha(body: &[u8]) -> String {
    sha1_smol::Sha1::from(body).digest().to_string()
}

/// The acquire on one master: set the lock only if this proxy's canary key is still there
/// (`-1` otherwise: the master lost its data since it was last checked and must not vote).
/// Checked in the same script so no wipe can fall between the check and the write.
pub const ACQUIRE_SCRIPT: &str = "if redis.call('exists', KEYS[2]) == 0 then return -1 end return redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])";

/// The vote of a master whose canary was missing at acquire time.
pub const CANARY_MISSING: Reply = Reply::Integer(-1);

/// The compare-and-delete run on every master that may hold a refused acquire's value.
pub const ROLLBACK_SCRIPT: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

/// `EVAL <compare-and-delete> 1 key value`.
pub fn rollback_command(key: &[u8], value: &[u8]) -> Bytes {
    command(&[
        b"EVAL".as_ref(),
        ROLLBACK_SCRIPT.as_bytes(),
        b"1",
        key,
        value,
    ])
}

/// One reply for all masters by the quorum rule, waiting only as long as needed.
pub async fn quorum_reply(cluster: &Cluster, payload: &Bytes) -> Reply {
    let votes = cluster
        .fan_out(payload, None, None, |v| crate::redlock::merge(v).is_some())
        .await;
    crate::redlock::merge(&votes).unwrap_or_else(|| crate::redlock::no_quorum(votes.len()))
}
