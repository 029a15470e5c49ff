//! How the proxy reaches one master: the [`Connect`] that opens a TCP or TLS stream to a
//! [`Backend`] and authenticates before anything else goes on it ([`Dial`]). For a
//! Sentinel-managed master, every connection first asks the sentinels, in order, which server
//! is the group's primary, and a watcher subscribed to a sentinel's `+switch-master` tells the
//! connection to move when the group fails over ([`Connect::changed`]).
//!
//! Invariants:
//! - A password goes on the wire in `AUTH` only, and is printed nowhere ([`Backend`] and
//!   [`Secret`] print it as `***` and `<redacted>`).
//! - Every connection, first or re-made, sends `AUTH` first when the master has credentials,
//!   and is handed to the transport only once the master said `OK`; without credentials it
//!   sends `PING` first, and a master that answers `NOAUTH` (it has a password the proxy was
//!   not given) refuses it as a wrong password would. A refusal is a connection failure
//!   carrying the master's own error text ([`AuthRefused`]), which the transport keeps for
//!   `INFO` (`state=auth_failed`): the master is unreachable, so it takes no part in any
//!   quorum, and is tried again on the backoff of the link that dials (the voting link's, the
//!   subscriber link's), until the master accepts the credentials (or wants none) again.
//!   Without the `PING`, such a master accepted the connection and refused every command on
//!   it: the voting link looked `connecting` for ever, and the subscriber link, refused its
//!   first subscription, reconnected at once, dozens of times a second (issue 40).
//! - A password that is not in the address comes from the environment variable
//!   [`PASSWORD_ENV`], read when the proxy starts.
//! - A Sentinel group's primary is asked for on every connection (a lost connection
//!   re-resolves), each sentinel within [`SENTINEL_TIMEOUT`]; the credentials are the
//!   primary's, sentinels are asked without. A new primary is a new `run_id` to the health
//!   monitor: it is quarantined like a master that restarted empty (docs/SAFETY.md).

use crate::backend::{Backend, SentinelGroup};
use crate::live::LiveDuration;
use crate::protocol::{decode_reply, encode_command, Reply};
use crate::secret::Secret;
use crate::transport::{liveness_window, AuthRefused, Connect, ReadHalf, WriteHalf};
use bytes::BytesMut;
use futures::future::BoxFuture;
use rustls_pki_types::ServerName;
use std::io;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsConnector;

/// The environment variable that gives the masters' password when their address has none.
pub const PASSWORD_ENV: &str = "REDLOCK_PROXY_BACKEND_PASSWORD";

/// Most bytes of a master's answer to `AUTH` read before giving up on it.
const AUTH_REPLY_MAX: usize = 4096;
/// How long one sentinel may take to name its group's primary before the next is asked.
pub const SENTINEL_TIMEOUT: Duration = Duration::from_millis(300);
/// The pause before a switch watcher tries the sentinels again.
const WATCH_RETRY: Duration = Duration::from_millis(500);

/// What to send before anything else on every connection: `AUTH [user] password`.
#[derive(Clone)]
struct Credentials {
    user: Option<String>,
    password: Secret,
}

