//! Master health: quarantine after data loss, refusal of unsafe configurations.

use redlock_proxy::{LocalCluster, LocalMaster};
use redlock_testkit::key;
use redlock_testkit::launcher::{wait_for_info, Proxy};
use redlock_testkit::masters::{master_cmd, master_get};
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
