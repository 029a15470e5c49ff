//! A small Redisson lock client, in Rust, for the tests: Redisson (the Java library) cannot be
//! installed here, so this client replays what it sends, byte for byte, over the kit's RESP
//! client ([`crate::resp::Client`]): its exact Lua scripts (Redisson 3.45 and its current
//! source: `RedissonLock`, `RedissonBaseLock`, `RedissonFencedLock`, the watchdog of `RedissonBaseLock` and of
//! `renewal.LockTask`), sent by `EVALSHA` with `SCRIPT LOAD` after a `NOSCRIPT` (Redisson's
//! script cache) or by `EVAL`, its key and channel names, its unlock latch and its waiter
//! protocol:
//! - a lock is a hash `name`, field `<uuid>:<threadId>` → reentrancy count;
//! - acquire ([`ACQUIRE`]): null = acquired (or re-entered), else the holder's PTTL; without a
//!   lease of its own the lock gets the watchdog timeout (30 s) and a watchdog task renews it
//!   every third of that ([`RENEW`], or [`RENEW_BATCH`] as its current source does) while held;
//! - a waiter subscribes to `redisson_lock__channel:{name}` on a connection of its own, tries,
//!   then waits for an unlock message or the returned PTTL (whichever comes first), and
//!   retries;
//! - unlock ([`UNLOCK`]) decrements the count, deletes the hash and publishes `0` on the channel
//!   at zero, and leaves a latch `redisson_unlock_latch:{name}:<requestId>` holding its answer,
//!   so that a retried unlock of the same request answers the same; the client deletes the
//!   latch afterwards;
//! - `RFencedLock` ([`FENCED_ACQUIRE`]) answers `{-1, token}` when acquired, `{pttl, -1}`
//!   when held.
//!
//! Every wait is bounded: a waiter gives up at its wait time ([`RLock::lock`] waits at most
//! [`LOCK_WAIT_LIMIT`]), and a watchdog ends at unlock, when its renewal answers 0 or an error,
//! or after [`WATCHDOG_LIMIT`].

use crate::resp::{Client, Reply};
use redlock_proxy::on_master::script_sha;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// `RedissonLock.tryLockInnerAsync`: `KEYS = [name]`, `ARGV = [lease ms, <uuid>:<threadId>]`.
/// Null: acquired (or re-entered); else the holder's PTTL.
pub const ACQUIRE: &str = "if ((redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; return redis.call('pttl', KEYS[1]);";

/// `RedissonLock.unlockInnerAsync`: `KEYS = [name, channel, latch]`, `ARGV = [unlock message,
/// lease ms, <uuid>:<threadId>, publish command, latch ms]`. The latched answer if this
/// request already ran; null: not held by this thread; 0: still held (re-entered); 1: released
/// (and the message published).
pub const UNLOCK: &str = "local val = redis.call('get', KEYS[3]); if val ~= false then return tonumber(val);end; if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then return nil;end; local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); if (counter > 0) then redis.call('pexpire', KEYS[1], ARGV[2]); redis.call('set', KEYS[3], 0, 'px', ARGV[5]); return 0; else redis.call('del', KEYS[1]); redis.call(ARGV[4], KEYS[2], ARGV[1]); redis.call('set', KEYS[3], 1, 'px', ARGV[5]); return 1; end; ";

/// The watchdog's renewal of one lock (`RedissonBaseLock.renewExpirationAsync`, before the
/// batched renewal): `KEYS = [name]`, `ARGV = [lease ms, <uuid>:<threadId>]`; 1 renewed, 0
/// not held.
pub const RENEW: &str = "if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then redis.call('pexpire', KEYS[1], ARGV[1]); return 1; end; return 0;";

