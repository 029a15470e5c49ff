//! Redisson's locks through the proxy over 3 and 5 real masters and over 3 Redis Clusters of 3
//! primaries each (hash locks, their tokens and roll-backs per slot), driven by the test kit's
//! Redisson client (`testkit/src/redisson.rs`: Redisson's exact scripts, key and channel names,
//! latch and waiter protocol): lock and re-entry, a contender refused while held, the unlock
//! latch, the `PUBLISH` inside the unlock on every master, the watchdog keeping a lock past
//! three leases, `RFencedLock`'s tokens, the roll-back of a partial grant, a grant past its
//! validity, a waiter woken by the unlock's message (`SUBSCRIBE` through the proxy). Each
//! scenario first runs against one plain redis-server, so a failure there is the client's, not
//! the proxy's.
//!
//! Timing bounds here are derived from the leases and generous (behaviour, not latency).

use redlock_proxy::cluster::keys::token_key_on;
use redlock_proxy::cluster::slots::key_slot;
use redlock_proxy::on_master::UNDO_HASH_SCRIPT;
use redlock_proxy::{LocalCluster, LocalMaster};
use redlock_testkit::cluster::{proxy_over, three_clusters, RedisCluster};
use redlock_testkit::key;
use redlock_testkit::launcher::{Env, Proxy};
use redlock_testkit::masters::{master_cmd, signal};
use redlock_testkit::redisson::{
    channel_name, latch_name, Attempt, Error, Redisson, Renewal, Scripts, Subscription,
    LATCH_TIMEOUT_MS, RENEW_BATCH,
};
use redlock_testkit::resp::Client;
use redlock_testkit::{eventually, lock_grant};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A lease no step of a test comes near (the locks are released explicitly).
const LONG: Option<Duration> = Some(Duration::from_secs(20));
/// How long the checks on the masters may wait for the last master's copy of a write.
const SETTLE: Duration = Duration::from_secs(10);
/// How long a subscriber listens to find that no message comes: the roll-back's wake-up goes
/// through every master, so the proxy passes it on as soon as a quorum's copies came.
const QUIET: Duration = Duration::from_secs(1);

/// Where a scenario runs: one plain redis-server (the baseline), or a proxy and what is behind
/// it.
struct Target {
    label: String,
    port: u16,
    behind: Behind,
}

/// What holds the data of a [`Target`].
enum Behind {
    /// The baseline: the server itself.
    Itself,
    /// Single masters, by port.
    Masters(Vec<u16>),
    /// Redis Clusters, each a master: a key lives on its slot's primary.
    Clusters(Vec<RedisCluster>),
}

impl Target {
    /// The servers that hold `key`: a master's, each cluster's primary of its slot, or the
    /// plain server.
    fn servers(&self, key: &str) -> Vec<u16> {
        match &self.behind {
            Behind::Itself => vec![self.port],
            Behind::Masters(ports) => ports.clone(),
            Behind::Clusters(clusters) => {
                let slot = key_slot(key.as_bytes());
                let owner = |c: &RedisCluster| c.primary_of(slot).expect("an owner of the slot");
                tokio::task::block_in_place(|| clusters.iter().map(owner).collect())
            }
        }
    }

    /// The name of `key`'s token counter on the servers that hold it.
    fn counter(&self, key: &str) -> String {
        let cluster = matches!(self.behind, Behind::Clusters(_));
        String::from_utf8(token_key_on(cluster, key.as_bytes()).to_vec()).expect("UTF-8 key")
    }

    /// Whether a proxy serves it (the baseline is a plain redis-server).
    fn proxied(&self) -> bool {
        !matches!(self.behind, Behind::Itself)
    }

    /// Waits (bounded) until `check` holds for `args` (`args[1]` a key) on every server
    /// holding that key.
    async fn on_every_server(&self, args: &[&str], check: impl Fn(&str) -> bool) {
        let servers = self.servers(args[1]);
        let all = eventually(SETTLE, async || {
            for port in &servers {
                if !check(&master_cmd(*port, args).await) {
                    return false;
                }
            }
            true
        })
        .await;
        let mut seen = Vec::new();
        for port in &servers {
            seen.push(master_cmd(*port, args).await);
        }
        assert!(all, "{}: {args:?} on every server: {seen:?}", self.label);
    }
}

