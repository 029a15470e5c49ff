//! Start-up and the first deployment, over real `redis-server` masters (issue 22, items 1, 3,
//! 4 and 5):
//!
//! - a proxy that starts while its link to one master is cut never arms that master without a
//!   quarantine once it has restarted empty, whatever its first looks at the others said;
//! - a brand-new deployment with a minority of masters down (or refusing the proxy's
//!   password) serves on a quorum, and the missing master joins later through a quarantine;
//! - the first acquire after start is never answered null (a client reads null as "held"):
//!   it waits for the masters' judgement (up to the start-up hold), and is then told
//!   `-LOADING` if they are still not judged (issue 40, bug 4);
//! - SIGTERM during start-up ends the binary cleanly, and `--local` masters never outlive the
//!   proxy, even after SIGKILL.
//!
//! Bounds are generous (seconds): these tests are about behaviour.

use redlock_proxy::on_master::{ARMED_KEY, QUARANTINE_KEY};
use redlock_proxy::{Config, LocalCluster, LocalMaster};
use redlock_testkit::key;
use redlock_testkit::launcher::{wait_for_info_within, Proxy};
use redlock_testkit::masters::{master_cmd, master_get};
use redlock_testkit::relay::{Mode, Relay};
use redlock_testkit::resp::Client;
use redlock_testkit::rig::STARTING;
use redlock_testkit::workload::{refused_while_free_keys_granted, wait_grantable};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NODE_TIMEOUT_MS: u64 = 300;

/// Whether a lock on `k` is granted through the proxy within `limit` (then released).
async fn granted_within(proxy: &Proxy, k: &str, limit: Duration) -> bool {
    wait_grantable(proxy.port, k, 10_000, limit).await.is_some()
}

/// A loopback port nothing listens on (bound, then released).
fn dead_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Item 1. P2 starts while its link to A is cut and looks at B and C; P1 starts; X is granted
/// `k` on A and B through P1; A is cut off from P1 and restarts empty; P2's link to A heals.
/// Before the fix, P2 then judged the deployment brand new from its first looks (B and C were
/// unarmed when it saw them) and armed A without a quarantine: Y was granted `k` on A and C
/// while X held it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_started_during_a_cut_never_arms_an_amnesiac_master_without_quarantine() {
    const CAP_MS: u64 = 4000;
    let settings = |c: &mut Config| {
        c.node_timeout_ms = NODE_TIMEOUT_MS;
        // A short cap keeps the quarantine of a master joining late to about 4 s.
        c.max_lock_ttl_ms = CAP_MS;
    };
    let mut masters = LocalCluster::start(3).expect("redis-server must be installed");
    let ports: Vec<u16> = masters.masters.iter().map(|m| m.port).collect();
    let to_p2 = Relay::start_each(&masters).await;
    let a_to_p1 = Relay::start(ports[0]).await;
    to_p2[0].set_mode(Mode::Reset);
    let p2 = Proxy::start(to_p2.iter().map(Relay::addr).collect(), settings).await;
    // Let P2 look at B and C (it polls every 100 ms).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let addrs_p1 = vec![
        a_to_p1.addr(),
        format!("127.0.0.1:{}", ports[1]),
        format!("127.0.0.1:{}", ports[2]),
    ];
    let p1 = Proxy::start(addrs_p1, settings).await;
    let mut admin = p1.client().await;
    // Every master of P1 votes (A perhaps after a quarantine of the cap plus drift).
    wait_for_info_within(&mut admin, "state=up", 3, Duration::from_secs(15)).await;
    let k = key("cut-at-start");
    // C missed X's write: X's lease sits on exactly A and B.
    assert_eq!(
        master_cmd(ports[2], &["SET", &k, "foreign", "PX", "60000"]).await,
        "+OK"
    );
    let mut x = p1.client().await;
    let granted = x
        .cmd(&["SET", &k, "tok-x", "NX", "PX", &CAP_MS.to_string()])
        .await;
    let granted_at = Instant::now();
    assert_eq!(granted, "+OK", "X");
    assert_eq!(master_get(ports[0], &k).await.as_deref(), Some("tok-x"));
    assert_eq!(master_get(ports[1], &k).await.as_deref(), Some("tok-x"));
    assert_eq!(master_cmd(ports[2], &["DEL", &k]).await, ":1");
    // A is cut off from P1 and restarts empty; P2's link to it heals.
    a_to_p1.set_mode(Mode::Reset);
    let a = &mut masters.masters[0];
    tokio::task::block_in_place(|| a.restart(&[])).expect("restart A");
    to_p2[0].set_mode(Mode::Pass);
    let mut y = p2.client().await;
    let mut other = p2.client().await;
    // Y tries while X's lease surely runs (it ends CAP_MS after the grant); the same proxy
    // grants free keys meanwhile: the refusals are not a proxy that refuses everything.
    let until = granted_at + Duration::from_millis(CAP_MS - 500);
    let every = Duration::from_millis(20);
    let (refused, others_granted) =
        refused_while_free_keys_granted(&mut y, &mut other, &k, 1000, every, until, "X").await;
    assert!(refused >= 10, "Y tried only {refused} times");
    assert!(
        others_granted >= 5,
        "P2 granted only {others_granted} free keys"
    );
    // P2 keeps A out until every lease it may have held has expired.
    let info = p2.client().await.cmd(&["INFO", "masters"]).await;
    assert!(info.contains("state=quarantined"), "{info}");
    assert_eq!(master_get(ports[1], &k).await.as_deref(), Some("tok-x"));
}