/// The watchdog's renewal of many locks at once (`renewal.LockTask`, Redisson's current
/// source): `KEYS = names`, `ARGV = [lease ms, <uuid>:<threadId> of each]`; one 1 or 0 per lock.
pub const RENEW_BATCH: &str = "local result = {} for i = 1, #KEYS, 1 do if (redis.call('hexists', KEYS[i], ARGV[i + 1]) == 1) then redis.call('pexpire', KEYS[i], ARGV[1]); table.insert(result, 1); else table.insert(result, 0); end; end; return result;";

/// `RedissonFencedLock.tryLockInnerAsync(leaseTime, unit, threadId)`: `KEYS = [name, token
/// counter]`, `ARGV` as [`ACQUIRE`]'s. `{-1, token}` when acquired, `{pttl, -1}` when held.
pub const FENCED_ACQUIRE: &str = "if (redis.call('exists', KEYS[1]) == 0 or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then local token = redis.call('incr', KEYS[2]);redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return {-1, token}; end; return {redis.call('pttl', KEYS[1]), -1};";

/// `RedissonFencedLock`'s override of the plain acquire (its `lock()` and `tryLock()`): as
/// [`ACQUIRE`], with the token counter incremented.
pub const FENCED_LOCK_ACQUIRE: &str = "if ((redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then redis.call('incr', KEYS[2]);redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; return redis.call('pttl', KEYS[1]);";

/// `LockPubSub.UNLOCK_MESSAGE`: what an unlock publishes.
pub const UNLOCK_MESSAGE: &str = "0";
/// The lease of a lock taken without one (`lockWatchdogTimeout`, 30 s by default).
pub const WATCHDOG_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an unlock's latch lives: `(timeout + retryInterval) × retryAttempts` of Redisson's
/// defaults (3000 ms, 1500 ms, 3).
pub const LATCH_TIMEOUT_MS: u64 = 13_500;
/// The longest [`RLock::lock`] waits (Redisson's waits forever; a test must not).
pub const LOCK_WAIT_LIMIT: Duration = Duration::from_secs(60);
/// The longest a watchdog renews one hold.
pub const WATCHDOG_LIMIT: Duration = Duration::from_secs(600);

/// Redisson's `prefixName`: `prefix:name` when the name already has a hash tag, else
/// `prefix:{name}`.
fn prefix_name(prefix: &str, name: &str) -> String {
    match name.contains('{') {
        true => format!("{prefix}:{name}"),
        false => format!("{prefix}:{{{name}}}"),
    }
}

/// The channel unlocks of `name` are published on.
pub fn channel_name(name: &str) -> String {
    prefix_name("redisson_lock__channel", name)
}

/// The latch of the unlock request `request_id` of `name`.
pub fn latch_name(name: &str, request_id: &str) -> String {
    format!(
        "{}:{request_id}",
        prefix_name("redisson_unlock_latch", name)
    )
}

/// `RFencedLock`'s token counter of `name`.
pub fn token_name(name: &str) -> String {
    prefix_name("redisson_lock_token", name)
}

