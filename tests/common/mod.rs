//! Test harness: real `redis-server` masters on ephemeral loopback ports, the proxy running
//! in-process on an ephemeral port, a raw RESP client, direct checks on the masters, and a TCP
//! fault relay (delay, blackhole, reset) to put between the proxy and a master.
#![allow(dead_code)] // each test binary uses a different part of the harness

pub mod checker;
pub mod relay;
pub mod workload;

use redlock_proxy::local::LocalCluster;
use redlock_proxy::Config;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// The node timeout of tests about behaviour (replies, order, clients): far above any
/// scheduler hiccup on a shared CI machine, so a slow moment never turns a vote into a "no".
/// Tests about timing set their own (`node_timeout_ms` in their config tweak) and derive their
/// bounds from it.
pub const BEHAVIOUR_NODE_TIMEOUT_MS: u64 = 2000;

/// A running proxy over a set of master addresses.
pub struct Proxy {
    pub port: u16,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    /// Starts the proxy in this runtime, listening on a free loopback port.
    pub async fn start(backends: Vec<String>, tweak: impl FnOnce(&mut Config)) -> Proxy {
        let mut config = Config {
            port: 0,
            backends,
            node_timeout_ms: BEHAVIOUR_NODE_TIMEOUT_MS,
            ..Config::default()
        };
        tweak(&mut config);
        config.validate().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(redlock_proxy::run(config, listener, async move {
            let _ = stopped.await;
        }));
        let proxy = Proxy {
            port,
            stop: Some(stop),
            task: Some(task),
        };
        proxy.wait_connected().await;
        proxy
    }

    /// Waits (bounded) until the proxy answers and has tried its masters once.
    async fn wait_connected(&self) {
        let mut client = Client::connect(self.port).await;
        assert_eq!(client.cmd(&["PING"]).await, "+PONG");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    pub async fn client(&self) -> Client {
        Client::connect(self.port).await
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
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// N masters and a proxy over them.
pub struct Env {
    pub masters: LocalCluster,
    pub proxy: Proxy,
}

impl Env {
    pub async fn start(n: usize) -> Env {
        Env::start_with(n, |_| {}).await
    }

    pub async fn start_with(n: usize, tweak: impl FnOnce(&mut Config)) -> Env {
        let masters = LocalCluster::start(n).expect("redis-server must be installed");
        let proxy = Proxy::start(masters.addrs(), tweak).await;
        Env { masters, proxy }
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

    /// Waits (at most 2 s) until no master holds `key`: replies may be sent once a majority
    /// answered, while the remaining masters' copies of the command are still in flight.
    pub async fn assert_gone(&self, key: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
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

    /// How many masters hold `key` = `value`.
    pub async fn holders(&self, key: &str, value: &str) -> usize {
        self.values(key)
            .await
            .iter()
            .filter(|v| v.as_deref() == Some(value))
            .count()
    }
}

/// `GET key` directly on a master.
pub async fn master_get(port: u16, key: &str) -> Option<String> {
    let mut client = Client::try_connect(port).await?;
    let reply = client.cmd(&["GET", key]).await;
    match reply.as_str() {
        "$nil" | "_" => None,
        other => other.strip_prefix('$').map(str::to_string),
    }
}

/// A command directly on a master, reply rendered like [`Client::cmd`].
pub async fn master_cmd(port: u16, args: &[&str]) -> String {
    Client::connect(port).await.cmd(args).await
}

/// A raw RESP client whose replies are rendered as compact strings:
/// `+OK`, `-ERR ...`, `:1`, `$value`, `$nil`, `_`, `*[a,b]`, `%{k:v}`, `=text`.
pub struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    pub async fn connect(port: u16) -> Client {
        Client::try_connect(port).await.expect("connect")
    }

    pub async fn try_connect(port: u16) -> Option<Client> {
        let stream = tokio::time::timeout(
            Duration::from_secs(2),
            TcpStream::connect(("127.0.0.1", port)),
        )
        .await
        .ok()?
        .ok()?;
        Some(Client {
            stream,
            buf: Vec::new(),
        })
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    pub async fn send(&mut self, args: &[&str]) {
        self.send_raw(&encode(args)).await;
    }

    pub async fn cmd(&mut self, args: &[&str]) -> String {
        self.send(args).await;
        self.read().await
    }

    /// Reads one reply (10 s bound).
    pub async fn read(&mut self) -> String {
        self.try_read(Duration::from_secs(10))
            .await
            .expect("a reply within 10 s")
    }

    /// One reply, or `None` on timeout or end of stream.
    pub async fn try_read(&mut self, limit: Duration) -> Option<String> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some((text, used)) = parse(&self.buf) {
                self.buf.drain(..used);
                return Some(text);
            }
            self.buf.reserve(64 * 1024);
            let n = tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf))
                .await
                .ok()?
                .ok()?;
            if n == 0 {
                return None;
            }
        }
    }

    /// Sends a command and reads one reply within `limit`; `None` on a write error, a timeout
    /// or end of stream (the connection must then not be reused: a late reply may follow).
    pub async fn try_cmd(&mut self, args: &[&str], limit: Duration) -> Option<String> {
        self.stream.write_all(&encode(args)).await.ok()?;
        self.try_read(limit).await
    }

    /// True if the server closed the connection (within 2 s).
    pub async fn is_closed(&mut self) -> bool {
        let mut chunk = Vec::with_capacity(1024);
        matches!(
            tokio::time::timeout(Duration::from_secs(2), self.stream.read_buf(&mut chunk)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }
}

pub fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn line(buf: &[u8]) -> Option<(&str, usize)> {
    let end = buf.windows(2).position(|w| w == b"\r\n")?;
    Some((std::str::from_utf8(&buf[..end]).ok()?, end + 2))
}

/// Parses one reply from `buf`: (rendered, bytes used).
fn parse(buf: &[u8]) -> Option<(String, usize)> {
    let (first, used) = line(buf)?;
    let (kind, rest) = first.split_at(1);
    match kind {
        "+" | "-" | ":" => Some((first.to_string(), used)),
        "_" => Some(("_".into(), used)),
        "$" | "=" => {
            let len: i64 = rest.parse().ok()?;
            if len < 0 {
                return Some(("$nil".into(), used));
            }
            let len = len as usize;
            if buf.len() < used + len + 2 {
                return None;
            }
            let body = String::from_utf8_lossy(&buf[used..used + len]).into_owned();
            Some((format!("{kind}{body}"), used + len + 2))
        }
        "*" | "%" | "~" => {
            let n: i64 = rest.parse().ok()?;
            if n < 0 {
                return Some(("*nil".into(), used));
            }
            let count = if kind == "%" { n * 2 } else { n } as usize;
            let mut at = used;
            let mut items = Vec::new();
            for _ in 0..count {
                let (item, u) = parse(&buf[at..])?;
                items.push(item);
                at += u;
            }
            let text = if kind == "%" {
                let pairs: Vec<String> = items
                    .chunks(2)
                    .map(|p| format!("{}:{}", p[0], p[1]))
                    .collect();
                format!("%{{{}}}", pairs.join(","))
            } else {
                format!("*[{}]", items.join(","))
            };
            Some((text, at))
        }
        _ => Some((format!("?{first}"), used)),
    }
}

/// One `redis-cli` command (one-shot mode, output not a terminal) and what it printed.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("redis-cli is installed with redis-server (Debian redis-tools)");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// A fresh key name for one test.
pub fn key(name: &str) -> String {
    format!("test:{name}:{}", std::process::id())
}

/// The release script every lock library sends, in one of its forms.
pub const RELEASE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
