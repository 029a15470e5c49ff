//! Running a proxy over local masters, the one way the tests and the benchmark do it:
//! - [`Proxy`]: `redlock_proxy::run` in this process, on an ephemeral loopback port, stopped
//!   gracefully, and restartable with the same configuration on a new port;
//! - [`ProxyProcess`]: a proxy binary (the release build) as a child process on an ephemeral
//!   port: its port read from its log, its log drained (WARN/ERROR lines counted and echoed);
//! - [`Env`]: N `redis-server` masters (`redlock_proxy::LocalCluster`) and a [`Proxy`] over
//!   them, optionally behind fault relays, with checks on the masters directly;
//! - [`ready_for_load`]: waits until a fresh proxy has every master up.

use crate::masters::{master_cmd, master_get, start_replicas};
use crate::relay::Relay;
use crate::resp::{Client, Reply};
use redlock_proxy::on_master::COMPARE_AND_DELETE;
use redlock_proxy::{Config, Listeners, LocalCluster, LocalMaster, TlsAcceptorHandle};
use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// The node timeout of tests about behaviour (replies, order, clients): far above any
/// scheduler hiccup on a shared CI machine, so a slow moment never turns a vote into a "no".
/// Tests about timing set their own (`node_timeout_ms` in their config tweak) and derive their
/// bounds from it.
pub const BEHAVIOUR_NODE_TIMEOUT_MS: u64 = 2000;

/// A proxy running in this process (in the current tokio runtime) over a set of masters.
pub struct Proxy {
    pub port: u16,
    /// The TLS listener's port, when the configuration sets `tls_port` (any value: the
    /// listener takes a free loopback port beside the plain one).
    pub tls_port: Option<u16>,
    config: Config,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    /// Starts the proxy over `backends` on a free loopback port: the default configuration
    /// with [`BEHAVIOUR_NODE_TIMEOUT_MS`], then `tweak`.
    pub async fn start(backends: Vec<String>, tweak: impl FnOnce(&mut Config)) -> Proxy {
        Proxy::start_config(Proxy::config_for(backends, tweak)).await
    }

    /// The configuration [`Proxy::start`] runs.
    fn config_for(backends: Vec<String>, tweak: impl FnOnce(&mut Config)) -> Config {
        let mut config = Config {
            port: 0,
            backends: backends
                .iter()
                .map(|b| b.parse().expect("a valid master address"))
                .collect(),
            node_timeout_ms: BEHAVIOUR_NODE_TIMEOUT_MS,
            ..Config::default()
        };
        tweak(&mut config);
        config
    }

    /// Starts the proxy with exactly `config` (its ports are ignored: free loopback ports).
    pub async fn start_config(config: Config) -> Proxy {
        let proxy = Proxy::launch(config).await;
        proxy.wait_connected(None).await;
        proxy
    }