/// `n` random bytes in hex (Redisson's `generateId` for request ids; its client id is a UUID).
fn random_hex(n: usize) -> String {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    let mut out = String::with_capacity(2 * n);
    while out.len() < 2 * n {
        // RandomState is seeded at random per process and per instance.
        let mut h = RandomState::new().build_hasher();
        h.write_u64(SEQUENCE.fetch_add(1, Ordering::Relaxed));
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out.truncate(2 * n);
    out
}

/// What went wrong, as Redisson would throw it.
#[derive(Debug)]
pub enum Error {
    /// An error reply (`RedisException`).
    Reply(String),
    /// Unlock of a lock this thread does not hold (`IllegalMonitorStateException`).
    NotHeld,
    /// A reply of a shape the script cannot give.
    Unexpected(String),
    /// [`RLock::lock`] waited [`LOCK_WAIT_LIMIT`].
    TimedOut,
    Io(io::Error),
}

impl From<io::Error> for Error {
    fn from(err: io::Error) -> Error {
        Error::Io(err)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// How scripts go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scripts {
    /// `EVALSHA`; after `NOSCRIPT`, `SCRIPT LOAD` and `EVALSHA` again (`useScriptCache`).
    EvalSha,
    /// `EVAL` with the body every time.
    Eval,
}

/// Which renewal script the watchdog sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// [`RENEW`], one lock per call.
    PerLock,
    /// [`RENEW_BATCH`] (with this one lock).
    Batched,
}

/// One script call on `conn`, as Redisson sends it.
async fn eval(
    conn: &mut Client,
    mode: Scripts,
    script: &str,
    keys: &[&str],
    args: &[&str],
) -> Result<Reply> {
    let numkeys = keys.len().to_string();
    let sha = script_sha(script.as_bytes());
    let call = |command: &'static str, first: &str| -> Vec<Vec<u8>> {
        [command, first, &numkeys]
            .iter()
            .chain(keys)
            .chain(args)
            .map(|a| a.as_bytes().to_vec())
            .collect()
    };
    let send = async |conn: &mut Client, words: &[Vec<u8>]| {
        let words: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
        conn.request(&words).await
    };
    let reply = match mode {
        Scripts::Eval => send(conn, &call("EVAL", script)).await?,
        Scripts::EvalSha => match send(conn, &call("EVALSHA", &sha)).await? {
            Reply::Error(e) if e.starts_with(b"NOSCRIPT") => {
                let loaded = conn
                    .request(&[b"SCRIPT", b"LOAD", script.as_bytes()])
                    .await?;
                if loaded.text().as_deref() != Some(sha.as_str()) {
                    return Err(Error::Unexpected(format!("SCRIPT LOAD: {loaded}")));
                }
                send(conn, &call("EVALSHA", &sha)).await?
            }
            reply => reply,
        },
    };
    match reply {
        Reply::Error(e) => Err(Error::Reply(String::from_utf8_lossy(&e).into_owned())),
        reply => Ok(reply),
    }
}

/// A Redisson client: its id (a UUID, as `ServiceManager.getId()`) and settings.
#[derive(Debug, Clone)]
pub struct Redisson {
    port: u16,
    id: String,
    watchdog_timeout: Duration,
    /// How long an unlock's latch lives ([`LATCH_TIMEOUT_MS`] by default).
    latch_timeout: Duration,
    renewal: Renewal,
    scripts: Scripts,
}

impl Redisson {
    /// A client of the server on `port`, with Redisson's defaults.
    pub fn new(port: u16) -> Redisson {
        let hex = random_hex(16);
        let id = format!(
            "{}-{}-{}-{}-{}",
            &hex[..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..]
        );
        Redisson {
            port,
            id,
            watchdog_timeout: WATCHDOG_TIMEOUT,
            latch_timeout: Duration::from_millis(LATCH_TIMEOUT_MS),
            renewal: Renewal::PerLock,
            scripts: Scripts::EvalSha,
        }
    }

    /// `lockWatchdogTimeout`: the lease of locks taken without one.
    pub fn watchdog_timeout(mut self, timeout: Duration) -> Redisson {
        self.watchdog_timeout = timeout;
        self
    }

    /// The unlock latch's lifetime, as Redisson derives it from its `timeout`,
    /// `retryInterval` and `retryAttempts` settings.
    pub fn latch_timeout(mut self, timeout: Duration) -> Redisson {
        self.latch_timeout = timeout;
        self
    }

    pub fn renewal(mut self, renewal: Renewal) -> Redisson {
        self.renewal = renewal;
        self
    }

