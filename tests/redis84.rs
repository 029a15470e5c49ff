//! The lock commands of Redis 8.4 and Valkey 9 through the proxy over real Redis 7.0 masters:
//! `SET … IFEQ|IFNE|IFDEQ|IFDNE`, `DELEX`, `DIGEST`, `DELIFEQ`.
//!
//! There is no Redis 8.4 (nor Valkey) server on this machine: the expected reply bytes below
//! are written from Redis 8.4's command docs and reply schemas (redis.io/docs/latest/commands/
//! set/, delex/, digest/: "Integer reply: 0 if not deleted … or 1 if deleted", "Null reply …
//! a specified IFEQ/IFNE/IFDEQ/IFDNE condition is false", "Bulk string reply: the previous value
//! of the key, whether the key was set or not", the DIGEST page's example `"Hello world"` →
//! `b6acb9d84a38ff74`, 16 hex digits) and Valkey 9.0's `DELIFEQ` page, with Redis' shared
//! texts (`WRONGTYPE …`, `ERR syntax error`, the arity error). They are compared byte for byte
//! in RESP2 and RESP3 through 3 and 5 masters.

use redlock_proxy::LocalCluster;
use redlock_testkit::key;
use redlock_testkit::launcher::Env;
use redlock_testkit::masters::{command_stats, master_get, signal};
use redlock_testkit::resp::{encode_str, Client};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: Duration = Duration::from_secs(10);
const WRONGTYPE: &str = "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n";

/// Redis 8.4's digest text of `value` (XXH3-64, 16 lower-case hex digits).
fn digest(value: &str) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(value.as_bytes()))
}

/// A raw connection to the proxy in `protocol` (2 or 3).
async fn raw(port: u16, protocol: u8) -> TcpStream {
    let mut client = Client::connect(port).await;
    if protocol == 3 {
        let hello = client.request(&[b"HELLO", b"3"]).await.expect("HELLO 3");
        assert!(!hello.is_null());
    }
    client.into_stream()
}

/// Sends `args` and reads exactly the bytes of `expected` (within [`LIMIT`]).
async fn expect(stream: &mut TcpStream, args: &[&str], expected: &str) {
    stream.write_all(&encode_str(args)).await.unwrap();
    let mut got = vec![0; expected.len()];
    tokio::time::timeout(LIMIT, stream.read_exact(&mut got))
        .await
        .unwrap_or_else(|_| panic!("{args:?}: no reply within {LIMIT:?}"))
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&got), expected, "{args:?}");
}

fn bulk(s: &str) -> String {
    format!("${}\r\n{s}\r\n", s.len())
}