/// A plain redis-server, then every proxied target ([`each_proxied_target`]).
async fn each_target(scenario: impl AsyncFn(&Target)) {
    let plain = LocalMaster::start(None, &[]).expect("redis-server must be installed");
    let target = Target {
        label: "redis-server".into(),
        port: plain.port,
        behind: Behind::Itself,
    };
    scenario(&target).await;
    each_proxied_target(scenario).await;
}

/// Proxies over 3 and over 5 masters, and over 3 Redis Clusters of 3 primaries each (hash
/// locks, their tokens and roll-backs per slot); each scenario runs on all.
async fn each_proxied_target(scenario: impl AsyncFn(&Target)) {
    for n in [3, 5] {
        let env = Env::start(n).await;
        let target = Target {
            label: format!("proxy over {n} masters"),
            port: env.proxy.port,
            behind: Behind::Masters(env.ports()),
        };
        scenario(&target).await;
    }
    let clusters = tokio::task::block_in_place(|| three_clusters(3, 0));
    let proxy = proxy_over(&clusters, |_| {}).await;
    let target = Target {
        label: "proxy over 3 clusters".into(),
        port: proxy.port,
        behind: Behind::Clusters(clusters),
    };
    scenario(&target).await;
}

/// Lock, re-entry, a contender refused while held, unlock to zero, an unlock by a thread that
/// does not hold it, the contender's turn; one client sends `EVALSHA` (Redisson's script
/// cache), the other `EVAL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_reentry_contender_and_unlock() {
    each_target(async |t: &Target| {
        let k = key("reentry");
        let mut a = Redisson::new(t.port).lock(&k, 1).await.unwrap();
        let redisson_b = Redisson::new(t.port).scripts(Scripts::Eval);
        let mut b = redisson_b.lock(&k, 1).await.unwrap();
        a.lock(LONG).await.unwrap();
        a.lock(LONG).await.unwrap();
        assert_eq!(a.hold_count().await.unwrap(), 2, "{}", t.label);
        assert!(a.is_held_by_current_thread().await.unwrap());
        let field = a.lock_name();
        t.on_every_server(&["HGET", &k, &field], |r| r == "$2")
            .await;
        // A contender (another client, or another thread of the same one) is refused.
        assert!(
            !b.try_lock(Duration::ZERO, LONG).await.unwrap(),
            "{}",
            t.label
        );
        let mut a2 = Redisson::new(t.port).lock(&k, 2).await.unwrap();
        assert!(!a2.try_lock(Duration::ZERO, LONG).await.unwrap());
        assert!(
            matches!(b.unlock().await, Err(Error::NotHeld)),
            "{}",
            t.label
        );
        assert!(!a.unlock().await.unwrap(), "still held once");
        assert_eq!(a.hold_count().await.unwrap(), 1);
        assert!(a.unlock().await.unwrap(), "released");
        t.on_every_server(&["EXISTS", &k], |r| r == ":0").await;
        assert!(matches!(a.unlock().await, Err(Error::NotHeld)));
        assert!(
            b.try_lock(Duration::ZERO, LONG).await.unwrap(),
            "{}",
            t.label
        );
        assert!(b.unlock().await.unwrap());
    })
    .await;
}

/// An unlock retried with the same request id answers what the first one answered (its latch),
/// without counting down twice; the latch lives the latch timeout (padded through the proxy)
/// and, once the client deleted it, the same request answers "not held".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlock_retried_with_its_request_id_answers_its_latch() {
    each_target(async |t: &Target| {
        let k = key("latch");
        let mut a = Redisson::new(t.port).lock(&k, 7).await.unwrap();
        a.lock(LONG).await.unwrap();
        a.lock(LONG).await.unwrap();
        assert!(!a.unlock_request("r1").await.unwrap(), "{}", t.label);
        assert!(
            !a.unlock_request("r1").await.unwrap(),
            "{}: latched",
            t.label
        );
        assert_eq!(a.hold_count().await.unwrap(), 1, "counted down once");
        let latch = latch_name(&k, "r1");
        let most = LATCH_TIMEOUT_MS + LATCH_TIMEOUT_MS / 50 + 2;
        t.on_every_server(&["PTTL", &latch], |r| {
            let pttl: u64 = r.trim_start_matches(':').parse().unwrap_or(0);
            pttl > 0 && pttl <= most
        })
        .await;
        assert!(a.unlock_request("r2").await.unwrap(), "{}", t.label);
        t.on_every_server(&["EXISTS", &k], |r| r == ":0").await;
        assert!(
            a.unlock_request("r2").await.unwrap(),
            "{}: latched",
            t.label
        );
        let mut c = Client::connect(t.port).await;
        assert_eq!(c.cmd(&["DEL", &latch_name(&k, "r2")]).await, ":1");
        assert!(matches!(a.unlock_request("r2").await, Err(Error::NotHeld)));
    })
    .await;
}