    pub fn scripts(mut self, scripts: Scripts) -> Redisson {
        self.scripts = scripts;
        self
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// `getLock(name)` as used by the thread `thread_id`, on a command connection of its own.
    pub async fn lock(&self, name: &str, thread_id: u64) -> io::Result<RLock> {
        RLock::open(self.clone(), name, thread_id, false).await
    }

    /// `getFencedLock(name)` as used by the thread `thread_id`.
    pub async fn fenced_lock(&self, name: &str, thread_id: u64) -> io::Result<RFencedLock> {
        Ok(RFencedLock(
            RLock::open(self.clone(), name, thread_id, true).await?,
        ))
    }
}

/// What a watchdog did: renewals that answered 1, and why it stopped (if it did).
#[derive(Debug, Default)]
pub struct WatchdogLog {
    pub renewals: AtomicU64,
    pub stopped: Mutex<Option<String>>,
}

struct Watchdog {
    task: JoinHandle<()>,
    log: Arc<WatchdogLog>,
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What one acquire answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Taken (or re-entered); `RFencedLock`'s token.
    Acquired(Option<i64>),
    /// Held by another, for this long (ms).
    Held(i64),
}

/// `RLock` as one thread uses it.
pub struct RLock {
    redisson: Redisson,
    name: String,
    thread_id: u64,
    fenced: bool,
    conn: Client,
    /// `internalLockLeaseTime`: the lease of the last acquire (the unlock's re-entrant
    /// `PEXPIRE` and the watchdog use it).
    lease_ms: u64,
    /// Holds taken without a lease of their own (the watchdog renews while there are some).
    watched: u32,
    watchdog: Option<Watchdog>,
}

impl RLock {
    async fn open(
        redisson: Redisson,
        name: &str,
        thread_id: u64,
        fenced: bool,
    ) -> io::Result<RLock> {
        let conn = Client::open(redisson.port, crate::resp::CONNECT_LIMIT).await?;
        Ok(RLock {
            lease_ms: redisson.watchdog_timeout.as_millis() as u64,
            redisson,
            name: name.to_string(),
            thread_id,
            fenced,
            conn,
            watched: 0,
            watchdog: None,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `<uuid>:<threadId>`: this thread's field in the lock's hash.
    pub fn lock_name(&self) -> String {
        format!("{}:{}", self.redisson.id, self.thread_id)
    }

    /// One acquire (`tryAcquire`): with `lease`, for that long; without, for the watchdog
    /// timeout, and the watchdog starts (or counts one more hold). An `RFencedLock`'s answers
    /// its token.
    pub async fn try_acquire(&mut self, lease: Option<Duration>) -> Result<Attempt> {
        self.attempt(lease, true).await
    }

    /// One acquire; an `RFencedLock`'s by its token script `with_token`, else by its plain
    /// one (its `lock()`: null or the PTTL, the counter incremented all the same).
    async fn attempt(&mut self, lease: Option<Duration>, with_token: bool) -> Result<Attempt> {
        let lease_ms = lease
            .map_or(self.redisson.watchdog_timeout, |l| l)
            .as_millis() as u64;
        let (name, lock_name, mode) = (self.name.clone(), self.lock_name(), self.redisson.scripts);
        let (lease_arg, token_key) = (lease_ms.to_string(), token_name(&name));
        let args = [lease_arg.as_str(), lock_name.as_str()];
        let (script, keys) = match (self.fenced, with_token) {
            (false, _) => (ACQUIRE, vec![name.as_str()]),
            (true, true) => (FENCED_ACQUIRE, vec![name.as_str(), token_key.as_str()]),
            (true, false) => (FENCED_LOCK_ACQUIRE, vec![name.as_str(), token_key.as_str()]),
        };
        let attempt = match eval(&mut self.conn, mode, script, &keys, &args).await? {
            r if r.is_null() => Attempt::Acquired(None),
            Reply::Int(pttl) => Attempt::Held(pttl),
            Reply::Array(pair) => match pair.as_slice() {
                [Reply::Int(-1), Reply::Int(token)] => Attempt::Acquired(Some(*token)),
                [Reply::Int(pttl), Reply::Int(-1)] => Attempt::Held(*pttl),
                _ => return Err(Error::Unexpected(format!("{pair:?}"))),
            },
            other => return Err(Error::Unexpected(other.to_string())),
        };
        if let Attempt::Acquired(_) = attempt {
            self.lease_ms = lease_ms;
            if lease.is_none() {
                self.watch().await?;
            }
        }
        Ok(attempt)
    }

    /// `tryLock(waitTime, leaseTime)`: acquired within `wait`, subscribed to the lock's
    /// channel after a first refusal and retrying at each unlock message or when the holder's
    /// PTTL runs out.
    pub async fn try_lock(&mut self, wait: Duration, lease: Option<Duration>) -> Result<bool> {
        Ok(self.wait_for(wait, lease, false).await?.is_some())
    }

    /// `lock(leaseTime)` (waits at most [`LOCK_WAIT_LIMIT`]).
    pub async fn lock(&mut self, lease: Option<Duration>) -> Result<()> {
        match self.wait_for(LOCK_WAIT_LIMIT, lease, false).await? {
            Some(_) => Ok(()),
            None => Err(Error::TimedOut),
        }
    }

    /// The waiter protocol; the acquire's answer, or `None` when `wait` ran out.
    async fn wait_for(
        &mut self,
        wait: Duration,
        lease: Option<Duration>,
        with_token: bool,
    ) -> Result<Option<Attempt>> {
        let deadline = Instant::now() + wait;
        if let acquired @ Attempt::Acquired(_) = self.attempt(lease, with_token).await? {
            return Ok(Some(acquired));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        let mut subscription =
            Subscription::open(self.redisson.port, &channel_name(&self.name)).await?;
        // Each round waits for a message or the holder's PTTL: bounded by the wait, and every
        // round but the last takes at least a reply's round trip.
        while Instant::now() < deadline {
            let ttl = match self.attempt(lease, with_token).await? {
                acquired @ Attempt::Acquired(_) => return Ok(Some(acquired)),
                Attempt::Held(ttl) => ttl,
            };
            let remaining = deadline.saturating_duration_since(Instant::now());
            let pause = match u64::try_from(ttl) {
                Ok(ms) => remaining.min(Duration::from_millis(ms)),
                Err(_) => remaining,
            };
            subscription.wait_message(pause).await?;
        }
        Ok(None)
    }

    /// `unlock()`: fully released, or still held by this thread (re-entered). `NotHeld` if this
    /// thread did not hold it. The latch is deleted afterwards, as Redisson does.
    pub async fn unlock(&mut self) -> Result<bool> {
        let request_id = random_hex(16);
        let answer = self.unlock_request(&request_id).await;
        let latch = latch_name(&self.name, &request_id);
        let deleted = self.conn.request(&[b"DEL", latch.as_bytes()]).await?;
        if let Reply::Error(e) = deleted {
            return Err(Error::Reply(String::from_utf8_lossy(&e).into_owned()));
        }
        // Redisson's `cancelExpirationRenewal` runs whatever the answer.
        self.watched = self.watched.saturating_sub(1);
        let released = answer?;
        if released || self.watched == 0 {
            self.watched = 0;
            self.watchdog = None;
        }
        Ok(released)
    }

    /// One unlock request as Redisson sends it (no latch clean-up): true released, false
    /// still held, `NotHeld` for null.
    pub async fn unlock_request(&mut self, request_id: &str) -> Result<bool> {
        let (name, lock_name) = (self.name.clone(), self.lock_name());
        let keys = [
            name.clone(),
            channel_name(&name),
            latch_name(&name, request_id),
        ];
        let lease = self.lease_ms.to_string();
        let latch_ms = self.redisson.latch_timeout.as_millis().to_string();
        let args = [UNLOCK_MESSAGE, &lease, &lock_name, "publish", &latch_ms];
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        match eval(&mut self.conn, self.redisson.scripts, UNLOCK, &keys, &args).await? {
            r if r.is_null() => Err(Error::NotHeld),
            Reply::Int(1) => Ok(true),
            Reply::Int(0) => Ok(false),
            other => Err(Error::Unexpected(other.to_string())),
        }
    }

    /// `isHeldByCurrentThread()`: `HEXISTS name <uuid>:<threadId>`.
    pub async fn is_held_by_current_thread(&mut self) -> Result<bool> {
        let field = self.lock_name();
        let words: [&[u8]; 3] = [b"HEXISTS", self.name.as_bytes(), field.as_bytes()];
        match self.conn.request(&words).await? {
            Reply::Int(n) => Ok(n == 1),
            other => Err(Error::Unexpected(other.to_string())),
        }
    }

    /// `getHoldCount()`: `HGET name <uuid>:<threadId>`, 0 when absent.
    pub async fn hold_count(&mut self) -> Result<i64> {
        let field = self.lock_name();
        match self
            .conn
            .request(&[b"HGET", self.name.as_bytes(), field.as_bytes()])
            .await?
        {
            r if r.is_null() => Ok(0),
            Reply::Bulk(n) => String::from_utf8_lossy(&n)
                .parse()
                .map_err(|_| Error::Unexpected(format!("HGET: {n:?}"))),
            other => Err(Error::Unexpected(other.to_string())),
        }
    }

    /// The running watchdog's log (none while no hold is watched).
    pub fn watchdog(&self) -> Option<Arc<WatchdogLog>> {
        self.watchdog.as_ref().map(|w| w.log.clone())
    }

    /// `scheduleExpirationRenewal`: one more watched hold; the first starts the task.
    async fn watch(&mut self) -> Result<()> {
        self.watched += 1;
        if self
            .watchdog
            .as_ref()
            .is_some_and(|w| !w.task.is_finished())
        {
            return Ok(());
        }
        let conn = Client::open(self.redisson.port, crate::resp::CONNECT_LIMIT).await?;
        let log = Arc::new(WatchdogLog::default());
        let renewal = RenewalTask {
            conn,
            mode: self.redisson.scripts,
            kind: self.redisson.renewal,
            name: self.name.clone(),
            lock_name: self.lock_name(),
            lease_ms: self.lease_ms,
        };
        let task = tokio::spawn(renewal.run(log.clone()));
        self.watchdog = Some(Watchdog { task, log });
        Ok(())
    }
}

/// The watchdog of one hold: renews every third of the lease.
struct RenewalTask {
    conn: Client,
    mode: Scripts,
    kind: Renewal,
    name: String,
    lock_name: String,
    lease_ms: u64,
}

impl RenewalTask {
    /// Renews until a renewal answers 0 (not held any more) or an error (Redisson logs it and
    /// stops), or [`WATCHDOG_LIMIT`] passes; aborted at unlock.
    async fn run(mut self, log: Arc<WatchdogLog>) {
        let started = Instant::now();
        let every = Duration::from_millis(self.lease_ms / 3);
        let lease = self.lease_ms.to_string();
        let stop = |why: String| *log.stopped.lock().unwrap() = Some(why);
        while started.elapsed() < WATCHDOG_LIMIT {
            tokio::time::sleep(every).await;
            let (keys, args, script) = match self.kind {
                Renewal::PerLock => (
                    [self.name.as_str()],
                    [lease.as_str(), &self.lock_name],
                    RENEW,
                ),
                Renewal::Batched => (
                    [self.name.as_str()],
                    [lease.as_str(), &self.lock_name],
                    RENEW_BATCH,
                ),
            };
            let renewed = match eval(&mut self.conn, self.mode, script, &keys, &args).await {
                Ok(Reply::Int(1)) => true,
                Ok(Reply::Array(results)) if results == [Reply::Int(1)] => true,
                Ok(other) => return stop(format!("not renewed: {other}")),
                Err(err) => return stop(format!("{err:?}")),
            };
            if renewed {
                log.renewals.fetch_add(1, Ordering::Relaxed);
            }
        }
        stop("watchdog limit".into());
    }
}

/// A waiter's subscription to a lock's channel, on a connection of its own.
pub struct Subscription {
    conn: Client,
    channel: String,
}

impl Subscription {
    /// `SUBSCRIBE channel`, confirmed.
    pub async fn open(port: u16, channel: &str) -> Result<Subscription> {
        let mut conn = Client::open(port, crate::resp::CONNECT_LIMIT).await?;
        let confirmed = conn.request(&[b"SUBSCRIBE", channel.as_bytes()]).await?;
        let expected = Reply::Array(vec![
            Reply::Bulk("subscribe".into()),
            Reply::Bulk(channel.to_string().into()),
            Reply::Int(1),
        ]);
        if confirmed != expected {
            return Err(Error::Unexpected(format!("SUBSCRIBE: {confirmed}")));
        }
        Ok(Subscription {
            conn,
            channel: channel.to_string(),
        })
    }

    /// Waits at most `limit` for an unlock message on the channel: whether one came. A
    /// message that came while nobody waited is kept by the socket and returned at once, as
    /// Redisson's latch keeps its permit.
    pub async fn wait_message(&mut self, limit: Duration) -> Result<bool> {
        let deadline = Instant::now() + limit;
        // Bounded by the deadline: each message read is one round.
        loop {
            let message = match self.conn.read_reply(deadline).await {
                Ok(message) => message,
                Err(err) if err.kind() == io::ErrorKind::TimedOut => return Ok(false),
                Err(err) => return Err(err.into()),
            };
            let Reply::Array(parts) = &message else {
                return Err(Error::Unexpected(format!("on {}: {message}", self.channel)));
            };
            match parts.as_slice() {
                [Reply::Bulk(kind), Reply::Bulk(channel), Reply::Bulk(payload)]
                    if kind.as_ref() == b"message"
                        && channel.as_ref() == self.channel.as_bytes() =>
                {
                    // `LockPubSub`: 0 an unlock, 1 a read unlock; both wake a waiter.
                    if matches!(payload.as_ref(), b"0" | b"1") {
                        return Ok(true);
                    }
                }
                _ => return Err(Error::Unexpected(format!("on {}: {message}", self.channel))),
            }
        }
    }
}

/// `RFencedLock` as one thread uses it: an [`RLock`] whose acquire also answers a token.
pub struct RFencedLock(pub RLock);

impl RFencedLock {
    /// `tryLockAndGetToken(waitTime, leaseTime)`: the token, or `None` when `wait` ran out.
    pub async fn try_lock_and_get_token(
        &mut self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<i64>> {
        match self.0.wait_for(wait, lease, true).await? {
            Some(Attempt::Acquired(token)) => match token {
                Some(token) => Ok(Some(token)),
                None => Err(Error::Unexpected("a fenced acquire without a token".into())),
            },
            _ => Ok(None),
        }
    }

    /// `lockAndGetToken(leaseTime)` (waits at most [`LOCK_WAIT_LIMIT`]).
    pub async fn lock_and_get_token(&mut self, lease: Option<Duration>) -> Result<i64> {
        self.try_lock_and_get_token(LOCK_WAIT_LIMIT, lease)
            .await?
            .ok_or(Error::TimedOut)
    }

    /// `lock(leaseTime)`: the plain acquire of `RFencedLock` (no token in its answer).
    pub async fn lock(&mut self, lease: Option<Duration>) -> Result<()> {
        self.0.lock(lease).await
    }

    /// `getToken()`: `GET redisson_lock_token:{name}`.
    pub async fn get_token(&mut self) -> Result<Option<i64>> {
        let key = token_name(&self.0.name);
        match self.0.conn.request(&[b"GET", key.as_bytes()]).await? {
            r if r.is_null() => Ok(None),
            Reply::Bulk(n) => String::from_utf8_lossy(&n)
                .parse()
                .map(Some)
                .map_err(|_| Error::Unexpected(format!("GET: {n:?}"))),
            other => Err(Error::Unexpected(other.to_string())),
        }
    }

    /// `unlock()`, as [`RLock::unlock`].
    pub async fn unlock(&mut self) -> Result<bool> {
        self.0.unlock().await
    }
}
