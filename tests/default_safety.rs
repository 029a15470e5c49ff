//! Mutual exclusion in the **default configuration** (no `max_lock_ttl_ms` set, quarantine on),
//! scenario by scenario, over real `redis-server` masters. Each scenario is one way a lock that
//! is held could be granted a second time:
//!
//! - a lease taken by a *script* (node-redlock's acquire), then a master of its majority
//!   restarts empty;
//! - the proxy restarts (forgetting everything it knew), then a master of the majority
//!   restarts empty, or is wiped before the new proxy first sees it;
//! - a master is wiped between two health polls and a script acquire reaches it;
//! - a script whose success is null (Redisson's acquire) answered by a minority;
//! - an `EVALSHA` of a script the proxy never saw;
//! - a same-token retry after a refusal whose clean-up was still pending on a paused master.
//!
//! "C missed the write" is built as in the Kleppmann scenario of `tests/faults.rs`: a foreign
//! value sits on C while A and B grant the lock, then is removed, as if C never got the `SET`.
//! A second client then tries for 3 s (the first holder's lease runs 30 s) and must never be
//! granted. Timing bounds here are generous (seconds): these tests are about behaviour.

use redlock_proxy::on_master::COMPARE_AND_DELETE;
use redlock_proxy::{Config, LocalCluster};
use redlock_testkit::key;
use redlock_testkit::launcher::{ready_for_load, Env, Proxy};
use redlock_testkit::masters::{master_cmd, master_get, signal};
use redlock_testkit::scripts::script;
use redlock_testkit::workload::{refused_while_free_keys_granted, wait_grantable};
use std::time::{Duration, Instant};

const NODE_TIMEOUT_MS: u64 = 300;

/// The default configuration, with a node timeout no scheduler hiccup reaches.
fn defaults(c: &mut Config) {
    c.node_timeout_ms = NODE_TIMEOUT_MS;
}

/// The proxy grants a probe lock (a quorum votes).
async fn grantable(proxy: &Proxy, k: &str) {
    let probe = format!("{k}:probe");
    assert!(
        wait_grantable(proxy.port, &probe, 1000, Duration::from_secs(10))
            .await
            .is_some(),
        "proxy never ready"
    );
}

/// [`grantable`], and every master votes (a grant needs only a quorum: the last one may lag by
/// a poll).
async fn ready(proxy: &Proxy, k: &str) {
    grantable(proxy, k).await;
    ready_for_load(proxy.port).await.expect("every master up");
}

/// How the first holder takes its 30 s lease.
#[derive(Clone, Copy, Debug)]
enum Acquire {
    SetNx,
    RedlockScript,
}

/// What happens to master A after the lease was granted on A and B.
#[derive(Clone, Copy, Debug)]
enum Loss {
    RestartEmpty,
    FlushAll,
}