/// The unlock's `redis.call(ARGV[4], KEYS[2], ARGV[1])` (`publish`) runs on the masters: a
/// subscriber on each server gets the unlock message, and a subscriber through the proxy gets
/// it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unlock_publishes_on_every_master() {
    each_target(async |t: &Target| {
        let k = key("publish");
        let channel = channel_name(&k);
        let mut subscribers = Vec::new();
        for port in t.servers(&k) {
            subscribers.push(Subscription::open(port, &channel).await.unwrap());
        }
        let mut through = match t.proxied() {
            true => Some(Subscription::open(t.port, &channel).await.unwrap()),
            false => None,
        };
        let mut a = Redisson::new(t.port).lock(&k, 1).await.unwrap();
        a.lock(LONG).await.unwrap();
        assert!(a.unlock().await.unwrap());
        for (i, s) in subscribers.iter_mut().enumerate() {
            let woken = s.wait_message(SETTLE).await.unwrap();
            assert!(woken, "{}: no unlock message on server {i}", t.label);
        }
        if let Some(s) = through.as_mut() {
            assert!(s.wait_message(SETTLE).await.unwrap(), "{}", t.label);
            let again = s.wait_message(Duration::from_millis(500)).await.unwrap();
            assert!(!again, "{}: the unlock message twice", t.label);
        }
    })
    .await;
}

/// Holds `a` (taken without a lease: the watchdog's) for three leases and one more, checking
/// twice a lease that a contender is refused and the lock is held; then releases it.
async fn held_past_three_leases(t: &Target, renewal: Renewal) {
    let lease = Duration::from_millis(1500);
    let k = key(&format!("watchdog-{renewal:?}"));
    let client = Redisson::new(t.port)
        .watchdog_timeout(lease)
        .renewal(renewal);
    let mut a = client.lock(&k, 1).await.unwrap();
    let mut b = Redisson::new(t.port).lock(&k, 1).await.unwrap();
    a.lock(None).await.unwrap();
    let started = Instant::now();
    // 8 checks, half a lease apart: 4 leases.
    for round in 0..8 {
        tokio::time::sleep(lease / 2).await;
        let refused = !b.try_lock(Duration::ZERO, Some(lease)).await.unwrap();
        assert!(
            refused,
            "{} {renewal:?}: taken by b in round {round}",
            t.label
        );
        assert!(
            a.is_held_by_current_thread().await.unwrap(),
            "round {round}"
        );
    }
    let held = started.elapsed();
    assert!(held > 3 * lease, "{held:?}");
    let log = a.watchdog().expect("the watchdog runs");
    let renewals = log.renewals.load(std::sync::atomic::Ordering::Relaxed);
    // One renewal every third of the lease: at least half of those are expected on time.
    let due = (held.as_millis() / (lease / 3).as_millis()) as u64;
    assert!(
        renewals >= due / 2,
        "{}: {renewals} of {due} renewals",
        t.label
    );
    assert_eq!(*log.stopped.lock().unwrap(), None);
    assert!(a.unlock().await.unwrap());
    assert!(a.watchdog().is_none(), "the watchdog ends at unlock");
    assert!(
        b.try_lock(Duration::ZERO, LONG).await.unwrap(),
        "{}",
        t.label
    );
    assert!(b.unlock().await.unwrap());
}

