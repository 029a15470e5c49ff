//! Lists as wake-up signals through the proxy (docs/PROTOCOL.md §14): every reply compared with
//! one redis-server's in RESP2 and RESP3 (pops, moves, blocking pops that find an element or
//! time out, their errors); a blocked `BLPOP` woken by a push through another proxy and by
//! python-redis-lock's release script, through 3 and 5 masters, with masters down and paused
//! during the wait, and through 3 Redis Clusters; a waiter whose connection ends pops nothing;
//! a blocking pop keeps its timeout and sees its client leave while a majority is down; idle
//! waiters cost the masters nothing.

use redlock_proxy::cluster::slots::key_slot;
use redlock_proxy::LocalMaster;
use redlock_testkit::cluster::{proxy_over, three_clusters};
use redlock_testkit::differential::assert_same_replies_in_resp2_and_resp3;
use redlock_testkit::key;
use redlock_testkit::launcher::{wait_for_info, Env, Proxy};
use redlock_testkit::masters::{command_stats, master_cmd, signal};
use redlock_testkit::resp::Client;
use std::time::{Duration, Instant};

/// Ample for any reply on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(10);

/// `{l}`, `{d}`: lists; `{s}`: a string; `{m}`: missing.
const SESSION: &[&str] = &[
    "SET {s} v",
    "LPUSH {l} a b c",
    "RPUSH {l} d",
    "LPUSH {l}",
    "LPUSH {s} x",
    "LLEN {l}",
    "LLEN {m}",
    "LLEN {s}",
    "LRANGE {l} 0 -1",
    "LRANGE {m} 0 -1",
    "LPOP {l}",
    "RPOP {l}",
    "LPOP {l} 1",
    "LPOP {m}",
    "LPOP {m} 2",
    "RPOP {m} 1",
    "LPOP {l} 0",
    "LPOP {l} -1",
    "LPOP {l} x",
    "LPOP {s}",
    "LPOP",
    "LPOP {l} 1 2",
    "RPUSH {l} e f g",
    "LMOVE {l} {d} LEFT RIGHT",
    "LMOVE {l} {d} RIGHT LEFT",
    "LMOVE {m} {d} LEFT LEFT",
    "LMOVE {l} {d} UP LEFT",
    "LMOVE {s} {d} LEFT LEFT",
    "LRANGE {d} 0 -1",
    "BLPOP {m} {l} 0",
    "BRPOP {d} 1",
    "BLPOP {m} 0.05",
    "BRPOP {m} {m}x 0.05",
    "BLMOVE {d} {l} LEFT LEFT 0",
    "BLMOVE {m} {l} LEFT LEFT 0.05",
    "BLPOP {m} -1",
    "BLPOP {m} x",
    "BLPOP {m} 1e300",
    "BLPOP {m} inf",
    "BLPOP {s} 0",
    "BLPOP {m}",
    "BLMOVE {l} {d} LEFT UP 0",
    "LRANGE {l} 0 -1",
    "DEL {l} {d}",
];

#[tokio::test]
async fn list_replies_match_one_redis_server() {
    let env = Env::start(3).await;
    let redis = LocalMaster::start(None, &[]).expect("redis-server");
    assert_same_replies_in_resp2_and_resp3(
        env.proxy.port,
        redis.port,
        SESSION,
        &["{l}", "{d}", "{s}", "{m}"],
    )
    .await;
}

/// Sends `BLPOP key timeout` on `waiter` without waiting for the reply.
async fn block(waiter: &mut Client, key: &str, timeout: &str) {
    waiter.send(&["BLPOP", key, timeout]).await;
    // Not answered while nothing is pushed.
    assert_eq!(waiter.try_read(Duration::from_millis(200)).await, None);
}

/// python-redis-lock's release script (`redis_lock.UNLOCK_SCRIPT`).
const UNLOCK: &str = r#"
    if redis.call("get", KEYS[1]) ~= ARGV[1] then
        return 1
    else
        redis.call("del", KEYS[2])
        redis.call("lpush", KEYS[2], 1)
        redis.call("pexpire", KEYS[2], ARGV[2])
        redis.call("del", KEYS[1])
        return 0
    end
