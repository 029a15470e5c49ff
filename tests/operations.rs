//! Operations: the metrics endpoint scraped from a proxy over real masters (grants,
//! contention, no quorum, quarantine, votes), the probes, `INFO stats`, `CLIENT LIST/KILL`,
//! SIGHUP reloads of the binary, `--check-config`, and the files of `deploy/` checked against
//! what the proxy exports.

use redlock_proxy::on_master::COMPARE_AND_DELETE;
use redlock_testkit::http::{exposed_names, get, get_accepting, series};
use redlock_testkit::launcher::{ready_for_load, Env, ProxyProcess};
use redlock_testkit::masters::signal;
use redlock_testkit::resp::Client;
use redlock_testkit::{eventually, key};
use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_redlock-proxy");

/// The text of a command's string reply.
async fn text(c: &mut Client, args: &[&[u8]]) -> String {
    let reply = c.request(args).await.expect("the proxy answers");
    reply
        .text()
        .unwrap_or_else(|| panic!("not a string reply: {reply}"))
}

/// One `INFO` section's text.
async fn info(c: &mut Client, section: &str) -> String {
    text(c, &[b"INFO", section.as_bytes()]).await
}

/// A numeric `field:value` of an `INFO` text.
fn field(info: &str, name: &str) -> u64 {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {info}"))
}

/// Where the proxy's metrics endpoint listens (`INFO server`'s `metrics_addr`).
async fn metrics_addr(c: &mut Client) -> SocketAddr {
    let server = info(c, "server").await;
    server
        .lines()
        .find_map(|l| l.strip_prefix("metrics_addr:"))
        .expect("metrics_addr in INFO server")
        .trim()
        .parse()
        .unwrap()
}

async fn scrape(addr: SocketAddr) -> String {
    let (status, body) = get(addr, "/metrics").await.unwrap();
    assert_eq!(status, 200, "{body}");
    body
}

/// The value of a series, 0 if absent.
fn value(scrape: &str, name: &str) -> f64 {
    series(scrape, name).unwrap_or(0.0)
}