/// The watchdog renews the lock every third of its lease, so it is held past three leases;
/// with Redisson's per-lock renewal and with its batched one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_the_lock_past_three_leases() {
    each_target(async |t: &Target| {
        let (per_lock, batched) = tokio::join!(
            held_past_three_leases(t, Renewal::PerLock),
            held_past_three_leases(t, Renewal::Batched)
        );
        let _ = (per_lock, batched);
    })
    .await;
}

/// The batched renewal of two locks at once (one held by its caller, one not): `{1, 0}`. The
/// two names share a hash tag: over Redis Cluster, Redisson batches the renewals of one slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_renewal_answers_each_lock() {
    each_target(async |t: &Target| {
        let tag = key("batch");
        let (k1, k2) = (format!("{{{tag}}}-1"), format!("{{{tag}}}-2"));
        let client = Redisson::new(t.port);
        let mut a = client.lock(&k1, 1).await.unwrap();
        a.lock(LONG).await.unwrap();
        let mut other = Redisson::new(t.port).lock(&k2, 1).await.unwrap();
        other.lock(LONG).await.unwrap();
        let field = a.lock_name();
        let mut c = Client::connect(t.port).await;
        let renewed = c
            .cmd(&["EVAL", RENEW_BATCH, "2", &k1, &k2, "20000", &field, &field])
            .await;
        assert_eq!(renewed, "*[:1,:0]", "{}", t.label);
        assert!(a.unlock().await.unwrap());
        assert!(other.unlock().await.unwrap());
    })
    .await;
}

/// `LOCK.TOKEN key field` through the proxy: the token, or `None` for null.
async fn lock_token(c: &mut Client, k: &str, field: &str) -> Option<i64> {
    let reply = c.cmd(&["LOCK.TOKEN", k, field]).await;
    match reply.as_str() {
        "$nil" => None,
        _ => Some(reply.trim_start_matches(':').parse().expect(&reply)),
    }
}

/// `RFencedLock`'s tokens increase from holder to holder, a re-entry's is not below its
/// holder's, and a contender gets none. Through the proxy the token is the proxy's fencing
/// token of the hash (`LOCK.TOKEN key field` answers it), which also orders the grants of
/// plain `RLock`s and of `LOCK.ACQUIRE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_lock_tokens_increase() {
    each_target(async |t: &Target| {
        let k = key("fenced");
        let (one, two) = (Redisson::new(t.port), Redisson::new(t.port));
        let mut a = one.fenced_lock(&k, 1).await.unwrap();
        let mut b = two.fenced_lock(&k, 1).await.unwrap();
        let mut c = Client::connect(t.port).await;
        let mut last = 0;
        for round in 0..4 {
            let (holder, contender) = match round % 2 {
                0 => (&mut a, &mut b),
                _ => (&mut b, &mut a),
            };
            let token = holder.lock_and_get_token(LONG).await.unwrap();
            assert!(
                token > last,
                "{}: round {round}: {token} <= {last}",
                t.label
            );
            let again = holder.lock_and_get_token(LONG).await.unwrap();
            assert!(again >= token, "{}: re-entry {again} < {token}", t.label);
            let refused = contender.try_lock_and_get_token(Duration::ZERO, LONG).await;
            assert_eq!(refused.unwrap(), None, "{}", t.label);
            if t.proxied() {
                let field = holder.0.lock_name();
                assert_eq!(lock_token(&mut c, &k, &field).await, Some(token));
                let other = contender.0.lock_name();
                assert_eq!(lock_token(&mut c, &k, &other).await, None);
            }
            assert!(!holder.unlock().await.unwrap());
            assert!(holder.unlock().await.unwrap());
            t.on_every_server(&["EXISTS", &k], |r| r == ":0").await;
            last = again;
        }
        // RFencedLock's plain lock() counts a token too (through the proxy: takes one).
        a.lock(LONG).await.unwrap();
        if !t.proxied() {
            let counted = a.get_token().await.unwrap().expect("the counter");
            assert!(counted > last, "{counted} <= {last}");
            return;
        }
        // The proxy never writes RFencedLock's counter key (docs/SAFETY.md): getToken() is null.
        assert_eq!(a.get_token().await.unwrap(), None, "{}", t.label);
        let field = a.0.lock_name();
        let fenced = lock_token(&mut c, &k, &field).await.expect("a token");
        assert!(fenced > last, "{}: {fenced} <= {last}", t.label);
        assert!(a.unlock().await.unwrap());
        t.on_every_server(&["EXISTS", &k], |r| r == ":0").await;
        // A plain RLock's grant of the same key and a LOCK.ACQUIRE take tokens above.
        let mut plain = one.lock(&k, 3).await.unwrap();
        plain.lock(LONG).await.unwrap();
        let field = plain.lock_name();
        let token = lock_token(&mut c, &k, &field).await.expect("a token");
        assert!(token > fenced, "{}: {token} <= {fenced}", t.label);
        assert!(plain.unlock().await.unwrap());
        t.on_every_server(&["EXISTS", &k], |r| r == ":0").await;
        let granted = c.cmd(&["LOCK.ACQUIRE", &k, "v", "10000"]).await;
        let (acquired, _) = lock_grant(&granted).expect(&granted);
        assert!(acquired as i64 > token, "{acquired} <= {token}");
    })
    .await;
}