"#;

#[tokio::test]
async fn a_blocked_waiter_is_woken_by_a_push_through_another_proxy() {
    let env = Env::start(5).await;
    let other = Proxy::start(env.masters.addrs(), |_| {}).await;
    let signal_key = key("signal");
    let mut waiter = env.proxy.client().await;
    block(&mut waiter, &signal_key, "0").await;
    let mut pusher = other.client().await;
    assert_eq!(pusher.cmd(&["LPUSH", &signal_key, "1"]).await, ":1");
    let woken = waiter.try_read(PATIENCE).await;
    assert_eq!(woken.as_deref(), Some(&*format!("*[${signal_key},$1]")));
}

/// The node timeout of the failure tests: a wake-up that waited for a paused master would
/// take at least this long.
const NODE_TIMEOUT: Duration = Duration::from_secs(3);

/// A waiter blocked on python-redis-lock's signal list while masters fail is woken by the
/// lock's release script, within the node timeout.
async fn woken_by_release_with(n: usize, down: &[usize], paused: &[usize]) {
    let mut env = Env::start_with(n, |c| c.node_timeout_ms = NODE_TIMEOUT.as_millis() as u64).await;
    let (lock, signal_key) = (key("lock"), key("lock-signal"));
    let mut holder = env.proxy.client().await;
    assert_eq!(
        holder.cmd(&["SET", &lock, "me", "NX", "PX", "30000"]).await,
        "+OK"
    );
    let mut waiter = env.proxy.client().await;
    block(&mut waiter, &signal_key, "0").await;
    for &i in down {
        env.masters.masters[i].kill();
    }
    let pids: Vec<u32> = paused
        .iter()
        .map(|&i| env.masters.masters[i].pid().expect("running"))
        .collect();
    for &pid in &pids {
        signal(pid, "STOP");
    }
    holder
        .send(&["EVAL", UNLOCK, "2", &lock, &signal_key, "me", "1000"])
        .await;
    let woken = waiter.try_read(NODE_TIMEOUT).await;
    let released = holder.read().await;
    for &pid in &pids {
        signal(pid, "CONT");
    }
    assert_eq!(
        released, ":0",
        "{n} masters, {down:?} down, {paused:?} paused"
    );
    assert_eq!(
        woken.as_deref(),
        Some(&*format!("*[${signal_key},$1]")),
        "{n} masters, {down:?} down, {paused:?} paused"
    );
}

#[tokio::test]
async fn a_waiter_is_woken_by_the_release_with_a_master_paused_through_3() {
    woken_by_release_with(3, &[], &[1]).await;
}

#[tokio::test]
async fn a_waiter_is_woken_by_the_release_with_a_master_down_and_one_paused_through_5() {
    woken_by_release_with(5, &[0], &[3]).await;
}

#[tokio::test]
async fn a_blocking_pop_times_out_after_its_timeout_and_not_before() {
    let env = Env::start(3).await;
    let mut waiter = env.proxy.client().await;
    for (timeout, ms) in [("0.3", 300), ("1", 1000)] {
        let sent = Instant::now();
        let reply = waiter.cmd(&["BLPOP", &key("never"), timeout]).await;
        assert_eq!(reply, "*nil");
        assert!(
            sent.elapsed() >= Duration::from_millis(ms),
            "{timeout}: early"
        );
    }
}

#[tokio::test]
async fn a_waiter_whose_connection_ends_pops_nothing() {
    let env = Env::start(3).await;
    let signal_key = key("gone");
    let mut waiter = env.proxy.client().await;
    block(&mut waiter, &signal_key, "0").await;
    drop(waiter);
    // Its registration goes with the connection: a later push stays on every master.
    let mut pusher = env.proxy.client().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(pusher.cmd(&["RPUSH", &signal_key, "x"]).await, ":1");
    tokio::time::sleep(Duration::from_millis(300)).await;
    for port in env.ports() {
        assert_eq!(master_cmd(port, &["LLEN", &signal_key]).await, ":1");
    }
}

