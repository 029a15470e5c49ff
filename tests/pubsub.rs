//! Pub/sub through the proxy (docs/PROTOCOL.md, "Pub/sub"): RESP2's subscribed mode and RESP3's
//! pushes compared frame by frame with one redis-server's; one message per publish with two
//! proxies over five masters (a client's `PUBLISH` and a script's `redis.call('publish', …)`);
//! a message passed on once a quorum of masters delivered it (a minority's, a node timeout
//! later); messages while a master is paused; a master that dies mid-subscription subscribed
//! again when it returns.

use redlock_proxy::{Config, LocalMaster};
use redlock_testkit::key;
use redlock_testkit::launcher::{Env, Proxy};
use redlock_testkit::masters::{master_cmd, signal};
use redlock_testkit::resp::{Client, Reply};
use std::time::Duration;
use std::time::Instant;

/// Ample for any frame on a loaded machine: tests wait for what must arrive, never for time.
const PATIENCE: Duration = Duration::from_secs(10);

/// Which connection a step is sent on: the subscriber or the publisher.
#[derive(Clone, Copy)]
enum On {
    Sub,
    Pub,
}

/// The session: (connection, command, frames the subscriber then receives, frames the
/// publisher receives). `{a}`, `{b}`, `{c}`: channels; `{p}`: a pattern matching `{a}` and
/// `{b}`, not `{c}`; `{s}`: a shard channel.
const SESSION: &[(On, &str, usize, usize)] = &[
    (On::Sub, "SUBSCRIBE {a} {b}", 2, 0),
    (On::Sub, "SUBSCRIBE {a}", 1, 0),
    (On::Sub, "PSUBSCRIBE {p}", 1, 0),
    (On::Sub, "GET x", 1, 0),
    (On::Sub, "SET x 1", 1, 0),
    (On::Sub, "PING", 1, 0),
    (On::Sub, "PING hi", 1, 0),
    (On::Sub, "SUBSCRIBE", 1, 0),
    (On::Pub, "PUBLISH {a} hello", 2, 1),
    (On::Pub, "PUBLISH {b} world", 2, 1),
    (On::Pub, "PUBLISH {a} hello", 2, 1),
    (On::Pub, "PUBLISH {c} nobody", 0, 1),
    (On::Pub, "PUBLISH {a}", 0, 1),
    (On::Pub, "PUBSUB NUMSUB {a} {b} {c}", 0, 1),
    (On::Pub, "PUBSUB NUMSUB", 0, 1),
    (On::Pub, "PUBSUB NUMPAT x", 0, 1),
    (On::Pub, "PUBSUB NOPE", 0, 1),
    (On::Sub, "UNSUBSCRIBE {a} {c}", 2, 0),
    (On::Pub, "PUBLISH {a} gone", 1, 1),
    (On::Sub, "PUNSUBSCRIBE", 1, 0),
    (On::Sub, "UNSUBSCRIBE", 1, 0),
    (On::Sub, "UNSUBSCRIBE", 1, 0),
    (On::Sub, "PUNSUBSCRIBE {p}", 1, 0),
    (On::Sub, "GET x", 1, 0),
    (On::Sub, "SSUBSCRIBE {s}", 1, 0),
    (On::Pub, "SPUBLISH {s} m", 1, 1),
    (On::Pub, "PUBLISH {s} not-a-shard-message", 0, 1),
    (On::Pub, "PUBSUB SHARDNUMSUB {s}", 0, 1),
    (On::Sub, "PING", 1, 0),
    (On::Sub, "SUNSUBSCRIBE", 1, 0),
    (On::Sub, "SUBSCRIBE {b}", 1, 0),
    (On::Sub, "RESET", 1, 0),
    (On::Pub, "PUBLISH {b} after-reset", 0, 1),
    (On::Sub, "PING", 1, 0),
];

/// One side of the comparison: a subscriber and a publisher connection to one server.
struct Side {
    sub: Client,
    publisher: Client,
}

impl Side {
    async fn open(port: u16, protocol: &str) -> Side {
        let mut side = Side {
            sub: Client::connect(port).await,
            publisher: Client::connect(port).await,
        };
        for c in [&mut side.sub, &mut side.publisher] {
            // HELLO's own reply names the server: not compared.
            c.cmd(&["HELLO", protocol]).await;
        }
        side
    }

    /// Sends `args` on `on` and reads the frames each connection then receives.
    async fn step(&mut self, on: On, args: &[&str], frames: (usize, usize)) -> Vec<Reply> {
        let deadline = Instant::now() + PATIENCE;
        match on {
            On::Sub => self.sub.send(args).await,
            On::Pub => self.publisher.send(args).await,
        }
        let mut got = Vec::new();
        for _ in 0..frames.1 {
            got.push(
                self.publisher
                    .read_reply(deadline)
                    .await
                    .expect("publisher frame"),
            );
        }
        for _ in 0..frames.0 {
            got.push(
                self.sub
                    .read_reply(deadline)
                    .await
                    .expect("subscriber frame"),
            );
        }
        got
    }
}