/// Plants a foreign holder's hash (`other:1`, 30 s) on the masters `at`.
async fn plant(ports: &[u16], k: &str) {
    for port in ports {
        assert_eq!(master_cmd(*port, &["HSET", k, "other:1", "1"]).await, ":1");
        assert_eq!(master_cmd(*port, &["PEXPIRE", k, "30000"]).await, ":1");
    }
}

/// A foreign holder on a majority: the acquire is refused with the holder's PTTL, and the
/// masters that granted it (the free minority) are rolled back: none keeps the field, also
/// where a master refused the attempt's token (another proxy's counter ahead there). The key
/// still held by a majority, no unlock message: the holder's waiters wait for its unlock, not
/// for each other's roll-backs. A foreign holder on a minority does not stop the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_grant_is_rolled_back() {
    each_proxied_target(async |t: &Target| {
        let q = t.servers("any").len() / 2 + 1;
        for token_refused in [false, true] {
            let k = key(if token_refused {
                "partial-ahead"
            } else {
                "partial"
            });
            let servers = t.servers(&k);
            plant(&servers[..q], &k).await;
            if token_refused {
                // A counter a minute ahead on the free masters: they refuse the offer.
                let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
                let ahead = since_epoch.as_micros() + 60_000_000;
                let counter = t.counter(&k);
                for port in &servers[q..] {
                    let set = ["SET", &counter, &format!("{ahead:016}"), "PX", "60000"];
                    assert_eq!(master_cmd(*port, &set).await, "+OK");
                }
            }
            let mut waiter = Subscription::open(t.port, &channel_name(&k)).await.unwrap();
            let mut a = Redisson::new(t.port).lock(&k, 1).await.unwrap();
            let held = a.try_acquire(LONG).await.unwrap();
            let Attempt::Held(pttl) = held else {
                panic!("{}: {held:?}", t.label);
            };
            assert!(pttl > 20_000 && pttl <= 30_000, "{}: {pttl}", t.label);
            let field = a.lock_name();
            t.on_every_server(&["HEXISTS", &k, &field], |r| r == ":0")
                .await;
            if !token_refused {
                let woken = waiter.wait_message(QUIET).await.unwrap();
                assert!(!woken, "{}: an unlock message", t.label);
            }
        }
        // A minority's foreign holder: granted on the others.
        let free = key("minority");
        plant(&t.servers(&free)[..q - 1], &free).await;
        let mut b = Redisson::new(t.port).lock(&free, 1).await.unwrap();
        b.lock(LONG).await.unwrap();
        assert!(b.unlock().await.unwrap());
    })
    .await;
}

