//! Fencing tokens through the proxy over real masters: the `LOCK.*` commands, tokens that
//! increase across proxies, proxy restarts and the data loss of a minority, and the negative
//! control (tokens proposed without the masters' clocks go backwards after such a loss).

use redlock_proxy::{Config, LocalCluster};
use redlock_testkit::launcher::{Proxy, BEHAVIOUR_NODE_TIMEOUT_MS};
use redlock_testkit::masters::{master_cmd, signal};
use redlock_testkit::resp::Client;
use redlock_testkit::scripts::ACQUIRE_OR_EXTEND;
use redlock_testkit::{eventually, key, lock_grant};
use std::time::{Duration, Instant};

/// A short TTL cap, so the quarantine of a master that lost its data (the cap + drift) is
/// short too.
const CAP_MS: u64 = 1500;

fn settings(c: &mut Config) {
    c.node_timeout_ms = BEHAVIOUR_NODE_TIMEOUT_MS;
    c.max_lock_ttl_ms = CAP_MS;
}

/// Waits until `n` masters are up (voting) on this proxy, at most 10 s.
async fn up(c: &mut Client, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = c.cmd(&["INFO", "masters"]).await;
        if info.matches("state=up").count() == n {
            return;
        }
        assert!(Instant::now() < deadline, "masters not up: {info}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn acquire(c: &mut Client, k: &str, v: &str) -> Option<u64> {
    let reply = c.cmd(&["LOCK.ACQUIRE", k, v, "1000"]).await;
    if reply == "*nil" || reply == "$nil" {
        return None;
    }
    let (token, validity) = lock_grant(&reply).unwrap_or_else(|| panic!("{reply}"));
    assert!(validity > 900 && validity <= 1000, "{reply}");
    Some(token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_commands_answer_tokens_extend_and_release() {
    let masters = LocalCluster::start(3).unwrap();
    let proxy = Proxy::start(masters.addrs(), settings).await;
    let mut c = proxy.client().await;
    up(&mut c, 3).await;
    let k = key("fence");
    let first = acquire(&mut c, &k, "a").await.expect("granted");
    assert_eq!(acquire(&mut c, &k, "b").await, None, "held");
    assert_eq!(c.cmd(&["LOCK.TOKEN", &k, "a"]).await, format!(":{first}"));
    assert_eq!(c.cmd(&["LOCK.TOKEN", &k, "b"]).await, "$nil");
    let extended = c.cmd(&["LOCK.EXTEND", &k, "a", "1200"]).await;
    let validity: u64 = extended.trim_start_matches(':').parse().expect(&extended);
    assert!(validity > 1100 && validity <= 1200, "{extended}");
    assert_eq!(c.cmd(&["LOCK.EXTEND", &k, "b", "1200"]).await, "$nil");
    assert_eq!(c.cmd(&["LOCK.RELEASE", &k, "b"]).await, ":0");
    assert_eq!(c.cmd(&["LOCK.RELEASE", &k, "a"]).await, ":1");
    assert_eq!(c.cmd(&["LOCK.RELEASE", &k, "a"]).await, ":0");
    // A plain `SET NX PX` grant carries a token too.
    assert_eq!(c.cmd(&["SET", &k, "c", "NX", "PX", "1000"]).await, "+OK");
    let token = c.cmd(&["LOCK.TOKEN", &k, "c"]).await;
    let second: u64 = token.trim_start_matches(':').parse().expect(&token);
    assert!(second > first, "{second} <= {first}");
    // Redis' own texts for bad arguments, and the cap.
    let cases: [(&[&str], &str); 6] = [
        (
            &["LOCK.ACQUIRE", &k, "v"],
            "-ERR wrong number of arguments for 'lock.acquire' command",
        ),
        (
            &["LOCK.TOKEN", &k],
            "-ERR wrong number of arguments for 'lock.token' command",
        ),
        (
            &["LOCK.ACQUIRE", &k, "v", "abc"],
            "-ERR value is not an integer or out of range",
        ),
        (
            &["LOCK.ACQUIRE", &k, "v", "0"],
            "-ERR invalid expire time in 'lock.acquire' command",
        ),
        (
            &["LOCK.EXTEND", &k, "v", "-5"],
            "-ERR invalid expire time in 'lock.extend' command",
        ),
        (
            &["LOCK.ACQUIRE", &k, "v", "1501"],
            "-ERR lock TTL 1501 ms is refused by redlock-proxy: above max_lock_ttl_ms (1500 ms)",
        ),
    ];
    for (cmd, expected) in cases {
        assert_eq!(c.cmd(cmd).await, expected, "{cmd:?}");
    }
    let listed = c.cmd(&["COMMAND", "INFO", "lock.acquire"]).await;
    assert!(listed.contains("lock.acquire"), "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_proxies_and_a_proxy_restart() {
    let masters = LocalCluster::start(3).unwrap();
    let one = Proxy::start(masters.addrs(), settings).await;
    let two = Proxy::start(masters.addrs(), settings).await;
    let k = key("fence-two");
    let mut tokens = Vec::new();
    let mut c1 = one.client().await;
    let mut c2 = two.client().await;
    up(&mut c1, 3).await;
    up(&mut c2, 3).await;
    for round in 0..20 {
        let c = if round % 2 == 0 { &mut c1 } else { &mut c2 };
        let v = format!("v{round}");
        tokens.push(acquire(c, &k, &v).await.expect("granted"));
        assert_eq!(c.cmd(&["LOCK.RELEASE", &k, &v]).await, ":1");
    }
    drop(c1);
    let one = one.restart(|| {}).await;
    let mut c1 = one.client().await;
    up(&mut c1, 3).await;
    tokens.push(
        acquire(&mut c1, &k, "after-restart")
            .await
            .expect("granted"),
    );
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

/// Master 2 misses the grants (paused), master 1 then loses its data and sits out its
/// quarantine; a proxy started afterwards acquires with masters 1 and 2, neither of which
/// remembers the key's counter.
async fn token_after_a_minority_lost_the_counter(clock: bool) -> (u64, u64) {
    let masters = LocalCluster::start(3).unwrap();
    let ports: Vec<u16> = masters.masters.iter().map(|m| m.port).collect();
    let first = Proxy::start(masters.addrs(), settings).await;
    let mut c = first.client().await;
    up(&mut c, 3).await;
    let k = key("fence-amnesia");
    let paused = masters.masters[2].pid().expect("pid");
    signal(paused, "STOP");
    let mut last = 0;
    for round in 0..3 {
        let v = format!("v{round}");
        last = acquire(&mut c, &k, &v)
            .await
            .expect("granted on masters 0 and 1");
        assert_eq!(c.cmd(&["LOCK.RELEASE", &k, &v]).await, ":1");
    }
    signal(paused, "CONT");
    assert_eq!(master_cmd(ports[1], &["FLUSHALL"]).await, "+OK");
    drop(c);
    first.stop().await;
    let second = Proxy::start(masters.addrs(), |c| {
        settings(c);
        c.token_clock = clock;
    })
    .await;
    let mut c = second.client().await;
    // Master 1 is quarantined for the cap + drift, then every master votes again.
    up(&mut c, 3).await;
    // Master 0 still refuses a token at or below its counter: acquire with masters 1 and 2.
    signal(masters.masters[0].pid().expect("pid"), "STOP");
    let after = acquire(&mut c, &k, "late")
        .await
        .expect("granted on masters 1 and 2");
    signal(masters.masters[0].pid().expect("pid"), "CONT");
    (last, after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_that_lost_its_counters_never_lets_a_token_go_back() {
    let (before, after) = token_after_a_minority_lost_the_counter(true).await;
    assert!(after > before, "token went back: {after} after {before}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_clock_a_lost_counter_lets_a_token_go_back() {
    // Negative control: tokens proposed as a bare counter (no clock floor) regress.
    let (before, after) = token_after_a_minority_lost_the_counter(false).await;
    assert!(
        after < before,
        "expected a regression, got {after} after {before}"
    );
}

/// The protected resource of the fencing argument: accepts a write only with a token above the
/// last one it accepted.
#[derive(Default)]
struct TokenCheckingResource {
    last: u64,
    value: Option<String>,
}

impl TokenCheckingResource {
    fn write(&mut self, token: u64, value: &str) -> Result<(), String> {
        if token <= self.last {
            return Err(format!("stale token {token} (last {})", self.last));
        }
        self.last = token;
        self.value = Some(value.to_string());
        Ok(())
    }
}

/// Kleppmann's scenario: a holder pauses for twice its TTL; another client takes the lock and
/// writes; the paused holder then writes with its old token and is rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_lease_is_fenced_off() {
    let masters = LocalCluster::start(3).unwrap();
    let proxy = Proxy::start(masters.addrs(), settings).await;
    let mut paused = proxy.client().await;
    let mut other = proxy.client().await;
    up(&mut paused, 3).await;
    let k = key("fence-paused");
    let mut resource = TokenCheckingResource::default();
    let ttl_ms: u64 = 300;
    let reply = paused
        .cmd(&["LOCK.ACQUIRE", &k, "a", &ttl_ms.to_string()])
        .await;
    let (old, _) = lock_grant(&reply).expect(&reply);
    tokio::time::sleep(Duration::from_millis(2 * ttl_ms)).await;
    let reply = other
        .cmd(&["LOCK.ACQUIRE", &k, "b", &ttl_ms.to_string()])
        .await;
    let (new, _) = lock_grant(&reply).expect(&reply);
    resource.write(new, "b").expect("the new holder writes");
    let late = resource.write(old, "a");
    assert!(late.is_err(), "the paused holder's write was accepted");
    assert_eq!(resource.value.as_deref(), Some("b"));
}

/// A lease through a local variable, set apart from the value (`SET NX`, then `PEXPIRE`).
const SET_THEN_PEXPIRE: &str = "local ttl = tonumber(ARGV[2]) if redis.call('set', KEYS[1], ARGV[1], 'NX') then redis.call('pexpire', KEYS[1], ttl) return {1, redis.call('pttl', KEYS[1])} end return {0, 0}";

async fn eval(c: &mut Client, script: &str, k: &str, v: &str, ttl: &str) -> String {
    c.cmd(&["EVAL", script, "1", k, v, ttl]).await
}

async fn token_of(c: &mut Client, k: &str, v: &str) -> Option<u64> {
    let reply = c.cmd(&["LOCK.TOKEN", k, v]).await;
    (reply != "$nil").then(|| reply.trim_start_matches(':').parse().expect(&reply))
}

/// Waits (at most 10 s) until no master holds `k`: a release is answered once a majority
/// deleted it, and the next step must not find it on the last one.
async fn released_everywhere(ports: &[u16], k: &str) {
    let gone = eventually(Duration::from_secs(10), async || {
        for port in ports {
            if master_cmd(*port, &["EXISTS", k]).await != ":0" {
                return false;
            }
        }
        true
    })
    .await;
    assert!(gone, "{k} still held on a master");
}

/// A lock taken by a client's own script gets a fencing token of its own, above the key's
/// earlier grants, whatever the script's spelling; an extend keeps it; a run whose token the
/// masters refuse leaves `LOCK.TOKEN` answering null (never an earlier holder's token) and
/// lifts later proposals above what they reported (docs/SAFETY.md, "Tokens for locks taken by
/// scripts").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_by_a_script_gets_a_token_of_its_own() {
    let masters = LocalCluster::start(3).unwrap();
    let ports: Vec<u16> = masters.masters.iter().map(|m| m.port).collect();
    // The default cap: a token window of some 15 s, wide enough to plant a counter ahead of
    // every clock below.
    let proxy = Proxy::start(masters.addrs(), |c| {
        c.node_timeout_ms = BEHAVIOUR_NODE_TIMEOUT_MS
    })
    .await;
    let mut c = proxy.client().await;
    up(&mut c, 3).await;
    let k = key("script-fence");
    // A grant through `LOCK.ACQUIRE`, released: its counter stays on the masters.
    let first = c.cmd(&["LOCK.ACQUIRE", &k, "a", "1000"]).await;
    let (first, _) = lock_grant(&first).expect(&first);
    assert_eq!(c.cmd(&["LOCK.RELEASE", &k, "a"]).await, ":1");
    released_everywhere(&ports, &k).await;

    assert_eq!(eval(&mut c, ACQUIRE_OR_EXTEND, &k, "b", "1000").await, ":1");
    let second = token_of(&mut c, &k, "b").await.expect("a token for b");
    assert!(
        second > first,
        "{second} <= {first}: an earlier grant's token"
    );
    // Every master (the reply came once a majority answered: the last may still be running).
    let counter = format!("redlock-proxy:token:{k}");
    let outlives = eventually(Duration::from_secs(10), async || {
        for port in &ports {
            let pttl = master_cmd(*port, &["PTTL", &counter]).await;
            if pttl.trim_start_matches(':').parse::<i64>().unwrap() <= 1000 {
                return false;
            }
        }
        true
    })
    .await;
    assert!(outlives, "the counter outlives the lock on every master");
    // An extend through the same script keeps the token; a contender gets none.
    assert_eq!(eval(&mut c, ACQUIRE_OR_EXTEND, &k, "b", "1500").await, ":1");
    assert_eq!(token_of(&mut c, &k, "b").await, Some(second));
    assert_eq!(eval(&mut c, ACQUIRE_OR_EXTEND, &k, "c", "1000").await, ":0");
    assert_eq!(token_of(&mut c, &k, "c").await, None);
    assert_eq!(c.cmd(&["LOCK.RELEASE", &k, "b"]).await, ":1");
    released_everywhere(&ports, &k).await;

    let granted = eval(&mut c, SET_THEN_PEXPIRE, &k, "d", "1000").await;
    assert!(granted.starts_with("*[:1,"), "{granted}");
    let third = token_of(&mut c, &k, "d").await.expect("a token for d");
    assert!(third > second, "{third} <= {second}");
    assert_eq!(c.cmd(&["LOCK.RELEASE", &k, "d"]).await, ":1");
    released_everywhere(&ports, &k).await;

    // Another proxy's counter 5 s ahead of this one's proposals (within the window): the
    // masters refuse the next script's token. The script still ran (the lock is held), and
    // `LOCK.TOKEN` answers null, not the counter it found.
    let clock = master_cmd(ports[0], &["TIME"]).await;
    let digits: Vec<u64> = clock
        .trim_start_matches("*[")
        .trim_end_matches(']')
        .split(',')
        .map(|d| d.trim_start_matches('$').parse().expect(&clock))
        .collect();
    let ahead = digits[0] * 1_000_000 + digits[1] + 5_000_000;
    for port in &ports {
        let planted = format!("{ahead:016}:another-proxy");
        let set = [
            "SET",
            &format!("redlock-proxy:token:{k}"),
            &planted,
            "PX",
            "30000",
        ];
        assert_eq!(master_cmd(*port, &set).await, "+OK");
    }
    assert_eq!(eval(&mut c, ACQUIRE_OR_EXTEND, &k, "e", "1000").await, ":1");
    assert_eq!(token_of(&mut c, &k, "e").await, None);
    // The counter keeps the token as the floor, and names the refused run after a `~` (for
    // a Redisson acquire's roll-back), which is no full record.
    let floor = format!("${ahead:016}~");
    let floor_kept = eventually(Duration::from_secs(10), async || {
        for port in &ports {
            if !master_cmd(*port, &["GET", &counter])
                .await
                .starts_with(&floor)
            {
                return false;
            }
        }
        true
    })
    .await;
    assert!(floor_kept, "the token stays the floor on every master");
    assert_eq!(c.cmd(&["LOCK.RELEASE", &k, "e"]).await, ":1");
    released_everywhere(&ports, &k).await;
    // The refusal lifted this proxy's proposals above the counter: the next run takes a token.
    assert_eq!(eval(&mut c, ACQUIRE_OR_EXTEND, &k, "f", "1000").await, ":1");
    let fourth = token_of(&mut c, &k, "f").await.expect("a token for f");
    assert!(fourth > ahead, "{fourth} <= {ahead}");
}