/// Waits (bounded by `limit`) until the endpoint's `path` answers `status`; returns the body.
async fn wait_status(addr: SocketAddr, path: &str, status: u16, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let (now, body) = get(addr, path).await.unwrap();
        if now == status {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{path} still {now} after {limit:?}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (bounded) until a scrape satisfies `check`; returns it.
async fn wait_scrape(addr: SocketAddr, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let body = scrape(addr).await;
        if check(&body) {
            return body;
        }
        assert!(Instant::now() < deadline, "never saw {what} in:\n{body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn with_master(name: &str, master: &str, extra: &str) -> String {
    format!("{name}{{master=\"{master}\"{extra}}}")
}

/// A master's acquire votes of kind `vote` in a scrape, whatever else their series say (in
/// at the decision or late).
fn votes_of(scrape: &str, master: &str, vote: &str) -> f64 {
    let (master, vote) = (format!("master=\"{master}\""), format!("vote=\"{vote}\""));
    scrape
        .lines()
        .filter_map(|line| line.strip_prefix("redlock_proxy_master_votes_total{"))
        .filter_map(|line| line.split_once("} "))
        .filter(|(labels, _)| labels.split(',').any(|l| l == master))
        .filter(|(labels, _)| labels.split(',').any(|l| l == vote))
        .filter_map(|(_, value)| value.trim().parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_grants_contention_no_quorum_and_quarantine() {
    let mut env = Env::start_with(3, |c| {
        c.metrics = Some("127.0.0.1:0".into());
        c.max_lock_ttl_ms = 1500;
    })
    .await;
    ready_for_load(env.proxy.port).await.unwrap();
    let mut c = env.proxy.client().await;
    let addr = metrics_addr(&mut c).await;
    assert_eq!(get(addr, "/healthz").await.unwrap().0, 200);
    let ready = wait_status(addr, "/readyz", 200, Duration::from_secs(5)).await;
    assert!(ready.contains("3 of 3 masters usable, quorum 2"), "{ready}");
    let masters = env.masters.addrs();

    // A grant, then a contended acquire of the same key.
    let k = key("ops-metrics");
    assert_eq!(c.cmd(&["SET", &k, "a", "NX", "PX", "1500"]).await, "+OK");
    assert_eq!(c.cmd(&["SET", &k, "b", "NX", "PX", "1500"]).await, "$nil");
    // Refused by rule: no expiry.
    assert!(c.cmd(&["SET", &k, "c", "NX"]).await.starts_with("-ERR"));
    let body = scrape(addr).await;
    let acquires = |body: &str, result: &str| {
        value(
            body,
            &format!("redlock_proxy_acquires_total{{result=\"{result}\"}}"),
        )
    };
    assert_eq!(acquires(&body, "granted"), 1.0, "{body}");
    assert_eq!(acquires(&body, "contended"), 1.0, "{body}");
    assert_eq!(acquires(&body, "refused"), 1.0, "{body}");
    assert_eq!(acquires(&body, "no_quorum"), 0.0, "{body}");
    assert_eq!(
        value(&body, "redlock_proxy_acquire_duration_seconds_count"),
        2.0
    );
    // A decision needs two votes of three: at least two `ok` and two `held` votes were in.
    let votes =
        |body: &str, vote: &str| -> f64 { masters.iter().map(|m| votes_of(body, m, vote)).sum() };
    assert!(votes(&body, "ok") >= 2.0, "{body}");
    assert!(votes(&body, "held") >= 2.0, "{body}");
    assert_eq!(votes(&body, "timeout"), 0.0, "{body}");
    for m in &masters {
        assert_eq!(
            value(&body, &with_master("redlock_proxy_master_up", m, "")),
            1.0
        );
        let up = with_master("redlock_proxy_master_state", m, ",state=\"up\"");
        assert_eq!(value(&body, &up), 1.0, "{body}");
        let replies = with_master("redlock_proxy_master_reply_duration_seconds_count", m, "");
        assert!(value(&body, &replies) >= 1.0, "{body}");
    }
    assert_eq!(
        value(&body, "redlock_proxy_connected_clients"),
        1.0,
        "{body}"
    );
    assert!(value(&body, "redlock_proxy_commands_total{command=\"set\"}") >= 3.0);
    let version = format!(
        "redlock_proxy_build_info{{version=\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(value(&body, &version), 1.0, "{body}");

    // Releases: the holder's, then one of a value that no longer holds the key.
    let release = ["EVAL", COMPARE_AND_DELETE.text(), "1", &k, "a"];
    assert_eq!(c.cmd(&release).await, ":1");
    assert_eq!(c.cmd(&release).await, ":0");
    let body = scrape(addr).await;
    assert_eq!(
        value(&body, "redlock_proxy_releases_total{result=\"released\"}"),
        1.0
    );
    assert_eq!(
        value(&body, "redlock_proxy_releases_total{result=\"not_held\"}"),
        1.0
    );

    // A majority of masters killed: not ready, and acquires find no quorum.
    env.masters.masters[1].kill();
    env.masters.masters[2].kill();
    let why = wait_status(addr, "/readyz", 503, Duration::from_secs(5)).await;
    assert!(why.contains("not ready: 1 of 3 masters usable"), "{why}");
    assert!(
        why.contains(&format!("master1 {}: down", masters[1])),
        "{why}"
    );
    assert_eq!(c.cmd(&["SET", &k, "d", "NX", "PX", "1500"]).await, "$nil");
    let body = scrape(addr).await;
    assert_eq!(acquires(&body, "no_quorum"), 1.0, "{body}");
    let down = with_master("redlock_proxy_master_state", &masters[1], ",state=\"down\"");
    assert_eq!(value(&body, &down), 1.0, "{body}");
    assert_eq!(
        value(
            &body,
            &with_master("redlock_proxy_master_up", &masters[1], "")
        ),
        0.0
    );
    // Masters without a connection are not asked: their votes are not eligible.
    assert!(votes(&body, "not_eligible") >= 2.0, "{body}");

    // Back empty (a crash without persistence): quarantined, with its reason counted.
    env.masters.masters[1].restart(&[]).unwrap();
    env.masters.masters[2].restart(&[]).unwrap();
    let quarantined = with_master(
        "redlock_proxy_master_state",
        &masters[1],
        ",state=\"quarantined\"",
    );
    let body = wait_scrape(addr, "master1 quarantined", |b| {
        value(b, &quarantined) == 1.0
    })
    .await;
    let causes: f64 = ["restarted", "marker_gone"]
        .iter()
        .map(|cause| {
            let extra = format!(",reason=\"{cause}\"");
            value(
                &body,
                &with_master(
                    "redlock_proxy_master_quarantines_total",
                    &masters[1],
                    &extra,
                ),
            )
        })
        .sum();
    assert_eq!(causes, 1.0, "{body}");
    // Ready again once the quarantine (the lease bound, 1.5 s and drift) is over.
    wait_status(addr, "/readyz", 200, Duration::from_secs(10)).await;
    let body = scrape(addr).await;
    assert_eq!(value(&body, &quarantined), 0.0, "{body}");
}

/// Issue 40, bug 2: a master's answer that comes after the quorum decided is counted too, so
/// with 5 healthy masters every master shows an `ok` for every grant (before, only the first
/// three answers of each acquire were: about 3 in 5 per master, and the slowest master none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_master_s_answer_counts_as_its_vote_even_after_the_quorum() {
    let env = Env::start_with(5, |c| c.metrics = Some("127.0.0.1:0".into())).await;
    ready_for_load(env.proxy.port).await.unwrap();
    let mut c = env.proxy.client().await;
    let addr = metrics_addr(&mut c).await;
    const GRANTS: u32 = 40;
    for i in 0..GRANTS {
        let k = key(&format!("late-votes-{i}"));
        assert_eq!(c.cmd(&["SET", &k, "v", "NX", "PX", "10000"]).await, "+OK");
    }
    let masters = env.masters.addrs();
    let all_in = |body: &str| {
        masters
            .iter()
            .all(|m| votes_of(body, m, "ok") >= f64::from(GRANTS))
    };
    // The late answers are counted as they come, each within the node timeout.
    let body = wait_scrape(addr, "an ok vote of every master for every grant", all_in).await;
    for m in &masters {
        assert_eq!(votes_of(&body, m, "ok"), f64::from(GRANTS), "{m}: {body}");
    }
    let late: f64 = masters
        .iter()
        .map(|m| {
            value(
                &body,
                &with_master(
                    "redlock_proxy_master_votes_total",
                    m,
                    ",vote=\"ok\",late=\"true\"",
                ),
            )
        })
        .sum();
    // A grant is decided at the third `ok` of five: the other two come after it, unless they
    // were already in when the decision ran.
    assert!(late <= f64::from(2 * GRANTS), "{late}: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_stats_and_client_list_and_kill() {
    let env = Env::start_with(3, |c| c.maxclients = 2).await;
    let mut watcher = env.proxy.client().await;
    let before = info(&mut watcher, "stats").await;
    let mut named = env.proxy.client().await;
    assert_eq!(named.cmd(&["CLIENT", "SETNAME", "worker-1"]).await, "+OK");
    assert_eq!(named.cmd(&["PING"]).await, "+PONG");
    // A third client is over maxclients: refused and counted.
    let mut refused = env.proxy.client().await;
    assert_eq!(refused.read().await, "-ERR max number of clients reached");
    let after = info(&mut watcher, "stats").await;
    assert!(after.starts_with("# Stats\r\n"), "{after}");
    // CLIENT SETNAME, PING and this INFO since the first (each counted as it is read).
    assert_eq!(
        field(&after, "total_commands_processed"),
        field(&before, "total_commands_processed") + 3
    );
    // The launcher's first client, and these three.
    assert_eq!(field(&after, "total_connections_received"), 4);
    assert_eq!(field(&after, "rejected_connections"), 1);
    assert!(
        !after.contains("# Masters"),
        "only the section asked for: {after}"
    );
    let all = info(&mut watcher, "all").await;
    for section in [
        "# Server",
        "# Clients",
        "# Stats",
        "# Replication",
        "# Masters",
    ] {
        assert!(all.contains(section), "{section} missing from INFO all");
    }

    let list = text(&mut watcher, &[b"CLIENT", b"LIST"]).await;
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 2, "{list}");
    let worker = lines
        .iter()
        .find(|l| l.contains(" name=worker-1 "))
        .unwrap_or_else(|| panic!("{list}"));
    assert!(worker.contains(" cmd=ping "), "{worker}");
    // Redis 7 names subcommands with `|`: the watcher's own line shows this very call.
    let own = lines
        .iter()
        .find(|l| !l.contains(" name=worker-1 "))
        .unwrap_or_else(|| panic!("{list}"));
    assert!(own.contains(" cmd=client|list "), "{own}");
    let id = worker
        .strip_prefix("id=")
        .and_then(|l| l.split(' ').next())
        .unwrap()
        .to_string();
    // Unknown address (old form), then by id (filter form): the client is closed at once.
    assert_eq!(
        watcher.cmd(&["CLIENT", "KILL", "127.0.0.1:1"]).await,
        "-ERR No such client"
    );
    assert_eq!(watcher.cmd(&["CLIENT", "KILL", "ID", &id]).await, ":1");
    assert!(named.is_closed().await);
    assert_eq!(
        watcher.cmd(&["CLIENT", "KILL", "ID", "0"]).await,
        "-ERR client-id should be greater than 0"
    );
    // By the watcher's own address, which SKIPME (default yes) spares.
    let me = text(&mut watcher, &[b"CLIENT", b"INFO"]).await;
    let addr = me
        .split(' ')
        .find_map(|f| f.strip_prefix("addr="))
        .unwrap()
        .to_string();
    assert_eq!(watcher.cmd(&["CLIENT", "KILL", "ADDR", &addr]).await, ":0");
    assert_eq!(
        watcher
            .cmd(&["CLIENT", "KILL", "ADDR", &addr, "SKIPME", "no"])
            .await,
        ":1"
    );
    assert!(watcher.is_closed().await);
}

/// A configuration file in a fresh temporary directory.
struct ConfigFile {
    dir: PathBuf,
    path: PathBuf,
}

impl ConfigFile {
    fn new(name: &str) -> ConfigFile {
        let dir = std::env::temp_dir().join(format!("redlock-ops-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("proxy.toml");
        ConfigFile { dir, path }
    }

    fn write(&self, text: &str) -> &Path {
        std::fs::write(&self.path, text).unwrap();
        &self.path
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits (bounded) until `INFO clients` shows `maxclients:n`.
async fn wait_maxclients(port: u16, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut c = Client::connect(port).await;
        let now = field(&info(&mut c, "clients").await, "maxclients");
        if now == n {
            return;
        }
        assert!(Instant::now() < deadline, "maxclients still {now}, not {n}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (bounded) until the proxy has logged `n` WARN/ERROR lines.
async fn wait_warnings(proxy: &ProxyProcess, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while proxy.warnings.load(Ordering::Relaxed) < n {
        assert!(Instant::now() < deadline, "no error logged for the reload");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_a_good_file_and_a_broken_one_changes_nothing() {
    let masters = redlock_proxy::LocalCluster::start(3).unwrap();
    let file = ConfigFile::new("sighup");
    let path = file
        .write("maxclients = 100\nlog_level = \"info\"\n")
        .to_path_buf();
    let args = vec!["--config".to_string(), path.display().to_string()];
    let proxy = ProxyProcess::start(Path::new(BIN), &masters.addrs(), &args).unwrap();
    wait_maxclients(proxy.port, 100).await;

    // A good file: applied live, the node timeout included.
    file.write("maxclients = 7\nlog_level = \"debug\"\nnode_timeout_ms = 80\n");
    signal(proxy.pid(), "HUP");
    wait_maxclients(proxy.port, 7).await;
    let mut info = Client::connect(proxy.port).await;
    let masters = info.cmd(&["INFO", "masters"]).await;
    assert!(masters.contains("node_timeout_ms:80\r\n"), "{masters}");
    let mut c = Client::connect(proxy.port).await;
    assert_eq!(c.cmd(&["PING"]).await, "+PONG");

    // A broken file: nothing changes, an error is logged.
    let warned = proxy.warnings.load(Ordering::Relaxed);
    file.write("maxclients = 9\nmaxclients = \"many\n");
    signal(proxy.pid(), "HUP");
    wait_warnings(&proxy, warned + 1).await;
    // A change only a restart may make: refused as a whole (maxclients stays too).
    file.write("maxclients = 9\ndrift_factor = 0.05\n");
    signal(proxy.pid(), "HUP");
    wait_warnings(&proxy, warned + 2).await;
    wait_maxclients(proxy.port, 7).await;
    assert_eq!(c.cmd(&["PING"]).await, "+PONG");
    // Each error said once, on one line (issue 40: a TOML error spans lines, and each was
    // written twice, in the message and as a field).
    let parse = proxy.logged(&["configuration not reloaded", "TOML parse error"]);
    assert_eq!(parse.len(), 1, "{:?}", proxy.logged(&[]));
    assert!(parse[0].contains("invalid basic string"), "{parse:?}");
    assert_eq!(parse[0].matches("TOML parse error").count(), 1, "{parse:?}");
    let restart = proxy.logged(&["changing drift_factor needs a restart"]);
    assert_eq!(restart.len(), 1, "{restart:?}");
    assert_eq!(
        restart[0].matches("needs a restart").count(),
        1,
        "{restart:?}"
    );
}

/// Issue 40: with `--threads 2` each shard founds or joins the deployment on its own
/// connections, and says so in the log: each line names its thread (the binary's JSON log, as
/// the test kit runs it: `threadName`), so the two are told apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shard_s_log_lines_name_its_thread() {
    let masters = redlock_proxy::LocalCluster::start(3).unwrap();
    let args = ["--threads".to_string(), "2".into()];
    let proxy = ProxyProcess::start(Path::new(BIN), &masters.addrs(), &args).unwrap();
    let decided = ["deployment decided"];
    let both = eventually(Duration::from_secs(10), async || {
        proxy.logged(&decided).len() == 2
    })
    .await;
    assert!(both, "{:?}", proxy.logged(&[]));
    let lines = proxy.logged(&decided);
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains(r#""threadName":"main""#))
            .count(),
        1,
        "{lines:?}"
    );
    assert_eq!(
        (lines.iter())
            .filter(|l| l.contains(r#""threadName":"redlock-proxy-shard-1""#))
            .count(),
        1,
        "{lines:?}"
    );
}

const NOPERM: &str =
    "-NOPERM this user has no permissions to access one of the keys used as arguments";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_users_live_and_ends_the_sessions_of_removed_ones() {
    let masters = redlock_proxy::LocalCluster::start(3).unwrap();
    let file = ConfigFile::new("users");
    let users = |alice_keys: &str, with_alice: bool| {
        let alice =
            format!("[[users]]\nname = \"alice\"\npassword = \"pw\"\nkeys = [{alice_keys}]\n");
        format!(
            "[[users]]\nname = \"default\"\nenabled = false\n[[users]]\nname = \"bob\"\npassword = \"bob-pw\"\nkeys = [\"*\"]\n{}",
            if with_alice { alice.as_str() } else { "" }
        )
    };
    let path = file.write(&users("\"app:*\"", true)).to_path_buf();
    let args = vec!["--config".to_string(), path.display().to_string()];
    let proxy = ProxyProcess::start(Path::new(BIN), &masters.addrs(), &args).unwrap();
    let mut alice = Client::connect(proxy.port).await;
    assert_eq!(alice.cmd(&["AUTH", "alice", "pw"]).await, "+OK");
    // The masters are ready once a read gets a quorum (bounded).
    let deadline = Instant::now() + Duration::from_secs(10);
    while alice.cmd(&["GET", "app:1"]).await != "$nil" {
        assert!(
            Instant::now() < deadline,
            "the masters did not become ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(alice.cmd(&["GET", "jobs:1"]).await, NOPERM);
    let info = alice.cmd(&["CLIENT", "INFO"]).await;
    assert!(info.contains(" user=alice "), "{info}");

    // alice's keys change: her open connection follows at its next command.
    file.write(&users("\"jobs:*\"", true));
    signal(proxy.pid(), "HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while alice.cmd(&["GET", "jobs:1"]).await == NOPERM {
        assert!(
            Instant::now() < deadline,
            "the new key patterns were not applied"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(alice.cmd(&["GET", "app:1"]).await, NOPERM);

    // alice is removed: her connection ends with the reason; bob is unaffected.
    let mut bob = Client::connect(proxy.port).await;
    assert_eq!(bob.cmd(&["AUTH", "bob", "bob-pw"]).await, "+OK");
    file.write(&users("", false));
    signal(proxy.pid(), "HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = alice.cmd(&["PING"]).await;
        if reply.starts_with("-ERR user 'alice' was removed or disabled") {
            break;
        }
        assert_eq!(reply, "+PONG");
        assert!(Instant::now() < deadline, "alice's session was not ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(alice.is_closed().await);
    assert_eq!(bob.cmd(&["GET", "anything"]).await, "$nil");
    let mut again = Client::connect(proxy.port).await;
    assert_eq!(
        again.cmd(&["AUTH", "alice", "pw"]).await,
        "-WRONGPASS invalid username-password pair or user is disabled."
    );
}

#[test]
fn check_config_exits_0_or_1_with_the_reason() {
    let file = ConfigFile::new("check");
    let check = |text: &str| {
        let path = file.write(text);
        let out = Command::new(BIN)
            .arg("--check-config")
            .arg(path)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let (code, text) = check("backends = [\"127.0.0.1:6379\"]\nmetrics = \"127.0.0.1:9379\"\n");
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("test is successful"), "{text}");
    let (code, text) = check("backends = [\"127.0.0.1:6379\"]\nnode_timeout_ms = \"soon\"\n");
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("line 2"), "{text}");
    assert!(text.contains("test failed"), "{text}");
    let (code, text) = check("backends = [\"127.0.0.1:6379\"]\nmetrics = \"nowhere\"\n");
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("metrics must be ADDR:PORT"), "{text}");

    // Issue 40: a template whose TLS files are not on this machine (configs/secure.toml): the
    // message names the config key as well as the flag, and says how to check the rest.
    let secure = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/secure.toml");
    let run = |extra: &[&str]| {
        let out = Command::new(BIN)
            .arg("--check-config")
            .arg(&secure)
            .args(extra)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    };
    let (code, text) = run(&[]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("cannot read backend_tls_ca_cert_file (--backend-tls-ca-cert-file) /etc/"),
        "{text}"
    );
    assert!(text.contains("--syntax-only"), "{text}");
    let (code, text) = run(&["--syntax-only"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("syntax test (the files it names not read) is successful"),
        "{text}"
    );
    // A syntax error is still one.
    let broken = file.write("backends = [\"127.0.0.1:6379\"]\nnode_timeout_ms = \"soon\"\n");
    let out = Command::new(BIN)
        .args(["--syntax-only", "--check-config"])
        .arg(broken)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

/// Every `redlock_proxy_…` name in a text (a rule file, a dashboard).
fn names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("redlock_proxy_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_files_name_only_metrics_the_proxy_exports() {
    let env = Env::start_with(3, |c| c.metrics = Some("127.0.0.1:0".into())).await;
    let mut c = env.proxy.client().await;
    let exposed: BTreeSet<String> = exposed_names(&scrape(metrics_addr(&mut c).await).await)
        .into_iter()
        .collect();
    let listed: BTreeSet<String> = redlock_proxy::METRIC_NAMES
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(exposed, listed, "METRIC_NAMES is not what a scrape exposes");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    for file in ["prometheus/alerts.yml", "grafana/dashboard.json"] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let names = names_in(&text);
        assert!(!names.is_empty(), "{file} names no metric");
        for name in names {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|base| exposed.contains(*base))
                .unwrap_or(&name);
            assert!(
                exposed.contains(base),
                "{file} uses {name}, which is not exported"
            );
        }
    }
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("grafana/dashboard.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    assert!(dashboard["panels"]
        .as_array()
        .is_some_and(|p| !p.is_empty()));
}

/// `promtool check metrics` on `scrape`: its exit status and what it printed. Prometheus'
/// promtool is part of the test environment (Debian's `prometheus` package, installed in CI).
fn promtool_check(scrape: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|err| panic!("promtool is needed (apt-get install -y prometheus): {err}"));
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(scrape.as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// `/metrics` answers the Prometheus text format (0.0.4) unless the scraper asks for
/// OpenMetrics, as Prometheus' client libraries negotiate; the default passes `promtool check
/// metrics` (issue 40: it answered OpenMetrics whatever `Accept` said, which promtool refuses:
/// `unknown metric type "info"`, counters without help).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_exposition_passes_promtool_and_openmetrics_is_served_when_asked() {
    let env = Env::start_with(3, |c| c.metrics = Some("127.0.0.1:0".into())).await;
    let mut c = env.proxy.client().await;
    // Something counted in every kind of family (counters, histograms, gauges).
    assert_eq!(
        c.cmd(&["SET", &key("promtool"), "v", "NX", "PX", "10000"])
            .await,
        "+OK"
    );
    let addr = metrics_addr(&mut c).await;
    const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
    const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    // What Prometheus 2.42 sends, and what other scrapers send.
    let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let cases = [
        (None, TEXT),
        (Some("*/*"), TEXT),
        (Some("text/plain"), TEXT),
        (Some("text/plain;version=0.0.4"), TEXT),
        (Some("application/openmetrics-text"), OPENMETRICS),
        (Some(prometheus), OPENMETRICS),
        (
            Some("text/plain;version=0.0.4;q=0.9,application/openmetrics-text;q=0.5"),
            TEXT,
        ),
    ];
    for (accept, expected) in cases {
        let answer = get_accepting(addr, "/metrics", accept).await.unwrap();
        assert_eq!(answer.status, 200, "{accept:?}: {}", answer.body);
        assert_eq!(answer.content_type, expected, "Accept: {accept:?}");
        let openmetrics = expected == OPENMETRICS;
        assert_eq!(
            answer.body.ends_with("# EOF\n"),
            openmetrics,
            "Accept: {accept:?}"
        );
        assert!(
            answer
                .body
                .contains("redlock_proxy_acquires_total{result=\"granted\"} 1"),
            "{}",
            answer.body
        );
        if !openmetrics {
            let (passed, said) = promtool_check(&answer.body);
            assert!(
                passed && said.trim().is_empty(),
                "promtool check metrics (Accept: {accept:?}):\n{said}\n{}",
                answer.body
            );
        }
    }
}

/// `threads 3`: three shards, each on its own thread with its own connection to every master.
/// Clients spread over them still contend at the masters (one grant for one key), and `INFO`
/// counts every shard's acquires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_on_their_own_threads_grant_one_holder_and_count_together() {
    let env = Env::start_with(3, |c| c.threads = 3).await;
    let mut clients = Vec::new();
    for _ in 0..30 {
        clients.push(env.proxy.client().await);
    }
    // Clients go to the shards in turn: each shard's masters must be judged before it grants.
    let mut attempts = 0;
    for (i, c) in clients.iter_mut().take(3).enumerate() {
        let warm = key(&format!("shard-warm-{i}"));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            attempts += 1;
            if c.cmd(&["SET", &warm, "v", "NX", "PX", "30000"]).await == "+OK" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "shard of client {i} never granted"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let k = key("sharded");
    let replies = futures::future::join_all(clients.iter_mut().enumerate().map(|(i, c)| {
        let k = k.clone();
        async move {
            c.cmd(&["SET", &k, &format!("v{i}"), "NX", "PX", "30000"])
                .await
        }
    }))
    .await;
    attempts += replies.len() as u64;
    let winners = replies.iter().filter(|r| *r == "+OK").count();
    assert_eq!(winners, 1, "{replies:?}");
    assert!(
        replies.iter().all(|r| r == "+OK" || r == "$nil"),
        "{replies:?}"
    );
    for port in env.ports() {
        let clients = redlock_testkit::masters::master_cmd(port, &["INFO", "clients"]).await;
        let connected = field(&clients, "connected_clients");
        assert!(connected >= 3, "master {port}: {connected} connections");
    }
    let stats = info(&mut clients[0], "stats").await;
    let counted: u64 = ["granted", "contended", "no_quorum", "expired", "refused"]
        .iter()
        .map(|r| field(&stats, &format!("acquires_{r}")))
        .sum();
    assert_eq!(counted, attempts, "{stats}");
}

/// How many lines of `proxy`'s log hold every one of `needles`, once at least one does (its log
/// is read by another thread, so a line can trail the reply that caused it; at most 10 s).
async fn logged_once(proxy: &ProxyProcess, needles: &[&str]) -> usize {
    eventually(Duration::from_secs(10), async || {
        !proxy.logged(needles).is_empty()
    })
    .await;
    proxy.logged(needles).len()
}

/// Issue 23, items 9 and 10: without a quorum, `no_quorum_reply = "error"` answers an acquire
/// `NOQUORUM <n> of <N> masters usable, quorum <Q>` (the default stays null), and the log says
/// once that acquires are refused for lack of a quorum and once that they resume; each master
/// restarted empty gets one line when its quarantine begins (naming the restart, with its end)
/// and one when it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_quorum_reply_and_one_log_line_per_change() {
    let mut masters = redlock_proxy::LocalCluster::start(5).unwrap();
    // A 1 s cap: a master back empty is quarantined for 2 s (the lease bound).
    let args = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["--max-lock-ttl-ms".to_string(), "1000".into()];
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let erring = ProxyProcess::start(
        Path::new(BIN),
        &masters.addrs(),
        &args(&["--no-quorum-reply", "error"]),
    )
    .unwrap();
    let nulling = ProxyProcess::start(Path::new(BIN), &masters.addrs(), &args(&[])).unwrap();
    let (mut e, mut n) = (
        Client::connect(erring.port).await,
        Client::connect(nulling.port).await,
    );
    for (c, name) in [(&mut e, "nq-before-e"), (&mut n, "nq-before-n")] {
        redlock_testkit::launcher::wait_for_info(c, "state=up", 5).await;
        assert_eq!(
            c.cmd(&["SET", &key(name), "v", "NX", "PX", "1000"]).await,
            "+OK"
        );
    }
    for m in &mut masters.masters[..3] {
        m.kill();
    }
    for c in [&mut e, &mut n] {
        redlock_testkit::launcher::wait_for_info(c, "state=down", 3).await;
    }
    let k = key("nq");
    for _ in 0..3 {
        assert_eq!(
            e.cmd(&["SET", &k, "v", "NX", "PX", "1000"]).await,
            "-NOQUORUM 2 of 5 masters usable, quorum 3"
        );
        assert_eq!(n.cmd(&["SET", &k, "v", "NX", "PX", "1000"]).await, "$nil");
    }
    // The line tells the refused acquire's own votes (issue 38), not the masters usable.
    let refusing = [
        "acquires are refused for lack of a quorum: 0 of 5 masters took the key, quorum 3; 3 not eligible to vote",
    ];
    assert_eq!(
        logged_once(&erring, &refusing).await,
        1,
        "{:?}",
        erring.logged(&[])
    );
    assert_eq!(logged_once(&nulling, &refusing).await, 1);

    // Back empty: quarantined 2 s, then the acquires resume, which is logged when the quorum
    // is back, without waiting for an acquire (issue 40).
    for m in &mut masters.masters[..3] {
        m.restart(&[]).unwrap();
    }
    let resumed = ["acquires resume: a quorum of masters answers again"];
    for proxy in [&erring, &nulling] {
        let told = eventually(Duration::from_secs(20), async || {
            proxy.logged(&resumed).len() == 1
        })
        .await;
        assert!(told, "no acquire, no resume line: {:?}", proxy.logged(&[]));
    }
    let granted = eventually(Duration::from_secs(20), async || {
        e.cmd(&["SET", &key("nq-after"), "v", "NX", "PX", "1000"])
            .await
            == "+OK"
    })
    .await;
    assert!(granted, "{:?}", erring.logged(&[]));
    assert_eq!(
        logged_once(&erring, &resumed).await,
        1,
        "{:?}",
        erring.logged(&[])
    );
    // Every restarted master: one line at the start of its quarantine, naming the restart and
    // its end, and one when it ends (within 20 s: 2 s of quarantine and the polls).
    let all_ended = eventually(Duration::from_secs(20), async || {
        masters.masters[..3]
            .iter()
            .all(|m| erring.logged(&[&m.addr(), "out of quarantine"]).len() == 1)
    })
    .await;
    assert!(all_ended, "{:?}", erring.logged(&["quarantine"]));
    for m in &masters.masters[..3] {
        let began = erring.logged(&[&m.addr(), "master quarantined until"]);
        assert_eq!(began.len(), 1, "{began:?}");
        assert!(began[0].contains("restarted"), "{began:?}");
        let ended = erring.logged(&[&m.addr(), "out of quarantine"]);
        assert_eq!(ended.len(), 1, "{ended:?}");
    }
}
