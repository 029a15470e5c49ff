//! The set of masters as one voting body: fan-out of a request to every master, collection of
//! the votes into a slot vector, and the script cache that makes `EVALSHA` work on masters
//! that never saw (or forgot) a script (the proxy sends them the body).
//!
//! Invariant: every fan-out sends the *same* request to every master at once and records each
//! master's answer in the slot of that master; the caller's decision rule (pure, in
//! [`crate::redlock`]) says when enough is known. Masters still pending at that point keep
//! their place in their connection's FIFO, so a later command of the same client to that
//! master is never overtaken by it.

use crate::backend::Master;
use crate::config::Config;
use crate::lease_script::{is_compare_and_delete, may_set_expiry, recognise, LeaseShape};
use crate::protocol::reply::encode_command;
use crate::protocol::Reply;
use crate::redlock::{backend_ttl_ms, quorum, MergeRule, Vote};
use bytes::{Bytes, BytesMut};
use dashmap::DashMap;
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Semaphore};

/// Most fan-outs in progress at once. Enough to keep every master's connection busy (a fan-out
/// is one pipelined request per master), small enough that a backlog of this many is worked
/// off well within a node timeout.
pub const MAX_FANOUTS: usize = 256;

/// Votes of a fan-out still pending when it was decided, as `(master index, vote)`.
pub type LateVotes = FuturesUnordered<BoxFuture<'static, (usize, Vote)>>;

/// Most scripts remembered by SHA1. Clients that interpolate values into script bodies would
/// otherwise grow the cache without end; an evicted script's `EVALSHA` gets `NOSCRIPT`, and
/// every client library then sends the body again (`EVAL`).
pub const MAX_SCRIPTS: usize = 10_000;

/// All masters, the shared script cache and the timing settings.
pub struct Cluster {
    pub masters: Vec<Arc<Master>>,
    /// SHA1 (lower-case hex) → script, from every `EVAL` and `SCRIPT LOAD` seen.
    pub scripts: DashMap<String, Script>,
    pub drift_factor: f64,
    pub node_timeout: Duration,
    /// Quarantine masters that lost data (off only in tests).
    pub quarantine: bool,
    /// The longest lock TTL any proxy forwards (`max_lock_ttl_ms`).
    pub max_lock_ttl_ms: u64,
    /// SHA1 of [`ACQUIRE_SCRIPT`].
    pub acquire_sha: String,
    /// Unique per process (pid, start time): the prefix of this proxy's attempt ids.
    instance: String,
    attempts: AtomicU64,
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
            max_lock_ttl_ms: config.max_lock_ttl_ms,
            acquire_sha: script_sha(ACQUIRE_SCRIPT.as_bytes()),
            instance: format!(
                "{}.{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos())
            ),
            attempts: AtomicU64::new(0),
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

    /// The longest any key the proxy sets or extends can live on a master: the TTL cap plus
    /// drift. How long a master that lost data is quarantined (see [`crate::health`]).
    pub fn lease_bound(&self) -> Duration {
        Duration::from_millis(backend_ttl_ms(self.max_lock_ttl_ms, self.drift_factor))
    }

    /// The refusal for a TTL above the cap, if `ttl_ms` is above it.
    pub fn check_ttl(&self, ttl_ms: u64) -> Result<(), Reply> {
        if ttl_ms > self.max_lock_ttl_ms {
            // Quarantine of a master that lost data lasts the cap + drift: a longer lease
            // could outlive it.
            return Err(Reply::error(format!(
                "ERR lock TTL {ttl_ms} ms is above max_lock_ttl_ms ({} ms) of redlock-proxy",
                self.max_lock_ttl_ms
            )));
        }
        Ok(())
    }

    /// A new acquire attempt id, unique across proxies and restarts.
    pub fn next_attempt_id(&self) -> String {
        let n = self.attempts.fetch_add(1, Ordering::Relaxed);
        format!("{}.{n}", self.instance)
    }

