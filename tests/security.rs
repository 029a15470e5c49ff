//! Clients → proxy security: passwords and users as redis-server has them (byte for byte
//! against a real one configured the same way), key patterns between tenants, Redis' pre-auth
//! limits, `maxclients`, the idle `timeout`, the query buffer limit against a slowloris, and
//! HTTP requests sent to the RESP port (cross-protocol scripting). Real clients (redis-cli, redis-py, ioredis) authenticate with users.

use redlock_proxy::on_master::COMPARE_AND_DELETE;
use redlock_proxy::{Config, LocalMaster};
use redlock_testkit::key;
use redlock_testkit::launcher::Env;
use redlock_testkit::resp::{assert_same_replies, redis_cli, Client};
use sha2::Digest;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The proxy's users, and the same on a redis-server by `CONFIG SET` / `ACL SETUSER`.
fn with_users(config: &mut Config) {
    let users = r#"
        requirepass = "secret"
        [[users]]
        name = "alice"
        password = "pw"
        keys = ["app:*"]
        [[users]]
        name = "bob"
        enabled = false
        password = "pw"
        keys = ["*"]
        [[users]]
        name = "carol"
        password_sha256 = ["a43547358f6eda1a31f352c388d9290d296e6c8e6436edce81da55e710b982f6"]
        keys = ["~jobs:*"]
    "#;
    let parsed: Config = toml::from_str(users).unwrap();
    config.requirepass = parsed.requirepass;
    config.users = parsed.users;
}

const REDIS_USERS: &[&[&str]] = &[
    &["ACL", "SETUSER", "alice", "on", ">pw", "~app:*", "+@all"],
    &["ACL", "SETUSER", "bob", "off", ">pw", "~*", "+@all"],
    &[
        "ACL",
        "SETUSER",
        "carol",
        "on",
        ">carol-pw",
        "~jobs:*",
        "+@all",
    ],
    &["CONFIG", "SET", "requirepass", "secret"],
];