/// `blocked_clients` of the proxy's `INFO clients`.
async fn blocked_clients(c: &mut Client) -> u64 {
    let info = c.cmd(&["INFO", "clients"]).await;
    info.split("blocked_clients:")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no blocked_clients in {info}"))
}

/// With 2 of 3 masters down, a blocked pop's registration on its keyspace channel cannot be
/// confirmed by a quorum; the wait for it (the hub's, as long as the node timeout here) must
/// not outlast the client's timeout, nor its connection. Issue 40: `BLPOP key 0.3` answered
/// after 2.0 s (the hub's shortest wait) whatever its timeout, and a client that left was
/// noticed only then.
#[tokio::test]
async fn a_blocking_pop_keeps_its_timeout_and_sees_its_client_leave_with_a_majority_down() {
    // The hub waits for a registration's confirmations this long.
    const HUB_WAIT: Duration = Duration::from_secs(8);
    let mut env = Env::start_with(3, |c| c.node_timeout_ms = HUB_WAIT.as_millis() as u64).await;
    env.masters.masters[1].kill();
    env.masters.masters[2].kill();
    let mut c = env.proxy.client().await;
    wait_for_info(&mut c, "state=down", 2).await;
    for (timeout, ms) in [("0.3", 300), ("1", 1000)] {
        let sent = Instant::now();
        let reply = c.cmd(&["BLPOP", &key("majority-down"), timeout]).await;
        let took = sent.elapsed();
        eprintln!("BLPOP {timeout}: {took:?}");
        assert_eq!(reply, "*nil");
        assert!(
            took >= Duration::from_millis(ms),
            "{timeout}: early ({took:?})"
        );
        assert!(took < HUB_WAIT / 2, "{timeout}: answered after {took:?}");
    }
    let mut waiter = env.proxy.client().await;
    block(&mut waiter, &key("majority-down-gone"), "0").await;
    assert_eq!(blocked_clients(&mut c).await, 1);
    let left = Instant::now();
    drop(waiter);
    while blocked_clients(&mut c).await > 0 {
        assert!(
            left.elapsed() < HUB_WAIT / 2,
            "the blocked pop of a client that left still waits after {:?}",
            left.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "a waiter that left stopped waiting after {:?}",
        left.elapsed()
    );
}

/// `LMPOP` calls on a master so far.
async fn pops(port: u16) -> u64 {
    let stats = command_stats(port).await.expect("INFO commandstats");
    stats.get("lmpop").copied().unwrap_or(0)
}

#[tokio::test]
async fn idle_waiters_cost_the_masters_nothing() {
    let env = Env::start(3).await;
    let mut waiters = Vec::new();
    for i in 0..50 {
        let mut waiter = env.proxy.client().await;
        waiter
            .send(&["BLPOP", &key(&format!("idle{}", i % 10)), "0"])
            .await;
        waiters.push(waiter);
    }
    // Every waiter tried once; then nothing while nothing changes.
    let port = env.ports()[0];
    let deadline = Instant::now() + PATIENCE;
    while pops(port).await < 50 {
        assert!(Instant::now() < deadline, "the waiters did not all try");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The tries already sent have arrived (a first subscription's confirmations may wake
    // its waiter once more).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = pops(port).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(pops(port).await, before, "idle waiters polled the master");
    let mut observer = env.proxy.client().await;
    let info = observer.cmd(&["INFO", "clients"]).await;
    assert!(info.contains("blocked_clients:50\r\n"), "{info}");
    let list = observer.cmd(&["CLIENT", "LIST"]).await;
    assert_eq!(list.matches(" flags=b ").count(), 50, "{list}");
    // A push on one key wakes its waiters only: each of its 5 tries once, one pops first (two
    // racing waiters may each be first on a different master: a signal, not a queue).
    let pushed = key("idle3");
    let mut pusher = env.proxy.client().await;
    pusher.cmd(&["LPUSH", &pushed, "1"]).await;
    let deadline = Instant::now() + PATIENCE;
    for port in env.ports() {
        while master_cmd(port, &["LLEN", &pushed]).await != ":0" {
            assert!(Instant::now() < deadline, "not popped on {port}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let mut woken = 0;
    for waiter in &mut waiters {
        woken += usize::from(waiter.try_read(Duration::from_millis(100)).await.is_some());
    }
    assert!((1..=3).contains(&woken), "{woken} woken by one push");
    // One try per waiter of the key: the winner's own pop notifies a change that adds
    // nothing, which wakes nobody.
    let tries = pops(port).await - before;
    assert!(tries <= 5, "{tries} tries for the key's 5 waiters");
}

/// Lists over 3 Redis Clusters of 3 primaries each: every key lives on its slot's primary,
/// which notifies its changes only to its own subscribers, so the cluster form of the guard
/// publishes a list's keyspace event after each write (Redis Cluster carries a publish to
/// every node). Pushes, pops and moves answer as on one Redis; a blocked `BLPOP` is woken by a
/// push through the proxy and by python-redis-lock's release script (its two keys under one
/// hash tag), a `BLMOVE` by a push; keys of two slots are refused with Redis Cluster's
/// `CROSSSLOT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_and_their_waiters_over_clusters() {
    let clusters = tokio::task::block_in_place(|| three_clusters(3, 0));
    let proxy = proxy_over(&clusters, |_| {}).await;
    // A slot that no cluster's first node serves: the proxy subscribes there, and that node
    // would notify the changes of its own keys by itself.
    let not_the_seeds = |tag: &String| {
        let slot = key_slot(tag.as_bytes());
        clusters
            .iter()
            .all(|c| c.primary_of(slot) != Some(c.nodes[0].port))
    };
    let tag = tokio::task::block_in_place(|| {
        (0..100)
            .map(|i| key(&format!("lists{i}")))
            .find(not_the_seeds)
            .expect("a slot none of the seeds serves")
    });
    let tagged = |name: &str| format!("{{{tag}}}:{name}");
    let (l, d, lock, signal_key) = (tagged("l"), tagged("d"), tagged("lock"), tagged("signal"));
    let mut c = proxy.client().await;
    assert_eq!(c.cmd(&["LPUSH", &l, "a", "b"]).await, ":2");
    assert_eq!(c.cmd(&["RPUSH", &l, "c"]).await, ":3");
    assert_eq!(c.cmd(&["LPOP", &l]).await, "$b");
    assert_eq!(c.cmd(&["RPOP", &l, "1"]).await, "*[$c]");
    assert_eq!(c.cmd(&["LMOVE", &l, &d, "LEFT", "RIGHT"]).await, "$a");
    assert_eq!(c.cmd(&["BLPOP", &l, &d, "0"]).await, format!("*[${d},$a]"));
    let other_slot = key("elsewhere");
    assert_eq!(
        c.cmd(&["LMOVE", &l, &other_slot, "LEFT", "LEFT"]).await,
        "-CROSSSLOT Keys in request don't hash to the same slot"
    );

    let mut waiter = proxy.client().await;
    block(&mut waiter, &l, "0").await;
    assert_eq!(c.cmd(&["LPUSH", &l, "x"]).await, ":1");
    let woken = waiter.try_read(PATIENCE).await;
    assert_eq!(woken.as_deref(), Some(&*format!("*[${l},$x]")));

    waiter.send(&["BLMOVE", &l, &d, "LEFT", "LEFT", "0"]).await;
    assert_eq!(waiter.try_read(Duration::from_millis(200)).await, None);
    assert_eq!(c.cmd(&["RPUSH", &l, "y"]).await, ":1");
    assert_eq!(waiter.try_read(PATIENCE).await.as_deref(), Some("$y"));

    // python-redis-lock: a holder, a waiter on the signal list, the release script's push.
    assert_eq!(
        c.cmd(&["SET", &lock, "me", "NX", "PX", "30000"]).await,
        "+OK"
    );
    block(&mut waiter, &signal_key, "0").await;
    let released = c
        .cmd(&["EVAL", UNLOCK, "2", &lock, &signal_key, "me", "1000"])
        .await;
    assert_eq!(released, ":0");
    let woken = waiter.try_read(PATIENCE).await;
    assert_eq!(woken.as_deref(), Some(&*format!("*[${signal_key},$1]")));
}