/// A foreign holder on all masters but Q−1, one more master paused beyond the node timeout:
/// fewer than Q masters can grant, so the acquire is refused (`NOQUORUM`: no majority answered
/// alike) and rolled back on the masters that granted; the paused master, once resumed, runs
/// the late call past its write deadline and takes nothing. No majority holds the key then (a
/// split of two attempts looks the same): a waiter subscribed to the lock's channel is woken by
/// Redisson's unlock message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_short_of_a_majority_is_rolled_back_everywhere() {
    for n in [3usize, 5] {
        let env = Env::start(n).await;
        let ports = env.ports();
        let q = n / 2 + 1;
        let k = key(&format!("short-{n}"));
        // Q−1 free masters, one paused, the rest held by another.
        plant(&ports[q - 1..n - 1], &k).await;
        let paused = env.masters.masters[n - 1].pid().unwrap();
        signal(paused, "STOP");
        let channel = channel_name(&k);
        let mut waiter = Subscription::open(env.proxy.port, &channel).await.unwrap();
        let mut a = Redisson::new(env.proxy.port).lock(&k, 1).await.unwrap();
        let reply = a.try_acquire(LONG).await;
        signal(paused, "CONT");
        match reply {
            Err(Error::Reply(e)) if e.starts_with("NOQUORUM") => {}
            other => panic!("{n} masters: {other:?}"),
        }
        let t = Target {
            label: format!("proxy over {n} masters"),
            port: env.proxy.port,
            behind: Behind::Masters(ports),
        };
        t.on_every_server(&["HEXISTS", &k, &a.lock_name()], |r| r == ":0")
            .await;
        let woken = waiter.wait_message(SETTLE).await.unwrap();
        assert!(woken, "{n} masters: no unlock message after the roll-back");
    }
}

/// A grant that a majority gave only after its validity ran out (a master of the majority
/// paused longer than the lease's validity) is not answered as acquired: an error, and the
/// grant is rolled back on the masters that gave it. The paused master grants on resume, so its
/// copy would live a whole lease after the refusal; the check runs within half a lease of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_past_its_validity_is_refused_and_rolled_back() {
    let lease = Duration::from_millis(2000);
    // Beyond the lease's validity (lease − drift); the node timeout is beyond the pause.
    let pause = lease + lease / 4;
    for n in [3usize, 5] {
        let masters = LocalCluster::start(n).unwrap();
        let node_timeout = 2 * pause.as_millis() as u64;
        let proxy = Proxy::start(masters.addrs(), |c| c.node_timeout_ms = node_timeout).await;
        let ports: Vec<u16> = masters.masters.iter().map(|m| m.port).collect();
        let q = n / 2 + 1;
        let k = key(&format!("late-{n}"));
        plant(&ports[q..], &k).await;
        let slow = masters.masters[q - 1].pid().unwrap();
        signal(slow, "STOP");
        let resume = tokio::spawn(async move {
            tokio::time::sleep(pause).await;
            signal(slow, "CONT");
        });
        let mut a = Redisson::new(proxy.port).lock(&k, 1).await.unwrap();
        let reply = a.try_acquire(Some(lease)).await;
        let refused_at = Instant::now();
        resume.await.unwrap();
        match reply {
            Err(Error::Reply(e)) if e.contains("lease validity expired") => {}
            other => panic!("{n} masters: {other:?}"),
        }
        let field = a.lock_name();
        let gone = eventually(lease / 2, async || {
            for port in &ports {
                if master_cmd(*port, &["HEXISTS", &k, &field]).await != ":0" {
                    return false;
                }
            }
            true
        })
        .await;
        let mut left = Vec::new();
        for port in &ports {
            left.push(master_cmd(*port, &["PTTL", &k]).await);
        }
        assert!(
            gone,
            "{n} masters: held {:?} after the refusal: {left:?}",
            refused_at.elapsed()
        );
    }
}

/// A waiter (subscribed, its try refused with the holder's PTTL) is woken by the holder's
/// unlock message long before that PTTL runs out, and gets the lock.
async fn waiter_woken_by_unlock(t: &Target) {
    let k = key("waiter");
    let mut a = Redisson::new(t.port).lock(&k, 1).await.unwrap();
    let mut b = Redisson::new(t.port).lock(&k, 1).await.unwrap();
    let holder_lease = Duration::from_secs(30);
    a.lock(Some(holder_lease)).await.unwrap();
    let waiter = tokio::spawn(async move {
        let won = b.try_lock(Duration::from_secs(25), LONG).await.unwrap();
        (won, Instant::now(), b)
    });
    // Long enough for the waiter to be refused once and subscribed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released_at = Instant::now();
    assert!(a.unlock().await.unwrap());
    let (won, at, mut b) = waiter.await.unwrap();
    assert!(won, "{}", t.label);
    let woken_after = at.duration_since(released_at);
    // The holder's PTTL was some 29.5 s: only the message can wake the waiter this soon.
    assert!(
        woken_after < holder_lease / 6,
        "{}: {woken_after:?}",
        t.label
    );
    assert!(b.unlock().await.unwrap());
}

