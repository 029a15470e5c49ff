//! Hashes through the proxy (docs/PROTOCOL.md §3, "Hashes"): every reply, error and arity text
//! compared with one redis-server's, in RESP2 and RESP3; the command table's rows compared with
//! Redis' `COMMAND INFO`; and the TTL bound of keys that `HSET` and `HINCRBY` create, read on
//! every master.

use redlock_proxy::LocalMaster;
use redlock_testkit::key;
use redlock_testkit::launcher::Env;
use redlock_testkit::masters::master_cmd;
use redlock_testkit::resp::{Client, Reply};

/// The hash commands the proxy serves.
const HASH_COMMANDS: [&str; 7] = [
    "hset", "hincrby", "hdel", "hget", "hexists", "hlen", "hgetall",
];

/// Commands on key `k` (a hash), `n` (a hash `HINCRBY` creates), `s` (a string) and `m`
/// (missing): valid ones in every form a Redisson-style lock uses, and every kind of error the
/// masters or the command table answer.
fn session(k: &str, n: &str, s: &str, m: &str) -> Vec<Vec<String>> {
    let lines = [
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
    lines
        .iter()
        .map(|line| {
            line.replace("{k}", k)
                .replace("{n}", n)
                .replace("{s}", s)
                .replace("{m}", m)
                .split(' ')
                .map(String::from)
                .collect()
        })
        .collect()
}

/// The same commands through the proxy over 3 masters and to one redis-server, one by one, in
/// RESP2 and in RESP3: identical replies (values, types, error and arity texts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_replies_match_one_redis_in_resp2_and_resp3() {
    let env = Env::start(3).await;
    let reference = LocalMaster::start(None, &[]).unwrap();
    for protocol in ["2", "3"] {
        let mut ours = Client::connect(env.proxy.port).await;
        let mut theirs = Client::connect(reference.port).await;
        for c in [&mut ours, &mut theirs] {
            c.cmd(&["HELLO", protocol]).await;
        }
        let name = |what: &str| key(&format!("{what}{protocol}"));
        let (k, n, s, m) = (
            name("hash"),
            name("counter"),
            name("string"),
            name("missing"),
        );
        let mut compared = 0;
        for words in session(&k, &n, &s, &m) {
            let args: Vec<&str> = words.iter().map(String::as_str).collect();
            let (got, want) = (ours.cmd(&args).await, theirs.cmd(&args).await);
            assert_eq!(got, want, "RESP{protocol}: {args:?}");
            compared += 1;
        }
        assert!(compared > 55);
        // The RESP3 shape of HGETALL is told apart from RESP2's array.
        ours.cmd(&["HSET", &k, "f", "1"]).await;
        let all = ours.cmd(&["HGETALL", &k]).await;
        let shown = if protocol == "3" { "%" } else { "*" };
        assert!(all.starts_with(shown), "RESP{protocol}: {all}");
    }
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

/// The lease bound B the proxy applies (`quarantine_ms` in `INFO masters`).
async fn bound_ms(c: &mut Client) -> i64 {
    let info = c.cmd(&["INFO", "masters"]).await;
    let line = info
        .split("quarantine_ms:")
        .nth(1)
        .expect("quarantine_ms in INFO");
    let digits: String = line.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().expect("an integer")
}

async fn pttls(env: &Env, key: &str) -> Vec<i64> {
    let mut out = Vec::new();
    for port in env.ports() {
        let reply = master_cmd(port, &["PTTL", key]).await;
        out.push(reply.trim_start_matches(':').parse().expect("an integer"));
    }
    out
}

async fn assert_bound(env: &Env, key: &str, bound: i64) {
    for pttl in pttls(env, key).await {
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
    let bound = bound_ms(&mut c).await;
    assert!(bound > 60_000, "{bound}");
    let k = key("hset-bound");
    assert_eq!(c.cmd(&["HSET", &k, "holder", "1"]).await, ":1");
    assert_bound(&env, &k, bound).await;
    assert_eq!(c.cmd(&["PEXPIRE", &k, "5000"]).await, ":1");
    assert_eq!(c.cmd(&["HINCRBY", &k, "holder", "1"]).await, ":2");
    assert_eq!(c.cmd(&["HSET", &k, "other", "1"]).await, ":1");
    for pttl in pttls(&env, &k).await {
        assert!(pttl > 0 && pttl <= 5_000, "{pttl}");
    }
    for port in env.ports() {
        let all = master_cmd(port, &["HGETALL", &k]).await;
        assert_eq!(all, "*[$holder,$2,$other,$1]", "master {port}");
    }
    assert_eq!(c.cmd(&["HDEL", &k, "holder"]).await, ":1");
    assert_eq!(c.cmd(&["HDEL", &k, "other"]).await, ":1");
    assert_eq!(pttls(&env, &k).await, [-2, -2, -2]);
    // HINCRBY creates a key as HSET does (a Redisson-style reentrant acquire).
    let counted = key("hincrby-bound");
    assert_eq!(c.cmd(&["HINCRBY", &counted, "holder", "1"]).await, ":1");
    assert_bound(&env, &counted, bound).await;
    // A failed write creates nothing.
    let failed = key("hincrby-failed");
    let refused = c.cmd(&["HINCRBY", &failed, "holder", "x"]).await;
    assert!(refused.starts_with("-ERR"), "{refused}");
    assert!(c.cmd(&["HSET", &failed, "f"]).await.starts_with("-ERR"));
    assert_eq!(pttls(&env, &failed).await, [-2, -2, -2]);
}
