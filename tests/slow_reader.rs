//! Clients that do not read their replies: they must not stall anyone else (acquires and
//! fan-outs progress whatever their client does), and one whose waiting replies pass
//! `client_output_buffer_limit` is disconnected, the grants it was never given rolled back.

use redlock_proxy::MAX_FANOUTS;
use redlock_testkit::key;
use redlock_testkit::launcher::{Env, BEHAVIOUR_NODE_TIMEOUT_MS};
use redlock_testkit::masters::master_cmd;
use redlock_testkit::resp::{encode_str, Client, Silent};
use std::time::Duration;
use tokio::time::{sleep, timeout, Instant};

/// How long another client may wait for an answer (CI machines are noisy).
const ANSWER: Duration = Duration::from_secs(5);

/// A reply larger than the socket buffers: an `ECHO` of this many bytes.
const LARGE_REPLY: usize = 8 << 20;

/// The proxy's configuration for a large reply: `max_value_bytes` (64 KiB by default) refuses
/// the `ECHO` that makes it, with a short error, so it is raised above it.
fn echoes_large(c: &mut redlock_proxy::Config) {
    c.node_timeout_ms = BEHAVIOUR_NODE_TIMEOUT_MS;
    c.max_value_bytes = 2 * LARGE_REPLY as u64;
}

