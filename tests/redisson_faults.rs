//! Redisson's lock protocol under the fault suite's nemeses (issue 25): workers take a few hot
//! locks through two proxies over five masters with Redisson's exact acquire script (a lease of
//! their own), wait as Redisson's waiters do (subscribed to the lock's channel, retrying on an
//! unlock message or when the holder's PTTL runs out), hold briefly and unlock (its script
//! publishes the message), while masters are partitioned, crashed, restarted empty, paused and
//! their links cut. The checker: no two holders of a lock at once, and no lost wake-up: a
//! waiter that waited out the holder's PTTL although the lock had been released (an unlock
//! answered 1) more than [`WAKE_MARGIN`] before, with nobody granted since.

use redlock_testkit::checker::{overlaps, Hold};
use redlock_testkit::key;
use redlock_testkit::nemesis::{step_mixed_no_flush, Nemesis};
use redlock_testkit::redisson::{channel_name, Attempt, Redisson, Subscription};
use redlock_testkit::rig::{run_alone, scaled, with_quarantine, Rig};
use redlock_testkit::workload::{now_ns, seed, Rng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The lease each acquire asks for (and the proxies' TTL cap, so a master that lost data is
/// quarantined about that long).
const LEASE: Duration = Duration::from_millis(1500);
/// How long a waiter tries before it gives up on one lock.
const WAIT: Duration = Duration::from_secs(6);
/// How long after an unlock a waiter may still be asleep without the wake-up being lost: the
/// longest link delay the nemesis injects on a minority of masters (its TTL), and the
/// message's way through a proxy on a loaded machine.
const WAKE_MARGIN: Duration = Duration::from_millis(1000);

/// One wait of a waiter for an unlock message.
struct Wait {
    key: usize,
    worker: usize,
    proxy: usize,
    /// The holder's PTTL the refused acquire answered (the wait's bound, unless less was left).
    pttl: i64,
    start: u64,
    end: u64,
    /// Woken by a message (else it waited out its bound).
    woken: bool,
}

/// What one worker saw.
#[derive(Default)]
struct Log {
    holds: Vec<Hold>,
    /// Unlocks answered 1 (released): key, when the answer was read, through which proxy.
    released: Vec<(usize, u64, usize)>,
    /// Every acquire and unlock answered: key, when it was sent, when answered, what.
    calls: Vec<(usize, u64, u64, String)>,
    waits: Vec<Wait>,
    errors: u64,
    /// The kinds of error seen, with how many of each.
    error_kinds: std::collections::BTreeMap<String, u64>,
    gave_up: u64,
}

impl Log {
    fn error(&mut self, kind: String) {
        self.errors += 1;
        // Only the kind: a reply's variable part (a count, a time) would make each unique.
        let kind: String = kind.chars().take_while(|c| !c.is_ascii_digit()).collect();
        *self.error_kinds.entry(kind).or_default() += 1;
    }
}

/// Worker `w`: Redisson's `tryLock(WAIT, LEASE)` then `unlock()`, on random hot keys, until
/// `stop` (or a count bound).
async fn worker(
    port: u16,
    proxy: usize,
    keys: Arc<Vec<String>>,
    w: usize,
    stop: Arc<AtomicBool>,
) -> Log {
    // Redisson's unlock latch lives 13.5 s by default, beyond this scenario's TTL cap (the
    // guard would turn every unlock into an error): shorter timeouts, as a deployment with a
    // low `max_lock_ttl_ms` must configure Redisson (docs/PROTOCOL.md §5).
    let redisson = Redisson::new(port).latch_timeout(LEASE);
    let mut rng = Rng::new(seed() ^ (w as u64 + 1));
    let mut log = Log::default();
    for _ in 0..10_000 {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let k = rng.below(keys.len());
        let Ok(mut lock) = redisson.lock(&keys[k], w as u64).await else {
            log.errors += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let give_up = Instant::now() + WAIT;
        let mut subscription: Option<Subscription> = None;
        // Bounded by `give_up` (every pass sends one acquire or waits).
        while Instant::now() < give_up {
            let t_send = now_ns();
            let attempt = lock.try_acquire(Some(LEASE)).await;
            log.calls.push((
                k,
                t_send,
                now_ns(),
                format!("w{w} p{proxy} acquire: {attempt:?}"),
            ));
            match attempt {
                Ok(Attempt::Acquired(_)) => {
                    let t_ok = now_ns();
                    tokio::time::sleep(Duration::from_millis(rng.range(5, 150))).await;
                    let t_release_sent = now_ns();
                    let unlock = lock.unlock().await;
                    let what = format!("w{w} p{proxy} unlock: {unlock:?}");
                    log.calls.push((k, t_release_sent, now_ns(), what));
                    match unlock {
                        Ok(true) => log.released.push((k, now_ns(), proxy)),
                        Ok(false) => log.error("unlock: still held".into()),
                        Err(err) => log.error(format!("unlock: {err:?}")),
                    }
                    log.holds.push(Hold {
                        key: keys[k].clone(),
                        token: format!("{}:{w}", redisson.id()),
                        worker: w,
                        proxy,
                        ttl_ms: LEASE.as_millis() as u64,
                        t_send,
                        t_ok,
                        t_release_sent: Some(t_release_sent),
                        t_extend_sent: None,
                        fence: None,
                    });
                    break;
                }
                Ok(Attempt::Held(pttl)) => {
                    let Some(sub) = subscription.as_mut() else {
                        // Redisson subscribes after the first refusal, then tries again.
                        match Subscription::open(port, &channel_name(&keys[k])).await {
                            Ok(sub) => subscription = Some(sub),
                            Err(err) => log.error(format!("subscribe: {err:?}")),
                        }
                        continue;
                    };
                    let left = give_up.saturating_duration_since(Instant::now());
                    let bound = Duration::from_millis(pttl.max(1) as u64).min(left);
                    let start = now_ns();
                    let woken = sub.wait_message(bound).await.unwrap_or(false);
                    log.waits.push(Wait {
                        key: k,
                        worker: w,
                        proxy,
                        pttl,
                        start,
                        end: now_ns(),
                        woken,
                    });
                }
                Err(err) => {
                    log.error(format!("acquire: {err:?}"));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        if Instant::now() >= give_up {
            log.gave_up += 1;
        }
    }
    log
}

/// The waits that slept through a release: woken by no message, ending more than
/// [`WAKE_MARGIN`] after an unlock of their key (`keys[k]`) that came after they began, with
/// no grant of that key in between.
/// What the workers did with key `k` from 2 s before `at` to 1.5 s after (ms from `at`), for
/// a failure's report.
fn timeline(logs: &[Log], k: usize, at: u64) -> Vec<String> {
    let rel = |t: u64| (t as i64 - at as i64) / 1_000_000;
    let near = |t: u64| t + 2_000_000_000 >= at && t <= at + 1_500_000_000;
    let mut events: Vec<(u64, String)> = Vec::new();
    for log in logs {
        for (key, sent, answered, what) in &log.calls {
            if *key == k && near(*sent) {
                events.push((
                    *sent,
                    format!("{what} (answered at {:+} ms)", rel(*answered)),
                ));
            }
        }
        for wait in log.waits.iter().filter(|w| w.key == k && near(w.start)) {
            let how = if wait.woken { "woken" } else { "unwoken" };
            let what = format!(
                "w{} p{} waits (PTTL {} ms) until {:+} ms, {how}",
                wait.worker,
                wait.proxy,
                wait.pttl,
                rel(wait.end)
            );
            events.push((wait.start, what));
        }
    }
    events.sort();
    (events.into_iter())
        .map(|(t, what)| format!("{:+} ms {what}", rel(t)))
        .collect()
}

fn lost_wakeups(logs: &[Log], keys: &[String]) -> Vec<(u64, usize, String)> {
    let margin = WAKE_MARGIN.as_nanos() as u64;
    let releases: Vec<(usize, u64, usize)> = logs.iter().flat_map(|l| l.released.clone()).collect();
    let granted_between = |k: usize, from: u64, to: u64| {
        logs.iter()
            .flat_map(|l| &l.holds)
            .any(|h| h.key == keys[k] && h.t_ok > from && h.t_ok < to)
    };
    let mut lost = Vec::new();
    for wait in logs.iter().flat_map(|l| &l.waits).filter(|w| !w.woken) {
        for &(k, released, by) in &releases {
            let slept_through =
                k == wait.key && released > wait.start && released + margin < wait.end;
            if slept_through && !granted_between(k, released, wait.end) {
                lost.push((
                    released,
                    k,
                    format!(
                        "{}: released through proxy {by} {} ms before a wait through proxy {} ended unwoken ({} ms long)",
                        keys[k],
                        (wait.end - released) / 1_000_000,
                        wait.proxy,
                        (wait.end - wait.start) / 1_000_000
                    ),
                ));
            }
        }
    }
    lost
}

#[test]
fn redisson_waiters_under_mixed_faults() {
    run_alone(async {
        let seed = seed();
        let lease_ms = LEASE.as_millis() as u64;
        let mut rig = Rig::start(5, true, 2, seed, with_quarantine(lease_ms)).await;
        rig.wait_ready(lease_ms, Duration::from_secs(5)).await;
        let keys: Arc<Vec<String>> =
            Arc::new((0..2).map(|i| key(&format!("redisson{i}"))).collect());
        let ports = rig.ports();
        let stop = Arc::new(AtomicBool::new(false));
        let mut nemesis = std::mem::replace(&mut rig.nemesis, Nemesis::placeholder());
        let faults_for = scaled(15.0);
        let faults = {
            let stop = stop.clone();
            tokio::task::spawn_blocking(move || {
                let deadline = Instant::now() + faults_for;
                for _ in 0..10_000 {
                    if Instant::now() >= deadline {
                        break;
                    }
                    step_mixed_no_flush(&mut nemesis);
                }
                nemesis.heal_all();
                // Waiters finish what they began after the last fault.
                std::thread::sleep(Duration::from_secs(2));
                stop.store(true, Ordering::Relaxed);
                nemesis
            })
        };
        let workers: Vec<_> = (0..6)
            .map(|w| {
                let proxy = w % ports.len();
                tokio::spawn(worker(ports[proxy], proxy, keys.clone(), w, stop.clone()))
            })
            .collect();
        let mut logs = Vec::new();
        for worker in workers {
            logs.push(worker.await.expect("worker"));
        }
        rig.nemesis = faults.await.expect("nemesis thread");
        let holds: Vec<Hold> = logs.iter().flat_map(|l| l.holds.clone()).collect();
        let waits: usize = logs.iter().map(|l| l.waits.len()).sum();
        let woken: usize = logs
            .iter()
            .map(|l| l.waits.iter().filter(|w| w.woken).count())
            .sum();
        let overlapping = overlaps(&holds);
        let lost = lost_wakeups(&logs, &keys);
        let mut error_kinds = std::collections::BTreeMap::new();
        for (kind, n) in logs.iter().flat_map(|l| &l.error_kinds) {
            *error_kinds.entry(kind.clone()).or_insert(0) += n;
        }
        println!("[redisson] errors by kind: {error_kinds:?}");
        println!(
            "[redisson] seed={seed}: {} grants, {waits} waits ({woken} woken by a message), {} errors, {} gave up, {} faults took effect, {} overlaps, {} lost wake-ups",
            holds.len(),
            logs.iter().map(|l| l.errors).sum::<u64>(),
            logs.iter().map(|l| l.gave_up).sum::<u64>(),
            rig.nemesis.faults(),
            overlapping.len(),
            lost.len()
        );
        assert!(
            overlapping.is_empty(),
            "MUTUAL EXCLUSION VIOLATED (SEED={seed}): {overlapping:?}"
        );
        if let Some((at, k, _)) = lost.first() {
            let around: Vec<&(u64, String)> = rig
                .nemesis
                .log
                .iter()
                .filter(|(t, _)| *t + 3_000_000_000 >= *at && *t <= *at + 2_000_000_000)
                .collect();
            let rel = |t: u64| (t as i64 - *at as i64) / 1_000_000;
            let faults: Vec<String> = around
                .iter()
                .map(|(t, w)| format!("{:+} ms {w}", rel(*t)))
                .collect();
            panic!(
                "LOST WAKE-UPS (SEED={seed}): {:?}\nfaults around the first (ms from its release):\n{}\nits key meanwhile:\n{}",
                lost.iter().map(|l| &l.2).collect::<Vec<_>>(),
                faults.join("\n"),
                timeline(&logs, *k, *at).join("\n")
            );
        }
        assert!(
            holds.len() >= 50,
            "only {} grants: the run proves little",
            holds.len()
        );
        assert!(woken >= 20, "only {woken} waits woken by a message");
        assert!(
            rig.nemesis.faults() >= 5,
            "only {} faults took effect",
            rig.nemesis.faults()
        );
    });
}
