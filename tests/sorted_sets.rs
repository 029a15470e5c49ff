//! Sorted sets through the proxy (docs/PROTOCOL.md §3, "Sorted sets"): every reply, error and
//! arity text compared with one redis-server's, in RESP2 and RESP3; the TTL bound of keys that
//! `ZADD` creates, read on every master; and redis-semaphore's `Semaphore` cycle (its acquire
//! script, `ZREM`) checked on the masters.

use redlock_proxy::LocalMaster;
use redlock_testkit::differential::assert_same_replies_in_resp2_and_resp3;
use redlock_testkit::key;
use redlock_testkit::launcher::{lease_bound_ms, Env};
use redlock_testkit::resp::Client;
use redlock_testkit::scripts::semaphore_acquire;

/// Commands on key `k` (a sorted set), `s` (a string) and `m` (missing): valid ones in every
/// option the recipes use, and every kind of error the masters or the command table answer.
const SESSION: &[&str] = &[
    "SET {s} v",
    "ZADD {k} 1 a 2 b 3 c",
    "ZADD {k} NX 9 a 4 d",
    "ZADD {k} XX CH 5 a",
    "ZADD {k} GT CH 1 b 7 c",
    "ZADD {k} INCR 1.5 a",
    "ZADD {k} NX INCR 1 a",
    "ZADD {k} 1 incr",
    "zadd {k} 2.5e1 e -inf f +inf g",
    "ZADD {k}",
    "ZADD {k} 1",
    "ZADD {k} x a",
    "ZADD {k} nan a",
    "ZADD {k} NX XX 1 a",
    "ZADD {k} GT LT 1 a",
    "ZADD {k} GT NX 1 a",
    "ZADD {k} INCR 1 a 2 b",
    "ZADD {k} 1 a 2",
    "ZADD {s} 1 a",
    "ZCARD {k}",
    "ZCARD {m}",
    "ZCARD {s}",
    "ZCARD",
    "ZCARD {k} {m}",
    "ZSCORE {k} a",
    "ZSCORE {k} e",
    "ZSCORE {k} f",
    "ZSCORE {k} nope",
    "ZSCORE {m} a",
    "ZSCORE {s} a",
    "ZSCORE {k}",
    "ZRANK {k} b",
    "ZRANK {k} nope",
    "ZRANK {m} a",
    "ZRANK {k}",
    "ZRANK {k} a b",
    "ZRANGE {k} 0 -1",
    "ZRANGE {k} 0 -1 WITHSCORES",
    "ZRANGE {k} 0 1 REV withscores",
    "ZRANGE {k} (1 +inf BYSCORE LIMIT 0 2",
    "ZRANGE {k} -inf 5 BYSCORE WITHSCORES",
    "ZRANGE {k} [a (c BYLEX",
    "ZRANGE {m} 0 -1 WITHSCORES",
    "ZRANGE {k} 0 -1 BOGUS",
    "ZRANGE {k} a b",
    "ZRANGE {k} 0 -1 LIMIT 0 1",
    "ZRANGE {k} x y BYSCORE",
    "ZRANGE {s} 0 -1",
    "ZRANGE {k} 0",
    "ZREM {k} a nope",
    "ZREM {m} a",
    "ZREM {s} a",
    "ZREM {k}",
    "ZREMRANGEBYSCORE {k} -inf 2",
    "ZREMRANGEBYSCORE {k} (5 +inf",
    "ZREMRANGEBYSCORE {k} x y",
    "ZREMRANGEBYSCORE {m} 0 1",
    "ZREMRANGEBYSCORE {k} 1",
    "ZCARD {k}",
    "ZRANGE {k} 0 -1 WITHSCORES",
    "ZREMRANGEBYSCORE {k} -inf +inf",
    "EXISTS {k}",
    "ZRANGE {k} 0 -1",
];

/// The same commands through the proxy over 3 masters and to one redis-server, one by one, in
/// RESP2 and in RESP3: identical replies (values, types, error and arity texts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sorted_set_replies_match_one_redis_in_resp2_and_resp3() {
    let env = Env::start(3).await;
    let reference = LocalMaster::start(None, &[]).unwrap();
    let (ours, theirs) = (env.proxy.port, reference.port);
    assert!(SESSION.len() > 60);
    assert_same_replies_in_resp2_and_resp3(ours, theirs, SESSION, &["{k}", "{s}", "{m}"]).await;
}

/// A key `ZADD` creates gets the lease bound on every master; a TTL of its own (a semaphore's
/// `PEXPIRE`) is kept by later `ZADD`s, never lengthened; `ZREM` of the last member deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zadd_never_leaves_a_key_without_expiry() {
    let env = Env::start(3).await;
    let mut c = Client::connect(env.proxy.port).await;
    let k = key("zadd-bound");
    let bound = lease_bound_ms(&mut c).await;
    assert!(bound > 60_000, "{bound}");
    assert_eq!(c.cmd(&["ZADD", &k, "1", "a"]).await, ":1");
    let within = |pttl: i64| pttl > bound - 5_000 && pttl <= bound;
    for pttl in env.pttls_when(&k, within).await {
        assert!(within(pttl), "{pttl} of {bound}");
    }
    assert_eq!(c.cmd(&["PEXPIRE", &k, "5000"]).await, ":1");
    assert_eq!(c.cmd(&["ZADD", &k, "2", "b"]).await, ":1");
    for pttl in env.pttls_when(&k, |p| p > 0 && p <= 5_000).await {
        assert!(pttl > 0 && pttl <= 5_000, "{pttl}");
    }
    assert_eq!(c.cmd(&["ZREM", &k, "a", "b"]).await, ":2");
    assert_eq!(env.pttls_when(&k, |p| p == -2).await, [-2, -2, -2]);
    // A failed ZADD creates nothing.
    assert!(c.cmd(&["ZADD", &k, "x", "a"]).await.starts_with("-ERR"));
    assert_eq!(env.pttls_when(&k, |p| p == -2).await, [-2, -2, -2]);
}

/// redis-semaphore's `Semaphore` of 2 through the proxy: two holders admitted, a third refused,
/// each admission on every master; `ZREM` frees a permit on every master, and the waiter gets
/// in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_semaphore_cycle_through_the_proxy() {
    let env = Env::start(3).await;
    let mut c = Client::connect(env.proxy.port).await;
    let k = key("semaphore-cycle");
    let mut acquire = async |id: &str| {
        let words = semaphore_acquire(&k, 2, id, 10_000);
        let args: Vec<&str> = words.iter().map(String::as_str).collect();
        c.cmd(&args).await
    };
    assert_eq!(acquire("A").await, ":1");
    assert_eq!(acquire("B").await, ":1");
    assert_eq!(acquire("C").await, ":0");
    env.until_every_master(&["ZRANGE", &k, "0", "-1"], "*[$A,$B]")
        .await;
    assert_eq!(c.cmd(&["ZREM", &k, "A"]).await, ":1");
    assert_eq!(c.cmd(&["ZCARD", &k]).await, ":1");
    let words = semaphore_acquire(&k, 2, "C", 10_000);
    let args: Vec<&str> = words.iter().map(String::as_str).collect();
    assert_eq!(c.cmd(&args).await, ":1");
    env.until_every_master(&["ZRANGE", &k, "0", "-1"], "*[$B,$C]")
        .await;
    // The script's PEXPIRE is a lease by effect: padded by drift.
    let padded = 10_000 + redlock_proxy::drift_ms(10_000, 0.01) as i64;
    for pttl in env.pttls(&k).await {
        assert!(pttl > 0 && pttl <= padded, "{pttl}");
    }
}
