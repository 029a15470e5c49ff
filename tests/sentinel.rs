//! Masters found through Redis Sentinel (`sentinel://…/name`; docs/PROTOCOL.md §2,
//! docs/SAFETY.md "Failovers"): three groups of a primary and a replica, watched by three
//! sentinels. A failover is amnesia (replication is asynchronous): a replica promoted after it
//! missed a lock must not vote for a contender while that lock is held. With the failover
//! quarantine it does not, also when no proxy ran during the failover (the armed marker names
//! the process that armed it); the negative controls (quarantine off; an unstamped marker) show
//! the scenarios bite. And a workload under repeated failovers keeps mutual exclusion.
//!
//! With `wait_replicas` (docs/SAFETY.md, "Confirmed writes") a failover to a replica that
//! confirmed every counted write needs no quarantine (with 0 it is quarantined), while one to a
//! replica that missed writes still is. (That an unconfirmed vote does not count is shown over
//! plain replicas, `tests/health.rs`.)

use redlock_proxy::Config;
use redlock_testkit::key;
use redlock_testkit::launcher::{master_number, master_state, wait_for_info_where, Proxy};
use redlock_testkit::masters::{master_cmd, master_get, signal};
use redlock_testkit::resp::Client;
use redlock_testkit::rig::run_alone;
use redlock_testkit::sentinel::SentinelGroups;
use redlock_testkit::workload::{
    contend_until, grant_behind_a_cut_replica, wait_grantable, Workload,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sentinels take `DOWN_AFTER_MS` to call a primary down, then elect and promote.
const FAILOVER_LIMIT: Duration = Duration::from_secs(30);
/// How long a fresh proxy may take to grant its first lock: the scenarios run side by side,
/// each starting 3 groups and 3 sentinels, and on a busy 2-CPU machine the founding once took
/// longer than 10 s (a bounded wait: it returns at the first grant).
const READY_LIMIT: Duration = Duration::from_secs(60);

/// Who sees the failover of [`contender_after_a_lossy_failover`].
#[derive(Clone, Copy, Debug)]
enum Failover {
    /// The proxy runs through it; `quarantine` off is the negative control.
    Watched { quarantine: bool },
    /// The proxy that granted A's lock stops before it and a new one starts after it;
    /// `legacy_marker`: the negative control, the promoted server's armed marker reset to `1`
    /// (unstamped, as earlier versions wrote it).
    Unwatched { legacy_marker: bool },
}

/// A holds `k` on groups 0 and 1 (group 2 holds a foreign value then); group 0's primary dies
/// and its replica, cut off before A's write, is promoted; B tries `k` through the proxy until
/// A's lease ends (the negative controls: until its first grant). Returns B's grants.
async fn contender_after_a_lossy_failover(failover: Failover) -> usize {
    // Long enough that B still has the 20 s it contends at most after a failover and a
    // proxy's start slowed down on a busy machine (they took over 20 s once, in CI).
    let ttl_a: u64 = 60_000;
    let mut groups = tokio::task::block_in_place(|| SentinelGroups::start(3, 3));
    let quarantine = !matches!(failover, Failover::Watched { quarantine: false });
    let tweak = |c: &mut Config| {
        c.quarantine = quarantine;
        c.max_lock_ttl_ms = ttl_a;
    };
    let mut proxy = Some(Proxy::start(groups.backends(), tweak).await);
    let port = |proxy: &Option<Proxy>| proxy.as_ref().expect("a proxy runs").port;
    let k = key(&format!("failover-{failover:?}").replace([' ', '{', '}', ':'], ""));
    let probe = format!("{k}:probe");
    let ready = wait_grantable(port(&proxy), &probe, 1000, READY_LIMIT).await;
    assert!(ready.is_some(), "proxy never ready");
    let primaries: Vec<u16> = (0..3).map(|g| groups.primary(g)).collect();
    assert_eq!(
        master_cmd(primaries[2], &["SET", &k, "foreign", "PX", "60000"]).await,
        "+OK"
    );
    // Group 0's replica stops hearing its primary before A's write.
    let replica = &groups.servers[0][1];
    let replica_pid = replica.pid().expect("running");
    let lease_end =
        grant_behind_a_cut_replica(port(&proxy), primaries[0], replica_pid, &k, ttl_a).await;
    assert_eq!(master_cmd(primaries[2], &["DEL", &k]).await, ":1");
    if matches!(failover, Failover::Unwatched { .. }) {
        proxy.take().expect("a proxy runs").stop().await;
    }
    // The primary dies; the replica, resumed, is promoted without A's lock.
    groups.servers[0][0].kill();
    signal(replica_pid, "CONT");
    let promoted =
        tokio::task::block_in_place(|| groups.wait_new_primary(0, primaries[0], FAILOVER_LIMIT));
    assert_eq!(promoted, groups.servers[0][1].port);
    assert_eq!(
        master_get(promoted, &k).await,
        None,
        "the replica had A's lock"
    );
    if let Failover::Unwatched { legacy_marker } = failover {
        if legacy_marker {
            let armed = redlock_proxy::on_master::ARMED_KEY;
            assert_eq!(master_cmd(promoted, &["SET", armed, "1"]).await, "+OK");
        }
        proxy = Some(Proxy::start(groups.backends(), tweak).await);
    }
    let mut b = Client::connect(port(&proxy)).await;
    let negative_control = matches!(
        failover,
        Failover::Watched { quarantine: false }
            | Failover::Unwatched {
                legacy_marker: true
            }
    );
    contend_until(&mut b, &k, lease_end, negative_control).await
}

// Each scenario runs after its negative control's, not beside it: a scenario starts 3 groups
// and 3 sentinels, and more of them at once on a 2-CPU machine slowed failovers past their
// bounds.

/// The proxy runs through the failover: the promoted replica votes for nobody while A's lease
/// runs. Negative control: without the quarantine it votes for B while A holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_promoted_without_a_held_lock_is_quarantined() {
    let watched = Failover::Watched { quarantine: true };
    assert_eq!(contender_after_a_lossy_failover(watched).await, 0);
    let control = Failover::Watched { quarantine: false };
    assert!(
        contender_after_a_lossy_failover(control).await > 0,
        "negative control: without the quarantine B must get the lock A holds"
    );
}