/// Byte sequences whose replies (and close behaviour) must be those of redis-server.
const SESSIONS: &[&[u8]] = &[
    b"PING\r\n",
    b"ECHO x\r\nCLIENT ID\r\nINFO\r\nACL WHOAMI\r\nGET k\r\n",
    b"HELLO 3\r\n",
    b"HELLO\r\n",
    b"HELLO 3 AUTH default nope\r\n",
    b"HELLO 3 AUTH alice wrong SETNAME x\r\nPING\r\n",
    b"AUTH nope\r\nPING\r\n",
    b"AUTH a b c\r\n",
    b"AUTH\r\n",
    b"AUTH secret\r\nPING\r\nACL WHOAMI\r\n",
    b"AUTH default secret\r\nAUTH alice wrong\r\nACL WHOAMI\r\n",
    b"AUTH alice pw\r\nGET x\r\nGET app:1\r\nEVAL \"return 1\" 1 x\r\nEVAL \"return 1\" 0\r\nDEL app:1 x\r\nEXISTS app:1 app:2\r\nACL WHOAMI\r\n",
    b"AUTH alice pw\r\nEVAL \"return 1\" 2 app:x y\r\nEVAL \"return 1\" 1 app:x\r\nPTTL jobs:1\r\n",
    b"AUTH carol carol-pw\r\nGET jobs:7\r\nGET app:7\r\nACL WHOAMI\r\n",
    b"AUTH bob pw\r\nPING\r\n",
    b"AUTH secret\r\nRESET\r\nPING\r\n",
    b"QUIT\r\n",
    b"FOO bar\r\n",
    b"GET\r\n",
    b"*11\r\n",
    b"*2\r\n$16385\r\n",
    b"*2\r\n$4\r\nAUTH\r\n$16384\r\n",
    b"AUTH secret\r\n*2\r\n$4\r\nECHO\r\n$16385\r\n",
    b"AUTH secret\r\n*11\r\n$4\r\nPING\r\n",
    // Before AUTH, Redis checks a subcommand's arity first; the proxy says NOAUTH
    // (docs/PROTOCOL.md §11), so only the authenticated half is compared.
    b"AUTH secret\r\nACL WHOAMI extra\r\nACL NOPE\r\nACL\r\n",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_users_and_pre_auth_limits_answer_as_redis_does() {
    let env = Env::start_with(1, with_users).await;
    let reference = LocalMaster::start(None, &[]).unwrap();
    let mut admin = Client::connect(reference.port).await;
    for command in REDIS_USERS {
        assert_eq!(admin.cmd(command).await, "+OK", "{command:?}");
    }
    // carol's password as the proxy holds it (SHA-256 of "carol-pw").
    assert_eq!(
        hex::encode(sha2::Sha256::digest(b"carol-pw")),
        "a43547358f6eda1a31f352c388d9290d296e6c8e6436edce81da55e710b982f6"
    );
    // Every session on its own pair of connections, all at once (each ends with a timeout).
    let (proxy_port, redis_port) = (env.proxy.port, reference.port);
    let checks = SESSIONS.iter().map(|session| async move {
        let (mut ours, mut theirs) = assert_same_replies(proxy_port, redis_port, session).await;
        let (a, b) = tokio::join!(ours.is_closed(), theirs.is_closed());
        assert_eq!(a, b, "close after {:?}", String::from_utf8_lossy(session));
    });
    futures::future::join_all(checks).await;
    // The proxy's own refusal of user management (Redis would manage its users).
    let mut c = env.proxy.client().await;
    assert_eq!(c.cmd(&["AUTH", "secret"]).await, "+OK");
    let refused = c.cmd(&["ACL", "SETUSER", "mallory", "on"]).await;
    assert!(
        refused.starts_with("-ERR 'ACL SETUSER' is refused by redlock-proxy"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_touch_or_release_another_tenants_lock() {
    let env = Env::start_with(3, |config| {
        config.users = toml::from_str::<Config>(
            r#"
            [[users]]
            name = "default"
            enabled = false
            [[users]]
            name = "tenant-a"
            password = "a-pw"
            keys = ["a:*"]
            [[users]]
            name = "tenant-b"
            password = "b-pw"
            keys = ["b:*"]
            "#,
        )
        .unwrap()
        .users;
    })
    .await;
    let lock = format!("a:{}", key("lock"));
    let mut a = env.proxy.client().await;
    let mut b = env.proxy.client().await;
    // The default user is disabled: nobody is in without credentials.
    assert_eq!(a.cmd(&["PING"]).await, "-NOAUTH Authentication required.");
    // As Redis with `default off nopass`: no password to check, and the user is off.
    assert!(a
        .cmd(&["AUTH", "anything"])
        .await
        .starts_with("-ERR AUTH <password> called without any password configured"));
    assert_eq!(
        a.cmd(&["AUTH", "default", "anything"]).await,
        "-WRONGPASS invalid username-password pair or user is disabled."
    );
    assert_eq!(a.cmd(&["AUTH", "tenant-a", "a-pw"]).await, "+OK");
    assert_eq!(b.cmd(&["AUTH", "tenant-b", "b-pw"]).await, "+OK");
    assert_eq!(
        a.cmd(&["SET", &lock, "mine", "NX", "PX", "30000"]).await,
        "+OK"
    );
    const NOPERM: &str =
        "-NOPERM this user has no permissions to access one of the keys used as arguments";
    for attempt in [
        vec!["EVAL", COMPARE_AND_DELETE.text(), "1", &lock, "mine"],
        vec!["DEL", &lock],
        vec!["LOCK.RELEASE", &lock, "mine"],
        vec!["PEXPIRE", &lock, "1"],
        vec!["SET", &lock, "theirs", "NX", "PX", "30000"],
        vec!["LOCK.TOKEN", &lock, "mine"],
        vec!["GET", &lock],
    ] {
        assert_eq!(b.cmd(&attempt).await, NOPERM, "{attempt:?}");
    }
    // Still held by a majority (the third master's copy may land after the reply).
    assert!(env.holders(&lock, "mine").await >= 2);
    // B's own keys work, A's release works.
    let theirs = format!("b:{}", key("lock"));
    assert_eq!(
        b.cmd(&["SET", &theirs, "x", "NX", "PX", "30000"]).await,
        "+OK"
    );
    assert_eq!(
        a.cmd(&["EVAL", COMPARE_AND_DELETE.text(), "1", &lock, "mine"])
            .await,
        ":1"
    );
    env.assert_gone(&lock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_clients_authenticate_with_users() {
    let env = Env::start_with(3, with_users).await;
    let port = env.proxy.port;
    let lock = format!("app:{}", key("real"));
    // redis-cli --user --pass.
    let cli = {
        let lock = lock.clone();
        tokio::task::spawn_blocking(move || {
            let base = ["--user", "alice", "--pass", "pw", "--no-auth-warning"];
            let run = |extra: &[&str]| {
                let args: Vec<&str> = base.iter().chain(extra).copied().collect();
                redis_cli(port, &args)
            };
            (
                run(&["SET", &lock, "cli", "NX", "PX", "30000"]),
                run(&["EVAL", COMPARE_AND_DELETE.text(), "1", &lock, "cli"]),
                run(&["GET", "other:key"]),
                redis_cli(
                    port,
                    &[
                        "--user",
                        "alice",
                        "--pass",
                        "bad",
                        "--no-auth-warning",
                        "PING",
                    ],
                ),
            )
        })
        .await
        .unwrap()
    };
    assert_eq!(cli.0, "OK\n");
    assert_eq!(cli.1, "1\n");
    assert!(cli.2.starts_with("NOPERM"), "{}", cli.2);
    // redis-cli reports the failed AUTH on stderr; the command after it is refused.
    assert!(cli.3.contains("NOAUTH"), "{}", cli.3);

    // redis-py: username/password, RESP2 and RESP3 (HELLO 3 AUTH), its Lock class.
    let deps = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/.deps");
    let python = r#"
import redis, sys
port, key = int(sys.argv[1]), sys.argv[2]
for proto in (2, 3):
    r = redis.Redis(port=port, username="alice", password="pw", protocol=proto)
    lock = r.lock(key, timeout=30)
    assert lock.acquire(blocking=False), proto
    assert r.execute_command("ACL", "WHOAMI") in (b"alice", "alice")
    lock.release()
    try:
        r.get("other:key")
        raise SystemExit("NOPERM expected")
    except redis.exceptions.NoPermissionError:
        pass
try:
    redis.Redis(port=port, username="alice", password="nope").ping()
    raise SystemExit("WRONGPASS expected")
except redis.exceptions.AuthenticationError:
    pass
print("python ok")
"#;
    let out = tokio::process::Command::new(deps.join("venv/bin/python"))
        .args(["-c", python, &port.to_string(), &lock])
        .output()
        .await
        .expect("redis-py (tests/clients/install.sh)");
    assert_printed(&out, "python ok");

    // ioredis: username/password.
    let node = r#"
const Redis = require("ioredis");
const [port, key] = process.argv.slice(1);
(async () => {
  const r = new Redis({ port: +port, username: "alice", password: "pw", lazyConnect: true });
  await r.connect();
  if ((await r.set(key, "io", "PX", 30000, "NX")) !== "OK") throw new Error("no grant");
  if ((await r.call("ACL", "WHOAMI")) !== "alice") throw new Error("whoami");
  await r.get("other:key").then(() => { throw new Error("NOPERM expected"); },
    (e) => { if (!/NOPERM/.test(e.message)) throw e; });
  await r.del(key);
  r.disconnect();
  const bad = new Redis({ port: +port, username: "alice", password: "nope", lazyConnect: true,
    maxRetriesPerRequest: 0, retryStrategy: () => null });
  let refusal = "";
  bad.on("error", (e) => { refusal = e.message; });
  await bad.connect().then(() => { throw new Error("WRONGPASS expected"); }, () => {});
  if (!/WRONGPASS/.test(refusal)) throw new Error("got: " + refusal);
  bad.disconnect();
  console.log("node ok");
})().catch((e) => { console.error(e); process.exit(1); });
"#;
    let out = tokio::process::Command::new("node")
        .args(["-e", node, &port.to_string(), &lock])
        .env("NODE_PATH", deps.join("node/node_modules"))
        .output()
        .await
        .expect("node");
    assert_printed(&out, "node ok");
}

/// A client script's output says `what` (else its stderr is the failure).
fn assert_printed(out: &std::process::Output, what: &str) {
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(what),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maxclients_refuses_with_redis_text_and_frees_the_slot() {
    let env = Env::start_with(1, |config| config.maxclients = 2).await;
    let mut first = served(env.proxy.port).await;
    let _second = served(env.proxy.port).await;
    let mut third = env.proxy.client().await;
    assert_eq!(third.read().await, "-ERR max number of clients reached");
    assert!(third.is_closed().await);
    assert_eq!(first.cmd(&["PING"]).await, "+PONG");
    drop(first);
    // The slot comes back once the proxy has seen the close.
    served(env.proxy.port).await;
}

/// A connection the proxy serves: retried (bounded) while a connection that was just closed
/// still holds its slot.
async fn served(port: u16) -> Client {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut client = Client::connect(port).await;
        match client.try_cmd(&["PING"], Duration::from_secs(2)).await {
            Some(reply) if reply == "+PONG" => return client,
            other => assert!(Instant::now() < deadline, "still refused: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_clients_are_closed_after_timeout_and_busy_ones_are_not() {
    let env = Env::start_with(1, |config| config.timeout = 1).await;
    let mut idle = env.proxy.client().await;
    let mut busy = env.proxy.client().await;
    assert_eq!(idle.cmd(&["PING"]).await, "+PONG");
    let started = Instant::now();
    // `busy` talks every 200 ms for 2.5 s: never idle for a whole second.
    while started.elapsed() < Duration::from_millis(2500) {
        assert_eq!(busy.cmd(&["PING"]).await, "+PONG");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // `idle` has said nothing for 2.5 s > 1 s: closed, without a reply.
    assert!(idle.is_closed().await);
    assert_eq!(busy.cmd(&["PING"]).await, "+PONG");
}

/// Resident memory of a process, in KiB (Linux `/proc`).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_costs_bounded_memory_and_is_closed() {
    let masters = redlock_proxy::LocalCluster::start(1).unwrap();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_redlock-proxy"));
    let limit = 1024 * 1024;
    let config = std::env::temp_dir().join(format!("slowloris-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        format!("client_query_buffer_limit = {limit}\nrequirepass = \"secret\"\n"),
    )
    .unwrap();
    let proxy = redlock_testkit::launcher::ProxyProcess::start(
        bin,
        &masters.addrs(),
        &["--config".into(), config.display().to_string()],
    )
    .unwrap();
    let before = rss_kib(proxy.pid());

    // Before AUTH: a bulk over 16 KiB is refused at its header, whatever follows.
    let mut early = Client::connect(proxy.port).await;
    early
        .send_raw(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$500000000\r\n")
        .await;
    assert_eq!(
        early.read().await,
        "-ERR Protocol error: unauthenticated bulk length"
    );
    assert!(early.is_closed().await);

    // After AUTH: a 100 MB argument, over max_value_bytes, is read past, never buffered (the
    // query buffer limit is 1 MiB), and refused; the connection serves what follows.
    let mut big = Client::connect(proxy.port).await;
    let value = "x".repeat(100 << 20);
    assert_eq!(
        big.pipeline(&[vec!["AUTH", "secret"], vec!["SET", "k", &value], vec!["PING"]])
            .await,
        [
            "+OK",
            "-ERR string exceeds maximum allowed size (max_value_bytes 65536 of redlock-proxy): an argument of 104857600 bytes",
            "+PONG"
        ]
    );
    drop(value);
    let read_past = rss_kib(proxy.pid());
    assert!(
        read_past < before + 16 * 1024,
        "RSS grew from {before} KiB to {read_past} KiB reading past 100 MB"
    );

    // After AUTH: a request of 100,000 arguments announced, each under max_value_bytes, sent
    // in small pieces; the proxy buffers at most the query buffer limit, then closes the
    // connection (and logs it).
    let mut slow = Client::connect(proxy.port).await;
    assert_eq!(slow.cmd(&["AUTH", "secret"]).await, "+OK");
    slow.send_raw(b"*100000\r\n").await;
    let arg = [&b"$60000\r\n"[..], &[b'x'; 60_000], b"\r\n"].concat();
    let stream = arg.repeat(4 * limit / arg.len() + 1);
    let mut sent = 0usize;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut closed = false;
    for piece in stream.chunks(4096) {
        if Instant::now() >= deadline {
            break;
        }
        if slow.write(piece).await.is_err() {
            closed = true;
            break;
        }
        sent += piece.len();
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    closed = closed || slow.is_closed().await;
    assert!(closed, "still open after {sent} bytes");
    assert!(sent >= limit, "closed after only {sent} bytes");
    let after = rss_kib(proxy.pid());
    // Bounded: the growth is the limit's order (the buffer doubles as it fills, and the
    // allocator keeps freed segments for reuse), not the announced 6 GB.
    assert!(
        after < before + 32 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
    assert!(proxy.warnings.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    // The proxy still serves others.
    let mut other = Client::connect(proxy.port).await;
    assert_eq!(
        other
            .pipeline(&[vec!["AUTH", "secret"], vec!["PING"]])
            .await,
        vec!["+OK", "+PONG"]
    );
    let _ = std::fs::remove_file(config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenants_example_config_works_as_its_comments_say() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/tenants.toml");
    let example = Config::from_file(&path).unwrap();
    example.validate().unwrap();
    let env = Env::start_with(3, |config| config.users = example.users.clone()).await;
    let mut c = env.proxy.client().await;
    assert_eq!(c.cmd(&["PING"]).await, "-NOAUTH Authentication required.");
    assert_eq!(c.cmd(&["AUTH", "orders-svc", "orders-pw"]).await, "+OK");
    let lock = format!("orders:{}", key("example"));
    assert_eq!(
        c.cmd(&["SET", &lock, "me", "NX", "PX", "5000"]).await,
        "+OK"
    );
    assert!(c
        .cmd(&["SET", "billing:1", "me", "NX", "PX", "5000"])
        .await
        .starts_with("-NOPERM"));
}

/// What a raw connection to `port` receives after sending `parts` (one write each, 300 ms
/// apart), and whether the server closed it: read until the server closes it or 3 s pass.
async fn raw_exchange(port: u16, parts: &[&[u8]]) -> (String, bool) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        stream.write_all(part).await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => received.extend_from_slice(&buf[..n]),
            Err(_) => break false,
        }
    };
    (String::from_utf8_lossy(&received).into_owned(), closed)
}

/// An HTTP request sent to the RESP port (a browser made to post to it: cross-protocol
/// scripting) is dropped as redis-server drops it: a command named `POST` or `Host:` closes
/// the connection without a reply (nor the replies still unwritten before it), and says so in
/// the log, once a minute at most. Compared byte for byte with a real redis-server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_requests_on_the_resp_port_are_dropped_as_redis_drops_them() {
    const ATTACK: &str = "Possible SECURITY ATTACK detected";
    let masters = redlock_proxy::LocalCluster::start(3).unwrap();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_redlock-proxy"));
    let proxy = redlock_testkit::launcher::ProxyProcess::start(bin, &masters.addrs(), &[]).unwrap();
    let redis = LocalMaster::start(None, &[]).expect("redis-server");
    let cases: &[&[&[u8]]] = &[
        &[b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 4\r\n\r\nPING"],
        &[b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"],
        // The request line's reply is written before the `Host:` line arrives.
        &[b"GET / HTTP/1.1\r\n", b"Host: localhost\r\n\r\n"],
        &[b"PING\r\npost /x HTTP/1.0\r\n"],
        &[b"*1\r\n$4\r\nPOST\r\n"],
        &[b"host: localhost\r\n"],
    ];
    for parts in cases {
        let (from_redis, redis_closed) = raw_exchange(redis.port, parts).await;
        let sent = String::from_utf8_lossy(&parts.concat()).into_owned();
        assert!(redis_closed, "redis-server kept {sent:?} open");
        let from_proxy = raw_exchange(proxy.port, parts).await;
        assert_eq!(from_proxy, (from_redis, true), "{sent:?}");
    }
    // Other clients are served as before.
    let mut c = Client::connect(proxy.port).await;
    assert_eq!(c.cmd(&["PING"]).await, "+PONG");
    // Logged once for all of them, as redis-server does within a minute.
    assert!(
        redlock_testkit::eventually(Duration::from_secs(5), async || {
            !proxy.logged(&[ATTACK]).is_empty()
        })
        .await,
        "not logged"
    );
    let logged = proxy.logged(&[ATTACK]);
    assert_eq!(logged.len(), 1, "{logged:#?}");
    assert!(logged[0].contains("\"level\":\"WARN\""), "{}", logged[0]);
}