#[tokio::test]
async fn subscribed_mode_and_pushes_match_one_redis_server() {
    let env = Env::start(3).await;
    let redis = LocalMaster::start(None, &[]).expect("redis-server");
    for protocol in ["2", "3"] {
        let base = key(&format!("ps{protocol}"));
        let names = [
            ("{a}", format!("{base}.a")),
            ("{b}", format!("{base}.b")),
            ("{c}", format!("{base}.c")),
            ("{p}", format!("{base}.[ab]")),
            ("{s}", format!("{base}.s")),
        ];
        let mut ours = Side::open(env.proxy.port, protocol).await;
        let mut theirs = Side::open(redis.port, protocol).await;
        for &(on, line, to_sub, to_pub) in SESSION {
            let line = names
                .iter()
                .fold(line.to_string(), |l, (n, v)| l.replace(n, v));
            let args: Vec<&str> = line.split(' ').collect();
            let want = theirs.step(on, &args, (to_sub, to_pub)).await;
            let got = ours.step(on, &args, (to_sub, to_pub)).await;
            assert_eq!(got, want, "RESP{protocol}: {line}");
        }
        // Nothing more arrived at either subscriber (no copy of a message from a second
        // master, no frame the session did not count).
        for side in [&mut ours, &mut theirs] {
            let extra = side.sub.try_read(Duration::from_millis(300)).await;
            assert_eq!(extra, None, "RESP{protocol}: an extra frame");
        }
    }
}

/// Reads `count` messages (RESP2 arrays) from `sub`; their payloads in order.
async fn payloads(sub: &mut Client, count: usize) -> Vec<String> {
    let deadline = Instant::now() + PATIENCE;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        match sub.read_reply(deadline).await.expect("a message") {
            Reply::Array(items) if items.len() == 3 => {
                out.push(items[2].text().expect("a payload"))
            }
            other => panic!("not a message: {other:?}"),
        }
    }
    out
}

#[tokio::test]
async fn one_message_per_publish_with_two_proxies_over_five_masters() {
    // Copies are matched within the node timeout: one no scheduler hiccup reaches.
    let slow = |c: &mut Config| c.node_timeout_ms = 2000;
    let env = Env::start_with(5, slow).await;
    let second = Proxy::start(env.masters.addrs(), slow).await;
    let channel = key("wake");
    let mut sub = second.client().await;
    let confirmed = sub.cmd(&["SUBSCRIBE", &channel]).await;
    assert!(confirmed.contains("subscribe"), "{confirmed}");
    let mut publisher = env.proxy.client().await;
    let mut sent = Vec::new();
    for i in 0..40 {
        // Distinct payloads, and the same payload again and again (Redisson's unlock message
        // is always the same bytes): each publish is one message.
        let payload = if i % 2 == 0 {
            format!("m{i}")
        } else {
            "0".to_string()
        };
        let receivers = publisher.cmd(&["PUBLISH", &channel, &payload]).await;
        assert_eq!(
            receivers, ":1",
            "the subscribing proxy counts as one receiver"
        );
        sent.push(payload);
    }
    // A script's publish runs on every master: one message too.
    let script = "redis.call('publish', ARGV[1], ARGV[2]) return 1";
    let ran = publisher
        .cmd(&["EVAL", script, "0", &channel, "from-script"])
        .await;
    assert_eq!(ran, ":1");
    sent.push("from-script".to_string());
    assert_eq!(payloads(&mut sub, sent.len()).await, sent);
    assert_eq!(
        sub.try_read(Duration::from_millis(500)).await,
        None,
        "a copy from another master got through"
    );
    // The second proxy passed on one copy of each publish and dropped the other masters'.
    let stats = second.client().await.cmd(&["INFO", "stats"]).await;
    let delivered = format!("pubsub_messages_delivered:{}\r\n", sent.len());
    let dropped = format!("pubsub_copies_dropped:{}\r\n", sent.len() * 4);
    assert!(
        stats.contains(&delivered) && stats.contains(&dropped),
        "{stats}"
    );
    assert!(stats.contains("pubsub_channels:1\r\n"), "{stats}");
    // Every master counts one receiver: the second proxy's subscription.
    for port in env.ports() {
        let numsub = master_cmd(port, &["PUBSUB", "NUMSUB", &channel]).await;
        assert_eq!(numsub, format!("*[${channel},:1]"));
    }
}