/// No proxy runs during the failover: the promoted server's armed marker still names its old
/// primary's process, so the next proxy quarantines it (docs/SAFETY.md, "Failovers").
/// Negative control: with the marker as earlier versions wrote it (no stamp), nothing tells the
/// next proxy that the promoted server's data came from elsewhere, and B gets A's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_no_proxy_watched_is_quarantined_by_the_next_proxy() {
    let unwatched = Failover::Unwatched {
        legacy_marker: false,
    };
    assert_eq!(contender_after_a_lossy_failover(unwatched).await, 0);
    let control = Failover::Unwatched {
        legacy_marker: true,
    };
    assert!(
        contender_after_a_lossy_failover(control).await > 0,
        "negative control: with an unstamped marker B must get the lock A holds"
    );
}

#[test]
fn failovers_under_load_keep_mutual_exclusion() {
    run_alone(async {
        let groups = Arc::new(tokio::task::block_in_place(|| SentinelGroups::start(3, 3)));
        let proxy = Proxy::start(groups.backends(), |c| c.max_lock_ttl_ms = 1000).await;
        let probe = key("probe");
        let ready = wait_grantable(proxy.port, &probe, 500, READY_LIMIT).await;
        assert!(ready.is_some(), "proxy never ready");
        let mut workload = Workload::new(vec![proxy.port], "sentinel", 7);
        workload.duration = Duration::from_secs(25);
        let groups_ = groups.clone();
        let (report, failovers, took) = workload
            .run_beside(move || {
                let mut done = 0;
                for g in 0..3 {
                    std::thread::sleep(Duration::from_secs(2));
                    groups_.failover(g, FAILOVER_LIMIT);
                    done += 1;
                }
                std::thread::sleep(Duration::from_secs(3));
                done
            })
            .await;
        println!(
            "[sentinel] {:.1} s, {failovers} failovers: {report}",
            took.as_secs_f64()
        );
        assert_eq!(failovers, 3);
        report.assert_safe(50);
    });
}

/// Node timeout of the `wait_replicas` scenarios: `WAIT` gets half of it, far more than a
/// replica's acknowledgement takes on a loaded machine (these tests are about behaviour).
const CONFIRM_NODE_TIMEOUT_MS: u64 = 1000;

/// The proxy's `INFO masters` state of master `i`, once `done` holds for it (at most `limit`).
async fn state_when(port: u16, i: usize, limit: Duration, done: impl Fn(&str) -> bool) -> String {
    let mut client = Client::connect(port).await;
    let what = format!("master{i}'s state to be as asked");
    let info = wait_for_info_where(&mut client, limit, &what, |info| {
        done(master_state(info, i).unwrap_or_default())
    })
    .await;
    master_state(&info, i).unwrap_or_default().to_string()
}