/// A takes a 30 s lease on masters 0 and 1 (master 2 missed it); `proxy_restart` replaces the
/// proxy by a fresh one; master 0 loses its data; B then tries for 3 s and must get a null
/// every time, while the same proxy grants free keys; A's release then answers `1`.
async fn second_holder_refused(acquire: Acquire, loss: Loss, proxy_restart: bool) {
    let mut masters = LocalCluster::start(3).expect("redis-server must be installed");
    let proxy = Proxy::start(masters.addrs(), defaults).await;
    let k = key(&format!("{acquire:?}-{loss:?}-{proxy_restart}"));
    ready(&proxy, &k).await;
    let ports: Vec<u16> = masters.masters.iter().map(|m| m.port).collect();
    let m = |i: usize| ports[i];
    assert_eq!(
        master_cmd(m(2), &["SET", &k, "foreign", "PX", "60000"]).await,
        "+OK"
    );
    let mut a = proxy.client().await;
    let granted = match acquire {
        Acquire::SetNx => a.cmd(&["SET", &k, "tok-a", "NX", "PX", "30000"]).await,
        Acquire::RedlockScript => {
            let body = script("node-redlock-acquire");
            a.cmd(&["EVAL", &body, "1", &k, "tok-a", "30000"]).await
        }
    };
    assert!(granted == "+OK" || granted == ":1", "A: {granted}");
    assert_eq!(master_get(m(0), &k).await.as_deref(), Some("tok-a"));
    assert_eq!(master_get(m(1), &k).await.as_deref(), Some("tok-a"));
    assert_eq!(master_cmd(m(2), &["DEL", &k]).await, ":1");
    let proxy = if proxy_restart {
        drop(a);
        proxy.stop().await;
        None
    } else {
        Some(proxy)
    };
    match loss {
        Loss::RestartEmpty => {
            let m0 = &mut masters.masters[0];
            tokio::task::block_in_place(|| m0.restart(&[])).expect("restart m0");
        }
        Loss::FlushAll => assert_eq!(master_cmd(m(0), &["FLUSHALL"]).await, "+OK"),
    }
    let proxy = match proxy {
        Some(proxy) => proxy,
        None => {
            let fresh = Proxy::start(masters.addrs(), defaults).await;
            // Serving (past the start-up error) before B's first try.
            grantable(&fresh, &k).await;
            fresh
        }
    };
    // B acquires with `SET NX` (its refused attempts are rolled back, so they leave nothing
    // behind that could block its own later attempts): each try must be refused with a null,
    // while the same proxy grants free keys (it is not refusing everything).
    let (mut b, mut other) = (proxy.client().await, proxy.client().await);
    let until = Instant::now() + Duration::from_millis(3000);
    let what = format!("A ({acquire:?}, {loss:?}, proxy restart {proxy_restart})");
    let interval = Duration::from_millis(20);
    let (refused, granted) =
        refused_while_free_keys_granted(&mut b, &mut other, &k, 1000, interval, until, &what).await;
    assert!(refused >= 10, "B tried only {refused} times");
    assert!(granted >= 5, "the proxy granted only {granted} free keys");
    // A's lease is still on master 1, untouched by B's attempts.
    assert_eq!(master_get(m(1), &k).await.as_deref(), Some("tok-a"));
    // A's release: master 1 deleted it, master 0 (quarantined since its loss, or under a
    // fresh proxy's founding claim, which fences it as well) is fenced, so the proxy vouches
    // for A with `1`.
    let released = proxy
        .client()
        .await
        .cmd(&["EVAL", COMPARE_AND_DELETE.text(), "1", &k, "tok-a"])
        .await;
    assert_eq!(released, ":1", "A's release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_acquire_then_restart_empty_is_not_granted_twice() {
    second_holder_refused(Acquire::RedlockScript, Loss::RestartEmpty, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_restart_then_restart_empty_is_not_granted_twice() {
    second_holder_refused(Acquire::SetNx, Loss::RestartEmpty, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_before_a_fresh_proxy_sees_the_master_is_not_granted_twice() {
    second_holder_refused(Acquire::SetNx, Loss::FlushAll, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_acquire_after_a_flushall_between_polls_is_not_granted_twice() {
    second_holder_refused(Acquire::RedlockScript, Loss::FlushAll, false).await;
}

/// A wipe the health poll has not seen yet (the poll interval is a minute here): only the
/// marker check inside the script acquire's guard can notice it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wipe_between_polls_is_seen_by_the_script_guard() {
    let env = Env::start_with(3, |c| {
        defaults(c);
        c.health_interval_ms = 60_000;
    })
    .await;
    let k = key("guard");
    ready(&env.proxy, &k).await;
    let m = |i: usize| env.masters.masters[i].port;
    master_cmd(m(2), &["SET", &k, "foreign", "PX", "60000"]).await;
    let mut a = env.proxy.client().await;
    assert_eq!(
        a.cmd(&["SET", &k, "tok-a", "NX", "PX", "30000"]).await,
        "+OK"
    );
    master_cmd(m(2), &["DEL", &k]).await;
    assert_eq!(master_cmd(m(0), &["FLUSHALL"]).await, "+OK");
    let body = script("node-redlock-acquire");
    let reply = a.cmd(&["EVAL", &body, "1", &k, "tok-b", "1000"]).await;
    assert_ne!(reply, ":1", "a wiped master voted for a script acquire");
}

/// Redisson's acquire answers null when it takes the lock and the holder's PTTL otherwise: a
/// null from one master of three (the others: one says held, one is silent) is no grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_whose_success_is_null_is_not_granted_by_a_minority() {
    let env = Env::start_with(3, defaults).await;
    let k = key("redisson");
    ready(&env.proxy, &k).await;
    let redisson = "if (redis.call('exists', KEYS[1]) == 0) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; return redis.call('pttl', KEYS[1]);";
    let m = |i: usize| env.masters.masters[i].port;
    for i in [1, 2] {
        master_cmd(m(i), &["HSET", &k, "other:1", "1"]).await;
        master_cmd(m(i), &["PEXPIRE", &k, "30000"]).await;
    }
    let pid = env.masters.masters[2].pid().unwrap();
    signal(pid, "STOP");
    let mut c = env.proxy.client().await;
    let reply = c.cmd(&["EVAL", redisson, "1", &k, "30000", "me:1"]).await;
    signal(pid, "CONT");
    assert_ne!(reply, "$nil", "one master's null reported as a grant");
    assert!(reply.starts_with("-NOQUORUM"), "{reply}");
}

/// An `EVALSHA` of a script loaded on the masters behind the proxy's back (another proxy, an
/// earlier run) is not forwarded: its meaning was never checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_evalsha_gets_noscript_and_eval_works() {
    let env = Env::start_with(3, defaults).await;
    let k = key("unknown-sha");
    ready(&env.proxy, &k).await;
    let extend = script("redis-cli-extend");
    let mut sha = String::new();
    for m in &env.masters.masters {
        sha = master_cmd(m.port, &["SCRIPT", "LOAD", &extend]).await;
    }
    let mut c = env.proxy.client().await;
    assert_eq!(c.cmd(&["SET", &k, "tok", "NX", "PX", "30000"]).await, "+OK");
    assert_eq!(
        c.cmd(&["EVALSHA", &sha[1..], "1", &k, "tok", "20000"])
            .await,
        "-NOSCRIPT No matching script. Please use EVAL."
    );
    assert_eq!(
        c.cmd(&["EVAL", &extend, "1", &k, "tok", "20000"]).await,
        ":1"
    );
    assert_eq!(
        c.cmd(&["EVALSHA", &sha[1..], "1", &k, "tok", "20000"])
            .await,
        ":1"
    );
}

/// Every TTL forwarded is capped by `max_lock_ttl_ms` (60 s by default), whatever sets it; a
/// script that computes a longer one is capped on the masters and answered with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ttl_is_capped_whatever_sets_it() {
    let env = Env::start_with(3, defaults).await;
    let k = key("cap");
    ready(&env.proxy, &k).await;
    let mut c = env.proxy.client().await;
    let above =
        "-ERR lock TTL 60001 ms is refused by redlock-proxy: above max_lock_ttl_ms (60000 ms)";
    for cmd in [
        vec!["SET", &k, "tok", "NX", "PX", "60001"],
        vec!["SET", &k, "tok", "XX", "PX", "60001"],
        vec!["PEXPIRE", &k, "60001"],
    ] {
        assert_eq!(c.cmd(&cmd).await, above, "{cmd:?}");
    }
    assert!(c
        .cmd(&["EXPIRE", &k, "61"])
        .await
        .starts_with("-ERR lock TTL 61000 ms is refused by redlock-proxy"));
    assert_eq!(c.cmd(&["SET", &k, "tok", "NX", "PX", "30000"]).await, "+OK");
    let extend = script("redis-cli-extend");
    assert_eq!(
        c.cmd(&["EVAL", &extend, "1", &k, "tok", "60001"]).await,
        above
    );
    // redis-py's extend adds to the current TTL: 30 s + 50 s is capped on every master.
    let py_extend = script("python-redis-py-extend");
    let reply = c
        .cmd(&["EVAL", &py_extend, "1", &k, "tok", "50000", "0"])
        .await;
    assert!(
        reply.starts_with("-ERR script set a TTL above max_lock_ttl_ms"),
        "{reply}"
    );
    let bound = redlock_proxy::backend_ttl_ms(60_000, 0.01) as i64;
    for m in &env.masters.masters {
        let pttl = master_cmd(m.port, &["PTTL", &k]).await;
        let pttl: i64 = pttl[1..].parse().unwrap();
        assert!(pttl > 0 && pttl <= bound, "PTTL {pttl} above {bound}");
    }
}

/// A refused acquire whose write is stuck on a paused master: once the master resumes, that
/// write (past its deadline) takes no effect, and a retry with the same token, granted after
/// the master resumed, is not deleted by the refused attempt's clean-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_token_retry_survives_the_clean_up_of_the_refused_attempt() {
    let env = Env::start_with(3, defaults).await;
    let k = key("retry");
    ready(&env.proxy, &k).await;
    let m = |i: usize| env.masters.masters[i].port;
    // Master 2 holds a foreign value: master 0 (paused) decides every attempt.
    master_cmd(m(2), &["SET", &k, "foreign", "PX", "60000"]).await;
    let pid = env.masters.masters[0].pid().unwrap();
    let mut c = env.proxy.client().await;
    signal(pid, "STOP");
    let first = c.cmd(&["SET", &k, "tok", "NX", "PX", "20000"]).await;
    assert_eq!(first, "$nil");
    // Let the proxy time out on the paused master and reconnect to it a few times.
    tokio::time::sleep(Duration::from_millis(4 * NODE_TIMEOUT_MS)).await;
    signal(pid, "CONT");
    // The same client retries with the same token until granted (bounded).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if c.cmd(&["SET", &k, "tok", "NX", "PX", "20000"]).await == "+OK" {
            break;
        }
        assert!(Instant::now() < deadline, "retry never granted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Whatever the paused master had queued is gone or ran before the retry: the grant holds.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(master_get(m(0), &k).await.as_deref(), Some("tok"));
    assert_eq!(master_get(m(1), &k).await.as_deref(), Some("tok"));
}

/// How masters are kept from answering while an acquire is in flight.
#[derive(Clone, Copy, Debug)]
enum Stall {
    /// SIGSTOP, then SIGCONT: the master runs what sat in its socket buffers on resume.
    Pause,
    /// A relay that holds every byte for a second, then delivers it.
    SlowLink,
}

/// `stalled` of 5 masters stall while an acquire is in flight, then recover. With a majority
/// stalled the acquire is refused; with a minority it is granted and then released. Either
/// way, once every master answers again, no master holds anything: no phantom holder.
async fn nothing_left_after_stalled_masters_recover(
    stalled: usize,
    how: Stall,
    stall_for: Duration,
) {
    let (env, relays) = Env::start_behind_relays(5, defaults).await;
    let k = key(&format!("phantom-{stalled}-{how:?}"));
    ready(&env.proxy, &k).await;
    let victims = 5 - stalled..5;
    let mut c = env.proxy.client().await;
    for i in victims.clone() {
        match how {
            Stall::Pause => signal(env.masters.masters[i].pid().unwrap(), "STOP"),
            Stall::SlowLink => relays[i].set_delay(stall_for),
        }
    }
    let reply = c.cmd(&["SET", &k, "v", "NX", "PX", "30000"]).await;
    tokio::time::sleep(stall_for).await;
    for i in victims {
        match how {
            Stall::Pause => signal(env.masters.masters[i].pid().unwrap(), "CONT"),
            Stall::SlowLink => relays[i].set_delay(Duration::ZERO),
        }
    }
    if stalled > 2 {
        assert_eq!(reply, "$nil");
    } else {
        assert_eq!(reply, "+OK");
        let released = c
            .cmd(&["EVAL", COMPARE_AND_DELETE.text(), "1", &k, "v"])
            .await;
        assert_eq!(released, ":1");
    }
    // Long enough for every held-up byte to arrive (a slow link holds them `stall_for`).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut values = Vec::new();
        for m in &env.masters.masters {
            values.push(master_get(m.port, &k).await);
        }
        let settled = Instant::now() > deadline - Duration::from_secs(7);
        if settled && values.iter().all(Option::is_none) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left on the masters after they recovered: {values:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And the key is free.
    let mut other = env.proxy.client().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while other.cmd(&["SET", &k, "w", "NX", "PX", "30000"]).await != "+OK" {
        assert!(Instant::now() < deadline, "key never free again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Issue scenario: three of five masters paused while an acquire is in flight, for longer than
/// any connection is kept for late replies (11 s). The refusal comes in time, and once they
/// resume nothing is left on any master. (Shorter pauses passed before too.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_acquire_leaves_nothing_on_paused_masters_once_they_resume() {
    nothing_left_after_stalled_masters_recover(3, Stall::Pause, Duration::from_secs(11)).await;
}

/// A paused minority: the acquire is granted by the others; the paused masters' late writes must
/// not make the key look held (to `GET`/`PTTL` readers, to the next acquire) after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_minority_keeps_nothing_after_the_release() {
    nothing_left_after_stalled_masters_recover(2, Stall::Pause, Duration::from_secs(1)).await;
}

/// Links that hold bytes for a second and then deliver them (a partition that heals): the
/// late writes of a refused acquire take no effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_links_that_recover_deliver_no_phantom() {
    nothing_left_after_stalled_masters_recover(3, Stall::SlowLink, Duration::from_secs(1)).await;
}

/// The acquire script on one real master: a write that arrives after its deadline (held up in a
/// paused master's buffer) takes no effect, a clean-up deletes only what its own attempt wrote
/// (never a later attempt's grant with the same value), and a fencing token is taken only above
/// the key's counter and near the master's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_writes_are_void_and_clean_ups_undo_only_their_own_attempt() {
    use redlock_proxy::on_master::{
        token_key, ARMED_KEY, LOCK_SCRIPT, QUARANTINE_KEY, UNDO_SCRIPT, WITNESS_KEY,
    };
    let master = redlock_proxy::LocalMaster::start(None, &[]).unwrap();
    let port = master.port;
    master_cmd(port, &["SET", ARMED_KEY, "1"]).await;
    let k = key("attempts");
    let tk = String::from_utf8(token_key(k.as_bytes()).to_vec()).unwrap();
    // `*[$secs,$micros]` rendered by the test client, in µs.
    let now_us = |reply: String| -> u64 {
        let inner = reply
            .trim_start_matches("*[")
            .trim_end_matches(']')
            .to_string();
        let mut parts = inner
            .split(',')
            .map(|p| p.trim_start_matches('$').parse::<u64>().unwrap());
        parts.next().unwrap() * 1_000_000 + parts.next().unwrap()
    };
    let t_us = now_us(master_cmd(port, &["TIME"]).await);
    let t = t_us / 1000;
    // Every call's reply ends with the master's clock (µs) as the call read it: checked to be
    // the master's clock (within a minute of `TIME` above), then left out.
    let clock_off = move |reply: String| -> String {
        let (rest, clock) = reply
            .strip_suffix(']')
            .and_then(|r| r.rsplit_once(",:").or_else(|| r.split_once(':')))
            .unwrap_or_else(|| panic!("{reply}"));
        let clock: u64 = clock.parse().unwrap_or_else(|_| panic!("{reply}"));
        assert!(clock.abs_diff(t_us) < 60_000_000, "{reply}");
        match rest {
            "*[" => "*[]".to_string(),
            rest => format!("{rest}]"),
        }
    };
    // The earliest master clock (ms) that may take a token: 10 s before it.
    let acquire = |id: &str, deadline: u64, token: u64| {
        let k = k.clone();
        let earliest = (token / 1000 - 10_000).to_string();
        let (token, deadline) = (format!("{token:016}"), deadline.to_string());
        let record = format!("{token}:{id}");
        async move {
            let reply = master_cmd(
                port,
                &[
                    "EVAL",
                    LOCK_SCRIPT.text(),
                    "1",
                    &k,
                    "0",
                    &deadline,
                    &earliest,
                    "60000",
                    &record,
                    "tok",
                    "20000",
                ],
            )
            .await;
            let reply = clock_off(reply);
            // One acquire in the call: its answer, then the write witness if it took the key.
            let only = reply.strip_prefix("*[").and_then(|r| r.strip_suffix(']'));
            let only = only.unwrap_or_else(|| panic!("{reply}"));
            match only.strip_prefix("+OK,:") {
                Some(witness) if witness.parse::<u64>().is_ok() => "+OK".to_string(),
                _ => only.to_string(),
            }
        }
    };
    // The clean-up names the attempt by its record (token and id).
    let undo = |id: &str, token: u64| {
        let (k, tk) = (k.clone(), tk.clone());
        let record = format!("{token:016}:{id}");
        async move {
            master_cmd(
                port,
                &["EVAL", UNDO_SCRIPT.text(), "2", &k, &tk, "tok", &record],
            )
            .await
        }
    };
    // Past its deadline: refused, nothing written.
    assert_eq!(acquire("a1", t - 1000, t_us).await, ":-2");
    assert_eq!(master_get(port, &k).await, None);
    // Attempt a1 is written, then undone: gone (its token stays: tokens only go up).
    assert_eq!(acquire("a1", t + 60_000, t_us).await, "+OK");
    assert_eq!(undo("a1", t_us).await, ":1");
    assert_eq!(master_get(port, &k).await, None);
    assert_eq!(master_get(port, &tk).await, Some(format!("{t_us:016}:a1")));
    // A token not above the counter, or far from the master's clock, is refused.
    assert_eq!(
        acquire("a2", t + 60_000, t_us).await,
        format!("*[:-4,:{t_us}]")
    );
    let far = t_us + 60_000_000;
    assert!(acquire("a2", t + 60_000, far).await.starts_with("*[:-3,:"));
    assert_eq!(master_get(port, &k).await, None);
    // A retry a2 with the same value is granted; a stale clean-up of a1 leaves it alone.
    assert_eq!(acquire("a2", t + 60_000, t_us + 1).await, "+OK");
    assert_eq!(undo("a1", t_us).await, ":0");
    assert_eq!(master_get(port, &k).await.as_deref(), Some("tok"));
    // A late a1 write (before its deadline, key held) changes nothing either.
    assert_eq!(acquire("a1", t + 60_000, t_us + 2).await, "$nil");
    assert_eq!(undo("a1", t_us + 2).await, ":0");
    assert_eq!(master_get(port, &k).await.as_deref(), Some("tok"));
    // Quarantined or unarmed: no write.
    master_cmd(port, &["DEL", &k]).await;
    master_cmd(port, &["SET", QUARANTINE_KEY, "1", "PX", "60000"]).await;
    assert_eq!(acquire("a3", t + 60_000, t_us + 3).await, ":-1");
    master_cmd(port, &["DEL", QUARANTINE_KEY, ARMED_KEY]).await;
    assert_eq!(acquire("a3", t + 60_000, t_us + 3).await, ":-1");
    assert_eq!(master_get(port, &k).await, None);
    // Operations merged into one call (as a link sends them): each gets its own answer. The
    // second acquire of the key finds it held; after the release, a third with a token below
    // the first's is refused by the counter the first wrote in the same call.
    master_cmd(port, &["SET", ARMED_KEY, "1"]).await;
    let (deadline, earliest) = ((t + 60_000).to_string(), (t - 10_000).to_string());
    let (token, other) = (format!("{:016}", t_us + 10), format!("{:016}", t_us + 11));
    let record = |token: &str, id: &str| format!("{token}:{id}");
    let (r1, r2) = (record(&token, "m1"), record(&other, "m2"));
    let below = format!("{:016}", t_us + 9);
    let r3 = record(&below, "m3");
    // Each operation passes its lock key; the call's bounds (deadline, earliest clock,
    // counter PX) lead after the floor; then each acquire's record, value and PX.
    let merged = master_cmd(
        port,
        &[
            "EVAL",
            LOCK_SCRIPT.text(),
            "4",
            &k,
            &k,
            &k,
            &k,
            "0",
            &deadline,
            &earliest,
            "60000",
            &r1,
            "v1",
            "20000",
            &r2,
            "v2",
            "20000",
            "r",
            "v1",
            &r3,
            "v3",
            "20000",
        ],
    )
    .await;
    // The call took a key: the witness it counted up comes last (before the clock).
    let witness = master_get(port, WITNESS_KEY).await.expect("a witness");
    assert_eq!(
        clock_off(merged),
        format!("*[+OK,$nil,:1,*[:-4,:{}],:{witness}]", t_us + 10)
    );
    assert_eq!(master_get(port, &k).await, None);
    assert_eq!(master_get(port, &tk).await, Some(r1));
    // The write witness floor leads the arguments: a master whose witness is below it lost
    // writes it acknowledged, and no acquire of the call takes a key (each answers -1, even
    // past the call's deadline); its releases still run, and no witness is counted up.
    master_cmd(port, &["SET", &k, "v9"]).await;
    let r4 = record(&format!("{:016}", t_us + 20), "m4");
    let late = (t - 1000).to_string();
    let floored = |floor: u64, value: &'static str, deadline: &str| {
        let (k, earliest, r4) = (k.clone(), earliest.clone(), r4.clone());
        let (floor, deadline) = (floor.to_string(), deadline.to_string());
        async move {
            let reply = master_cmd(
                port,
                &[
                    "EVAL",
                    LOCK_SCRIPT.text(),
                    "3",
                    &k,
                    &k,
                    &k,
                    &floor,
                    &deadline,
                    &earliest,
                    "60000",
                    &r4,
                    "v4",
                    "20000",
                    "r",
                    value,
                    &r4,
                    "v5",
                    "20000",
                ],
            )
            .await;
            clock_off(reply)
        }
    };
    let witness: u64 = witness.parse().expect("a number");
    assert_eq!(floored(witness + 1, "v9", &late).await, "*[:-1,:1,:-1]");
    assert_eq!(master_get(port, &k).await, None);
    // A floor with more digits (the script compares decimals as strings, length first).
    assert_eq!(
        floored(witness + 100, "v9", &deadline).await,
        "*[:-1,:0,:-1]"
    );
    assert_eq!(
        master_get(port, WITNESS_KEY).await,
        Some(witness.to_string())
    );
    // At the floor: as ever. Past the call's deadline every acquire is refused; before it the
    // first takes the key, the release frees it, and the second, with the same token, finds
    // the counter the first wrote in this call.
    assert_eq!(floored(witness, "v4", &late).await, "*[:-2,:0,:-2]");
    let refused = format!("*[:-4,:{}]", t_us + 20);
    assert_eq!(
        floored(witness, "v4", &deadline).await,
        format!("*[+OK,:1,{refused},:{}]", witness + 1)
    );
    assert_eq!(master_get(port, &k).await, None);
    assert_eq!(master_get(port, &tk).await, Some(r4.clone()));
    // Above a floor with fewer digits, though "10" < "9" as strings (the counter dropped so
    // that the same token is taken again).
    master_cmd(port, &["SET", WITNESS_KEY, "10"]).await;
    master_cmd(port, &["DEL", &tk]).await;
    assert_eq!(
        floored(9, "v4", &deadline).await,
        format!("*[+OK,:1,{refused},:11]")
    );
}

/// The proxy's own keys on the masters cannot be touched through it: deleting the armed marker
/// would make every master look wiped, deleting the quarantine marker would end a quarantine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxys_own_keys_are_reserved() {
    let env = Env::start_with(3, defaults).await;
    ready(&env.proxy, &key("reserved")).await;
    let mut c = env.proxy.client().await;
    let refused = "-ERR keys starting with 'redlock-proxy:' are refused by redlock-proxy: they hold its own state on the masters";
    for cmd in [
        vec!["DEL", "redlock-proxy:armed"],
        vec!["DEL", "some-key", "redlock-proxy:quarantine"],
        vec!["SET", "redlock-proxy:quarantine", "1", "PX", "1"],
        vec!["PEXPIRE", "redlock-proxy:armed", "1"],
        vec![
            "EVAL",
            "return redis.call('del', KEYS[1])",
            "1",
            "redlock-proxy:armed",
        ],
    ] {
        assert_eq!(c.cmd(&cmd).await, refused, "{cmd:?}");
    }
    for m in &env.masters.masters {
        assert_eq!(
            master_cmd(m.port, &["EXISTS", "redlock-proxy:armed"]).await,
            ":1"
        );
    }
    // Other keys are untouched by the rule.
    assert_eq!(c.cmd(&["DEL", "some-key"]).await, ":0");
}

