//! End-to-end Redlock behaviour through the proxy over real redis-server masters, checked on
//! the masters directly.

use redlock_proxy::on_master::{script_sha, COMPARE_AND_DELETE};
use redlock_testkit::launcher::Env;
use redlock_testkit::masters::{command_stats, master_cmd, master_get};
use redlock_testkit::relay::Relay;
use redlock_testkit::scripts::script;
use redlock_testkit::{eventually, key};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_contend_release_over_five_masters() {
    let env = Env::start(5).await;
    let k = key("acr");
    let mut c = env.proxy.client().await;
    assert_eq!(
        c.cmd(&["SET", &k, "tok-a", "NX", "PX", "30000"]).await,
        "+OK"
    );
    assert!(env.holders(&k, "tok-a").await >= 3);
    for port in env.ports() {
        if master_get(port, &k).await.as_deref() == Some("tok-a") {
            let pttl: i64 = master_cmd(port, &["PTTL", &k]).await[1..].parse().unwrap();
            assert!(
                pttl >= 30_000,
                "master PTTL {pttl} covers the requested TTL plus drift"
            );
        }
    }
    // Contention: exactly what one Redis answers when the lock is held.
    let mut other = env.proxy.client().await;
    assert_eq!(
        other.cmd(&["SET", &k, "tok-b", "NX", "PX", "30000"]).await,
        "$nil"
    );
    assert_eq!(env.holders(&k, "tok-b").await, 0);
    // Options in any order and case, EX in seconds.
    assert_eq!(
        other.cmd(&["set", &k, "tok-b", "ex", "30", "nx"]).await,
        "$nil"
    );
    // PTTL through the proxy never promises more than the lock holds.
    let pttl: i64 = c.cmd(&["PTTL", &k]).await[1..].parse().unwrap();
    assert!((29_000..=30_000).contains(&pttl), "{pttl}");
    assert_eq!(c.cmd(&["GET", &k]).await, "$tok-a");
    // Release by a non-owner does nothing; by the owner removes it everywhere.
    assert_eq!(
        other
            .cmd(&["EVAL", COMPARE_AND_DELETE.text(), "1", &k, "tok-b"])
            .await,
        ":0"
    );
    assert!(env.holders(&k, "tok-a").await >= 3);
    assert_eq!(
        c.cmd(&["EVAL", COMPARE_AND_DELETE.text(), "1", &k, "tok-a"])
            .await,
        ":1"
    );
    env.assert_gone(&k).await;
    // Now free for the other client.
    assert_eq!(
        other.cmd(&["SET", &k, "tok-b", "PX", "30000", "NX"]).await,
        "+OK"
    );
    assert_eq!(other.cmd(&["DEL", &k]).await, ":1");
    env.assert_gone(&k).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_grants_are_rolled_back_and_foreign_values_kept() {
    let env = Env::start(5).await;
    let ports = env.ports();
    let mut c = env.proxy.client().await;
    // (masters pre-set with `foreign`, the value we try, our reply, holders of ours, of foreign)
    let cases = [
        // Another value on 2 of 5: our value still reaches a majority of 3.
        ("rb2", 2, "foreign", "mine", "+OK", 3, 2),
        // On 3 of 5: null, our value nowhere, the foreign value untouched.
        ("rb3", 3, "foreign", "mine", "$nil", 0, 3),
        // A contender using the holder's own token (the PHP seed draws tokens from 9001
        // values) must not delete the holder's lock while rolling back its failed attempt.
        ("same-token", 3, "4242", "4242", "$nil", 3, 3),
    ];
    for (name, preset, foreign, mine, reply, ours, theirs) in cases {
        let k = key(name);
        for port in &ports[..preset] {
            master_cmd(*port, &["SET", &k, foreign, "PX", "30000"]).await;
        }
        assert_eq!(
            c.cmd(&["SET", &k, mine, "NX", "PX", "30000"]).await,
            reply,
            "{name}"
        );
        assert_eq!(env.holders(&k, mine).await, ours, "{name}");
        assert_eq!(env.holders(&k, foreign).await, theirs, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_down_still_grants_majority_down_refuses_fast() {
    // About timing: refusals must come within twice the node timeout (one for the acquire's
    // own votes, one for an acquire of the key it may queue behind). Leases of 1 s at most: a
    // master that comes back empty is quarantined about that long.
    let node_timeout = Duration::from_millis(200);
    let mut env = Env::start_with(5, |c| {
        c.max_lock_ttl_ms = 1000;
        c.node_timeout_ms = node_timeout.as_millis() as u64;
    })
    .await;
    env.masters.masters[0].kill();
    env.masters.masters[1].kill();
    let mut c = env.proxy.client().await;
    let k = key("down2");
    // 1 s leases: a master that comes back empty is quarantined for about that long.
    assert_eq!(c.cmd(&["SET", &k, "v", "NX", "PX", "1000"]).await, "+OK");
    assert_eq!(c.cmd(&["GET", &k]).await, "$v");
    assert_eq!(
        c.cmd(&["EVAL", COMPARE_AND_DELETE.text(), "1", &k, "v"])
            .await,
        ":1"
    );

    env.masters.masters[2].kill();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let k = key("down3");
    let started = Instant::now();
    assert_eq!(c.cmd(&["SET", &k, "v", "NX", "PX", "1000"]).await, "$nil");
    let took = started.elapsed();
    assert!(took < node_timeout * 2, "refused in {took:?}");
    assert_eq!(env.holders(&k, "v").await, 0);
    let started = Instant::now();
    let reply = c.cmd(&["GET", &k]).await;
    assert!(
        reply.starts_with("-NOQUORUM fewer than 3 of 5 masters agreed"),
        "{reply}"
    );
    assert!(started.elapsed() < node_timeout * 2);

    // The masters come back empty: the proxy reconnects by itself, sees the new run_ids and
    // keeps them out of every quorum until the longest lease (1 s + drift) has expired.
    for m in &mut env.masters.masters[..3] {
        m.restart(&[]).unwrap();
    }
    let k = key("back");
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let info = c.cmd(&["INFO", "masters"]).await;
        if info.matches("quarantined (restarted").count() == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "not quarantined: {info}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(c.cmd(&["SET", &k, "v", "NX", "PX", "1000"]).await, "$nil");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let reply = c.cmd(&["SET", &k, "v", "NX", "PX", "1000"]).await;
        if reply == "+OK" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no grant 5 s after the masters returned"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let info = c.cmd(&["INFO", "masters"]).await;
        if info.matches("state=up").count() == 5 {
            break;
        }
        assert!(Instant::now() < deadline, "{info}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `n` masters, each behind a fault relay, and a proxy over the relays.
async fn behind_relays(n: usize, node_timeout_ms: u64) -> (Env, Vec<Relay>) {
    Env::start_behind_relays(n, |c| c.node_timeout_ms = node_timeout_ms).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_slower_than_the_ttl_give_null_and_leave_nothing() {
    let (env, relays) = behind_relays(3, 1000).await;
    for r in &relays {
        r.set_delay(Duration::from_millis(60));
    }
    let mut c = env.proxy.client().await;
    let k = key("slow");
    // TTL 50 ms: validity 50 - 2.5 - drift < the 60+ ms the masters take to answer.
    assert_eq!(c.cmd(&["SET", &k, "v", "NX", "PX", "50"]).await, "$nil");
    for port in env.ports() {
        assert_eq!(master_get(port, &k).await, None);
    }
    // With the same delay a long TTL is granted: the validity rule, not the delay, refused.
    assert_eq!(c.cmd(&["SET", &k, "v", "NX", "PX", "30000"]).await, "+OK");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evalsha_noscript_load_and_healing() {
    let env = Env::start(3).await;
    let mut c = env.proxy.client().await;
    let sha = "a4f7e0b1ccdd3a2d1adca5bd2e0d4f3a7e4bd9aa"; // not a loaded script
    assert_eq!(
        c.cmd(&["EVALSHA", sha, "0"]).await,
        "-NOSCRIPT No matching script. Please use EVAL."
    );
    let body = "return redis.call('get', KEYS[1])";
    let loaded = c.cmd(&["SCRIPT", "LOAD", body]).await;
    let real_sha = format!("${}", sha1_hex(body));
    assert_eq!(loaded, real_sha);
    let k = key("evalsha");
    c.cmd(&["SET", &k, "v", "NX", "PX", "30000"]).await;
    assert_eq!(c.cmd(&["EVALSHA", &real_sha[1..], "1", &k]).await, "$v");
    assert_eq!(
        c.cmd(&["SCRIPT", "EXISTS", &real_sha[1..], sha]).await,
        "*[:1,:0]"
    );
    // The masters lose their script caches: the proxy re-loads invisibly.
    for port in env.ports() {
        master_cmd(port, &["SCRIPT", "FLUSH"]).await;
    }
    assert_eq!(
        c.cmd(&["EVALSHA", &real_sha[1..].to_uppercase(), "1", &k])
            .await,
        "$v"
    );
    // SCRIPT FLUSH through the proxy forgets it everywhere.
    assert_eq!(c.cmd(&["SCRIPT", "FLUSH"]).await, "+OK");
    assert_eq!(
        c.cmd(&["EVALSHA", &real_sha[1..], "1", &k]).await,
        "-NOSCRIPT No matching script. Please use EVAL."
    );
    // EVAL remembers the body for later EVALSHA.
    let release_sha = sha1_hex(COMPARE_AND_DELETE.text());
    assert_eq!(
        c.cmd(&["EVAL", COMPARE_AND_DELETE.text(), "1", &k, "nope"])
            .await,
        ":0"
    );
    for port in env.ports() {
        master_cmd(port, &["SCRIPT", "FLUSH"]).await;
    }
    assert_eq!(c.cmd(&["EVALSHA", &release_sha, "1", &k, "v"]).await, ":1");
    env.assert_gone(&k).await;
    // The proxy's own acquire script is gone from the masters too: it is re-loaded by the
    // health check, and acquires work again within a poll or two.
    let deadline = Instant::now() + Duration::from_secs(1);
    while c.cmd(&["SET", &k, "again", "NX", "PX", "30000"]).await != "+OK" {
        assert!(
            Instant::now() < deadline,
            "no acquire after SCRIPT FLUSH on the masters"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // numkeys errors as Redis words them.
    assert_eq!(
        c.cmd(&["EVAL", "return 1", "2", "k"]).await,
        "-ERR Number of keys can't be greater than number of args"
    );
    assert_eq!(
        c.cmd(&["EVAL", "return 1", "-1"]).await,
        "-ERR Number of keys can't be negative"
    );
    assert_eq!(
        c.cmd(&["EVAL", "return 1", "x"]).await,
        "-ERR value is not an integer or out of range"
    );
}

fn sha1_hex(body: &str) -> String {
    script_sha(body.as_bytes())
}

/// Whether every master's PTTL of `key` satisfies `ok` within 2 s (a reply may leave once a
/// majority answered, with the last master's copy still in flight).
async fn pttls_all(ports: Vec<u16>, key: String, ok: impl Fn(i64) -> bool) -> bool {
    eventually(Duration::from_secs(2), async || {
        for p in &ports {
            let pttl: i64 = master_cmd(*p, &["PTTL", &key]).await[1..].parse().unwrap();
            if !ok(pttl) {
                return false;
            }
        }
        true
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_scripts_are_padded_and_validity_checked() {
    let (env, relays) = behind_relays(3, 1000).await;
    let ports: Vec<u16> = env.ports();
    let pttls_all = |k: String, ok: fn(i64) -> bool| pttls_all(ports.clone(), k, ok);
    let mut c = env.proxy.client().await;
    let k = key("lease");
    assert_eq!(c.cmd(&["SET", &k, "tok", "NX", "PX", "30000"]).await, "+OK");

    // compare-then-PEXPIRE (redis-cli, node-redis): TTL padded by drift on every master.
    let extend = script("redis-cli-extend");
    assert_eq!(
        c.cmd(&["EVAL", &extend, "1", &k, "tok", "60000"]).await,
        ":1"
    );
    assert!(pttls_all(k.clone(), |t| t > 60_000).await, "padded");
    // redlock's re-SET with PX, by EVALSHA after SCRIPT LOAD.
    let redlock_extend = script("node-redlock-extend");
    let sha = c.cmd(&["SCRIPT", "LOAD", &redlock_extend]).await;
    assert_eq!(
        c.cmd(&["EVALSHA", &sha[1..], "1", &k, "tok", "50000"])
            .await,
        ":1"
    );
    assert!(pttls_all(k.clone(), |t| t > 50_000).await, "padded");
    // Wrong token: 0, nothing changed.
    assert_eq!(
        c.cmd(&["EVALSHA", &sha[1..], "1", &k, "nope", "1000"])
            .await,
        ":0"
    );
    // redis-py's extend passes its TTL through a local variable (and may add the current
    // PTTL): the recogniser does not follow it, the lease it sets is padded by effect.
    let py_extend = script("python-redis-py-extend");
    assert_eq!(
        c.cmd(&["EVAL", &py_extend, "1", &k, "tok", "20000", "1"])
            .await,
        ":1"
    );
    assert!(
        pttls_all(k.clone(), |t| t > 20_000).await,
        "padded by effect"
    );

    // Masters slower than the new TTL: every master extends, but the validity has passed
    // by the time a majority answered, so the client is told an error, which no library
    // reads as success (python-redis-lock's extend answers 0 for extended).
    for r in &relays {
        r.set_delay(Duration::from_millis(60));
    }
    let expired = "-ERR lease validity expired before a majority answered (redlock-proxy); the lock is not held";
    assert_eq!(
        c.cmd(&["EVAL", &extend, "1", &k, "tok", "50"]).await,
        expired
    );
    let k2 = key("lease2");
    assert_eq!(
        c.cmd(&["SET", &k2, "tok", "NX", "PX", "30000"]).await,
        "+OK"
    );
    assert_eq!(
        c.cmd(&["EVALSHA", &sha[1..], "1", &k2, "tok", "50"]).await,
        expired
    );
    // Whatever a script answers once it set a lease too late: an error.
    let k3 = key("lease3");
    assert_eq!(
        c.cmd(&["SET", &k3, "tok", "NX", "PX", "30000"]).await,
        "+OK"
    );
    let ok_script = "redis.call('pexpire', KEYS[1], ARGV[1]) return 'OK'";
    assert_eq!(c.cmd(&["EVAL", ok_script, "1", &k3, "50"]).await, expired);
    // A lease script that set no lease (the key is gone by now) answers as it answered: its
    // reply promises nothing.
    assert_eq!(c.cmd(&["EVAL", ok_script, "1", &k2, "50"]).await, "$OK");
}

/// `cmdstat_set` calls on one master.
async fn set_calls(port: u16) -> u64 {
    let stats = command_stats(port).await.expect("INFO commandstats");
    stats.get("set").copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquires_of_one_key_coalesce_and_exactly_one_wins() {
    let env = Env::start(5).await;
    let k = key("hot");
    let before: u64 = {
        let mut sum = 0;
        for p in env.ports() {
            sum += set_calls(p).await;
        }
        sum
    };
    let mut clients = Vec::new();
    for _ in 0..100 {
        clients.push(env.proxy.client().await);
    }
    let attempts = clients.iter_mut().enumerate().map(|(i, c)| {
        let k = k.clone();
        async move {
            c.cmd(&["SET", &k, &format!("tok{i}"), "NX", "PX", "30000"])
                .await
        }
    });
    let replies = futures::future::join_all(attempts).await;
    let winners: Vec<usize> = (0..100).filter(|i| replies[*i] == "+OK").collect();
    assert_eq!(winners.len(), 1, "{replies:?}");
    assert!(replies.iter().all(|r| r == "+OK" || r == "$nil"));
    let winner = format!("tok{}", winners[0]);
    assert!(env.holders(&k, &winner).await >= 3);
    let mut after = 0;
    for p in env.ports() {
        after += set_calls(p).await;
    }
    // Without coalescing: 100 acquires × 5 masters = 500 SETs.
    assert!(
        after - before < 250,
        "{} master SETs for 100 acquires",
        after - before
    );
}

/// node-redlock's own acquire and release scripts, with one key, run as the proxy's Redlock
/// acquire (padded TTL, fencing counter, validity) and merged release, answering what the
/// scripts answer (`1`/`0`); with two keys they take the general script path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_redlock_scripts_run_as_the_proxys_acquire_and_release() {
    let env = Env::start(3).await;
    let mut c = env.proxy.client().await;
    let (acquire, release) = (
        script("node-redlock-acquire"),
        script("node-redlock-release"),
    );
    let k = key("node-redlock");
    let eval = |body: &str, keys: &[&str], argv: &[&str]| {
        let count = keys.len().to_string();
        let mut cmd = vec!["EVAL".to_string(), body.to_string(), count];
        cmd.extend(keys.iter().chain(argv).map(|s| s.to_string()));
        cmd
    };
    let mut ask = async |cmd: Vec<String>| {
        let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        c.cmd(&args).await
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let sent = loop {
        let sent = Instant::now();
        let reply = ask(eval(&acquire, &[&k], &["a", "10000"])).await;
        if reply == ":1" {
            break sent;
        }
        assert_eq!(reply, ":0");
        assert!(Instant::now() < deadline, "never granted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(ask(eval(&acquire, &[&k], &["b", "10000"])).await, ":0");
    assert!(env.holders(&k, "a").await >= 2);
    // Through the proxy's acquire: a majority has the key's fencing counter, and the TTL
    // padded by the drift (10 000 ms × 0.01 + 2 ms).
    let mut counted = 0;
    for port in env.ports() {
        if master_get(port, &format!("redlock-proxy:token:{k}"))
            .await
            .is_some()
        {
            counted += 1;
            let pttl: i64 = master_cmd(port, &["PTTL", &k]).await[1..].parse().unwrap();
            // Padded: what is left is at least the padded TTL less the time since the acquire
            // was sent (no more than 102 ms may pass for it to exceed an unpadded 10 000, but a
            // loaded machine is not held to that).
            let since_sent = sent.elapsed().as_millis() as i64;
            assert!(pttl >= 10_102 - since_sent - 1 && pttl <= 10_102, "{pttl}");
        }
    }
    assert!(counted >= 2, "{counted} masters with the counter");
    assert_eq!(ask(eval(&release, &[&k], &["b"])).await, ":0");
    assert_eq!(ask(eval(&release, &[&k], &["a"])).await, ":1");
    env.assert_gone(&k).await;
    // Two keys: the general path (a lease script, TTL padded, Q identical answers).
    let (k1, k2) = (key("node-redlock-1"), key("node-redlock-2"));
    assert_eq!(
        ask(eval(&acquire, &[&k1, &k2], &["c", "10000"])).await,
        ":2"
    );
    assert_eq!(ask(eval(&release, &[&k1, &k2], &["c"])).await, ":2");
    // Above max_lock_ttl_ms: refused like a SET NX PX would be.
    let long = ask(eval(&acquire, &[&k], &["d", "60000000"])).await;
    assert!(long.starts_with("-ERR"), "{long}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_integers_that_differ_per_master_answer_their_median() {
    // pottery's `locked()` and redlock-universal's extend answer each master's PTTL, a few
    // milliseconds apart: Q masters at or above the answer and Q at or below it vouch for it
    // whichever way the script's codes run (docs/PROTOCOL.md §6, rule 2s).
    let env = Env::start(5).await;
    let mut c = env.proxy.client().await;
    let k = key("per-master-integers");
    let body = "return tonumber(redis.call('get', KEYS[1]))";
    let values = ["50", "10", "40", "20", "30"];
    for (port, value) in env.ports().into_iter().zip(values) {
        master_cmd(port, &["SET", &k, value, "PX", "60000"]).await;
    }
    assert_eq!(c.cmd(&["EVAL", body, "1", &k]).await, ":30");
    // Four integers whose middle two differ, and a null: no majority on either side.
    master_cmd(env.ports()[0], &["SET", &k, "not a number", "PX", "60000"]).await;
    let reply = c.cmd(&["EVAL", body, "1", &k]).await;
    assert!(reply.starts_with("-NOQUORUM"), "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ttl_cap_applies_to_the_clients_ttl_on_every_path() {
    // Default cap, 60 s. At the cap every path grants (python-redis-lock's `extend(60)` asks
    // for 60 s: padded, 60 602 ms, within the lease bound, so not "capped"); one above it
    // every path refuses before anything reaches a master.
    const CAP: u64 = 60_000;
    let env = Env::start(3).await;
    let mut c = env.proxy.client().await;
    let bound = redlock_proxy::backend_ttl_ms(CAP, 0.01) as i64;
    let ports = env.ports();
    let (prl_extend, reacquire) = (
        script("python-redis-lock-extend"),
        script("python-redis-py-reacquire"),
    );
    let (k_px, k_ex, k_lock) = (key("cap-set-px"), key("cap-set-ex"), key("cap-lock"));
    // (the call with `{ttl}` for its TTL, the TTL's unit in ms, what it answers at the cap:
    // a prefix). Lease scripts: python-redis-lock's extend (seconds; `0` extended) and
    // redis-py's reacquire (milliseconds; `1` extended). `LOCK.ACQUIRE` answers its token and
    // validity, `LOCK.EXTEND` its validity.
    let paths: Vec<(Vec<&str>, u64, &str)> = vec![
        (vec!["SET", &k_px, "v", "NX", "PX", "{ttl}"], 1, "+OK"),
        (vec!["PEXPIRE", &k_px, "{ttl}"], 1, ":1"),
        (vec!["EXPIRE", &k_px, "{ttl}"], 1000, ":1"),
        (vec!["SET", &k_ex, "v", "NX", "EX", "{ttl}"], 1000, "+OK"),
        (
            vec!["EVAL", &prl_extend, "1", &k_ex, "v", "{ttl}"],
            1000,
            ":0",
        ),
        (vec!["EVAL", &reacquire, "1", &k_ex, "v", "{ttl}"], 1, ":1"),
        (vec!["LOCK.ACQUIRE", &k_lock, "v", "{ttl}"], 1, "*[:"),
        (vec!["LOCK.EXTEND", &k_lock, "v", "{ttl}"], 1, ":59"),
    ];
    for (call, unit, granted) in paths {
        let with = |ttl: u64| -> Vec<String> {
            call.iter()
                .map(|a| a.replace("{ttl}", &ttl.to_string()))
                .collect()
        };
        let refused = format!(
            "-ERR lock TTL {} ms is refused by redlock-proxy: above max_lock_ttl_ms ({CAP} ms)",
            CAP + unit
        );
        let args = with(CAP / unit + 1);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(c.cmd(&args).await, refused, "{call:?}");
        let args = with(CAP / unit);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let reply = c.cmd(&args).await;
        assert!(reply.starts_with(granted), "{call:?}: {reply}");
        let k = call.iter().find(|a| a.starts_with("test:")).unwrap();
        for p in &ports {
            let pttl: i64 = master_cmd(*p, &["PTTL", k]).await[1..].parse().unwrap();
            assert!(
                pttl <= bound,
                "{call:?}: PTTL {pttl} above the bound {bound}"
            );
        }
    }
}

/// Issue 23, item 3: lease scripts written other ways than the recogniser reads (the TTL through
/// a local variable, one script for acquire and extend, a `{1, pttl}` reply) are recognised by
/// what they do on the masters: the lease they set is padded by drift, and a success that
/// comes back after its validity is an error. A script that sets no lease answers as it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_scripts_are_recognised_by_effect_whatever_their_spelling() {
    let (env, relays) = behind_relays(3, 1000).await;
    let mut c = env.proxy.client().await;
    let ports = env.ports();
    let min_pttl = |k: String| {
        let ports = ports.clone();
        async move {
            let mut least = i64::MAX;
            for p in &ports {
                let pttl: i64 = master_cmd(*p, &["PTTL", &k]).await[1..].parse().unwrap();
                least = least.min(pttl);
            }
            least
        }
    };
    let via_local = "local ttl = tonumber(ARGV[2]) if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('pexpire', KEYS[1], ttl) return 1 end return 0";
    let acquire_or_extend = "local v = redis.call('get', KEYS[1]) if v == false or v == ARGV[1] then local px = ARGV[2] redis.call('set', KEYS[1], ARGV[1], 'PX', px) return 1 end return 0";
    let with_pttl = "local ok = redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) if ok then return {1, redis.call('pttl', KEYS[1])} end return {0, redis.call('pttl', KEYS[1])}";

    let k = key("by-effect");
    // One script takes the lock and extends it; 20 s asked, 20.2 s + 2 ms kept by the masters.
    assert_eq!(
        c.cmd(&["EVAL", acquire_or_extend, "1", &k, "me", "20000"])
            .await,
        ":1"
    );
    assert!(min_pttl(k.clone()).await > 20_000);
    assert_eq!(
        c.cmd(&["EVAL", acquire_or_extend, "1", &k, "other", "20000"])
            .await,
        ":0"
    );
    assert_eq!(
        c.cmd(&["EVAL", via_local, "1", &k, "me", "30000"]).await,
        ":1"
    );
    assert!(min_pttl(k.clone()).await > 30_000);
    // A lease in seconds (python-redis-lock's extend: `EXPIRE key ARGV[2]`) is padded in
    // milliseconds, not by a whole second.
    let prl_extend = script("python-redis-lock-extend");
    assert_eq!(
        c.cmd(&["EVAL", &prl_extend, "1", &k, "me", "10"]).await,
        ":0"
    );
    // 10 s and at most its padding on every master, never 11 s.
    let padded_in_ms = |t: i64| (9_000..=10_102).contains(&t);
    assert!(pttls_all(ports.clone(), k.clone(), padded_in_ms).await);
    // The `{1, pttl}` reply passes through; its PTTL is the padded one the master holds.
    let k2 = key("by-effect-pttl");
    let reply = c.cmd(&["EVAL", with_pttl, "1", &k2, "me", "10000"]).await;
    assert!(reply.starts_with("*[:1,:101"), "{reply}");

    // Masters slower than the lease: whatever the script answers, an error.
    for r in &relays {
        r.set_delay(Duration::from_millis(60));
    }
    let expired = "-ERR lease validity expired before a majority answered (redlock-proxy); the lock is not held";
    assert_eq!(
        c.cmd(&["EVAL", via_local, "1", &k, "me", "50"]).await,
        expired
    );
    let k3 = key("by-effect-late");
    assert_eq!(
        c.cmd(&["EVAL", with_pttl, "1", &k3, "me", "50"]).await,
        expired
    );
    // Refused (another holder): no lease set, the refusal as it is.
    assert_eq!(
        c.cmd(&["EVAL", acquire_or_extend, "1", &k2, "other", "50"])
            .await,
        ":0"
    );
}
