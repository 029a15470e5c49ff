//! Hashes through the proxy (docs/PROTOCOL.md §3, "Hashes"): every reply, error and arity text
//! compared with one redis-server's, in RESP2 and RESP3; the command table's rows compared with
//! Redis' `COMMAND INFO`; and the TTL bound of keys that `HSET` and `HINCRBY` create, read on
//! every master.

use redlock_proxy::LocalMaster;
use redlock_testkit::differential::assert_same_replies_in_resp2_and_resp3;
use redlock_testkit::key;
use redlock_testkit::launcher::{lease_bound_ms, Env};
use redlock_testkit::resp::{Client, Reply};

/// The hash commands the proxy serves.
const HASH_COMMANDS: [&str; 7] = [
    "hset", "hincrby", "hdel", "hget", "hexists", "hlen", "hgetall",
];

/// Commands on key `k` (a hash), `n` (a hash `HINCRBY` creates), `s` (a string) and `m`
/// (missing): valid ones in every form a Redisson-style lock uses, and every kind of error the
/// masters or the command table answer.
const SESSION: &[&str] = &[
    "SET {s} v",
    "HSET {k} f 1",
    "HSET {k} g 2 h 3",
    "HSET {k} f 10 g 2",
    "hset {k} i x",
    "HSET {k}",
    "HSET {k} f",
    "HSET {k} f 1 g",
    "HSET {s} f 1",
    "HINCRBY {k} f 5",
    "HINCRBY {k} f -20",
    "HINCRBY {k} i 1",
    "HINCRBY {k} f x",
    "HINCRBY {k} f 1.5",
    "HINCRBY {k} f 9223372036854775807",
    "HINCRBY {s} f 1",
    "HINCRBY {k} f",
    "HINCRBY {k} f 1 2",
    "hincrby {n} holder 1",
    "HINCRBY {n} holder 1",
    "HGET {k} f",
    "HGET {k} i",
    "HGET {k} nope",
    "HGET {m} f",
    "HGET {s} f",
    "HGET {k}",
    "HGET {k} f g",
    "HEXISTS {k} f",
    "HEXISTS {k} nope",
    "HEXISTS {m} f",
    "HEXISTS {s} f",
    "HEXISTS {k}",
    "HEXISTS {k} f g",
    "HLEN {k}",
    "HLEN {m}",
    "HLEN {s}",
    "HLEN",
    "HLEN {k} {m}",
    "HGETALL {k}",
    "HGETALL {n}",
    "HGETALL {m}",
    "HGETALL {s}",
    "HGETALL",
    "HGETALL {k} {m}",
    "HDEL {k} g nope",
    "HDEL {k} g",
    "HDEL {m} f",
    "HDEL {s} f",
    "HDEL {k}",
    "HGETALL {k}",
    "HLEN {k}",
    "HDEL {k} f h i",
    "EXISTS {k}",
    "HGETALL {k}",
    "HLEN {k}",
    "HINCRBY {n} holder -2",
    "HDEL {n} holder",
    "EXISTS {n}",
    "HGET {n} holder",
];

/// The same commands through the proxy over 3 masters and to one redis-server, one by one, in
/// RESP2 and in RESP3: identical replies (values, types, error and arity texts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_replies_match_one_redis_in_resp2_and_resp3() {
    let env = Env::start(3).await;
    let reference = LocalMaster::start(None, &[]).unwrap();
    let (ours, theirs) = (env.proxy.port, reference.port);
    assert!(SESSION.len() > 55);
    let names = ["{k}", "{n}", "{s}", "{m}"];
    let mut resp3 = assert_same_replies_in_resp2_and_resp3(ours, theirs, SESSION, &names).await;
    // The RESP3 shape of HGETALL is told apart from RESP2's array.
    let k = key("shape");
    resp3.cmd(&["HSET", &k, "f", "1"]).await;
    assert!(resp3.cmd(&["HGETALL", &k]).await.starts_with('%'));
    let mut resp2 = Client::connect(ours).await;
    assert!(resp2.cmd(&["HGETALL", &k]).await.starts_with('*'));
}

/// `COMMAND INFO` of the hash commands through the proxy: name, arity, flags and key positions
/// as redis-server reports them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_command_rows_are_redis_own() {
    let env = Env::start(3).await;
    let reference = LocalMaster::start(None, &[]).unwrap();
    let mut ours = Client::connect(env.proxy.port).await;
    let mut theirs = Client::connect(reference.port).await;
    for name in HASH_COMMANDS {
        let ask: [&[u8]; 3] = [b"COMMAND", b"INFO", name.as_bytes()];
        let row = async |c: &mut Client| match c.request(&ask).await.unwrap() {
            Reply::Array(mut rows) if rows.len() == 1 => match rows.remove(0) {
                Reply::Array(row) if row.len() >= 6 => row[..6].to_vec(),
                other => panic!("{name}: {other}"),
            },
            other => panic!("{name}: {other}"),
        };
        assert_eq!(row(&mut ours).await, row(&mut theirs).await, "{name}");
    }
}

async fn assert_bound(env: &Env, key: &str, bound: i64) {
    let within = |pttl: i64| pttl > bound - 5_000 && pttl <= bound;
    for pttl in env.pttls_when(key, within).await {
        assert!(
            pttl > bound - 5_000 && pttl <= bound,
            "{key}: {pttl} of {bound}"
        );
    }
}

/// A key `HSET` or `HINCRBY` creates gets the lease bound on every master; a TTL of its own (a
/// lock's `PEXPIRE`) is kept by later writes, never lengthened; `HDEL` of the last field deletes
/// it on every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_writes_never_leave_a_key_without_expiry() {
    let env = Env::start(3).await;
    let mut c = Client::connect(env.proxy.port).await;
    let bound = lease_bound_ms(&mut c).await;
    assert!(bound > 60_000, "{bound}");
    let k = key("hset-bound");
    assert_eq!(c.cmd(&["HSET", &k, "holder", "1"]).await, ":1");
    assert_bound(&env, &k, bound).await;
    assert_eq!(c.cmd(&["PEXPIRE", &k, "5000"]).await, ":1");
    assert_eq!(c.cmd(&["HINCRBY", &k, "holder", "1"]).await, ":2");
    assert_eq!(c.cmd(&["HSET", &k, "other", "1"]).await, ":1");
    env.until_every_master(&["HGETALL", &k], "*[$holder,$2,$other,$1]")
        .await;
    for pttl in env.pttls_when(&k, |p| p > 0 && p <= 5_000).await {
        assert!(pttl > 0 && pttl <= 5_000, "{pttl}");
    }
    assert_eq!(c.cmd(&["HDEL", &k, "holder"]).await, ":1");
    assert_eq!(c.cmd(&["HDEL", &k, "other"]).await, ":1");
    assert_eq!(env.pttls_when(&k, |p| p == -2).await, [-2, -2, -2]);
    // HINCRBY creates a key as HSET does (a Redisson-style reentrant acquire).
    let counted = key("hincrby-bound");
    assert_eq!(c.cmd(&["HINCRBY", &counted, "holder", "1"]).await, ":1");
    assert_bound(&env, &counted, bound).await;
    // A failed write creates nothing.
    let failed = key("hincrby-failed");
    let refused = c.cmd(&["HINCRBY", &failed, "holder", "x"]).await;
    assert!(refused.starts_with("-ERR"), "{refused}");
    assert!(c.cmd(&["HSET", &failed, "f"]).await.starts_with("-ERR"));
    assert_eq!(env.pttls_when(&failed, |p| p == -2).await, [-2, -2, -2]);
}