/// How X extends its lock in [`refused_extend`].
#[derive(Clone, Copy, Debug, PartialEq)]
enum Extend {
    LockExtend,
    /// redis-cli's compare-then-`PEXPIRE`, a lease script.
    LeaseScript,
}

/// Issue 22, item 2: X holds `k` for 3 s on four of five masters (the fifth missed the write);
/// two of those four are paused while X extends to 30 s. The extend is refused (two of five
/// extended in time), and once the paused masters resume, the held-up extends wrote nothing
/// (their deadline had passed). With `LOCK.EXTEND` the two that extended in time are set back
/// too, so no master keeps the key past X's old lease; a lease script's extend is not undone
/// there (docs/PROTOCOL.md §5). Before: `[x, x, -, x, x]` with a PTTL of about 29.5 s, and
/// nobody could take the key long after X's lease ended.
async fn refused_extend(how: Extend) {
    const OLD_TTL_MS: u64 = 3000;
    let env = Env::start_with(5, defaults).await;
    let ports = env.ports();
    let k = key(&format!("refused-extend-{how:?}"));
    ready(&env.proxy, &k).await;
    let ttl = OLD_TTL_MS.to_string();
    // Master 2 misses X's write: another value holds it there, and runs out within X's lease.
    // It is not deleted after the grant: X's acquire may still reach master 2 after the grant
    // was answered (it may land until its deadline, a node timeout after it was sent), and
    // once the key was deleted there it would be granted after all: a third holder, and a
    // rightful `1` to the extend.
    assert_eq!(
        master_cmd(ports[2], &["SET", &k, "foreign", "PX", &ttl]).await,
        "+OK"
    );
    let mut x = env.proxy.client().await;
    let granted = x.cmd(&["LOCK.ACQUIRE", &k, "tok-x", &ttl]).await;
    let granted_at = Instant::now();
    assert!(granted.starts_with("*["), "X: {granted}");
    for i in [3, 4] {
        signal(env.masters.masters[i].pid().unwrap(), "STOP");
    }
    let extended = match how {
        Extend::LockExtend => x.cmd(&["LOCK.EXTEND", &k, "tok-x", "30000"]).await,
        Extend::LeaseScript => {
            let body = script("redis-cli-extend");
            x.cmd(&["EVAL", &body, "1", &k, "tok-x", "30000"]).await
        }
    };
    // Paused for several node timeouts: every held-up extend is past its deadline.
    tokio::time::sleep(Duration::from_millis(5 * NODE_TIMEOUT_MS)).await;
    for i in [3, 4] {
        signal(env.masters.masters[i].pid().unwrap(), "CONT");
    }
    assert!(
        extended == "$nil" || extended.starts_with("-NOQUORUM"),
        "the extend reached only two of five masters in time: {extended}"
    );
    // The resumed masters run what was held up; then no master may keep the key past X's old
    // lease (its TTL plus drift, counted from the grant).
    tokio::time::sleep(Duration::from_millis(500)).await;
    // X's lease on the masters: its TTL plus the drift padding; an undo gives a master back
    // the TTL it had, longer at most by an answer's way back (within a node timeout).
    let padded = redlock_proxy::backend_ttl_ms(OLD_TTL_MS, 0.01);
    let old_end = granted_at + Duration::from_millis(padded + NODE_TIMEOUT_MS);
    let checked: &[usize] = match how {
        Extend::LockExtend => &[0, 1, 2, 3, 4],
        Extend::LeaseScript => &[2, 3, 4],
    };
    for &i in checked {
        let pttl: i64 = master_cmd(ports[i], &["PTTL", &k]).await[1..]
            .parse()
            .unwrap();
        let left = old_end
            .saturating_duration_since(Instant::now())
            .as_millis() as i64;
        assert!(
            pttl <= left,
            "master {i} keeps the key {pttl} ms, past X's old lease ({left} ms left)"
        );
    }
    if how == Extend::LeaseScript {
        return;
    }
    // Once X's old lease is over, another client gets the key.
    tokio::time::sleep_until(old_end.into()).await;
    let free = wait_grantable(env.proxy.port, &k, 1000, Duration::from_secs(5)).await;
    assert!(free.is_some(), "the key never came free after X's lease");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_extend_leaves_no_master_holding_the_new_ttl() {
    refused_extend(Extend::LockExtend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_lease_script_extend_writes_nothing_late_on_paused_masters() {
    refused_extend(Extend::LeaseScript).await;
}
