//! Master health: quarantine after data loss, refusal of unsafe configurations, votes that
//! need a replica's confirmation (`wait_replicas`).

use redlock_proxy::{LocalCluster, LocalMaster};
use redlock_testkit::key;
use redlock_testkit::launcher::{
    master_number, master_state, wait_for_info, wait_for_info_where, Env, Proxy,
};
use redlock_testkit::masters::{acquire_while_paused, master_cmd, master_get, signal};
use redlock_testkit::resp::Client;
use redlock_testkit::workload::wait_grantable;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_on_a_master_quarantines_it_for_the_longest_lease() {
    let masters = LocalCluster::start(3).unwrap();
    let proxy = Proxy::start(masters.addrs(), |c| c.max_lock_ttl_ms = 1500).await;
    let mut c = proxy.client().await;
    // Brand-new masters (none carries the lock marker): a fresh deployment, no quarantine.
    wait_for_info(&mut c, "state=up", 3).await;
    let k = key("flush");
    assert_eq!(c.cmd(&["SET", &k, "a", "NX", "PX", "1500"]).await, "+OK");
    // Above the configured cap: refused, since quarantine would not cover it.
    let refused = c.cmd(&["SET", &key("big"), "a", "NX", "PX", "1501"]).await;
    assert!(
        refused.starts_with(
            "-ERR lock TTL 1501 ms is refused by redlock-proxy: above max_lock_ttl_ms"
        ),
        "{refused}"
    );
    // Someone wipes master 0: it forgets the lock. Only 1 of the 2 others can vote, so
    // nobody else may get the lock until master 0 is trusted again.
    master_cmd(masters.masters[0].port, &["FLUSHALL"]).await;
    let info = wait_for_info(&mut c, "quarantined (data wiped", 1).await;
    assert!(info.contains("master0:"), "{info}");
    master_cmd(masters.masters[1].port, &["DEL", &k]).await; // a second, independent loss
    assert_eq!(c.cmd(&["SET", &k, "b", "NX", "PX", "1500"]).await, "$nil");
    // After max TTL + drift the master votes again.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    wait_for_info(&mut c, "state=up", 3).await;
    let deadline = Instant::now() + Duration::from_secs(2);
    while c.cmd(&["SET", &k, "b", "NX", "PX", "1500"]).await != "+OK" {
        assert!(Instant::now() < deadline, "no grant after the quarantine");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_masters_are_refused_and_shown() {
    let mut masters = LocalCluster::start(2).unwrap();
    masters
        .masters
        .push(LocalMaster::start(None, &["--maxmemory-policy", "allkeys-lru"]).unwrap());
    let proxy = Proxy::start(masters.addrs(), |_| {}).await;
    let mut c = proxy.client().await;
    let info = wait_for_info(&mut c, "unsafe (maxmemory-policy is allkeys-lru", 1).await;
    assert!(info.contains("master2:"), "{info}");
    let k = key("unsafe");
    // 2 safe masters of 3 are a quorum: still granted; the unsafe one is not asked.
    assert_eq!(c.cmd(&["SET", &k, "v", "NX", "PX", "30000"]).await, "+OK");
    master_cmd(masters.masters[0].port, &["DEL", &k]).await;
    // Only 1 safe master holds it now; the unsafe master's copy must not make a majority:
    // one value and one null among the voters is null.
    assert_eq!(c.cmd(&["GET", &k]).await, "$nil");
    // Fixed at runtime: it votes again.
    master_cmd(
        masters.masters[2].port,
        &["CONFIG", "SET", "maxmemory-policy", "noeviction"],
    )
    .await;
    wait_for_info(&mut c, "state=up", 3).await;
    // An acquire goes only to masters whose vote can count: now all three.
    let k2 = key("unsafe-fixed");
    assert_eq!(c.cmd(&["SET", &k2, "v", "NX", "PX", "30000"]).await, "+OK");
    let m2 = masters.masters[2].port;
    let deadline = Instant::now() + Duration::from_secs(2);
    while master_get(m2, &k2).await.as_deref() != Some("v") {
        assert!(
            Instant::now() < deadline,
            "the fixed master did not take part"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quarantine_a_restarted_master_votes_at_once() {
    let mut masters = LocalCluster::start(3).unwrap();
    let proxy = Proxy::start(masters.addrs(), |c| c.quarantine = false).await;
    let mut c = proxy.client().await;
    let k = key("noq");
    assert_eq!(c.cmd(&["SET", &k, "a", "NX", "PX", "30000"]).await, "+OK");
    masters.masters[0].restart(&[]).unwrap();
    master_cmd(masters.masters[1].port, &["DEL", &k]).await;
    wait_for_info(&mut c, "state=up", 3).await;
    // The unsafe outcome the quarantine exists to prevent: a second holder while the first
    // holder's lease is still running.
    let deadline = Instant::now() + Duration::from_secs(2);
    while c.cmd(&["SET", &k, "b", "NX", "PX", "30000"]).await != "+OK" {
        assert!(
            Instant::now() < deadline,
            "the restarted master never voted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A directory of its own for one master's AOF (removed with the test's temp files).
fn aof_dir(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("redlock-aof-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temp dir");
    dir.to_string_lossy().into_owned()
}

/// Issue 22, item 6: quarantine only where the lock could be gone. Master 0 persists with
/// `appendonly yes` and `appendfsync always` (the Redlock page's advice): killed with SIGKILL
/// and restarted, it has the lock from its AOF and votes again at once (before: 60.6 s out).
/// The same with `appendfsync everysec` (the last second of writes may be lost) is quarantined.
/// A `FLUSHDB` of another database keeps database 0's marker and locks: no quarantine; a
/// `FLUSHDB` of database 0 takes the marker with the locks: quarantined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_master_that_may_have_lost_locks_is_quarantined() {
    for fsync in ["always", "everysec"] {
        let dir = aof_dir(fsync);
        let aof: [&str; 6] = ["--appendonly", "yes", "--appendfsync", fsync, "--dir", &dir];
        let mut durable = LocalMaster::start(None, &aof).expect("start");
        let others = LocalCluster::start(2).expect("start");
        let mut addrs = vec![durable.addr()];
        addrs.extend(others.addrs());
        let proxy = Proxy::start(addrs, |_| {}).await;
        let mut c = proxy.client().await;
        wait_for_info(&mut c, "state=up", 3).await;
        let k = key(&format!("aof-{fsync}"));
        assert_eq!(
            c.cmd(&["SET", &k, "tok-x", "NX", "PX", "30000"]).await,
            "+OK"
        );
        // The acquire answers once a quorum said OK: wait until master 0 ran it too.
        let deadline = Instant::now() + Duration::from_secs(5);
        while master_get(durable.port, &k).await.as_deref() != Some("tok-x") {
            assert!(Instant::now() < deadline, "master 0 never got the lock");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let pid = durable.pid().expect("running");
        tokio::task::block_in_place(|| durable.restart(&aof)).expect("restart");
        assert_ne!(durable.pid(), Some(pid), "the master was restarted");
        // The restart is seen (a new connection), and the lock came back from the AOF.
        wait_for_info(&mut c, "connects=2", 1).await;
        assert_eq!(master_get(durable.port, &k).await.as_deref(), Some("tok-x"));
        assert_eq!(
            c.cmd(&["SET", &k, "tok-y", "NX", "PX", "1000"]).await,
            "$nil"
        );
        if fsync == "always" {
            wait_for_info(&mut c, "state=up", 3).await;
            // A grant that needs master 0's vote: master 1 holds the key for someone else.
            let k2 = key("aof-needs-master-0");
            master_cmd(
                others.masters[0].port,
                &["SET", &k2, "foreign", "PX", "30000"],
            )
            .await;
            assert_eq!(c.cmd(&["SET", &k2, "v", "NX", "PX", "10000"]).await, "+OK");
        } else {
            let info = wait_for_info(&mut c, "quarantined (restarted", 1).await;
            assert!(info.contains("master0:"), "{info}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    let masters = LocalCluster::start(3).expect("start");
    let proxy = Proxy::start(masters.addrs(), |_| {}).await;
    let mut c = proxy.client().await;
    wait_for_info(&mut c, "state=up", 3).await;
    let port = masters.masters[0].port;
    let mut direct = redlock_testkit::resp::Client::connect(port).await;
    assert_eq!(direct.cmd(&["SELECT", "1"]).await, "+OK");
    assert_eq!(direct.cmd(&["FLUSHDB"]).await, "+OK");
    // Several polls later (100 ms apart) every master still votes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let info = wait_for_info(&mut c, "state=up", 3).await;
    assert!(!info.contains("quarantined"), "{info}");
    assert_eq!(master_cmd(port, &["FLUSHDB"]).await, "+OK");
    let info = wait_for_info(&mut c, "quarantined (lock marker gone", 1).await;
    assert!(info.contains("master0:"), "{info}");
}

/// One redis-server reached through two addresses (here a relay in front of it) would vote
/// twice: both are refused as unsafe, with the reason (the literal duplicate address is refused
/// by the configuration check: `src/config.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis_server_behind_two_addresses_does_not_vote() {
    let masters = LocalCluster::start(2).expect("start");
    let twin = redlock_testkit::relay::Relay::start(masters.masters[0].port).await;
    let addrs = vec![
        masters.addrs()[0].clone(),
        twin.addr(),
        masters.addrs()[1].clone(),
    ];
    let proxy = Proxy::start(addrs, |_| {}).await;
    let mut c = proxy.client().await;
    let info = wait_for_info(&mut c, "state=unsafe (the same redis-server as master", 2).await;
    assert!(
        info.contains("master2:") && info.contains("state=up"),
        "{info}"
    );
    // One real master of two can vote: no quorum of 3 listed, no grant.
    let k = key("twin");
    assert_eq!(c.cmd(&["SET", &k, "v", "NX", "PX", "10000"]).await, "$nil");
}

/// `wait_replicas` 1 (or 0, the negative control) over 3 masters with a replica each: master 2
/// holds a foreign value and master 0's replica is paused (its primary still lists it online,
/// so `WAIT` waits for it, half a node timeout). Returns A's reply to an acquire then, and
/// whether A gets the lock once the replica resumes.
async fn acquire_with_a_paused_replica(wait_replicas: u32) -> (String, bool) {
    let env = Env::start_with_replicas(3, |c| {
        c.wait_replicas = wait_replicas;
        // WAIT gets half of it: far more than an acknowledgement takes on a loaded machine.
        c.node_timeout_ms = 1000;
    })
    .await;
    let k = key(&format!("paused-replica-{wait_replicas}"));
    let limit = Duration::from_secs(30);
    let ready = wait_grantable(env.proxy.port, &format!("{k}:probe"), 1000, limit).await;
    assert!(ready.is_some(), "proxy never ready");
    let ports = env.ports();
    assert_eq!(
        master_cmd(ports[2], &["SET", &k, "foreign", "PX", "60000"]).await,
        "+OK"
    );
    let replica_pid = env.replicas[0].pid().expect("running");
    signal(replica_pid, "STOP");
    let mut a = Client::connect(env.proxy.port).await;
    let reply = a.cmd(&["SET", &k, "tok-a", "NX", "PX", "30000"]).await;
    signal(replica_pid, "CONT");
    if reply == "+OK" {
        return (reply, true);
    }
    let later = wait_grantable(env.proxy.port, &k, 30_000, limit).await;
    let info = a.cmd(&["INFO", "masters"]).await;
    assert!(
        master_number(&info, 0, "missing_unconfirmed").is_some_and(|n| n > 0),
        "master0's unconfirmed vote is counted in INFO: {info}"
    );
    (reply, later.is_some())
}

/// docs/SAFETY.md, "Confirmed writes": a vote counts only once `WAIT` confirms it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vote_counts_only_once_the_replica_confirms_it() {
    let (reply, later) = acquire_with_a_paused_replica(1).await;
    assert_eq!(
        reply, "$nil",
        "master 0's vote was not confirmed (its replica is paused) and master 2 holds the key"
    );
    assert!(later, "granted once the replica confirms again");
    let (reply, _) = acquire_with_a_paused_replica(0).await;
    assert_eq!(
        reply, "+OK",
        "negative control: without wait_replicas master 0's vote counts unconfirmed"
    );
}

/// Issue 37, fault 4: durability switched off for a moment between two looks. Master 2 runs
/// with `appendonly yes` + `appendfsync always`; its persistence is switched off (no poll sees
/// it: the health interval is 60 s), A is granted on masters 1 and 2 (master 0 paused), master
/// 2 crashes and restarts with its original command line from an AOF that lacks A. Durable
/// before and after, but its write witness is behind the one its grant of A answered: a loss
/// (cause `witness_behind`), and B is refused. Negative control: the quarantine off grants B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_lost_acknowledged_writes_is_a_loss_though_durable() {
    for quarantine in [true, false] {
        let dir = aof_dir(&format!("toggle-{quarantine}"));
        let aof: [&str; 6] = [
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--dir",
            &dir,
        ];
        let mut masters = LocalCluster::start(2).expect("start");
        masters
            .masters
            .push(LocalMaster::start(None, &aof).expect("start"));
        let env = Env::start_over(masters, |c| {
            c.health_interval_ms = 60_000;
            c.quarantine = quarantine;
        })
        .await;
        let mut c = env.proxy.client().await;
        let port = env.ports()[2];
        let k = key(&format!("aof-toggle-{quarantine}"));
        assert_eq!(
            master_cmd(port, &["CONFIG", "SET", "appendonly", "no"]).await,
            "+OK"
        );
        let paused = env.masters.masters[0].pid().expect("running");
        let timeout = env.proxy.config().node_timeout_ms;
        let a = acquire_while_paused(&mut c, paused, (&k, "a", 20_000), timeout).await;
        assert_eq!(a, "+OK");
        assert_eq!(master_get(port, &k).await.as_deref(), Some("a"));
        if !quarantine {
            // Without the quarantine an acquire is a bare `SET` with no write deadline: master
            // 0 took A late; the control removes it to start from the same state.
            let first = env.ports()[0];
            let deadline = Instant::now() + Duration::from_secs(5);
            while master_cmd(first, &["DEL", &k]).await != ":1" {
                assert!(Instant::now() < deadline, "master 0 never took A");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let mut masters = env.masters;
        tokio::task::block_in_place(|| masters.masters[2].restart(&aof)).expect("restart");
        assert_eq!(master_get(port, &k).await, None, "the AOF lacks A");
        // Judged once its new connection was polled; then B, tried for a second.
        let info = wait_for_info_where(&mut c, Duration::from_secs(10), "master 2 judged", |i| {
            master_number(i, 2, "connects") == Some(2)
                && master_state(i, 2).is_some_and(|s| !s.starts_with("connecting"))
        })
        .await;
        let mut b = String::new();
        let tried = Instant::now();
        while tried.elapsed() < Duration::from_secs(1) && b != "+OK" {
            b = c.cmd(&["SET", &k, "b", "NX", "PX", "20000"]).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if quarantine {
            assert_eq!(b, "$nil", "B granted while A holds the lock\n{info}");
            let state = master_state(&info, 2).unwrap_or_default();
            assert!(
                state.starts_with("quarantined (restarted (run_id"),
                "{state}"
            );
            assert!(
                state.contains("without every lock write it acknowledged"),
                "{state}"
            );
            assert!(
                info.contains(",quarantine_cause=witness_behind\r\n"),
                "{info}"
            );
        } else {
            assert_eq!(b, "+OK", "the scenario did not bite\n{info}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Issue 37, fault 3: data replaced in place (`DEBUG RELOAD NOSAVE`: same `run_id`, the lock
/// marker restored with the older data). A proxy that starts afterwards cannot tell it from a
/// master that kept everything (once the process has run longer than the lease bound, its
/// load from disk is no reason to wait), so a master whose `enable-debug-command` is not `no`
/// does not vote unless the operator accepts it (`allow_debug_command`). Here (lease bound
/// 4 s): A granted on masters 1 and 2 (master 0 paused) after master 2's last RDB save, when
/// master 2 has run longer than the bound; no proxy runs while it reloads that RDB; a new
/// proxy then asks for B: refused (master 2 is `unsafe`). Negative control: the new proxy with
/// `allow_debug_command` grants B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_can_reload_in_place_does_not_vote_unless_allowed() {
    let (ttl_ms, node_timeout_ms) = (4_000, 500);
    for allowed in [false, true] {
        let mut masters = LocalCluster::start(2).expect("start");
        let debug = ["--enable-debug-command", "yes"];
        masters
            .masters
            .push(LocalMaster::start(None, &debug).expect("start"));
        let started = Instant::now();
        let addrs = masters.addrs();
        let port = masters.masters[2].port;
        let config = |allow: bool| {
            move |c: &mut redlock_proxy::Config| {
                c.allow_debug_command = allow;
                c.max_lock_ttl_ms = ttl_ms;
                c.node_timeout_ms = node_timeout_ms;
            }
        };
        let first = Proxy::start(addrs.clone(), config(true)).await;
        let mut c = first.client().await;
        wait_for_info(&mut c, "state=up", 3).await;
        // Longer than the lease bound since master 2 started (its uptime counts whole seconds).
        tokio::time::sleep(Duration::from_millis(ttl_ms + 1_200).saturating_sub(started.elapsed()))
            .await;
        let k = key(&format!("reload-{allowed}"));
        assert_eq!(master_cmd(port, &["SAVE"]).await, "+OK");
        let paused = masters.masters[0].pid().expect("running");
        let granted = Instant::now();
        let a = acquire_while_paused(&mut c, paused, (&k, "a", ttl_ms), node_timeout_ms).await;
        assert_eq!(a, "+OK");
        assert_eq!(master_get(port, &k).await.as_deref(), Some("a"));
        first.stop().await;
        assert_eq!(
            master_cmd(port, &["DEBUG", "RELOAD", "NOSAVE"]).await,
            "+OK"
        );
        assert_eq!(master_get(port, &k).await, None, "the reload dropped A");
        let second = Proxy::start(addrs, config(allowed)).await;
        let mut c = second.client().await;
        let info = wait_for_info_where(&mut c, Duration::from_secs(10), "masters judged", |i| {
            (0..3).all(|m| master_state(i, m).is_some_and(|s| !s.starts_with("connecting")))
        })
        .await;
        let b = c
            .cmd(&["SET", &k, "b", "NX", "PX", &ttl_ms.to_string()])
            .await;
        assert!(
            granted.elapsed() < Duration::from_millis(ttl_ms),
            "A's lease ended before B asked: {:?}",
            granted.elapsed()
        );
        if allowed {
            assert_eq!(b, "+OK", "the scenario did not bite\n{info}");
        } else {
            assert_eq!(b, "$nil", "B granted while A holds the lock\n{info}");
            let state = master_state(&info, 2).unwrap_or_default();
            assert!(
                state.starts_with("unsafe (enable-debug-command is yes"),
                "{state}"
            );
        }
    }
}

/// Issue 37, fault 3 with `allow_debug_command`, between two polls: the write witness floor.
/// Masters 1 and 2 save (their snapshot predates A), A is granted on all three, masters 1 and 2
/// reload that snapshot in place (`DEBUG RELOAD NOSAVE`: same `run_id`, armed, without `k` and
/// with a witness below the one A's grant answered), and B asks at once: no poll runs in
/// between (the health interval is 60 s). Each merged lock call carries the highest witness
/// its master answered the link; the script takes no key on a master whose witness is below it
/// and answers `-1`, so B is refused, and that answer has both masters polled at once:
/// quarantined with cause `witness_behind`. Negative control: without the floor
/// (`witness_floor = false`) masters 1 and 2 grant B while A holds `k`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_in_place_between_two_polls_is_refused_by_the_next_acquire() {
    for floor in [true, false] {
        let masters =
            LocalCluster::start_with(3, &["--enable-debug-command", "yes"]).expect("start");
        let env = Env::start_over(masters, |c| {
            c.allow_debug_command = true;
            c.health_interval_ms = 60_000;
            c.witness_floor = floor;
        })
        .await;
        let mut c = env.proxy.client().await;
        let ports = env.ports();
        let k = key(&format!("reload-between-polls-{floor}"));
        for &port in &ports[1..] {
            assert_eq!(master_cmd(port, &["SAVE"]).await, "+OK");
        }
        let granted = Instant::now();
        assert_eq!(c.cmd(&["SET", &k, "a", "NX", "PX", "20000"]).await, "+OK");
        for &port in &ports {
            assert_eq!(master_get(port, &k).await.as_deref(), Some("a"));
        }
        for &port in &ports[1..] {
            let reload = master_cmd(port, &["DEBUG", "RELOAD", "NOSAVE"]).await;
            assert_eq!(reload, "+OK");
            assert_eq!(master_get(port, &k).await, None, "the reload dropped A");
        }
        let b = c.cmd(&["SET", &k, "b", "NX", "PX", "20000"]).await;
        assert!(
            granted.elapsed() < Duration::from_secs(15),
            "A's lease nearly ended before B asked: {:?}",
            granted.elapsed()
        );
        if !floor {
            assert_eq!(b, "+OK", "the scenario did not bite");
            continue;
        }
        assert_eq!(b, "$nil", "B granted while A holds the lock");
        for &port in &ports[1..] {
            assert_eq!(master_get(port, &k).await, None, "B took the key");
        }
        // Polled at once (not at the 60 s interval): both quarantined for the lost writes.
        let info =
            wait_for_info_where(&mut c, Duration::from_secs(5), "1 and 2 quarantined", |i| {
                (1..3).all(|m| {
                    master_state(i, m)
                        .is_some_and(|s| s.starts_with("quarantined (lacks lock writes"))
                })
            })
            .await;
        let causes = info
            .lines()
            .filter(|l| l.contains(",quarantine_cause=witness_behind"))
            .count();
        assert_eq!(causes, 2, "{info}");
        assert_eq!(master_state(&info, 0), Some("up"), "{info}");
    }
}