    /// [`Proxy::start_config`] without waiting for anything: returns as soon as the proxy's
    /// port is bound (for tests of what a client sees right after start).
    pub async fn launch(config: Config) -> Proxy {
        config.validate().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut listeners = Listeners::from(listener);
        if let Some(files) = config.server_tls() {
            let tls = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let acceptor = TlsAcceptorHandle::load(files).expect("usable TLS files");
            listeners.tls = Some((tls, acceptor));
        }
        let tls_port = listeners.tls_addr().map(|a| a.port());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(redlock_proxy::run(config.clone(), listeners, async move {
            let _ = stopped.await;
        }));
        Proxy {
            port,
            tls_port,
            config,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Waits (bounded) until the proxy answers and has tried its masters once; with
    /// `masters_up`, until that many masters are `up` (at most 10 s), unless it asks for a
    /// password (the test then authenticates itself).
    async fn wait_connected(&self, masters_up: Option<usize>) {
        let mut client = Client::connect(self.port).await;
        // A proxy that requires a password answers too.
        let answer = client.cmd(&["PING"]).await;
        assert!(
            answer == "+PONG" || answer == "-NOAUTH Authentication required.",
            "{answer}"
        );
        if let (Some(n), "+PONG") = (masters_up, answer.as_str()) {
            wait_for_info_within(&mut client, "state=up", n, Duration::from_secs(10)).await;
        }
        // Closed before the wait, so the proxy has seen it go when the test opens its own
        // clients (a test with a small `maxclients` counts on that).
        drop(client);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    pub async fn client(&self) -> Client {
        Client::connect(self.port).await
    }

    /// The configuration it runs with (its ports as given: 0).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Graceful shutdown, waiting for the run loop to return.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("proxy stops within 10 s")
                .unwrap();
        }
    }

    /// Stops this proxy, runs `between` (the proxy is down meanwhile), then starts a fresh one
    /// with the same configuration on a new port: no memory of anything.
    pub async fn restart(self, between: impl FnOnce()) -> Proxy {
        let config = self.config.clone();
        self.stop().await;
        between();
        Proxy::start_config(config).await
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// N masters and a proxy over them (and a replica of each master, if asked for).
pub struct Env {
    pub masters: LocalCluster,
    pub proxy: Proxy,
    pub replicas: Vec<LocalMaster>,
}

impl Env {
    pub async fn start(n: usize) -> Env {
        Env::start_with(n, |_| {}).await
    }

    /// Returns once every master is `up` on the proxy (unless it asks for a password), so a
    /// test that looks at the masters finds each write on all of them: the proxy writes only
    /// to masters it has judged, and on a loaded machine that can take longer than the proxy
    /// takes to answer its first `PING`.
    pub async fn start_with(n: usize, tweak: impl FnOnce(&mut Config)) -> Env {
        let masters = LocalCluster::start(n).expect("redis-server must be installed");
        Env::over(masters, Vec::new(), tweak).await
    }

    /// [`Env::start_with`] over masters started by the caller (some with a clock of their
    /// own, say).
    pub async fn start_over(masters: LocalCluster, tweak: impl FnOnce(&mut Config)) -> Env {
        Env::over(masters, Vec::new(), tweak).await
    }

    /// [`Env::start_with`] over masters that each have a replica, in sync before the proxy
    /// starts (for `wait_replicas`).
    pub async fn start_with_replicas(n: usize, tweak: impl FnOnce(&mut Config)) -> Env {
        let masters = LocalCluster::start(n).expect("redis-server must be installed");
        let replicas = tokio::task::block_in_place(|| start_replicas(&masters.masters))
            .expect("replicas in sync");
        Env::over(masters, replicas, tweak).await
    }

    /// A proxy over `masters`, returned once every one is `up` on it (see
    /// [`Env::start_with`]).
    async fn over(
        masters: LocalCluster,
        replicas: Vec<LocalMaster>,
        tweak: impl FnOnce(&mut Config),
    ) -> Env {
        let proxy = Proxy::launch(Proxy::config_for(masters.addrs(), tweak)).await;
        proxy.wait_connected(Some(masters.masters.len())).await;
        Env {
            masters,
            proxy,
            replicas,
        }
    }

    /// N masters, each behind a fault relay, and a proxy over the relays.
    pub async fn start_behind_relays(
        n: usize,
        tweak: impl FnOnce(&mut Config),
    ) -> (Env, Vec<Relay>) {
        let masters = LocalCluster::start(n).expect("redis-server must be installed");
        let relays = Relay::start_each(&masters).await;
        let config = Proxy::config_for(relays.iter().map(Relay::addr).collect(), tweak);
        let proxy = Proxy::launch(config).await;
        proxy.wait_connected(Some(n)).await;
        let env = Env {
            masters,
            proxy,
            replicas: Vec::new(),
        };
        (env, relays)
    }

    pub fn ports(&self) -> Vec<u16> {
        self.masters.masters.iter().map(|m| m.port).collect()
    }

    /// Values of `key` on every master (`None` where absent or unreachable).
    pub async fn values(&self, key: &str) -> Vec<Option<String>> {
        let mut out = Vec::new();
        for port in self.ports() {
            out.push(master_get(port, key).await);
        }
        out
    }

    /// Waits (at most 10 s) until no master holds `key`: replies may be sent once a majority
    /// answered, while the remaining masters' copies of the command are still in flight.
    pub async fn assert_gone(&self, key: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let values = self.values(key).await;
            if values.iter().all(Option::is_none) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{key} still on masters: {values:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `PTTL key` on every master, in order.
    pub async fn pttls(&self, key: &str) -> Vec<i64> {
        let mut out = Vec::new();
        for port in self.ports() {
            let reply = master_cmd(port, &["PTTL", key]).await;
            out.push(reply.trim_start_matches(':').parse().expect("an integer"));
        }
        out
    }

    /// `PTTL key` on every master once each satisfies `settled`, or as they are after 10 s: a
    /// reply needs only a majority, so the last master may still be applying the command.
    pub async fn pttls_when(&self, key: &str, settled: impl Fn(i64) -> bool) -> Vec<i64> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let pttls = self.pttls(key).await;
            if pttls.iter().all(|p| settled(*p)) || tokio::time::Instant::now() >= deadline {
                return pttls;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits (at most 10 s) until every master answers `args` with `expected`; panics with
    /// the last answer otherwise (a reply needs only a majority: the last master may still be
    /// applying the command).
    pub async fn until_every_master(&self, args: &[&str], expected: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        for port in self.ports() {
            loop {
                let answer = master_cmd(port, args).await;
                if answer == expected {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "master {port} answers {args:?} with {answer}, not {expected}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    /// How many masters hold `key` = `value`.
    pub async fn holders(&self, key: &str, value: &str) -> usize {
        self.values(key)
            .await
            .iter()
            .filter(|v| v.as_deref() == Some(value))
            .count()
    }
}

/// A proxy binary run as a child process over some masters; killed when dropped.
pub struct ProxyProcess {
    child: Child,
    pub port: u16,
    /// Lines the proxy logged at WARN or ERROR.
    pub warnings: Arc<AtomicUsize>,
    /// The last [`LOG_KEPT`] lines it logged.
    log: Arc<Mutex<VecDeque<String>>>,
}

/// How many of its last log lines a [`ProxyProcess`] keeps.
const LOG_KEPT: usize = 5000;

impl ProxyProcess {
    /// Starts `bin --bind 127.0.0.1 --port 0 --log-format json --backend …` plus `extra_args`,
    /// and waits (10 s) for the port of its "listening on" log line.
    pub fn start(
        bin: &Path,
        backends: &[String],
        extra_args: &[String],
    ) -> io::Result<ProxyProcess> {
        let mut cmd = Command::new(bin);
        cmd.args(["--bind", "127.0.0.1", "--port", "0", "--log-format", "json"]);
        for backend in backends {
            cmd.args(["--backend", backend]);
        }
        cmd.args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|err| {
            io::Error::other(format!(
                "cannot start {}: {err} (run `cargo build --release`)",
                bin.display()
            ))
        })?;
        let warnings = Arc::new(AtomicUsize::new(0));
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (port_tx, port_rx) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            let (tx, warnings, log) = (port_tx.clone(), warnings.clone(), log.clone());
            std::thread::spawn(move || drain_proxy_log(out, tx, warnings, log));
        }
        if let Some(err) = child.stderr.take() {
            let (warnings, log) = (warnings.clone(), log.clone());
            std::thread::spawn(move || drain_proxy_log(err, port_tx, warnings, log));
        }
        let port = match port_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(port) => port,
            Err(_) => {
                let _ = child.kill();
                let status = child.wait().ok();
                return Err(io::Error::other(format!(
                    "the proxy did not log its listening address within 10 s (exit: {status:?})"
                )));
            }
        };
        Ok(ProxyProcess {
            child,
            port,
            warnings,
            log,
        })
    }

    /// The kept log lines that contain every one of `needles`.
    pub fn logged(&self, needles: &[&str]) -> Vec<String> {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.iter()
            .filter(|line| needles.iter().all(|n| line.contains(n)))
            .cloned()
            .collect()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A note for a report if the proxy exited or logged at WARN/ERROR so far.
    pub fn health_note(&mut self) -> Option<String> {
        if let Some(status) = self.exited() {
            return Some(format!("PROXY EXITED ({status})"));
        }
        let warnings = self.warnings.load(Ordering::Relaxed);
        (warnings > 0).then(|| format!("{warnings} proxy WARN/ERROR log lines"))
    }

    /// `Some(status)` if the process has exited.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            _ => None,
        }
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads the proxy's log: sends the port of its "listening on ADDR" line, echoes WARN/ERROR
/// lines (the first 20) to stderr and counts them, and keeps the last [`LOG_KEPT`] lines.
fn drain_proxy_log(
    pipe: impl Read,
    port_tx: mpsc::Sender<u16>,
    warnings: Arc<AtomicUsize>,
    log: Arc<Mutex<VecDeque<String>>>,
) {
    let mut port_tx = Some(port_tx);
    for line in BufReader::new(pipe).lines() {
        let Ok(line) = line else { break };
        if let Ok(mut log) = log.lock() {
            if log.len() == LOG_KEPT {
                log.pop_front();
            }
            log.push_back(line.clone());
        }
        if let Some(tx) = &port_tx {
            if let Some(port) = listening_port(&line) {
                let _ = tx.send(port);
                port_tx = None;
                continue;
            }
        }
        let level_warn = [
            "\"level\":\"WARN\"",
            "\"level\":\"ERROR\"",
            " WARN ",
            " ERROR ",
        ];
        if level_warn.iter().any(|l| line.contains(l)) {
            let seen = warnings.fetch_add(1, Ordering::Relaxed);
            if seen < 20 {
                eprintln!("    [proxy log] {line}");
            }
        }
    }
}

fn listening_port(line: &str) -> Option<u16> {
    let rest = &line[line.find("listening on ")? + "listening on ".len()..];
    let addr: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
        .collect();
    addr.rsplit(':').next()?.parse().ok()
}

/// The lease bound B a proxy applies (`quarantine_ms` in its `INFO masters`), in ms.
pub async fn lease_bound_ms(client: &mut Client) -> i64 {
    let info = client.cmd(&["INFO", "masters"]).await;
    let line = info
        .split("quarantine_ms:")
        .nth(1)
        .expect("quarantine_ms in INFO");
    let digits: String = line.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().expect("an integer")
}

/// Waits (at most 5 s) until the proxy's `INFO masters` on `client` shows `needle` exactly
/// `count` times (`state=up` 3 times, say); returns that INFO. Panics past the limit.
pub async fn wait_for_info(client: &mut Client, needle: &str, count: usize) -> String {
    wait_for_info_within(client, needle, count, Duration::from_secs(5)).await
}

/// [`wait_for_info`] with a limit of its own.
pub async fn wait_for_info_within(
    client: &mut Client,
    needle: &str,
    count: usize,
    limit: Duration,
) -> String {
    let what = format!("{count}× {needle:?}");
    wait_for_info_where(client, limit, &what, |info| {
        info.matches(needle).count() == count
    })
    .await
}

/// Waits (at most `limit`) until the proxy's `INFO masters` on `client` satisfies `done`;
/// returns that INFO. Panics past the limit, naming `what` was expected.
pub async fn wait_for_info_where(
    client: &mut Client,
    limit: Duration,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let info = client.cmd(&["INFO", "masters"]).await;
        if done(&info) {
            return info;
        }
        assert!(
            Instant::now() < deadline,
            "expected {what} within {limit:?} in {info}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The line of master `i` in an `INFO masters` text.
fn master_line(info: &str, i: usize) -> Option<&str> {
    info.lines().find(|l| l.starts_with(&format!("master{i}:")))
}

/// The `state=` of master `i` in an `INFO masters` text (`up`, `quarantined (…)`, …).
pub fn master_state(info: &str, i: usize) -> Option<&str> {
    let line = master_line(info, i)?;
    let state = &line[line.find(",state=")? + ",state=".len()..];
    Some(&state[..state.find(",replies=").unwrap_or(state.len())])
}

/// A numeric field of master `i` in an `INFO masters` text (`missing_unconfirmed`,
/// `clock_age_ms`, …).
pub fn master_number(info: &str, i: usize, field: &str) -> Option<i64> {
    let line = master_line(info, i)?;
    let value = line.split(&format!(",{field}=")).nth(1)?;
    value.split(',').next()?.trim().parse().ok()
}

/// Waits (at most 10 s) until a server (a redis-server or a fresh proxy) is ready for load:
/// every master the proxy lists in `INFO masters` is `state=up` (not connecting, down or
/// quarantined), and the compare-and-delete release is loaded (`SCRIPT LOAD` fans out through
/// the proxy). Returns its SHA1.
pub async fn ready_for_load(port: u16) -> io::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut conn = Client::open(port, Duration::from_secs(5)).await?;
    loop {
        let info = conn
            .request(&[b"INFO", b"masters"])
            .await?
            .text()
            .unwrap_or_default();
        let waiting: Vec<&str> = info
            .lines()
            .filter(|l| l.contains("state=") && !l.contains("state=up"))
            .collect();
        let script = if waiting.is_empty() {
            conn.request(&[b"SCRIPT", b"LOAD", COMPARE_AND_DELETE.text().as_bytes()])
                .await?
        } else {
            Reply::Null
        };
        match script {
            Reply::Bulk(_) => return Ok(script.text().unwrap_or_default()),
            other if Instant::now() > deadline => {
                return Err(io::Error::other(format!(
                    "port {port} not ready after 10 s: masters {waiting:?}, SCRIPT LOAD {other}"
                )))
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}