/// Item 3: five masters configured, a minority of them unusable at the first start (not
/// running, or refusing the proxy's password): the deployment is founded on the others and
/// serves; a master that comes up later joins through a quarantine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_deployment_with_a_minority_down_serves_and_the_rest_join_quarantined() {
    // Two of five not running.
    let masters = LocalCluster::start(3).expect("redis-server must be installed");
    let dead = [dead_port(), dead_port()];
    let mut addrs = masters.addrs();
    addrs.extend(dead.iter().map(|p| format!("127.0.0.1:{p}")));
    let proxy = Proxy::start(addrs, |c| c.node_timeout_ms = NODE_TIMEOUT_MS).await;
    let mut client = proxy.client().await;
    assert!(granted_within(&proxy, &key("minority-down"), Duration::from_secs(10)).await);
    let info = wait_for_info_within(&mut client, "state=up", 3, Duration::from_secs(5)).await;
    assert!(info.contains("deployment:founded_by_this_proxy"), "{info}");
    // A master that comes up now joins a running deployment: quarantined, not armed plainly.
    let late = LocalMaster::start(Some(dead[0]), &[]).expect("start the late master");
    let info =
        wait_for_info_within(&mut client, "state=quarantined", 1, Duration::from_secs(10)).await;
    assert!(
        info.contains("lock marker missing in a running deployment"),
        "{info}"
    );
    drop(late);

    // One of five refuses the proxy's password (`auth_failed`).
    let masters = LocalCluster::start(4).expect("redis-server must be installed");
    let locked = LocalMaster::start(None, &["--requirepass", "right"]).expect("start");
    let mut addrs = masters.addrs();
    addrs.push(format!("redis://:wrong@{}", locked.addr()));
    let proxy = Proxy::start(addrs, |c| c.node_timeout_ms = NODE_TIMEOUT_MS).await;
    let mut client = proxy.client().await;
    assert!(granted_within(&proxy, &key("auth-failed"), Duration::from_secs(10)).await);
    let info = wait_for_info_within(&mut client, "state=up", 4, Duration::from_secs(5)).await;
    assert!(info.contains("state=auth_failed"), "{info}");
}