    /// Stops every connection task.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    pub fn quorum(&self) -> usize {
        quorum(self.masters.len())
    }

    /// Sends `payload` (which produces `replies` replies per master) to every master at once
    /// and collects the votes until `decided` says the outcome is known or every master has
    /// answered or timed out.
    pub async fn fan_out(
        &self,
        payload: &Bytes,
        replies: usize,
        decided: impl Fn(&[Vote]) -> bool,
    ) -> Vec<Vote> {
        let (votes, _late) = self
            .fan_out_each(|_| Some((payload.clone(), None)), replies, decided)
            .await;
        votes
    }

    /// [`Cluster::fan_out`] with a payload of its own for each master (`payload(i)`; `None`:
    /// nothing is sent there and its vote is missing at once), and an optional second payload
    /// sent to a master that answers `NOSCRIPT` (the same call as `EVAL`). Only the acquire
    /// uses these; its `EVAL` retry goes out later than the client's next command may, which
    /// can only leave the value on that master until its clean-up (never a grant). Also
    /// returns the votes still pending at the decision, which arrive later (each within the
    /// node timeout), for the acquire's clean-up.
    pub async fn fan_out_each(
        &self,
        payload: impl Fn(usize) -> Option<(Bytes, Option<Bytes>)>,
        replies: usize,
        decided: impl Fn(&[Vote]) -> bool,
    ) -> (Vec<Vote>, LateVotes) {
        // Waiting here, before any master is asked, keeps the proxy's own backlog out of the
        // node timeout: under overload requests queue for a permit (and, beyond the per-client
        // bound, in the clients' sockets) instead of timing out on the masters' connections.
        // The semaphore is fair, so a client's requests still leave in its order.
        let _permit = self.fanouts.acquire().await;
        let mut votes = vec![Vote::Pending; self.masters.len()];
        let mut pending: LateVotes = self
            .masters
            .iter()
            .enumerate()
            .map(|(i, master)| {
                let call = payload(i);
                let master = master.clone();
                let vote: BoxFuture<'static, (usize, Vote)> = Box::pin(async move {
                    let Some((first, retry)) = call else {
                        return (i, master.absent_vote());
                    };
                    match (master.call(first, replies).await, retry) {
                        // The master lost the script (restart, SCRIPT FLUSH): send the body.
                        (Vote::Replied(r), Some(eval)) if r.is_error_code("NOSCRIPT") => {
                            (i, master.call(eval, replies).await)
                        }
                        (vote, _) => (i, vote),
                    }
                });
                vote
            })
            .collect();
        while let Some((i, vote)) = pending.next().await {
            votes[i] = vote;
            if decided(&votes) {
                break;
            }
        }
        (votes, pending)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Cluster {
    /// The cached script for `body`, analysed once and remembered under its SHA1.
    pub fn remember_script(&self, body: Bytes) -> Script {
        let sha = script_sha(&body);
        if let Some(known) = self.scripts.get(&sha) {
            return known.clone();
        }
        if self.scripts.len() >= MAX_SCRIPTS {
            let victim = self.scripts.iter().next().map(|e| e.key().clone());
            if let Some(victim) = victim {
                self.scripts.remove(&victim);
            }
        }
        let script = Script {
            lease: recognise(&body),
            merge: if is_compare_and_delete(&body) {
                MergeRule::Release
            } else {
                MergeRule::Strict
            },
            sets_expiry: may_set_expiry(&body),
            body,
        };
        self.scripts.insert(sha, script.clone());
        script
    }

    /// The cached script with this SHA1 (any case), if known.
    pub fn script_by_sha(&self, sha: &[u8]) -> Option<Script> {
        let sha = String::from_utf8_lossy(sha).to_ascii_lowercase();
        self.scripts.get(&sha).map(|s| s.clone())
    }
}

/// A script the proxy has seen, and what it knows of its meaning.
#[derive(Debug, Clone)]
pub struct Script {
    pub body: Bytes,
    /// Where it takes a lease TTL from, if it sets one from an argument.
    pub lease: Option<LeaseShape>,
    /// How its replies merge: only a recognised compare-and-delete has a known meaning.
    pub merge: MergeRule,
    /// It may set or extend expiries: followed by [`GUARD_SCRIPT`] on every master.
    pub sets_expiry: bool,
}

