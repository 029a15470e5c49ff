//! A master's wall clock between two looks (docs/SAFETY.md, "Clocks"): a forward step or a
//! fast rate expires its keys early, so the proxy judges each master's `TIME` against its own
//! monotonic clock and quarantines a master whose clock ran ahead (cause `clock`), before it
//! votes again.
//!
//! Each scenario: 3 masters, the third with a clock of its own (the clock nemesis,
//! `redlock_testkit::clock`). A holds `k` on masters 1 and 2 (master 0 paused during the
//! acquire); master 2's clock steps or speeds up, so `k` expires there while A's lease has
//! seconds left; B then asks for `k`. The negative control runs the same with the quarantine
//! off: B is granted, so the scenario bites.

use redlock_proxy::{LocalCluster, LocalMaster};
use redlock_testkit::clock::FakeClock;
use redlock_testkit::key;
use redlock_testkit::launcher::{master_state, wait_for_info_where, wait_for_info_within, Env};
use redlock_testkit::masters::{acquire_while_paused, master_cmd, master_get};
use std::time::{Duration, Instant};

/// What happens to master 2's clock once A holds the lock.
#[derive(Clone, Copy)]
enum Fault {
    StepForward(Duration),
    Rate(f64),
}

/// Three masters, the last (master 2) with a clock of its own, and that clock.
fn masters_with_clock_on_2() -> (FakeClock, LocalCluster) {
    let clock = FakeClock::new();
    let masters = LocalCluster {
        masters: vec![
            LocalMaster::start(None, &[]).expect("redis-server"),
            LocalMaster::start(None, &[]).expect("redis-server"),
            clock.start_master(),
        ],
    };
    (clock, masters)
}

/// Runs one scenario with a lease of `ttl_ms`; B's replies, tried until one is granted or
/// for a second after `k` expired on master 2, and the proxy's `INFO masters` then.
async fn scenario(fault: Fault, ttl_ms: u64, quarantine: bool) -> (Vec<String>, String) {
    let (mut clock, masters) = masters_with_clock_on_2();
    let env = Env::start_over(masters, |c| c.quarantine = quarantine).await;
    let ports = env.ports();
    let mut c = env.proxy.client().await;
    let k = key("clock");
    let ttl = ttl_ms.to_string();
    // A: granted by masters 1 and 2 while master 0 is paused; its late copy of the acquire
    // runs past its write deadline (the node timeout, in master 0's clock) and writes nothing.
    let paused = env.masters.masters[0].pid().expect("running");
    let granted = Instant::now();
    let timeout = env.proxy.config().node_timeout_ms;
    let a = acquire_while_paused(&mut c, paused, (&k, "a", ttl_ms), timeout).await;
    assert_eq!(a, "+OK");
    wait_for_info_within(&mut c, "state=up", 3, Duration::from_secs(10)).await;
    if !quarantine {
        // Without the quarantine an acquire is a bare `SET` with no write deadline: master 0
        // took A late; the control removes it to start from the same state.
        assert_eq!(master_cmd(ports[0], &["DEL", &k]).await, ":1");
    }
    assert_eq!(master_get(ports[0], &k).await, None, "master 0 took A late");
    match fault {
        Fault::StepForward(by) => clock.step_forward(by),
        Fault::Rate(rate) => clock.set_rate(rate),
    }
    // Until `k` expired on master 2 (well before A's lease ends).
    let limit = Duration::from_millis(ttl_ms);
    while master_get(ports[2], &k).await.is_some() {
        assert!(
            granted.elapsed() < limit,
            "k never expired early on master 2"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut replies = Vec::new();
    let tried = Instant::now();
    while tried.elapsed() < Duration::from_secs(1) {
        let b = c.cmd(&["SET", &k, "b", "NX", "PX", &ttl]).await;
        replies.push(b.clone());
        if b == "+OK" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A's lease still had seconds to run when B asked.
    assert!(
        granted.elapsed() + Duration::from_secs(1) < limit,
        "{:?}",
        granted.elapsed()
    );
    let info = c.cmd(&["INFO", "masters"]).await;
    (replies, info)
}

fn refused(replies: &[String], info: &str, cause: &str) {
    assert!(
        replies.iter().all(|r| r == "$nil"),
        "B granted while A holds the lock: {replies:?}\n{info}"
    );
    assert!(
        master_state(info, 2).is_some_and(|state| state.starts_with(cause)),
        "master 2 not quarantined for its clock ({cause}): {info}"
    );
    // The metric's vocabulary in INFO too.
    let line = info.lines().find(|l| l.starts_with("master2:"));
    assert!(
        line.is_some_and(|l| l.ends_with(",quarantine_cause=clock")),
        "{info}"
    );
}

/// A 12 s step of a master's clock during a 15 s lease: the next reading of its clock is a
/// loss (cause `clock`), and B is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_whose_clock_steps_forward_is_quarantined() {
    let (replies, info) = scenario(Fault::StepForward(Duration::from_secs(12)), 15_000, true).await;
    refused(&replies, &info, "quarantined (clock stepped forward");
}

/// A 40 s step (beyond the lease, and beyond the token window: refused by the clock rule, not
/// by the token offer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_beyond_the_lease_is_judged_by_the_clock_rule() {
    let (replies, info) = scenario(Fault::StepForward(Duration::from_secs(40)), 15_000, true).await;
    refused(&replies, &info, "quarantined (clock stepped forward");
}

/// A clock running at 1.6x real time (the drift factor allows 1.01x).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_whose_clock_runs_fast_is_quarantined() {
    let (replies, info) = scenario(Fault::Rate(1.6), 12_000, true).await;
    refused(&replies, &info, "quarantined (clock ran fast");
}