/// Item 4: right after start (nothing waited for but the port), the first acquire of a free key
/// is granted or refused with the explicit start-up error; never null, which a client reads as
/// "someone holds it". Over brand-new masters and over masters a previous proxy armed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_acquire_after_start_is_never_null() {
    let mut granted = 0;
    for run in 0..6 {
        // Runs alternate brand-new masters and masters armed by a proxy before.
        let masters = LocalCluster::start(3).expect("redis-server must be installed");
        if run % 2 == 1 {
            let first = Proxy::start(masters.addrs(), |_| {}).await;
            assert!(granted_within(&first, &key("arm"), Duration::from_secs(10)).await);
            first.stop().await;
        }
        let config = Config {
            backends: masters
                .addrs()
                .iter()
                .map(|a| a.parse().expect("address"))
                .collect(),
            node_timeout_ms: 2000,
            ..Config::default()
        };
        let proxy = Proxy::launch(config).await;
        let mut client = Client::connect(proxy.port).await;
        let k = key(&format!("first-{run}"));
        let set = client.cmd(&["SET", &k, "v", "NX", "PX", "10000"]).await;
        assert!(
            set == "+OK" || set.starts_with(STARTING),
            "run {run}: {set}"
        );
        let lock = client
            .cmd(&["LOCK.ACQUIRE", &format!("{k}:t"), "v", "10000"])
            .await;
        assert!(
            lock.starts_with("*[") || lock.starts_with(STARTING),
            "run {run}: {lock}"
        );
        granted += usize::from(set == "+OK") + usize::from(lock.starts_with("*["));
        proxy.stop().await;
    }
    // Held for up to the node timeout, the first acquires are answered, not only refused.
    assert!(granted >= 6, "only {granted} of 12 first acquires granted");
}

/// Issue 40, bug 4: a new deployment with one master of three down founds without it after
/// about a second of patience; an acquire sent meanwhile is held until then and granted
/// (before, it was refused after a node timeout with `-ERR redlock-proxy is starting`). One
/// whose masters are still not judged when the hold ends is refused with `-LOADING`, which
/// clients read as "retry later".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_during_start_up_waits_for_the_masters_then_is_told_loading() {
    let masters = LocalCluster::start(2).expect("redis-server must be installed");
    let mut addrs = masters.addrs();
    addrs.push(format!("127.0.0.1:{}", dead_port()));
    let config = |addrs: Vec<String>, node_timeout_ms| Config {
        backends: addrs.iter().map(|a| a.parse().expect("address")).collect(),
        node_timeout_ms,
        ..Config::default()
    };
    // The default node timeout (50 ms), far shorter than the founding's patience.
    let proxy = Proxy::launch(config(addrs, Config::default().node_timeout_ms)).await;
    let mut client = Client::connect(proxy.port).await;
    let asked = Instant::now();
    let set = client
        .cmd(&["SET", &key("held-at-start"), "v", "NX", "PX", "10000"])
        .await;
    assert_eq!(set, "+OK", "after {:?}", asked.elapsed());
    proxy.stop().await;

    // Masters that carry another proxy's founding claim (one that never completes, and a
    // smaller tag, which a claim does not replace): this proxy cannot found the deployment,
    // so its masters stay unjudged beyond the hold.
    let masters = LocalCluster::start(3).expect("redis-server must be installed");
    for m in &masters.masters {
        assert_eq!(master_cmd(m.port, &["SET", ARMED_KEY, "x"]).await, "+OK");
        let claim = ["SET", QUARANTINE_KEY, "founding:0", "PX", "60000"];
        assert_eq!(master_cmd(m.port, &claim).await, "+OK");
    }
    let proxy = Proxy::launch(config(masters.addrs(), Config::default().node_timeout_ms)).await;
    let mut client = Client::connect(proxy.port).await;
    let asked = Instant::now();
    let set = client
        .cmd(&["SET", &key("loading"), "v", "NX", "PX", "10000"])
        .await;
    let waited = asked.elapsed();
    assert!(
        set.starts_with("-LOADING redlock-proxy is starting: "),
        "{set} after {waited:?}"
    );
    // The hold runs from the proxy's start, a moment before the request.
    assert!(
        waited >= Duration::from_millis(1500),
        "refused after {waited:?}"
    );
    proxy.stop().await;
}