/// Lower-case hex SHA1 of a script body, as Redis computes it for `EVALSHA`.
pub fn script_sha(body: &[u8]) -> String {
    sha1_smol::Sha1::from(body).digest().to_string()
}

/// Encodes a command for the masters.
pub fn command<A: AsRef<[u8]>>(args: &[A]) -> Bytes {
    let mut out = BytesMut::new();
    encode_command(args, &mut out);
    out.freeze()
}

/// The acquire on one master. `KEYS` = the lock key, [`crate::health::ARMED_KEY`],
/// [`crate::health::QUARANTINE_KEY`], the attempt key ([`attempt_key`]); `ARGV` = the value,
/// `PX`, this attempt's id, the deadline (ms since the epoch, in the master's clock).
/// - Nothing is written after the deadline (`-2`): a write held up in a paused master's socket
///   buffer cannot take effect once the proxy has given up on it, so the clean-up sent after
///   the deadline is final (no phantom holder).
/// - Nothing is written unless the master is armed and not quarantined (`-1`): it lost its
///   data since it was last checked, or a proxy quarantined it. Checked in the same script, so
///   no wipe can fall between the check and the write.
/// - A successful write records the attempt's id beside the lock, with the same `PX`, so the
///   clean-up of a refused attempt deletes only what *that* attempt wrote, never the grant of a
///   later attempt with the same value (redis-py retries with the same token).
pub const ACQUIRE_SCRIPT: &str = "local t = redis.call('time') if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[4]) then return -2 end if redis.call('exists', KEYS[2]) == 0 or redis.call('exists', KEYS[3]) == 1 then return -1 end local ok = redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) if ok then redis.call('set', KEYS[4], ARGV[3], 'PX', ARGV[2]) end return ok";

/// The vote of a master that was unarmed or quarantined at acquire time.
pub const UNARMED: Reply = Reply::Integer(-1);

/// Where an acquire records its attempt id beside `key`.
pub fn attempt_key(key: &[u8]) -> Bytes {
    let mut name = BytesMut::with_capacity(key.len() + 22);
    name.extend_from_slice(b"redlock-proxy:attempt:");
    name.extend_from_slice(key);
    name.freeze()
}

/// The clean-up of one acquire attempt: deletes the lock and its attempt key only if both are
/// still that attempt's (`KEYS` = lock key, attempt key; `ARGV` = value, attempt id).
pub const UNDO_SCRIPT: &str = "if redis.call('get', KEYS[1]) == ARGV[1] and redis.call('get', KEYS[2]) == ARGV[2] then return redis.call('del', KEYS[1], KEYS[2]) end return 0";

/// Run on every master right after a script that may set expiries (`KEYS` = the two markers,
/// then the script's keys; `ARGV[1]` = the lease bound in ms). First it caps every key of the
/// script at the bound (a script can compute any TTL: redis-py's `extend` adds to the current
/// one), then it answers `-1` if the master is unarmed or quarantined, else how many keys it
/// had to cap. Run *after* the script, a present marker proves no wipe came before the
/// script ran (a wiped master is re-armed only together with its quarantine).
pub const GUARD_SCRIPT: &str = "local capped = 0 for i = 3, #KEYS do if redis.call('pttl', KEYS[i]) > tonumber(ARGV[1]) then redis.call('pexpire', KEYS[i], ARGV[1]) capped = capped + 1 end end if redis.call('exists', KEYS[1]) == 0 or redis.call('exists', KEYS[2]) == 1 then return -1 end return capped";

/// The compare-and-delete that undoes a refused acquire on a master.
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

/// One reply for all masters by the quorum rule `rule`, waiting only as long as needed.
pub async fn quorum_reply(cluster: &Cluster, payload: &Bytes, rule: MergeRule) -> Reply {
    let votes = cluster
        .fan_out(payload, 1, |v| crate::redlock::merge(v, rule).is_some())
        .await;
    crate::redlock::merge(&votes, rule).unwrap_or_else(|| crate::redlock::no_quorum(votes.len()))
}