/// The event of a keyspace notification (`*[$message,$__keyspace@0__:key,$set]` → `set`).
fn event(message: &str) -> Option<&str> {
    let body = message.strip_prefix("*[$message,")?.strip_suffix(']')?;
    body.rsplit(",$").next()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_does_not_stall_others() {
    let test = async {
        let env = Env::start_with(3, echoes_large).await;
        let port = env.proxy.port;
        let k = key("slow-reader-stall");
        let other = key("slow-reader-other");
        let probe = key("slow-reader-probe");
        let large = "x".repeat(LARGE_REPLY);
        // The large reply is made (not refused): what the silent clients below leave unread.
        let mut reader = env.proxy.client().await;
        let echoed = reader.try_cmd(&["ECHO", &large], ANSWER).await;
        assert_eq!(
            echoed.map(|r| r.len()),
            Some(LARGE_REPLY + 1),
            "the large ECHO"
        );

        // A: a reply larger than the socket buffers, then an acquire of `k`; never reads.
        let mut a = encode_str(&["ECHO", &large]);
        a.extend(encode_str(&["SET", &k, "a", "NX", "PX", "30000"]));
        let _a = Silent::start(port, a).await;
        // A2: the same large reply, then more fan-outs than the proxy runs at once
        // (`MAX_FANOUTS`); never reads. Its fan-outs must finish and give their permits back
        // while its socket is full.
        let mut hog = encode_str(&["ECHO", &large]);
        for _ in 0..MAX_FANOUTS + 44 {
            hog.extend(encode_str(&["GET", &probe]));
        }
        let _a2 = Silent::start(port, hog).await;
        sleep(Duration::from_millis(500)).await;

        // B contends for `k`: an answer (null while A holds it, or OK), not a wait without end.
        let mut b = env.proxy.client().await;
        let reply = b
            .try_cmd(&["SET", &k, "b", "NX", "PX", "30000"], ANSWER)
            .await;
        assert!(
            matches!(reply.as_deref(), Some("$nil") | Some("+OK")),
            "B's acquire of a key a non-reading client asked for got {reply:?} within {ANSWER:?}"
        );
        let value = b.try_cmd(&["GET", &k], ANSWER).await;
        assert!(
            matches!(value.as_deref(), Some("$a") | Some("$b") | Some("$nil")),
            "B's GET got {value:?} within {ANSWER:?}"
        );
        // C, on another key, while A and A2 still read nothing.
        let mut c = env.proxy.client().await;
        let reply = c
            .try_cmd(&["SET", &other, "c", "NX", "PX", "30000"], ANSWER)
            .await;
        assert_eq!(
            reply.as_deref(),
            Some("+OK"),
            "C's acquire of a free key within {ANSWER:?}"
        );
    };
    timeout(Duration::from_secs(60), test)
        .await
        .expect("the test finishes within 60 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_the_output_limit_is_disconnected_and_its_grant_rolled_back() {
    let test = async {
        let env = Env::start_with(3, |c| {
            c.node_timeout_ms = BEHAVIOUR_NODE_TIMEOUT_MS;
            c.client_output_buffer_limit = 1 << 20;
        })
        .await;
        let port = env.proxy.port;
        let k = key("slow-reader-limit");

        // Watch `k` on every master: the grant (`set`) and its rollback (`del`) show there.
        let mut watchers = Vec::new();
        for master in env.ports() {
            let reply =
                master_cmd(master, &["CONFIG", "SET", "notify-keyspace-events", "KA"]).await;
            assert_eq!(reply, "+OK");
            let mut watcher = Client::connect(master).await;
            watcher
                .send(&["SUBSCRIBE", &format!("__keyspace@0__:{k}")])
                .await;
            let confirmed = watcher.read().await;
            assert!(confirmed.starts_with("*[$subscribe,"), "{confirmed}");
            watchers.push(watcher);
        }

        // A: 16 replies of 512 KiB (8 MiB, far more than socket buffers take), then an acquire
        // of `k`, all in one small write the proxy reads at once; A never reads. The acquire's
        // OK comes after those 8 MiB, so it cannot have been handed to the socket when the
        // output limit (1 MiB) closes the connection: the grant must be rolled back.
        const AHEAD: usize = 16;
        const SIZE: usize = 512 * 1024;
        let script = format!("return string.rep('x', {SIZE})");
        let mut pipeline = Vec::new();
        for _ in 0..AHEAD {
            pipeline.extend(encode_str(&["EVAL", &script, "0"]));
        }
        pipeline.extend(encode_str(&["SET", &k, "a", "NX", "PX", "30000"]));
        assert!(pipeline.len() < 4096, "one read of the proxy takes it all");
        let ahead = AHEAD * (format!("${SIZE}\r\n").len() + SIZE + 2);
        let mut a = Silent::start(port, pipeline).await;

        // On a majority of masters: A's value set, then deleted (10 s bound).
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut rolled_back = 0;
        let mut seen_all = Vec::new();
        for watcher in &mut watchers {
            let mut seen: Vec<String> = Vec::new();
            while !(seen.iter().any(|e| e == "set") && seen.last().is_some_and(|e| e == "del")) {
                let left = deadline.saturating_duration_since(Instant::now());
                let Some(message) = watcher.try_read(left).await else {
                    break;
                };
                seen.extend(event(&message).map(str::to_string));
            }
            let set = seen.iter().position(|e| e == "set");
            if set.is_some_and(|at| seen[at..].iter().any(|e| e == "del")) {
                rolled_back += 1;
            }
            seen_all.push(seen);
        }
        assert!(
            rolled_back >= 2,
            "A's grant of {k} was not rolled back on a majority within 10 s; events per master: {seen_all:?}"
        );

        // The proxy closed A (the rollback comes after the disconnect), and A was never sent
        // its OK: what A can still read ends before the acquire's reply.
        let (received, closed) = a.drain(std::time::Instant::now() + ANSWER).await;
        assert!(
            closed,
            "the proxy did not close the connection of A (it read {received} bytes, then nothing)"
        );
        assert!(
            received < ahead,
            "A received {received} bytes, so its OK may have been written (replies ahead: {ahead})"
        );

        // `k` is free on every master, and another client gets it.
        let free_by = Instant::now() + Duration::from_secs(10);
        loop {
            let values = env.values(&k).await;
            if values.iter().all(Option::is_none) {
                break;
            }
            assert!(Instant::now() < free_by, "{k} still on masters: {values:?}");
            sleep(Duration::from_millis(20)).await;
        }
        let mut b = env.proxy.client().await;
        let reply = b
            .try_cmd(&["SET", &k, "b", "NX", "PX", "30000"], ANSWER)
            .await;
        assert_eq!(
            reply.as_deref(),
            Some("+OK"),
            "B acquires {k} once A's grant is rolled back"
        );
        assert!(env.holders(&k, "b").await >= 2);
    };
    timeout(Duration::from_secs(60), test)
        .await
        .expect("the test finishes within 60 s");
}
