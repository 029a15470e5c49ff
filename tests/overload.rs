//! Slow is not dead (issue 38): a master that answers late keeps its connection and votes
//! again the moment it is on time, and a request too large to send on is refused without any
//! other client waiting for it, read past without being buffered, its connection serving what
//! follows. Real redis-servers; the late master sits behind a delaying
//! relay. Node timeouts here are long enough that no scheduler hiccup reaches them: what is
//! checked is behaviour (connections kept, votes counted), never a duration.

use redlock_testkit::launcher::{master_number, master_state, Env};
use redlock_testkit::masters::master_get;
use redlock_testkit::{eventually, key};
use std::time::{Duration, Instant};

const NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// The refusal of a 10 MB argument at the default `max_value_bytes`.
const TEN_MB_REFUSED: &str = "-ERR string exceeds maximum allowed size (max_value_bytes 65536 of redlock-proxy): an argument of 10485760 bytes";

/// `(connects, retired_connections)` of master `i` in the proxy's `INFO masters`.
fn connections(info: &str, i: usize) -> (Option<i64>, Option<i64>) {
    (
        master_number(info, i, "connects"),
        master_number(info, i, "retired_connections"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_answering_twice_the_node_timeout_late_keeps_its_connection_and_votes_again() {
    let (env, relays) =
        Env::start_behind_relays(3, |c| c.node_timeout_ms = NODE_TIMEOUT.as_millis() as u64).await;
    let mut c = env.proxy.client().await;
    let before = c.cmd(&["INFO", "masters"]).await;
    let timeouts_before = master_number(&before, 1, "missing_timeout").unwrap_or_default();
    // A node timeout each way: every reply of master 1 comes two node timeouts after its
    // request, for 5 s. Masters 0 and 2 are a quorum: every acquire is still granted.
    relays[1].set_delay(NODE_TIMEOUT);
    let late_until = Instant::now() + Duration::from_secs(5);
    let mut n = 0;
    while Instant::now() < late_until && n < 100 {
        let k = format!("{}:{n}", key("late"));
        assert_eq!(c.cmd(&["SET", &k, "v", "NX", "PX", "30000"]).await, "+OK");
        n += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let during = c.cmd(&["INFO", "masters"]).await;
    assert!(
        master_number(&during, 1, "missing_timeout").unwrap_or_default() > timeouts_before,
        "master 1's late votes were not missing: {during}"
    );
    // The delay ends: master 1 votes again on the connection it had all along.
    relays[1].set_delay(Duration::ZERO);
    let port = env.ports()[1];
    let mut m = 0;
    let voted = eventually(Duration::from_secs(10), async || {
        m += 1;
        let k = format!("{}:{m}", key("on-time"));
        c.cmd(&["SET", &k, "v", "NX", "PX", "30000"]).await == "+OK"
            && eventually(Duration::from_secs(1), async || {
                master_get(port, &k).await.is_some()
            })
            .await
    })
    .await;
    assert!(voted, "master 1 took no acquire after its delay ended");
    let after = c.cmd(&["INFO", "masters"]).await;
    assert_eq!(
        connections(&after, 1),
        connections(&before, 1),
        "master 1's connection was replaced: {after}"
    );
    assert_eq!(master_state(&after, 1), Some("up"), "{after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_above_max_value_bytes_is_refused_and_no_other_client_waits_for_it() {
    let env = Env::start_with(5, |c| c.node_timeout_ms = NODE_TIMEOUT.as_millis() as u64).await;
    let mut c = env.proxy.client().await;
    let before = c.cmd(&["INFO", "masters"]).await;
    // Small acquires on four connections for as long as the large requests go on.
    let stop = Instant::now() + Duration::from_secs(3);
    let small: Vec<_> = (0..4)
        .map(|client| {
            let proxy = env.proxy.port;
            tokio::spawn(async move {
                let mut c = redlock_testkit::resp::Client::connect(proxy).await;
                let (mut granted, mut other) = (0, Vec::new());
                while Instant::now() < stop && granted < 10_000 {
                    let k = format!("{}:{client}:{granted}", key("small"));
                    match c.cmd(&["SET", &k, "v", "NX", "PX", "30000"]).await.as_str() {
                        "+OK" => granted += 1,
                        reply => other.push(reply.to_string()),
                    }
                }
                (granted, other)
            })
        })
        .collect();
    let big = "x".repeat(10 * 1024 * 1024);
    let too_big = key("too-big");
    for _ in 0..3 {
        let reply = c.cmd(&["SET", &too_big, &big, "NX", "PX", "5000"]).await;
        assert_eq!(reply, TEN_MB_REFUSED);
    }
    // At the cap a value goes through; one byte more does not.
    let at_cap = key("at-cap");
    let value = "y".repeat(64 * 1024);
    assert_eq!(
        c.cmd(&["SET", &at_cap, &value, "NX", "PX", "30000"]).await,
        "+OK"
    );
    let over = format!("{value}y");
    assert!(c
        .cmd(&["SET", &key("over-cap"), &over, "NX", "PX", "30000"])
        .await
        .starts_with("-ERR string exceeds maximum allowed size"));
    for task in small {
        let (granted, other) = task.await.expect("a small client ran");
        assert!(granted > 0, "a small client was never granted");
        assert!(other.is_empty(), "small acquires not granted: {other:?}");
    }
    for port in env.ports() {
        assert_eq!(master_get(port, &too_big).await, None);
    }
    let after = c.cmd(&["INFO", "masters"]).await;
    for i in 0..5 {
        assert_eq!(connections(&after, i), connections(&before, i), "{after}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_above_max_value_bytes_is_read_past_unbuffered_and_the_connection_goes_on() {
    // The query buffer limit at its least (1 MiB): a proxy that buffered a 10 MB request would
    // close the connection at 1 MiB, without a reply. Reading past it holds a read's worth.
    let env = Env::start_with(1, |c| c.client_query_buffer_limit = 1024 * 1024).await;
    let mut c = env.proxy.client().await;
    let big = "x".repeat(10 * 1024 * 1024);
    let k = key("read-past");
    // All in one write: each request parsed behind the one read past. An unknown command with
    // a 10 MB argument gets the same refusal (the check comes before the command lookup).
    let replies = c
        .pipeline(&[
            vec!["SET", &k, &big, "NX", "PX", "30000"],
            vec!["PING"],
            vec!["NOSUCHCOMMAND", &big],
            vec!["SET", &k, "v", "NX", "PX", "30000"],
        ])
        .await;
    // The last acquire is granted: the refused one took nothing.
    assert_eq!(replies, [TEN_MB_REFUSED, "+PONG", TEN_MB_REFUSED, "+OK"]);
    assert_eq!(c.cmd(&["PING"]).await, "+PONG");
}