/// The waiter protocol of the kit's client against one redis-server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_unlock_on_one_redis_server() {
    let plain = LocalMaster::start(None, &[]).expect("redis-server must be installed");
    let t = Target {
        label: "redis-server".into(),
        port: plain.port,
        behind: Behind::Itself,
    };
    waiter_woken_by_unlock(&t).await;
}

/// The same through the proxy over 3 and 5 masters and 3 clusters (`SUBSCRIBE` through the
/// proxy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_unlock_through_the_proxy() {
    each_proxied_target(waiter_woken_by_unlock).await;
}

/// The roll-back's script on one master (`undo_hash.lua`): it takes back one count of the
/// field only while the key's counter names the attempt (its record, or `<token>~<record>`
/// where the master refused the attempt's token), cuts the counter to its bare token (so a
/// second run, or a later attempt's undo, does nothing), and keeps a re-entry's count on top of
/// the attempt's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_undo_takes_back_only_its_own_attempt_once() {
    let master = LocalMaster::start(None, &[]).expect("redis-server must be installed");
    let port = master.port;
    let k = key("undo");
    let counter = format!("redlock-proxy:token:{k}");
    let (mine, other) = ("0001795000000000:p.1.0", "0001795000000001:p.2.0");
    let undo = async |record: &str| {
        let script = UNDO_HASH_SCRIPT.text();
        master_cmd(port, &["EVAL", script, "2", &k, &counter, "me:1", record]).await
    };
    let set_up = async |count: &str, record: &str| {
        master_cmd(port, &["DEL", &k]).await;
        master_cmd(port, &["HSET", &k, "me:1", count]).await;
        master_cmd(port, &["PEXPIRE", &k, "30000"]).await;
        master_cmd(port, &["SET", &counter, record, "PX", "60000"]).await;
    };
    // The attempt created the hash: undone, once; the counter keeps its token and expiry.
    set_up("1", mine).await;
    assert_eq!(undo(mine).await, ":1");
    assert_eq!(master_cmd(port, &["EXISTS", &k]).await, ":0");
    assert_eq!(
        master_cmd(port, &["GET", &counter]).await,
        "$0001795000000000"
    );
    let pttl = master_cmd(port, &["PTTL", &counter]).await;
    assert!(
        pttl.trim_start_matches(':').parse::<i64>().unwrap() > 50_000,
        "{pttl}"
    );
    master_cmd(port, &["HSET", &k, "me:1", "1"]).await;
    assert_eq!(undo(mine).await, ":0", "a second run");
    assert_eq!(master_cmd(port, &["HGET", &k, "me:1"]).await, "$1");
    // A retry re-entered on top of the attempt's leftover: its count stays.
    set_up("2", mine).await;
    assert_eq!(undo(mine).await, ":1");
    assert_eq!(master_cmd(port, &["HGET", &k, "me:1"]).await, "$1");
    // The master refused the attempt's token: the counter kept its higher token and named the
    // attempt after a '~'. Undone the same way, back to the bare token.
    set_up("1", &format!("0001795000000007~{mine}")).await;
    assert_eq!(undo(mine).await, ":1");
    assert_eq!(master_cmd(port, &["EXISTS", &k]).await, ":0");
    assert_eq!(
        master_cmd(port, &["GET", &counter]).await,
        "$0001795000000007"
    );
    set_up("1", &format!("0001795000000007~{other}")).await;
    assert_eq!(undo(mine).await, ":0", "another attempt's refused token");
    // Another attempt's record (a later new holder): nothing.
    set_up("1", other).await;
    assert_eq!(undo(mine).await, ":0");
    assert_eq!(master_cmd(port, &["HGET", &k, "me:1"]).await, "$1");
    assert_eq!(
        master_cmd(port, &["GET", &counter]).await,
        format!("${other}")
    );
    // The field gone (the holder unlocked): the record is cut, no field is made.
    set_up("1", mine).await;
    master_cmd(port, &["DEL", &k]).await;
    assert_eq!(undo(mine).await, ":0");
    assert_eq!(master_cmd(port, &["EXISTS", &k]).await, ":0");
}