/// Every condition, expiry option and error of the new commands, and their replies in Redis
/// 8.4's bytes (see the module doc), through `n` masters in RESP2 and RESP3.
async fn replies_are_redis_8_4_s(n: usize) {
    let env = Env::start(n).await;
    for protocol in [2, 3] {
        let null = if protocol == 2 { "$-1\r\n" } else { "_\r\n" };
        let mut c = raw(env.proxy.port, protocol).await;
        let (k, l) = (key("r84"), key("r84list"));
        let ok = "+OK\r\n";
        let hello = "Hello world";
        let (of_c, of_e) = (digest("c"), digest("e"));
        let cases: Vec<(Vec<&str>, String)> = vec![
            (vec!["SET", &k, hello], ok.into()),
            (vec!["DIGEST", &k], bulk("b6acb9d84a38ff74")),
            (vec!["DIGEST", "r84:missing"], null.into()),
            (vec!["DELEX", &k, "IFEQ", "nope"], ":0\r\n".into()),
            (vec!["DELEX", &k, "IFNE", hello], ":0\r\n".into()),
            (
                vec!["DELEX", &k, "IFDNE", "b6acb9d84a38ff74"],
                ":0\r\n".into(),
            ),
            (
                vec!["DELEX", &k, "IFDEQ", "0000000000000000"],
                ":0\r\n".into(),
            ),
            (
                vec!["DELEX", &k, "IFDEQ", "b6acb9d84a38ff74"],
                ":1\r\n".into(),
            ),
            (vec!["DELEX", &k], ":0\r\n".into()),
            (vec!["DELEX", &k, "IFEQ", "a"], ":0\r\n".into()),
            (vec!["SET", &k, "a"], ok.into()),
            (vec!["DELEX", &k, "ifne", "b"], ":1\r\n".into()),
            (vec!["SET", &k, "a"], ok.into()),
            (
                vec!["DELEX", &k, "IFDNE", "0000000000000000"],
                ":1\r\n".into(),
            ),
            (vec!["SET", &k, "a"], ok.into()),
            (vec!["DELIFEQ", &k, "b"], ":0\r\n".into()),
            (vec!["DELIFEQ", &k, "a"], ":1\r\n".into()),
            (vec!["SET", &k, "a"], ok.into()),
            (vec!["DELEX", &k], ":1\r\n".into()),
            (vec!["LPUSH", &l, "x"], ":1\r\n".into()),
            (vec!["DELEX", &l, "IFEQ", "x"], WRONGTYPE.into()),
            (vec!["DELEX", &l, "IFNE", "x"], WRONGTYPE.into()),
            (
                vec!["DELEX", &l, "IFDEQ", "0000000000000000"],
                WRONGTYPE.into(),
            ),
            (vec!["DIGEST", &l], WRONGTYPE.into()),
            (
                vec!["SET", &l, "v", "IFEQ", "x", "PX", "10000"],
                WRONGTYPE.into(),
            ),
            (vec!["SET", &l, "v", "IFNE", "x"], WRONGTYPE.into()),
            (vec!["DELEX", &l], ":1\r\n".into()),
            // IFEQ/IFDEQ do not create the key; IFNE/IFDNE do.
            (
                vec!["SET", &k, "a", "IFEQ", "a", "PX", "10000"],
                null.into(),
            ),
            (
                vec!["SET", &k, "a", "IFDEQ", "0000000000000000", "PX", "10000"],
                null.into(),
            ),
            (vec!["SET", &k, "a", "IFNE", "z", "PX", "10000"], ok.into()),
            // A hand-over, a refused one, with GET (the old value, set or not), an extend.
            (vec!["SET", &k, "b", "IFEQ", "a", "PX", "10000"], ok.into()),
            (
                vec!["SET", &k, "c", "IFEQ", "a", "PX", "10000"],
                null.into(),
            ),
            (
                vec!["SET", &k, "c", "IFEQ", "b", "GET", "PX", "10000"],
                bulk("b"),
            ),
            (
                vec!["SET", &k, "d", "IFEQ", "nope", "GET", "PX", "10000"],
                bulk("c"),
            ),
            (vec!["SET", &k, "c", "IFEQ", "c", "EX", "10"], ok.into()),
            (vec!["GET", &k], bulk("c")),
            (
                vec!["SET", &k, "e", "IFDEQ", &of_c, "PX", "10000"],
                ok.into(),
            ),
            (
                vec!["SET", &k, "f", "IFDNE", &of_e, "PX", "10000"],
                null.into(),
            ),
            (
                vec!["SET", &k, "f", "IFDNE", &of_e, "GET", "PX", "10000"],
                bulk("e"),
            ),
            (
                vec!["SET", &k, "f", "IFDNE", "0000000000000000", "PX", "10000"],
                ok.into(),
            ),
            (vec!["SET", &k, "g", "IFEQ", "f", "KEEPTTL"], ok.into()),
            (
                vec!["SET", &k, "h", "IFNE", "g", "GET", "PX", "10000"],
                bulk("g"),
            ),
            (vec!["GET", &k], bulk("g")),
            (
                vec!["SET", &k, "h", "IFNE", "x", "GET", "KEEPTTL"],
                bulk("g"),
            ),
            // Errors: one condition, each with its argument; DELEX's arity.
            (
                vec!["SET", &k, "v", "NX", "IFEQ", "v"],
                "-ERR syntax error\r\n".into(),
            ),
            (
                vec!["SET", &k, "v", "IFEQ", "v", "XX"],
                "-ERR syntax error\r\n".into(),
            ),
            (
                vec!["SET", &k, "v", "IFEQ", "a", "IFNE", "b"],
                "-ERR syntax error\r\n".into(),
            ),
            (vec!["SET", &k, "v", "IFEQ"], "-ERR syntax error\r\n".into()),
            (vec!["DELEX", &k, "IFEQ"], "-ERR syntax error\r\n".into()),
            (
                vec!["DELEX", &k, "IFXX", "v"],
                "-ERR syntax error\r\n".into(),
            ),
            (
                vec!["DELEX"],
                "-ERR wrong number of arguments for 'delex' command\r\n".into(),
            ),
            (
                vec!["DELIFEQ", &k],
                "-ERR wrong number of arguments for 'delifeq' command\r\n".into(),
            ),
            (
                vec!["DIGEST", &k, &k],
                "-ERR wrong number of arguments for 'digest' command\r\n".into(),
            ),
            (vec!["DELEX", &k, "IFEQ", "h"], ":1\r\n".into()),
        ];
        for (args, expected) in &cases {
            expect(&mut c, args, expected).await;
        }
        env.assert_gone(&k).await;
        env.assert_gone(&l).await;
        // The proxy's own refusal (not Redis'): a condition on the holder without expiry
        // would drop the lock's TTL.
        let refusal = "-ERR SET IFEQ/IFDEQ without PX/EX/EXAT/PXAT/KEEPTTL is refused by redlock-proxy: it would leave the lock without expiry; add PX <milliseconds> or KEEPTTL\r\n";
        expect(&mut c, &["SET", &k, "v", "IFEQ", "v"], refusal).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_are_redis_8_4_s_through_3_masters() {
    replies_are_redis_8_4_s(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_are_redis_8_4_s_through_5_masters() {
    replies_are_redis_8_4_s(5).await;
}

/// Script calls (`EVAL` and `EVALSHA`) `port`'s master has run.
async fn script_calls(port: u16) -> u64 {
    let stats = command_stats(port).await.expect("INFO commandstats");
    stats.get("eval").copied().unwrap_or(0) + stats.get("evalsha").copied().unwrap_or(0)
}

/// The lock cycle of Redis 8.4 lock code: `SET NX PX`, `SET k v IFEQ v PX` (an extend: every
/// master's TTL moves up), `SET k w IFEQ v PX` (a hand-over: every master holds `w`, which has
/// no token), `DELEX k IFEQ w` (a release: nothing left). Also measures what each spelling of
/// release and extend costs a master in script calls (printed; each is one).
async fn lock_cycle(n: usize) {
    // No health poll (a script call too) between the counts, after the first.
    let env = Env::start_with(n, |c| c.health_interval_ms = 60_000).await;
    let mut c = env.proxy.client().await;
    let k = key("cycle");
    let first = env.ports()[0];
    let mut costs = Vec::new();
    let spellings: [(&str, &[&str]); 4] = [
        ("LOCK.RELEASE", &["LOCK.RELEASE", &k, "v"]),
        ("DELEX IFEQ", &["DELEX", &k, "IFEQ", "v"]),
        ("DELIFEQ", &["DELIFEQ", &k, "v"]),
        (
            "EVAL compare-and-delete",
            &[
                "EVAL",
                "if redis.call('get',KEYS[1]) == ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end",
                "1",
                &k,
                "v",
            ],
        ),
    ];
    for (name, release) in spellings {
        assert_eq!(c.cmd(&["SET", &k, "v", "NX", "PX", "10000"]).await, "+OK");
        let before = script_calls(first).await;
        assert_eq!(c.cmd(release).await, ":1", "{name}");
        costs.push((name, script_calls(first).await - before));
        env.assert_gone(&k).await;
    }
    assert_eq!(c.cmd(&["SET", &k, "v", "NX", "PX", "2000"]).await, "+OK");
    for (name, extend) in [
        ("LOCK.EXTEND", vec!["LOCK.EXTEND", &k, "v", "8000"]),
        (
            "SET IFEQ PX",
            vec!["SET", &k, "v", "IFEQ", "v", "PX", "9000"],
        ),
    ] {
        let before = script_calls(first).await;
        let reply = c.cmd(&extend).await;
        assert!(reply == "+OK" || reply.starts_with(':'), "{name}: {reply}");
        costs.push((name, script_calls(first).await - before));
    }
    // Every master's TTL moved up to the last extend's (9000 + drift).
    for pttl in env.pttls(&k).await {
        assert!(pttl > 8000, "{pttl}");
    }
    let token = c.cmd(&["LOCK.TOKEN", &k, "v"]).await;
    assert!(
        token.starts_with(':'),
        "the acquire's token, kept by the extends: {token}"
    );
    let cmd = ["SET", &k, "w", "IFEQ", "v", "PX", "10000"];
    assert_eq!(c.cmd(&cmd).await, "+OK");
    assert_eq!(env.values(&k).await, vec![Some("w".to_string()); n]);
    assert_eq!(c.cmd(&["LOCK.TOKEN", &k, "w"]).await, "$nil", "no token");
    assert_eq!(c.cmd(&["SET", &k, "x", "NX", "PX", "10000"]).await, "$nil");
    assert_eq!(c.cmd(&["DELEX", &k, "IFEQ", "v"]).await, ":0");
    assert_eq!(c.cmd(&["DELEX", &k, "IFEQ", "w"]).await, ":1");
    env.assert_gone(&k).await;
    for (name, calls) in &costs {
        println!("{n} masters: {name}: {calls} script call(s) per master");
        assert_eq!(*calls, 1, "{name}");
    }
    let stats = c.cmd(&["INFO", "commandstats"]).await;
    for name in ["delex", "delifeq", "set"] {
        assert!(stats.contains(&format!("cmdstat_{name}:calls=")), "{stats}");
    }
    let info = c
        .cmd(&["COMMAND", "INFO", "delex", "digest", "delifeq"])
        .await;
    assert!(info.contains("delex") && info.contains("delifeq"), "{info}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_8_4_lock_cycle_through_3_masters() {
    lock_cycle(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_8_4_lock_cycle_through_5_masters() {
    lock_cycle(5).await;
}

/// Releases, extends and hand-overs spelled the Redis 8.4 way with a master paused and one
/// down (5 masters: a majority still answers), and a hand-over refused with a majority paused
/// (3 masters): null, and once the masters resume no master holds the new value (the paused
/// masters' writes are past their deadline, the one that took it was restored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_and_extends_with_masters_paused_and_down() {
    let fast = |c: &mut redlock_proxy::Config| c.node_timeout_ms = 300;
    let mut env = Env::start_over(LocalCluster::start(5).unwrap(), fast).await;
    let mut c = env.proxy.client().await;
    let k = key("faults");
    assert_eq!(c.cmd(&["SET", &k, "v", "NX", "PX", "10000"]).await, "+OK");
    env.masters.masters[4].kill();
    let paused = env.masters.masters[3].pid().unwrap();
    signal(paused, "STOP");
    assert_eq!(
        c.cmd(&["SET", &k, "v", "IFEQ", "v", "PX", "9000"]).await,
        "+OK"
    );
    assert_eq!(
        c.cmd(&["SET", &k, "w", "IFEQ", "v", "PX", "9000"]).await,
        "+OK"
    );
    assert_eq!(c.cmd(&["SET", &k, "x", "NX", "PX", "9000"]).await, "$nil");
    assert_eq!(c.cmd(&["DELEX", &k, "IFEQ", "w"]).await, ":1");
    signal(paused, "CONT");
    let ports = env.ports();
    for port in &ports[..4] {
        let deadline = tokio::time::Instant::now() + LIMIT;
        while master_get(*port, &k).await.is_some() {
            assert!(tokio::time::Instant::now() < deadline, "{k} left on {port}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    let env = Env::start_over(LocalCluster::start(3).unwrap(), fast).await;
    let mut c = env.proxy.client().await;
    assert_eq!(c.cmd(&["SET", &k, "v", "NX", "PX", "10000"]).await, "+OK");
    let pids: Vec<u32> = env.masters.masters[1..]
        .iter()
        .map(|m| m.pid().unwrap())
        .collect();
    pids.iter().for_each(|pid| signal(*pid, "STOP"));
    let refused = c.cmd(&["SET", &k, "w", "IFEQ", "v", "PX", "9000"]).await;
    let refused_extend = c.cmd(&["SET", &k, "v", "IFEQ", "v", "PX", "9000"]).await;
    // Held up past the node timeout and the write deadline.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    pids.iter().for_each(|pid| signal(*pid, "CONT"));
    assert_eq!(
        (refused.as_str(), refused_extend.as_str()),
        ("$nil", "$nil")
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(env.values(&k).await, vec![Some("v".to_string()); 3]);
    // The refused extend gave the TTL back: no master holds it for the new 9000 ms.
    for pttl in env.pttls(&k).await {
        assert!(pttl < 9000, "{pttl}");
    }
}