/// Negative controls: with the quarantine off, the same faults give B the lock while A's
/// lease has seconds left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_quarantine_a_clock_fault_breaks_mutual_exclusion() {
    for (fault, ttl_ms) in [
        (Fault::StepForward(Duration::from_secs(12)), 15_000),
        (Fault::Rate(1.6), 12_000),
    ] {
        let (replies, info) = scenario(fault, ttl_ms, false).await;
        assert_eq!(
            replies.last().map(String::as_str),
            Some("+OK"),
            "the scenario did not bite: {replies:?}\n{info}"
        );
    }
}

/// Issue 37, "clock watch": a step smaller than the node timeout between two polls. A holds `k`
/// for 5 s on masters 1 and 2 (master 0 paused during the acquire); master 2's clock steps
/// 1.5 s forward, far beyond the drift allowance (52 ms) but within the node timeout (2 s), so
/// the write deadline in its clock still lets an acquire through, and `k` expires there 1.5 s
/// early. B asks once it has, with no poll in between (the health interval is 60 s). Every
/// merged lock call answers the clock it read, which the proxy judges with the poll's rule:
/// ahead, so master 2's `OK` is no vote and B is refused, and master 2 is polled at once and
/// quarantined with cause `clock`. Negative control: without the per-call check
/// (`clock_per_call = false`) masters 0 and 2 grant B while A's lease has over a second left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_within_the_node_timeout_between_two_polls_is_refused_by_the_next_acquire() {
    const TTL_MS: u64 = 5000;
    const NODE_TIMEOUT_MS: u64 = 2000;
    const STEP: Duration = Duration::from_millis(1500);
    for per_call in [true, false] {
        let (mut clock, masters) = masters_with_clock_on_2();
        let env = Env::start_over(masters, |c| {
            c.health_interval_ms = 60_000;
            c.node_timeout_ms = NODE_TIMEOUT_MS;
            c.clock_per_call = per_call;
        })
        .await;
        let ports = env.ports();
        let mut c = env.proxy.client().await;
        let k = key(&format!("clock-per-call-{per_call}"));
        let paused = env.masters.masters[0].pid().expect("running");
        let granted = Instant::now();
        let a = acquire_while_paused(&mut c, paused, (&k, "a", TTL_MS), NODE_TIMEOUT_MS).await;
        assert_eq!(a, "+OK");
        wait_for_info_within(&mut c, "state=up", 3, Duration::from_secs(5)).await;
        assert_eq!(master_get(ports[0], &k).await, None, "master 0 took A late");
        assert_eq!(master_get(ports[2], &k).await.as_deref(), Some("a"));
        clock.step_forward(STEP);
        // Until `k` expired on master 2 (1.5 s before A's lease ends).
        while master_get(ports[2], &k).await.is_some() {
            assert!(
                granted.elapsed() < Duration::from_millis(TTL_MS),
                "k never expired early on master 2"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let b = c.cmd(&["SET", &k, "b", "NX", "PX", "5000"]).await;
        // A's lease still had over a second to run when B was answered.
        let lease_left = Duration::from_millis(TTL_MS - 52).saturating_sub(granted.elapsed());
        assert!(lease_left > Duration::from_millis(500), "{lease_left:?}");
        if !per_call {
            assert_eq!(b, "+OK", "the scenario did not bite");
            continue;
        }
        assert_eq!(b, "$nil", "B granted while A holds the lock");
        // Polled at once (not at the 60 s interval): quarantined for its clock (a step of 1.5 s
        // seconds after the last poll reads as a rate over that window, under the same cause).
        let info = wait_for_info_where(
            &mut c,
            Duration::from_secs(5),
            "master 2 quarantined",
            |i| master_state(i, 2).is_some_and(|s| s.starts_with("quarantined (clock ")),
        )
        .await;
        let line = info.lines().find(|l| l.starts_with("master2:"));
        assert!(
            line.is_some_and(|l| l.ends_with(",quarantine_cause=clock")),
            "{info}"
        );
        assert_eq!(master_state(&info, 0), Some("up"), "{info}");
        // B's write on masters 0 and 2 was rolled back (master 1 still holds A).
        for (port, held) in [(ports[0], None), (ports[1], Some("a")), (ports[2], None)] {
            let deadline = Instant::now() + Duration::from_secs(5);
            while master_get(port, &k).await.as_deref() != held {
                assert!(
                    Instant::now() < deadline,
                    "{port}: {:?}",
                    master_get(port, &k).await
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}