/// When master 0's clock was first read after `after` (the proxy reads it at the start of
/// every poll), waiting at most [`FAILOVER_LIMIT`].
async fn clock_read_after(client: &mut Client, after: Instant) -> Instant {
    let started = Instant::now();
    loop {
        let asked = Instant::now();
        let info = client.cmd(&["INFO", "masters"]).await;
        let age = master_number(&info, 0, "clock_age_ms")
            .and_then(|ms| u64::try_from(ms).ok())
            .expect("clock_age_ms in INFO");
        // The earliest the reading can have been: INFO was made after it was asked for, and
        // the age is in whole ms.
        let read_at = asked - Duration::from_millis(age + 1);
        if read_at > after {
            return read_at;
        }
        assert!(
            started.elapsed() < FAILOVER_LIMIT,
            "master0's clock is not read"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A holds `k` on every group with `wait_replicas` (1, or 0: the negative control); group 0
/// then fails over to its replica (`SENTINEL FAILOVER`), which had A's write. Returns master
/// 0's state once the proxy has judged the new primary, and the `PTTL` of the quarantine
/// marker on it.
async fn failover_after_confirmed_writes(wait_replicas: u32) -> (String, String) {
    let groups = tokio::task::block_in_place(|| SentinelGroups::start(3, 3));
    let proxy = Proxy::start(groups.backends(), |c| {
        c.wait_replicas = wait_replicas;
        c.node_timeout_ms = CONFIRM_NODE_TIMEOUT_MS;
        c.max_lock_ttl_ms = 20_000;
    })
    .await;
    let k = key(&format!("confirmed-failover-{wait_replicas}"));
    let ready = wait_grantable(proxy.port, &format!("{k}:probe"), 1000, READY_LIMIT).await;
    assert!(ready.is_some(), "proxy never ready");
    let mut a = Client::connect(proxy.port).await;
    assert_eq!(
        a.cmd(&["SET", &k, "tok-a", "NX", "PX", "20000"]).await,
        "+OK"
    );
    let promoted = tokio::task::block_in_place(|| groups.failover(0, FAILOVER_LIMIT));
    assert_eq!(promoted, groups.servers[0][1].port);
    assert_eq!(
        master_get(promoted, &k).await.as_deref(),
        Some("tok-a"),
        "the replica had A's lock"
    );
    let judged = |state: &str| state == "up" || state.starts_with("quarantined");
    let state = state_when(proxy.port, 0, FAILOVER_LIMIT, judged).await;
    let quarantine = redlock_proxy::on_master::QUARANTINE_KEY;
    let pttl = master_cmd(promoted, &["PTTL", quarantine]).await;
    // Safety either way: A's lock is held on every group.
    let b = a.cmd(&["SET", &k, "tok-b", "NX", "PX", "1000"]).await;
    assert_eq!(b, "$nil", "B must not get the lock A holds");
    (state, pttl)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_replica_that_confirmed_every_vote_needs_no_quarantine() {
    let (state, pttl) = failover_after_confirmed_writes(1).await;
    assert_eq!(state, "up", "the new primary votes at once");
    assert_eq!(pttl, ":-2", "no quarantine marker on the new primary");
    let (state, pttl) = failover_after_confirmed_writes(0).await;
    assert!(
        state.starts_with("quarantined"),
        "negative control: without wait_replicas a failover is amnesia: {state}"
    );
    assert_ne!(pttl, ":-2", "negative control: quarantined for every proxy");
}

/// `wait_replicas` 1: group 0's replica stops and its link is cut, so the primary's writes
/// after that (a plain `SET` here) reach no replica and it may not vote; the proxy looks at
/// it once more, then the primary dies and the replica is promoted without those writes: it
/// is quarantined, as without `wait_replicas` (its history ends before the proxy's last look).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_replica_that_missed_writes_is_still_quarantined() {
    let mut groups = tokio::task::block_in_place(|| SentinelGroups::start(3, 3));
    let proxy = Proxy::start(groups.backends(), |c| {
        c.wait_replicas = 1;
        c.node_timeout_ms = CONFIRM_NODE_TIMEOUT_MS;
        c.max_lock_ttl_ms = 20_000;
    })
    .await;
    let ready = wait_grantable(proxy.port, &key("missed:probe"), 1000, READY_LIMIT).await;
    assert!(ready.is_some(), "proxy never ready");
    let primary = groups.primary(0);
    let replica_pid = groups.servers[0][1].pid().expect("running");
    signal(replica_pid, "STOP");
    let killed = master_cmd(primary, &["CLIENT", "KILL", "TYPE", "replica"]).await;
    assert_eq!(killed, ":1", "the replication link was cut");
    let alone = |state: &str| state.starts_with("unsafe (0 of the 1 replicas");
    state_when(proxy.port, 0, FAILOVER_LIMIT, alone).await;
    assert_eq!(
        master_cmd(primary, &["SET", &key("missed"), "x"]).await,
        "+OK"
    );
    // A whole look at the primary after that write: a poll reads the clock first and INFO
    // last, and the next poll starts only after it, so a clock read after one that was read
    // after the write means that poll's INFO came after the write.
    let mut client = Client::connect(proxy.port).await;
    let first = clock_read_after(&mut client, Instant::now()).await;
    clock_read_after(&mut client, first).await;
    groups.servers[0][0].kill();
    signal(replica_pid, "CONT");
    let promoted =
        tokio::task::block_in_place(|| groups.wait_new_primary(0, primary, FAILOVER_LIMIT));
    assert_eq!(promoted, groups.servers[0][1].port);
    let quarantine = redlock_proxy::on_master::QUARANTINE_KEY;
    let started = Instant::now();
    loop {
        let pttl = master_cmd(promoted, &["PTTL", quarantine]).await;
        if pttl != ":-2" {
            break;
        }
        assert!(
            started.elapsed() < FAILOVER_LIMIT,
            "the promoted replica was never quarantined"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