/// A message is passed on once a quorum of masters delivered it (the publish ran on a
/// quorum: a lock waiter woken by a release's message finds the lock released there), not at
/// its first copy; one that only a minority delivers is passed on a node timeout after its
/// first copy. Before (the first copy passed on at once) the subscriber had the message after
/// the first master's copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_waits_for_a_quorum_of_masters_or_a_node_timeout() {
    // The wait for a quorum's copies: one no scheduler hiccup reaches.
    const WINDOW: Duration = Duration::from_secs(5);
    let window = |c: &mut Config| c.node_timeout_ms = WINDOW.as_millis() as u64;
    let env = Env::start_with(5, window).await;
    let ports = env.ports();
    let channel = key("quorum");
    let mut sub = env.proxy.client().await;
    sub.cmd(&["SUBSCRIBE", &channel]).await;
    // Subscribed on every master (the reply came once a quorum was).
    let subscribed = format!("*[${channel},:1]");
    let deadline = Instant::now() + PATIENCE;
    for port in &ports {
        while master_cmd(*port, &["PUBSUB", "NUMSUB", &channel]).await != subscribed {
            assert!(Instant::now() < deadline, "not subscribed on {port}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Two of five masters publish (as a release's script runs on them first): nothing yet.
    let first = Instant::now();
    for port in &ports[..2] {
        assert_eq!(master_cmd(*port, &["PUBLISH", &channel, "0"]).await, ":1");
    }
    assert_eq!(
        sub.try_read(WINDOW / 5).await,
        None,
        "passed on before a quorum of masters published"
    );
    // The third: passed on now, long before the node timeout would have.
    assert_eq!(
        master_cmd(ports[2], &["PUBLISH", &channel, "0"]).await,
        ":1"
    );
    assert_eq!(payloads(&mut sub, 1).await, ["0"]);
    assert!(first.elapsed() < WINDOW, "{:?}", first.elapsed());
    // The last two copies are copies.
    for port in &ports[3..] {
        assert_eq!(master_cmd(*port, &["PUBLISH", &channel, "0"]).await, ":1");
    }
    assert_eq!(sub.try_read(WINDOW / 5).await, None, "a copy got through");
    // A publish on one master only: passed on once the node timeout has run out, not before.
    let alone = Instant::now();
    assert_eq!(
        master_cmd(ports[4], &["PUBLISH", &channel, "1"]).await,
        ":1"
    );
    assert_eq!(payloads(&mut sub, 1).await, ["1"]);
    assert!(alone.elapsed() >= WINDOW / 2, "{:?}", alone.elapsed());
}

#[tokio::test]
async fn messages_flow_with_a_master_paused_and_after_one_returns() {
    let mut env = Env::start(3).await;
    let channel = key("paused");
    let pid = env.masters.masters[0].pid().expect("running");
    signal(pid, "STOP");
    // Subscribed on the two others (a quorum), answered without waiting for the paused one.
    let mut sub = env.proxy.client().await;
    sub.cmd(&["SUBSCRIBE", &channel]).await;
    let mut publisher = env.proxy.client().await;
    assert_eq!(publisher.cmd(&["PUBLISH", &channel, "one"]).await, ":1");
    assert_eq!(payloads(&mut sub, 1).await, ["one"]);
    signal(pid, "CONT");
    // Killed mid-subscription and restarted: the proxy subscribes there again, so a publish
    // on that master alone reaches the subscriber (a node timeout later: one master of three
    // is not a quorum).
    env.masters.masters[0].kill();
    assert_eq!(publisher.cmd(&["PUBLISH", &channel, "two"]).await, ":1");
    assert_eq!(payloads(&mut sub, 1).await, ["two"]);
    env.masters.masters[0].restart(&[]).expect("restart");
    let port = env.masters.masters[0].port;
    let deadline = Instant::now() + PATIENCE;
    let subscribed = format!("*[${channel},:1]");
    while master_cmd(port, &["PUBSUB", "NUMSUB", &channel]).await != subscribed {
        assert!(
            Instant::now() < deadline,
            "not subscribed again on the restarted master"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        master_cmd(port, &["PUBLISH", &channel, "three"]).await,
        ":1"
    );
    assert_eq!(payloads(&mut sub, 1).await, ["three"]);
}

#[tokio::test]
async fn subscribers_show_in_client_list_as_redis_shows_them() {
    let env = Env::start(3).await;
    let (channel, pattern) = (key("listed"), format!("{}*", key("listed")));
    let mut sub = env.proxy.client().await;
    sub.cmd(&["SUBSCRIBE", &channel]).await;
    sub.cmd(&["PSUBSCRIBE", &pattern]).await;
    let mut resp3 = env.proxy.client().await;
    resp3.cmd(&["HELLO", "3"]).await;
    resp3.cmd(&["SUBSCRIBE", &channel]).await;
    let mut observer = env.proxy.client().await;
    // RESP2 in subscribed mode is of type pubsub; a RESP3 subscriber stays normal (Redis'
    // `getClientType`); both carry the P flag and their counts.
    let pubsub = observer.cmd(&["CLIENT", "LIST", "TYPE", "pubsub"]).await;
    assert_eq!(pubsub.lines().count(), 1, "{pubsub}");
    assert!(
        pubsub.contains(" flags=P db=0 sub=1 psub=1 ssub=0 "),
        "{pubsub}"
    );
    let normal = observer.cmd(&["CLIENT", "LIST", "TYPE", "normal"]).await;
    assert_eq!(normal.lines().count(), 2, "{normal}");
    assert!(
        normal.contains(" flags=P db=0 sub=1 psub=0 ssub=0 "),
        "{normal}"
    );
    sub.cmd(&["UNSUBSCRIBE"]).await;
    sub.cmd(&["PUNSUBSCRIBE"]).await;
    let after = observer.cmd(&["CLIENT", "LIST", "TYPE", "pubsub"]).await;
    assert_eq!(
        after, "$",
        "a client that left every channel is normal again"
    );
}