/// The `redis-server` children of process `parent` (from `/proc`).
fn redis_children(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                // `pid (comm) state ppid …`; comm may hold spaces, so split after it.
                let Some((head, rest)) = stat.rsplit_once(") ") else {
                    return false;
                };
                let ppid = rest.split(' ').nth(1).and_then(|p| p.parse::<u32>().ok());
                head.contains("(redis-server") && ppid == Some(parent)
            })
        })
        .collect()
}

/// Adds the `redis-server` children `parent` has now to `seen`.
fn note_children(parent: u32, seen: &mut Vec<u32>) {
    for pid in redis_children(parent) {
        if !seen.contains(&pid) {
            seen.push(pid);
        }
    }
}

/// Whether process `pid` catches SIGTERM (`SigCgt` in `/proc/<pid>/status`, bit 15 − 1).
fn catches_sigterm(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (libc::SIGTERM - 1)) != 0)
}

/// Running (not exited, not a zombie waiting to be reaped).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
    })
}

fn assert_all_gone(children: &[u32], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while children.iter().any(|p| alive(*p)) {
        assert!(
            Instant::now() < deadline,
            "{what}: local masters {:?} outlived the proxy",
            children.iter().filter(|p| alive(**p)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Item 5: SIGTERM at any moment of the start-up (local masters starting, listeners binding,
/// first looks) ends the proxy cleanly (exit 0), and no local master outlives it; SIGKILL of a
/// running proxy takes its local masters down too.
#[test]
fn signals_during_start_up_end_the_proxy_cleanly_and_local_masters_die_with_it() {
    let bin = env!("CARGO_BIN_EXE_redlock-proxy");
    let start = || {
        Command::new(bin)
            .args(["--local", "3", "--bind", "127.0.0.1", "--port", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the proxy binary")
    };
    for delay_ms in [0u64, 10, 30, 60, 100, 150, 250] {
        let mut proxy = start();
        // No program handles a signal before it installs a handler: the clock starts when the
        // kernel shows SIGTERM caught (the binary's first step, before the local masters).
        let deadline = Instant::now() + Duration::from_secs(10);
        while !catches_sigterm(proxy.id()) {
            assert!(Instant::now() < deadline, "SIGTERM never caught");
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut children = redis_children(proxy.id());
        let signal_at = Instant::now() + Duration::from_millis(delay_ms);
        while Instant::now() < signal_at {
            note_children(proxy.id(), &mut children);
            std::thread::sleep(Duration::from_millis(2));
        }
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(proxy.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            note_children(proxy.id(), &mut children);
            if let Some(status) = proxy.try_wait().expect("wait") {
                break status;
            }
            assert!(Instant::now() < deadline, "no exit 10 s after SIGTERM");
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(
            status.code(),
            Some(0),
            "SIGTERM {delay_ms} ms after start: {status}"
        );
        assert_all_gone(&children, &format!("SIGTERM after {delay_ms} ms"));
    }

    let mut proxy = start();
    let deadline = Instant::now() + Duration::from_secs(10);
    // Handlers first: once a local master runs, SIGTERM is already caught (before the fix the
    // handlers came after every local master answered).
    while redis_children(proxy.id()).is_empty() {
        assert!(Instant::now() < deadline, "no local master within 10 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        catches_sigterm(proxy.id()),
        "a local master runs before SIGTERM is caught"
    );
    let children = loop {
        let children = redis_children(proxy.id());
        if children.len() == 3 {
            break children;
        }
        assert!(Instant::now() < deadline, "3 local masters within 10 s");
        std::thread::sleep(Duration::from_millis(10));
    };
    proxy.kill().expect("SIGKILL");
    proxy.wait().expect("reap");
    assert_all_gone(&children, "SIGKILL");
}
