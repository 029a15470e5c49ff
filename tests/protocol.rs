//! Being a Redis to clients: redis-cli, RESP3, pipelining order, inline commands, handshakes,
//! and protocol errors compared byte for byte with a real redis-server.

use redlock_proxy::on_master::COMPARE_AND_DELETE;
use redlock_proxy::LocalMaster;
use redlock_testkit::key;
use redlock_testkit::launcher::Env;
use redlock_testkit::resp::{assert_same_replies, encode_str, redis_cli, Client};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_one_shot_session() {
    let env = Env::start(3).await;
    let port = env.proxy.port;
    let k = key("cli");
    let run = move |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        redis_cli(port, &args)
    };
    let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let k2 = k.clone();
    let out = tokio::task::spawn_blocking(move || {
        vec![
            run(s(&["PING"])),
            run(s(&["SET", &k2, "tok", "NX", "PX", "30000"])),
            run(s(&["SET", &k2, "other", "NX", "PX", "30000"])),
            run(s(&["GET", &k2])),
            run(s(&["EVAL", COMPARE_AND_DELETE.text(), "1", &k2, "tok"])),
            run(s(&["GET", &k2])),
            run(s(&["-3", "SET", &k2, "x", "NX", "PX", "30000"])),
            run(s(&["-3", "SET", &k2, "y", "NX", "PX", "30000"])),
            run(s(&["-3", "HELLO", "3"])),
            run(s(&["FLUSHALL"])),
        ]
    })
    .await
    .unwrap();
    assert_eq!(out[0], "PONG\n");
    assert_eq!(out[1], "OK\n");
    assert_eq!(out[2], "\n"); // redis-cli prints an empty line for nil when not a tty
    assert_eq!(out[3], "tok\n");
    assert_eq!(out[4], "1\n");
    assert_eq!(out[5], "\n");
    assert_eq!(out[6], "OK\n");
    assert_eq!(out[7], "\n");
    assert!(out[8].contains("proto 3\n"), "{}", out[8]);
    assert!(
        out[9].starts_with("ERR 'FLUSHALL' is refused by redlock-proxy"),
        "{}",
        out[9]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp3_through_the_redis_crate() {
    let env = Env::start(3).await;
    let url = format!("redis://127.0.0.1:{}/?protocol=resp3", env.proxy.port);
    let client = redis::Client::open(url).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let k = key("resp3");
    let acquire = |value: &str| {
        let mut cmd = redis::cmd("SET");
        cmd.arg(&k).arg(value).arg("NX").arg("PX").arg(30000);
        cmd
    };
    let granted: redis::Value = acquire("v").query_async(&mut con).await.unwrap();
    assert_eq!(granted, redis::Value::Okay);
    let contended: redis::Value = acquire("w").query_async(&mut con).await.unwrap();
    assert_eq!(contended, redis::Value::Nil);
    let released: i64 = redis::Script::new(COMPARE_AND_DELETE.text())
        .key(&k)
        .arg("v")
        .invoke_async(&mut con)
        .await
        .unwrap();
    assert_eq!(released, 1);
    // Raw RESP3 bytes: null is `_`, HELLO answers a map.
    let mut c = env.proxy.client().await;
    let hello = c.cmd(&["HELLO", "3"]).await;
    assert!(hello.starts_with("%{$server:$redis,$version:"), "{hello}");
    assert!(hello.contains("$proto::3"), "{hello}");
    c.cmd(&["SET", &k, "v", "NX", "PX", "30000"]).await;
    assert_eq!(c.cmd(&["SET", &k, "w", "NX", "PX", "30000"]).await, "_");
    assert!(c.cmd(&["INFO"]).await.starts_with("=txt:# Server"));
    assert_eq!(
        c.cmd(&["HELLO", "4"]).await,
        "-NOPROTO unsupported protocol version"
    );
    c.cmd(&["HELLO", "2"]).await;
    assert_eq!(c.cmd(&["SET", &k, "w", "NX", "PX", "30000"]).await, "$nil");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_pipelined_mixed_commands_come_back_in_order() {
    let env = Env::start(3).await;
    let mut c = env.proxy.client().await;
    let mut bytes = Vec::new();
    let mut expected = Vec::new();
    for i in 0..1000 {
        let k = format!("{}:{}", key("pipe"), i % 7);
        let v = format!("v{i}");
        let (cmd, want): (Vec<String>, String) = match i % 5 {
            0 => (vec!["ECHO".into(), v.clone()], format!("${v}")),
            1 => (
                vec![
                    "SET".into(),
                    k.clone(),
                    v.clone(),
                    "NX".into(),
                    "PX".into(),
                    "30000".into(),
                ],
                String::new(),
            ),
            2 => (vec!["GET".into(), k.clone()], String::new()),
            3 => (vec!["DEL".into(), k.clone()], String::new()),
            _ => (vec!["PING".into()], "+PONG".into()),
        };
        let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        bytes.extend(encode_str(&args));
        expected.push((i, cmd, want));
    }
    bytes.extend_from_slice(b"PING\r\n");
    c.send_raw(&bytes).await;
    // Replay the same sequence on one real Redis to know what each reply must be.
    let reference = LocalMaster::start(None, &[]).unwrap();
    let mut r = Client::connect(reference.port).await;
    r.send_raw(&bytes).await;
    for (i, _cmd, want) in &expected {
        let got = c.read().await;
        let theirs = r.read().await;
        assert_eq!(got, theirs, "reply {i} differs from one Redis");
        if !want.is_empty() {
            assert_eq!(&got, want, "reply {i}");
        }
    }
    assert_eq!(c.read().await, "+PONG");
}

/// Inputs whose replies (and close behaviour) must match a real redis-server byte for byte.
const MALFORMED: &[&[u8]] = &[
    b"*3000000000\r\n",
    b"*x\r\n",
    b"*1\r\n$-10\r\n",
    b"*1\r\n$04\r\nPING\r\n",
    b"*1\r\n$+4\r\nPING\r\n",
    b"*1\r\n$2000000000\r\n",
    b"*1\r\nfoo\r\n",
    b"set \"\"\"k\"\"\" v\r\n",
    b"*0\r\n*-10\r\nPING\r\n",
    b"\x00\x01\x02\r\n",
    b"*\x00\r\n",
    b"$\x00\r\n",
    b"PING\r\nECHO \"hi there\"\r\n",
    b"*2\r\n$4\r\nECHO\r\n$3\r\nabc\r\n*1\r\n$3\r\nFOO\r\n",
    b"*1\r\n$3\r\nGET\r\n",
    b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nXX\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n",
    b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nNX\r\n$2\r\nXX\r\n",
    b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nPX\r\n$3\r\nabc\r\n",
    b"*6\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nNX\r\n$2\r\nPX\r\n$1\r\n0\r\n",
    b"*3\r\n$5\r\nHELLO\r\n$1\r\n3\r\n$3\r\nBAD\r\n",
    b"*2\r\n$6\r\nSELECT\r\n$1\r\nx\r\n",
    b"*2\r\n$6\r\nCLIENT\r\n$4\r\nNOPE\r\n",
    b"*2\r\n$6\r\nCLIENT\r\n$5\r\nHELLO\r\n",
    b"*2\r\n$4\r\nAUTH\r\n$1\r\nx\r\n",
    b"*3\r\n$4\r\nEVAL\r\n$8\r\nreturn 1\r\n$1\r\n0\r\n",
    b"*3\r\n$7\r\nEVALSHA\r\n$40\r\n0000000000000000000000000000000000000000\r\n$1\r\n0\r\n",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_errors_match_redis_and_the_proxy_keeps_serving() {
    let env = Env::start(1).await;
    let reference = LocalMaster::start(None, &[]).unwrap();
    // Every input on its own pair of connections, all at once (each ends with a read timeout).
    let checks = MALFORMED.iter().map(|input| {
        let (proxy_port, redis_port) = (env.proxy.port, reference.port);
        async move {
            let (mut ours, mut theirs) = assert_same_replies(proxy_port, redis_port, input).await;
            // Then both close the connection, or both keep it open (2 s).
            let (closed, redis_closed) = tokio::join!(ours.is_closed(), theirs.is_closed());
            assert_eq!(
                closed,
                redis_closed,
                "connection closed after {:?}: proxy {closed}, redis-server {redis_closed}",
                String::from_utf8_lossy(input)
            );
            // Still serving everyone else.
            let mut other = Client::connect(proxy_port).await;
            assert_eq!(other.cmd(&["PING"]).await, "+PONG");
        }
    });
    futures::future::join_all(checks).await;
    // Truncated frames: a half request then a close must not disturb anything.
    for cut in [1usize, 5, 9, 14] {
        let full = encode_str(&["SET", "k", "v", "NX", "PX", "1000"]);
        let mut c = env.proxy.client().await;
        c.send_raw(&full[..cut]).await;
        drop(c);
    }
    let mut other = env.proxy.client().await;
    assert_eq!(other.cmd(&["PING"]).await, "+PONG");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_commands_answer_like_redis() {
    let env = Env::start(3).await;
    let mut c = env.proxy.client().await;
    // What redis-py, node-redis and ioredis send on connect, pipelined.
    let replies = c
        .pipeline(&[
            vec!["CLIENT", "SETINFO", "LIB-NAME", "redis-py"],
            vec!["CLIENT", "SETINFO", "LIB-VER", "8.1.0"],
            vec![
                "CLIENT",
                "MAINT_NOTIFICATIONS",
                "ON",
                "moving-endpoint-type",
                "internal-ip",
            ],
            vec!["SELECT", "0"],
            vec!["CLIENT", "SETNAME", "worker-1"],
            vec!["CLIENT", "GETNAME"],
        ])
        .await;
    assert_eq!(replies[0], "+OK");
    assert_eq!(replies[1], "+OK");
    assert_eq!(
        replies[2],
        "-ERR unknown subcommand 'MAINT_NOTIFICATIONS'. Try CLIENT HELP."
    );
    assert_eq!(replies[3], "+OK");
    assert_eq!(replies[4], "+OK");
    assert_eq!(replies[5], "$worker-1");
    let info = c.cmd(&["INFO"]).await;
    assert!(info.contains("loading:0"), "{info}");
    assert!(info.contains("redis_version:"), "{info}");
    assert!(
        info.contains("# Masters\r\nmasters:3\r\nquorum:2"),
        "{info}"
    );
    assert!(info.contains("master0:addr=127.0.0.1:"), "{info}");
    assert!(info.contains("state=up"), "{info}");
    assert!(c
        .cmd(&["CLIENT", "INFO"])
        .await
        .contains("lib-name=redis-py lib-ver=8.1.0"));
    assert!(c
        .cmd(&["SELECT", "1"])
        .await
        .starts_with("-ERR SELECT 1 is refused"));
    assert!(c
        .cmd(&["MULTI"])
        .await
        .starts_with("-ERR 'MULTI' is refused by redlock-proxy"));
    assert!(c
        .cmd(&["SETNX", "k", "v"])
        .await
        .starts_with("-ERR SETNX is refused"));
    assert!(c.cmd(&["COMMAND", "DOCS"]).await.starts_with("*["));
    assert!(c
        .cmd(&["COMMAND", "INFO", "set"])
        .await
        .starts_with("*[*[$set,:-3,"));
    assert_eq!(c.cmd(&["ECHO", "x"]).await, "$x");
    assert_eq!(c.cmd(&["RESET"]).await, "+RESET");
    assert_eq!(c.cmd(&["CLIENT", "GETNAME"]).await, "$nil");
    assert_eq!(c.cmd(&["QUIT"]).await, "+OK");
    assert!(c.is_closed().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bulk_is_refused_without_buffering_it() {
    let env = Env::start_with(1, |c| {
        c.proto_max_bulk_len = 1024 * 1024;
        // Not this test's cap: an argument at proto_max_bulk_len must pass it.
        c.max_value_bytes = 1024 * 1024;
    })
    .await;
    let mut c = env.proxy.client().await;
    c.send_raw(b"*2\r\n$4\r\nECHO\r\n$1048577\r\n").await;
    assert_eq!(c.read().await, "-ERR Protocol error: invalid bulk length");
    assert!(c.is_closed().await);
    // Exactly at the cap is fine.
    let mut c = env.proxy.client().await;
    let big = "x".repeat(1024 * 1024);
    assert_eq!(c.cmd(&["ECHO", &big]).await.len(), big.len() + 1);
}