/// TLS to a master: the connector and the name its certificate must carry, or why there is
/// none (TLS material that could not be loaded).
type MasterTls = Result<(TlsConnector, ServerName<'static>), String>;

/// Opens connections to one master: TCP (Nagle off), TLS for `rediss://`, then `AUTH`.
pub struct Dial {
    host: String,
    port: u16,
    tls: Option<MasterTls>,
    credentials: Option<Credentials>,
    /// For a Sentinel-managed master: where to ask for the primary.
    sentinel: Option<SentinelGroup>,
    /// Failovers of the group seen so far, counted by the watcher started at the first
    /// [`Connect::changed`].
    switches: OnceLock<watch::Receiver<u64>>,
    /// How long the master may take to answer the `AUTH` or `PING` that opens a connection
    /// (a voting link's liveness window, from its node timeout: [`Dial::answering_within`];
    /// `None`: the transport's connect timeout). A master cut off behind a link that still accepts connections (a
    /// blackholing middlebox) would otherwise hold every attempt for the whole connect
    /// timeout, and a healed link would wait out the attempt under way before it votes again.
    answer_within: Option<LiveDuration>,
}

impl Dial {
    /// How to reach `backend`: `tls` is the connector for `rediss://` masters (or why it could
    /// not be built), `env_password` the password for addresses without one.
    pub fn new(
        backend: &Backend,
        tls: Option<&Result<TlsConnector, String>>,
        env_password: Option<&Secret>,
    ) -> Dial {
        let tls = backend.tls.then(|| {
            let connector = match tls {
                Some(Ok(connector)) => connector.clone(),
                Some(Err(why)) => return Err(why.clone()),
                None => return Err("rediss:// needs backend-tls-ca-cert-file".to_string()),
            };
            let name = ServerName::try_from(backend.host.clone())
                .map_err(|_| format!("'{}' is not a valid TLS server name", backend.host))?;
            Ok((connector, name))
        });
        let password = backend.password.as_ref().or(env_password).cloned();
        Dial {
            host: backend.host.clone(),
            port: backend.port,
            tls,
            credentials: password.map(|password| Credentials {
                user: backend.user.clone(),
                password,
            }),
            sentinel: backend.sentinel.clone(),
            switches: OnceLock::new(),
            answer_within: None,
        }
    }

    /// This dial, whose connection's opening `AUTH` or `PING` must be answered within the
    /// liveness window of a link whose node timeout is `node_timeout`
    /// ([`crate::transport::liveness_window`]): a master slower than one node timeout is slow,
    /// not dead, and a new connection to it is as welcome as an old one.
    pub fn answering_within(self, node_timeout: LiveDuration) -> Dial {
        Dial {
            answer_within: Some(node_timeout),
            ..self
        }
    }
}

impl Connect for Dial {
    fn connect(&self) -> BoxFuture<'static, io::Result<(ReadHalf, WriteHalf)>> {
        let (host, port) = (self.host.clone(), self.port);
        let tls = self.tls.clone();
        let credentials = self.credentials.clone();
        let sentinel = self.sentinel.clone();
        let limit = (self.answer_within.as_ref()).map(|t| liveness_window(t.get()));
        Box::pin(async move {
            let tls = tls.transpose().map_err(io::Error::other)?;
            let (host, port) = match &sentinel {
                Some(group) => primary_of(group).await?,
                None => (host, port),
            };
            let stream = TcpStream::connect((host.as_str(), port)).await?;
            stream.set_nodelay(true)?;
            match tls {
                None => {
                    let (mut rd, mut wr) = stream.into_split();
                    authenticate(&mut rd, &mut wr, credentials.as_ref(), limit).await?;
                    Ok((Box::new(rd) as ReadHalf, Box::new(wr) as WriteHalf))
                }
                Some((connector, name)) => {
                    let stream = connector.connect(name, stream).await?;
                    let (mut rd, mut wr) = tokio::io::split(stream);
                    authenticate(&mut rd, &mut wr, credentials.as_ref(), limit).await?;
                    Ok((Box::new(rd) as ReadHalf, Box::new(wr) as WriteHalf))
                }
            }
        })
    }

    fn changed(&self) -> BoxFuture<'static, ()> {
        let Some(group) = &self.sentinel else {
            return Box::pin(std::future::pending());
        };
        let mut switches = self
            .switches
            .get_or_init(|| {
                let (tx, rx) = watch::channel(0);
                tokio::spawn(watch_switches(group.clone(), tx));
                rx
            })
            .clone();
        switches.borrow_and_update();
        Box::pin(async move {
            if switches.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    }
}

/// The address of `group`'s primary, from the first sentinel that names one.
async fn primary_of(group: &SentinelGroup) -> io::Result<(String, u16)> {
    for (host, port) in &group.sentinels {
        let asked = ask_sentinel(host, *port, &group.name);
        if let Ok(Ok(Some(primary))) = tokio::time::timeout(SENTINEL_TIMEOUT, asked).await {
            return Ok(primary);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!("no sentinel named a primary for '{}'", group.name),
    ))
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME name` on one sentinel: the primary, or `None` if it does
/// not know the group.
async fn ask_sentinel(host: &str, port: u16, name: &str) -> io::Result<Option<(String, u16)>> {
    let (mut rd, mut wr) = TcpStream::connect((host, port)).await?.into_split();
    wr.write_all(&encode_command(&[
        "SENTINEL",
        "GET-MASTER-ADDR-BY-NAME",
        name,
    ]))
    .await?;
    match read_reply(&mut rd, &mut BytesMut::new()).await? {
        Reply::Array(items) => match items.as_slice() {
            [Reply::Bulk(host), Reply::Bulk(port)] => {
                let host = String::from_utf8_lossy(host).into_owned();
                let port = std::str::from_utf8(port).ok().and_then(|p| p.parse().ok());
                Ok(port.map(|port| (host, port)))
            }
            _ => Ok(None),
        },
        _ => Ok(None),
    }
}

/// Counts `group`'s failovers in `switches`: subscribed to `+switch-master` on one sentinel
/// at a time (the next when it fails), until nobody listens.
async fn watch_switches(group: SentinelGroup, switches: watch::Sender<u64>) {
    loop {
        for (host, port) in &group.sentinels {
            tokio::select! {
                _ = follow_switches(host, *port, &group.name, &switches) => {}
                _ = switches.closed() => return,
            }
            tokio::select! {
                _ = tokio::time::sleep(WATCH_RETRY) => {}
                _ = switches.closed() => return,
            }
        }
    }
}

/// Follows one sentinel's `+switch-master` messages until its connection fails.
async fn follow_switches(host: &str, port: u16, name: &str, switches: &watch::Sender<u64>) {
    let Ok(stream) = TcpStream::connect((host, port)).await else {
        return;
    };
    let (mut rd, mut wr) = stream.into_split();
    if wr
        .write_all(&encode_command(&["SUBSCRIBE", "+switch-master"]))
        .await
        .is_err()
    {
        return;
    }
    let mut buf = BytesMut::new();
    // `message +switch-master "<name> <old-ip> <old-port> <new-ip> <new-port>"`.
    while let Ok(reply) = read_reply(&mut rd, &mut buf).await {
        if let Reply::Array(items) = reply {
            let named = match items.as_slice() {
                [Reply::Bulk(kind), _, Reply::Bulk(text)] if kind.as_ref() == b"message" => text
                    .split(|b| *b == b' ')
                    .next()
                    .is_some_and(|group| group == name.as_bytes()),
                _ => false,
            };
            if named {
                tracing::info!(group = name, "sentinel reports a failover");
                switches.send_modify(|n| *n += 1);
            }
        }
    }
}

/// Reads one reply (at most [`AUTH_REPLY_MAX`] bytes of it).
async fn read_reply(rd: &mut (impl AsyncRead + Unpin), buf: &mut BytesMut) -> io::Result<Reply> {
    loop {
        if let Some(reply) = decode_reply(buf).map_err(io::Error::other)? {
            return Ok(reply);
        }
        if buf.len() > AUTH_REPLY_MAX || rd.read_buf(buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// Sends `AUTH` and waits for `OK`, or, without credentials, `PING` to learn whether the
/// master wants some; a refusal (`WRONGPASS …`, `NOAUTH …`) is an [`AuthRefused`] error.
async fn authenticate(
    rd: &mut (impl AsyncRead + Unpin),
    wr: &mut (impl AsyncWrite + Unpin),
    credentials: Option<&Credentials>,
    limit: Option<std::time::Duration>,
) -> io::Result<()> {
    let command = match credentials {
        None => encode_command(&["PING"]),
        Some(Credentials {
            user: Some(user),
            password,
        }) => encode_command(&["AUTH", user, password.expose()]),
        Some(Credentials {
            user: None,
            password,
        }) => encode_command(&["AUTH", password.expose()]),
    };
    wr.write_all(&command).await?;
    let refused = |text: &[u8]| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            AuthRefused(String::from_utf8_lossy(text).replace(',', ";")),
        )
    };
    let mut buf = BytesMut::with_capacity(256);
    let answer = read_reply(rd, &mut buf);
    let answer = match limit {
        Some(limit) => tokio::time::timeout(limit, answer).await.map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "no answer to the connection's first command within the liveness window",
            )
        })??,
        None => answer.await?,
    };
    match (answer, credentials) {
        (Reply::Error(text), None) if text.starts_with(b"NOAUTH") => Err(refused(&text)),
        // Any other answer (`PONG`, `LOADING …`) is for the health monitor to judge.
        (_, None) => Ok(()),
        (Reply::Simple(ok), Some(_)) if ok.as_ref() == b"OK" => Ok(()),
        (Reply::Error(text), Some(_)) => Err(refused(&text)),
        (other, Some(_)) => Err(io::Error::other(format!(
            "unexpected answer to AUTH: {other:?}"
        ))),
    }
}
